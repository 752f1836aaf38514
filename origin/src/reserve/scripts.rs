//! The product's Lua scripts, one file of `lua/` per Redis operation, loaded
//! into the binary at build time.
//!
//! Invariants kept here:
//! - scripts are created once per process from `lua/` and called by EVALSHA;
//!   `redis::Script` reloads a script and retries when Redis answers
//!   NOSCRIPT (e.g. after `SCRIPT FLUSH` or a failover);
//! - a script that needs the shared helpers gets `lua/_lib.lua` prepended
//!   here, not a second script call, so each stays one EVALSHA on one hash
//!   slot.

use redis::Script;

/// The product's Lua scripts, each `lua/_lib.lua` + its own file.
pub struct Scripts {
    pub reserve: Script,
    pub take: Script,
    pub quota_commit: Script,
    pub quota_return: Script,
    pub release: Script,
    pub sweep: Script,
    pub observe: Script,
    pub paid_holds: Script,
    pub reconcile: Script,
    pub rebuild_stage: Script,
    pub rebuild: Script,
    pub confirm: Script,
    pub unconfirm: Script,
    pub restore: Script,
    pub restore_quota: Script,
    pub settled: Script,
}

const LIB: &str = include_str!("../../../lua/_lib.lua");

fn with_lib(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

impl Scripts {
    pub fn load() -> Self {
        Scripts {
            reserve: with_lib(include_str!("../../../lua/reserve.lua")),
            take: with_lib(include_str!("../../../lua/take.lua")),
            quota_commit: Script::new(include_str!("../../../lua/quota_commit.lua")),
            quota_return: Script::new(include_str!("../../../lua/quota_return.lua")),
            release: with_lib(include_str!("../../../lua/release.lua")),
            sweep: with_lib(include_str!("../../../lua/sweep.lua")),
            observe: with_lib(include_str!("../../../lua/observe.lua")),
            paid_holds: Script::new(include_str!("../../../lua/paid_holds.lua")),
            reconcile: with_lib(include_str!("../../../lua/reconcile.lua")),
            rebuild_stage: Script::new(include_str!("../../../lua/rebuild_stage.lua")),
            rebuild: Script::new(include_str!("../../../lua/rebuild.lua")),
            confirm: with_lib(include_str!("../../../lua/confirm.lua")),
            unconfirm: Script::new(include_str!("../../../lua/unconfirm.lua")),
            restore: with_lib(include_str!("../../../lua/restore.lua")),
            restore_quota: Script::new(include_str!("../../../lua/restore_quota.lua")),
            settled: Script::new(include_str!("../../../lua/settled.lua")),
        }
    }
}
