//! Host benchmark of the sharded pre-queue draw (run by `scripts/bench-edge`,
//! or `cargo run --release -p edge --example crowd -- [entrants] [shards]`).
//!
//! Joins `entrants` synthetic accounts into `shards` in-memory shards (the
//! same account → shard mapping as the edge), runs each shard's stepwise
//! draw with the default step limits, then computes everyone's global place
//! the way an isolate does. Prints one JSON line of figures: the slowest
//! step, the largest shard's memory, the time for all places, and checks the
//! places are a permutation of `1..=entrants`.

use std::time::Instant;

use edge::draw::hash::{leaf_hex, value_hex};
use edge::draw::index::ShardIndex;
use edge::draw::steps::{DrawState, Limits, MemShard, step};
use edge::queue::places::place_of;
use edge::queue::shards::shard_of;

/// A synthetic entrant's leaf (its salt from its number, as good as random
/// for the cost measured here).
fn leaf_of(account: &str) -> String {
    let mut salt = [0u8; 16];
    salt[..account.len().min(16)].copy_from_slice(&account.as_bytes()[..account.len().min(16)]);
    leaf_hex(account, &salt)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let k: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let key = [7u8; 32];
    let accounts: Vec<String> = (0..n).map(|i| format!("user-{i:07}")).collect();

    let t = Instant::now();
    let mut shards = vec![MemShard::default(); k as usize];
    for a in &accounts {
        shards[shard_of(a, k) as usize].join(leaf_of(a));
    }
    let join_ms = t.elapsed().as_secs_f64() * 1e3;
    let sizes: Vec<usize> = shards.iter().map(|s| s.entrants.len()).collect();
    let even = n as f64 / f64::from(k);
    let spread = sizes
        .iter()
        .map(|s| (*s as f64 - even).abs() / even)
        .fold(0.0, f64::max);

    // Shards hold leaves; the check below starts from accounts.
    let value = |l: &str| value_hex(&key, l);
    let limits = Limits::default();
    let (mut steps, mut max_step_ms, mut total_draw_ms) = (0u64, 0f64, 0f64);
    let mut max_shard_bytes = 0usize;
    for s in &mut shards {
        let mut state = DrawState::start();
        while !state.is_done() {
            let t = Instant::now();
            state = match step(&state, s, &value, limits) {
                Ok(x) => x,
                Err(e) => match e {},
            };
            let ms = t.elapsed().as_secs_f64() * 1e3;
            max_step_ms = max_step_ms.max(ms);
            total_draw_ms += ms;
            steps += 1;
        }
        max_shard_bytes = max_shard_bytes.max(s.approx_bytes());
    }

    let indexes: Vec<ShardIndex> = shards.iter().map(MemShard::index).collect();
    let empty: Vec<String> = Vec::new();
    let t = Instant::now();
    let mut seen = vec![false; n];
    let mut ok = true;
    for a in &accounts {
        let v = value(&leaf_of(a));
        let parts: Vec<(&ShardIndex, &[String])> = indexes
            .iter()
            .zip(&shards)
            .map(|(ix, s)| {
                let b = ix
                    .straddling(&v)
                    .map(|j| s.buckets[j as usize].as_slice())
                    .unwrap_or(&empty);
                (ix, b)
            })
            .collect();
        match place_of(&v, &parts) {
            Some(p) if (1..=n as u64).contains(&p) && !seen[p as usize - 1] => {
                seen[p as usize - 1] = true
            }
            _ => ok = false,
        }
    }
    let place_ms = t.elapsed().as_secs_f64() * 1e3;
    let buckets: usize = shards.iter().map(|s| s.buckets.len()).sum();
    println!(
        "{{\"entrants\":{n},\"shards\":{k},\"join_ms\":{join_ms:.0},\"spread_max\":{spread:.4},\
\"draw_steps\":{steps},\"max_step_ms\":{max_step_ms:.2},\"draw_cpu_ms_total\":{total_draw_ms:.0},\
\"max_shard_mb\":{:.2},\"buckets\":{buckets},\"all_places_ms\":{place_ms:.0},\
\"per_place_us\":{:.2},\"permutation\":{}}}",
        max_shard_bytes as f64 / 1048576.0,
        place_ms * 1e3 / n as f64,
        ok && seen.iter().all(|s| *s)
    );
    if !(ok && seen.iter().all(|s| *s)) {
        std::process::exit(1);
    }
}
