//! Benchmark clients used by `scripts/bench`. They print JSON; the script
//! turns it into ratios against baselines measured in the same run.
//!
//! Imports flow one way: `curve` → `open_loop` → `tokens`; `settle` and
//! `relay` and `lag` stand alone.

pub mod curve;
pub mod lag;
pub mod open_loop;
pub mod relay;
pub mod settle;
pub mod tokens;
