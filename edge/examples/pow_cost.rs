//! What proof of work costs a bot farm (`scripts/bench-botcheck`): native
//! SHA-256 tries per CPU-second on this machine, one core, as the edge
//! checks them (`botcheck::pow::pow_hash`) and as a farm would run them (the
//! challenge's full blocks hashed once, only the nonce's block per try),
//! and the measured CPU time of solving real challenges at 16, 18, 20 and
//! 22 bits, scaled to 1,000 accounts. Prints markdown; never a test.
//!
//! `cargo run --release -p edge --example pow_cost [samples]`

use std::time::Instant;

use edge::botcheck::pow::{self as botcheck, CHALLENGE_TTL_MS, leading_zero_bits};
use sha2::{Digest, Sha256};
use token::KeyRing;

/// CPU seconds (user + system) this process has used (Linux, 10 ms ticks):
/// the machine is shared, so wall time would count other people's work.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, a)| a);
    let f: Vec<f64> = after.split(' ').map(|x| x.parse().unwrap_or(0.0)).collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() {
    let samples: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let ring = KeyRing::from_keys(&[("a1", &[7u8; 32])]).expect("ring");
    let challenge = |i: u64, bits: u32| {
        botcheck::issue(
            &ring,
            &format!("farm-account-{i:06}"),
            "drop-2026",
            bits,
            1_800_000_000_000 + i,
            CHALLENGE_TTL_MS,
            token::random_jti(),
        )
        .0
    };
    let c0 = challenge(0, 20);
    // Tries per second, one core, plain (as verified) and with the prefix's
    // blocks hashed once (what a farm's solver does).
    let n = 2_000_000u64;
    let t = cpu_secs();
    let mut best = 0;
    for i in 0..n {
        best = best.max(leading_zero_bits(&botcheck::pow_hash(&c0, &i.to_string())));
    }
    let plain = n as f64 / (cpu_secs() - t);
    let base = Sha256::new().chain_update(c0.as_bytes()).chain_update(b":");
    let t = cpu_secs();
    for i in 0..n {
        let h = base
            .clone()
            .chain_update(i.to_string().as_bytes())
            .finalize();
        best = best.max(leading_zero_bits(&h));
    }
    let mid = n as f64 / (cpu_secs() - t);
    assert!(best > 0);
    println!(
        "challenge length {} bytes; native SHA-256 tries per CPU-second (one thread, sha2 crate): {:.2} M as the edge verifies, {:.2} M with the challenge's blocks hashed once (a farm's solver)",
        c0.len(),
        plain / 1e6,
        mid / 1e6
    );
    println!();
    println!(
        "| bits | expected tries | samples | mean tries | mean CPU ms per account | CPU-s per 1,000 accounts (measured) | CPU-s per 1,000 (expected, farm solver) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for bits in [16u32, 18, 20, 22] {
        let mut tries = 0u64;
        let t = cpu_secs();
        let wall = Instant::now();
        for i in 0..samples {
            let c = challenge(i + 1, bits);
            let base = Sha256::new().chain_update(c.as_bytes()).chain_update(b":");
            let nonce = (0u64..)
                .find(|n| {
                    leading_zero_bits(
                        &base
                            .clone()
                            .chain_update(n.to_string().as_bytes())
                            .finalize(),
                    ) >= bits
                })
                .expect("a nonce");
            assert!(leading_zero_bits(&botcheck::pow_hash(&c, &nonce.to_string())) >= bits);
            tries += nonce + 1;
        }
        let secs = cpu_secs() - t;
        let per = secs / samples as f64;
        eprintln!(
            "pow_cost: {bits} bits: {samples} solves, {secs:.1} CPU-s in {:.1} s",
            wall.elapsed().as_secs_f64()
        );
        println!(
            "| {bits} | {} | {samples} | {:.0} | {:.1} | {:.0} | {:.0} |",
            1u64 << bits,
            tries as f64 / samples as f64,
            per * 1e3,
            per * 1000.0,
            1000.0 * (1u64 << bits) as f64 / mid
        );
    }
}
