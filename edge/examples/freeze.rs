//! Host benchmark of the draw v2's freeze at the coordinator
//! (`cargo run --release -p edge --example freeze -- [entrants] [shards]`):
//! `entrants` leaves over `shards` in-memory shards (the edge's account →
//! shard map), merged by `freeze::Freeze` in steps of at most 8,192 leaves
//! from pages of 512 per shard (fetched when a shard holds fewer than
//! 256), as the coordinator would fetch them.
//! Prints one JSON line: steps, page fetches, the slowest step, the
//! largest stored state, and that the root equals the whole tree's.

use std::time::Instant;

use edge::draw::freeze::{Freeze, Page};
use edge::queue::shards::shard_of;

const PAGE: usize = 512;
const MAX_OUT: usize = 8_192;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let k: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let mut shards: Vec<Vec<draw::Hash>> = vec![Vec::new(); k as usize];
    for i in 0..n {
        let account = format!("user-{i:07}");
        let mut salt = [0u8; 16];
        salt[..8].copy_from_slice(&(i as u64).to_le_bytes());
        shards[shard_of(&account, k) as usize].push(draw::leaf(&account, &salt));
    }
    for s in &mut shards {
        s.sort();
    }
    let mut f = Freeze::start(k);
    let mut pages = vec![Page::default(); k as usize];
    let mut fetched = vec![0usize; k as usize];
    let (mut steps, mut fetches, mut max_step_ms, mut total_ms, mut max_state) =
        (0u64, 0u64, 0f64, 0f64, 0usize);
    let mut chunks = 0u64;
    while !f.is_done() {
        for w in f.wants(&pages, PAGE / 2) {
            // What the shard's page after the leaf asked would hold (the
            // shards' leaves are sorted, so a cursor into them is the same).
            let s = w.shard;
            let rest = &shards[s][fetched[s]..];
            let take = rest.len().min(PAGE);
            pages[s].extend(rest[..take].to_vec(), PAGE);
            fetched[s] += take;
            fetches += 1;
        }
        let t = Instant::now();
        let got = f.merge(&mut pages, MAX_OUT).expect("state readable");
        let state = serde_json::to_string(&f).expect("state").len();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        chunks += got.chunks.len() as u64;
        max_state = max_state.max(state);
        max_step_ms = max_step_ms.max(ms);
        total_ms += ms;
        steps += 1;
    }
    let mut all: Vec<draw::Hash> = shards.into_iter().flatten().collect();
    all.sort();
    let same = f.root.as_deref() == Some(draw::to_hex(&draw::root(&all)).as_str());
    println!(
        "{{\"entrants\":{n},\"shards\":{k},\"steps\":{steps},\"page_fetches\":{fetches},\"chunks\":{chunks},\
         \"max_step_ms\":{max_step_ms:.2},\"steps_ms_total\":{total_ms:.0},\"max_state_bytes\":{max_state},\
         \"root_equals_whole_tree\":{same}}}"
    );
}
