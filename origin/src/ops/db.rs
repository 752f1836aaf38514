//! Postgres connections and the schema: the pool every process opens, and
//! the `migrations/` compiled into the binary (applied, or only checked
//! when `ORIGIN_AUTO_MIGRATE=0`).

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Postgres connections for one-off commands (`migrate`, `sale …`).
pub const CLI_POOL_SIZE: u32 = 4;

/// Connects to Postgres (lazily: readiness reports it when it is down).
pub fn pg_pool(url: &str, size: u32) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(url)
        .with_context(|| "DATABASE_URL is not a valid Postgres URL")
}

/// The migrations compiled into the binary (`migrations/`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("../migrations")
}

/// At start: applies the migrations, or with `auto` off only checks that
/// none is pending (serving roles then need no DDL rights).
pub async fn migrate_or_check(pool: &PgPool, auto: bool) -> anyhow::Result<()> {
    if auto {
        return migrate(pool)
            .await
            .context("Postgres must be reachable at start (DATABASE_URL)");
    }
    let pending = pending_migrations(pool)
        .await
        .context("Postgres must be reachable at start (DATABASE_URL)")?;
    anyhow::ensure!(
        pending == 0,
        "{pending} migration(s) not applied and ORIGIN_AUTO_MIGRATE=0: run `origin migrate` first"
    );
    Ok(())
}

/// How many of the compiled-in migrations the database lacks.
pub async fn pending_migrations(pool: &PgPool) -> Result<usize, sqlx::Error> {
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await
            .or_else(|e| match e {
                // No migrations table: nothing was ever applied.
                sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => Ok(Vec::new()),
                e => Err(e),
            })?;
    Ok(migrator()
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count())
}

/// Applies `migrations/`.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    migrator().run(pool).await.context("applying migrations")
}
