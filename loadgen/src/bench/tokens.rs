//! `loadgen tokens`: admit tokens for load tools such as wrk, signed with
//! the origin's admission keys (ADMISSION_TOKEN_KEYS).

use clap::Args;
use token::{Claims, KeyRing, TokenType};

#[derive(Args)]
pub struct TokensArgs {
    #[arg(long)]
    sale: String,
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// Account ids are `<prefix><n>`.
    #[arg(long, default_value = "bench-")]
    prefix: String,
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
}

pub(crate) fn admission_ring() -> anyhow::Result<KeyRing> {
    Ok(origin::ops::configuration::key_ring(
        "ADMISSION_TOKEN_KEYS",
    )?)
}

pub fn now_secs() -> u64 {
    origin::ops::clock::now_secs()
}

pub fn tokens(a: TokensArgs) -> anyhow::Result<()> {
    let ring = admission_ring()?;
    for i in 0..a.count {
        let c = Claims::new(
            TokenType::Admit,
            format!("{}{i}", a.prefix),
            Some(a.sale.clone()),
            now_secs(),
            a.ttl,
        );
        println!("{}", ring.sign(&c));
    }
    Ok(())
}
