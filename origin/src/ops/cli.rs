//! The `origin` command line (DESIGN.md's operator interface).

use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use secrecy::ExposeSecret;

use crate::ops::configuration::{self, Settings};
use crate::ops::db;
use crate::ops::startup::{self, Application};
use crate::ops::state::AppState;
use crate::ops::telemetry;
use crate::ops::workers::Workers;
use crate::reserve::engine::SkuStock;
use crate::reserve::store;
use crate::sales::create::parse_time;
use crate::sales::registry::SaleRegistry;
use crate::sales::sku::parse_sku_file;
use crate::sales::spec::{SaleChange, change_sale, create_sale};

#[derive(Parser, Debug)]
#[command(
    name = "origin",
    version,
    about = "Flash-sale origin: reservations, settlement, payments"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// HTTP API plus, unless switched off, the settlement worker, the expiry
    /// sweep and the reconciler. Listens on ORIGIN_ADDR (default 127.0.0.1:8080).
    Serve(ServeArgs),
    /// Applies migrations/ to DATABASE_URL.
    Migrate,
    /// Runs only the settlement worker (streams → Postgres) until stopped.
    Settle,
    /// Compares Redis with Postgres for every active sale and repairs drift.
    Reconcile {
        /// One pass, print the report as JSON, exit.
        #[arg(long)]
        once: bool,
    },
    /// Restores a sale's lost Redis shards (stock, holds, per-user counts) from Postgres.
    Rebuild {
        #[arg(long)]
        sale: String,
    },
    /// The dev payment provider (local runs and tests).
    #[command(subcommand)]
    Pay(PayCommand),
    /// Sale administration.
    #[command(subcommand)]
    Sale(SaleCommand),
    /// Mints a token (for local runs and tests; shops mint user tokens themselves).
    #[command(subcommand)]
    Token(TokenCommand),
    /// The configuration read from the environment.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Independent checks of what the edge publishes.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Endpoints that receive the events as signed webhooks (docs/webhooks.md).
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Prints the HTTP API's OpenAPI 3.1 document (docs/openapi/origin.json
    /// is this output, checked by a test); with --admin the admin API's
    /// (docs/openapi/admin.json).
    Openapi {
        #[arg(long)]
        admin: bool,
    },
    /// Exits 0 if this host's origin answers GET /readyz with 200, else 1
    /// (the container image's HEALTHCHECK: the image has no shell or curl).
    Healthcheck {
        /// Default: ORIGIN_ADDR's port on loopback.
        #[arg(long)]
        url: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Prints the effective configuration (secrets masked) and exits
    /// non-zero on any problem.
    Check {
        /// Also connect to Postgres and Redis, and check migrations.
        #[arg(long)]
        connect: bool,
    },
    /// Prints the README's configuration table (Markdown).
    Table,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Do not run the settlement worker in this process.
    #[arg(long)]
    pub no_settle: bool,
    /// Do not run the expiry sweep in this process.
    #[arg(long)]
    pub no_sweep: bool,
    /// Do not run the reconciler in this process.
    #[arg(long)]
    pub no_reconcile: bool,
    /// Do not run the outbox relay in this process.
    #[arg(long)]
    pub no_relay: bool,
}

#[derive(Subcommand, Debug)]
pub enum SaleCommand {
    /// Writes the sale to Postgres, initializes Redis and prints it as JSON.
    Create(crate::sales::create::CreateArgs),
    /// Changes the admission pace, pauses or resumes admission, or moves the
    /// end of a sale; prints it as JSON. Running origins pick it up within
    /// 5 s, the edge from them.
    Update {
        #[arg(long)]
        sale: String,
        /// Most people admitted per second by the edge (the ceiling of its
        /// adaptive rate).
        #[arg(long)]
        admission_rate: Option<f64>,
        #[arg(long)]
        admission_factor: Option<f64>,
        /// The reservation path's p99 (ms) above which the edge admits slower.
        #[arg(long)]
        admission_p99_ms: Option<f64>,
        /// `true` holds the edge's admission frontier (nobody new is
        /// admitted; nobody loses a place or a window); `false` resumes.
        #[arg(long)]
        paused: Option<bool>,
        /// `true`: failed bot checks get a shadow place; `false`: an error.
        #[arg(long)]
        bot_shadow: Option<bool>,
        /// RFC 3339 time or `now`.
        #[arg(long, value_parser = parse_time)]
        ends_at: Option<DateTime<Utc>>,
        /// Refused: the queue's shard count is fixed at creation.
        #[arg(long)]
        queue_shards: Option<i32>,
    },
    /// Ends a sale now (410 sale_ended from then on; granted holds stay
    /// payable until they expire); prints it as JSON.
    End {
        #[arg(long)]
        sale: String,
    },
    /// The sale as it stands: config, phase, Postgres inventory, Redis stock
    /// and holds, settlement lag, dead letters (JSON).
    Show {
        #[arg(long)]
        sale: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Verifies a finished draw from what the edge publishes: the seed
    /// against its commitment, the Merkle root of the entrants, the key
    /// (with the beacon's round, asked of the beacon), every value and the
    /// order; with --receipt, one entrant's leaf, audit path and place.
    /// Exit 1 names the first discrepancy.
    Draw {
        /// The edge's base URL (e.g. https://queue.shop.example).
        #[arg(long, required_unless_present = "from")]
        edge: Option<String>,
        #[arg(long, required_unless_present = "from")]
        sale: Option<String>,
        /// A receipt (`GET /api/sales/{sale}/queue/receipt`, with the
        /// `account` it belongs to) to check too.
        #[arg(long)]
        receipt: Option<PathBuf>,
        /// Also saves what was downloaded here (`summary.json`, `draw.json`).
        #[arg(long)]
        save: Option<PathBuf>,
        /// Checks a saved copy instead of downloading (no beacon request).
        #[arg(long, conflicts_with_all = ["edge", "sale"])]
        from: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum PayCommand {
    /// Signs and posts a provider webhook for a payment, like a real provider.
    Simulate {
        #[arg(long)]
        payment: String,
        /// `succeeded` or `failed`.
        #[arg(long, default_value = "succeeded")]
        outcome: String,
        /// Amount the provider reports (default: looked up in Postgres).
        #[arg(long)]
        amount_cents: Option<i64>,
        /// The origin to post to.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        origin: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// Registers an endpoint; prints it as JSON with its `id` and its
    /// `secret` (`whsec_…`, shown this once).
    Add {
        /// https, and not a loopback, private or link-local address (both
        /// allowed with WEBHOOK_ALLOW_PRIVATE=1).
        #[arg(long)]
        url: String,
        /// Event types, comma-separated (docs/events.md); every event when left out.
        #[arg(long)]
        events: Option<String>,
    },
    /// The endpoints, with their waiting and dead deliveries (no secrets).
    List,
    /// Stops every delivery to an endpoint; its waiting deliveries end dead.
    Remove { id: String },
    /// A new secret; the old one keeps signing beside it for `--overlap-hours`.
    Rotate {
        id: String,
        #[arg(long, default_value_t = 24)]
        overlap_hours: u64,
    },
    /// Sends an endpoint's dead deliveries again (all, or one event's).
    Replay {
        id: String,
        #[arg(long)]
        event: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// A `user` token signed with USER_TOKEN_KEYS.
    User {
        #[arg(long)]
        sub: String,
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
    },
    /// An `admit` token signed with ADMISSION_TOKEN_KEYS.
    Admit {
        #[arg(long)]
        sub: String,
        #[arg(long)]
        sale: String,
        #[arg(long, default_value_t = 120)]
        ttl: u64,
    },
}

/// Runs a parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Openapi { admin } => {
            if admin {
                print!("{}", crate::admin::openapi::json());
            } else {
                print!("{}", crate::http::openapi::json());
            }
            Ok(())
        }
        Command::Serve(args) => {
            telemetry::init_tracing("info,sqlx=warn");
            let settings = Settings::from_env()?;
            let workers = Workers {
                settle: !args.no_settle,
                sweep: !args.no_sweep,
                reconcile: !args.no_reconcile,
                relay: !args.no_relay,
            };
            let app = Application::build(settings, workers).await?;
            app.run_until_stopped(startup::stop_on_signals()).await
        }
        Command::Settle => {
            telemetry::init_tracing("info,sqlx=warn");
            let state = AppState::connect(Settings::from_env()?).await?;
            let stop = startup::stop_on_signals();
            let _admin = startup::serve_admin(state.settings.metrics_addr, stop.clone()).await?;
            let grace = state.settings.shutdown_grace;
            let settler = state.settler().run(stop.clone());
            tokio::pin!(settler);
            tokio::select! {
                _ = &mut settler => return Ok(()),
                _ = stop.cancelled() => {}
            }
            // The batch in hand commits and is acked, or, past the grace, is
            // dropped: its transaction rolls back and its entries stay
            // pending for the next worker.
            tokio::time::timeout(grace, settler).await.map_err(|_| {
                anyhow::anyhow!("settlement batch outlasted ORIGIN_SHUTDOWN_GRACE_MS ({grace:?})")
            })
        }
        Command::Reconcile { once } => {
            telemetry::init_tracing("info,sqlx=warn");
            let state = AppState::connect(Settings::from_env()?).await?;
            if !once {
                crate::settle::reconcile::run(
                    state.engine.clone(),
                    state.pool.clone(),
                    state.sales.clone(),
                    state.settings.reconcile_interval,
                    startup::stop_on_signals(),
                )
                .await;
                return Ok(());
            }
            let mut reports = Vec::new();
            for sale in state.sales.active().await? {
                reports.push(
                    crate::settle::reconcile::reconcile_sale(
                        &state.engine,
                        &state.pool,
                        &sale,
                        true,
                    )
                    .await?,
                );
            }
            println!("{}", serde_json::to_string_pretty(&reports)?);
            Ok(())
        }
        Command::Rebuild { sale } => {
            telemetry::init_tracing("info,sqlx=warn");
            let state = AppState::connect(Settings::from_env()?).await?;
            let loaded = state
                .sales
                .get(&sale)
                .await?
                .with_context(|| format!("no sale {sale:?}"))?;
            let rebuilt =
                crate::settle::rebuild::rebuild_sale(&state.engine, &state.pool, &loaded).await?;
            println!(
                "{}",
                serde_json::json!({"sale": sale, "rebuilt_shards": rebuilt})
            );
            Ok(())
        }
        Command::Pay(PayCommand::Simulate {
            payment,
            outcome,
            amount_cents,
            origin,
        }) => {
            anyhow::ensure!(
                outcome == "succeeded" || outcome == "failed",
                "--outcome is succeeded or failed"
            );
            let secret = std::env::var("PAYMENT_WEBHOOK_SECRET")
                .context("PAYMENT_WEBHOOK_SECRET is not set")?;
            let secret = secret
                .split(',')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            let amount = match amount_cents {
                Some(a) => a,
                None => {
                    let pool = db::pg_pool(
                        configuration::database_url()?.expose_secret(),
                        db::CLI_POOL_SIZE,
                    )?;
                    sqlx::query_scalar("SELECT amount_cents FROM payments WHERE id = $1")
                        .bind(&payment)
                        .fetch_optional(&pool)
                        .await?
                        .with_context(|| format!("no payment {payment:?}"))?
                }
            };
            let event = serde_json::json!({
                "id": format!("evt_sim_{}", uuid::Uuid::new_v4().simple()),
                "type": format!("payment.{outcome}"),
                "data": {"payment_id": payment, "amount_cents": amount},
            });
            let res = crate::payments::webhook::post_webhook(
                &reqwest::Client::new(),
                &origin,
                &secret,
                &event,
            )
            .await?;
            let status = res.status();
            println!("{status} {}", res.text().await.unwrap_or_default());
            anyhow::ensure!(status.is_success(), "the origin refused the webhook");
            Ok(())
        }
        Command::Config(ConfigCommand::Table) => {
            print!("{}", configuration::markdown_table());
            Ok(())
        }
        Command::Config(ConfigCommand::Check { connect }) => config_check(connect).await,
        Command::Healthcheck { url } => healthcheck(url).await,
        Command::Audit(AuditCommand::Draw {
            edge,
            sale,
            receipt,
            save,
            from,
        }) => {
            crate::ops::audit::run(
                edge.as_deref(),
                sale.as_deref(),
                from.as_ref(),
                save.as_ref(),
                receipt.as_ref(),
            )
            .await
        }
        Command::Webhook(cmd) => webhook(cmd).await,
        Command::Migrate => {
            let pool = db::pg_pool(
                configuration::database_url()?.expose_secret(),
                db::CLI_POOL_SIZE,
            )?;
            db::migrate(&pool).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Sale(SaleCommand::Create(a)) => {
            let pool = db::pg_pool(
                configuration::database_url()?.expose_secret(),
                db::CLI_POOL_SIZE,
            )?;
            db::migrate_or_check(&pool, configuration::auto_migrate()?).await?;
            let mut conn = store::connect(&configuration::redis_target()?)
                .await
                .context("connecting to Redis")?;
            let skus = match &a.skus {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading --skus {}", path.display()))?;
                    parse_sku_file(&text).map_err(anyhow::Error::msg)?
                }
                None => a.sku.clone(),
            };
            let spec = a.spec(skus);
            let sale = create_sale(&pool, &mut conn, &configuration::key_prefix()?, &spec).await?;
            println!("{}", serde_json::to_string_pretty(&sale)?);
            Ok(())
        }
        Command::Sale(SaleCommand::Update {
            sale,
            admission_rate,
            admission_factor,
            admission_p99_ms,
            paused,
            bot_shadow,
            ends_at,
            queue_shards,
        }) => {
            let change = SaleChange {
                admission_rate,
                admission_factor,
                ends_at,
                queue_shards,
                paused,
                admission_p99_ms,
                bot_shadow,
                ..Default::default()
            };
            change_and_print(&sale, &change).await
        }
        Command::Sale(SaleCommand::End { sale }) => {
            let change = SaleChange {
                ends_at: Some(Utc::now()),
                ..Default::default()
            };
            change_and_print(&sale, &change).await
        }
        Command::Sale(SaleCommand::Show { sale }) => show_sale(&sale).await,
        Command::Token(cmd) => {
            let now = crate::ops::clock::now_secs();
            let (ring, claims) = match cmd {
                TokenCommand::User { sub, ttl } => (
                    configuration::key_ring("USER_TOKEN_KEYS")?,
                    token::Claims::new(token::TokenType::User, sub, None, now, ttl),
                ),
                TokenCommand::Admit { sub, sale, ttl } => (
                    configuration::key_ring("ADMISSION_TOKEN_KEYS")?,
                    token::Claims::new(token::TokenType::Admit, sub, Some(sale), now, ttl),
                ),
            };
            // A token every verifier would refuse (`token_bad_subject`) is
            // refused here, where the operator can see why.
            anyhow::ensure!(
                token::valid_subject(&claims.sub),
                "--sub must be 1-{} bytes with no control character",
                token::MAX_SUBJECT_BYTES
            );
            println!("{}", ring.sign(&claims));
            Ok(())
        }
    }
}

/// `origin config check`: the effective configuration, masked; every
/// problem listed; an error (exit 1) if there is any.
async fn config_check(connect: bool) -> anyhow::Result<()> {
    println!("origin configuration (secrets masked)");
    let lines = configuration::effective();
    let width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for l in &lines {
        let source = match l.source {
            configuration::Source::Env => "",
            configuration::Source::Default => "  (default)",
            configuration::Source::Unset => "",
        };
        println!("  {:width$}  {}{source}", l.name, l.shown);
    }
    let mut problems: Vec<String> = Vec::new();
    match Settings::from_env() {
        Ok(settings) => {
            let warnings = configuration::warnings(&settings);
            if !warnings.is_empty() {
                println!("warnings:");
                for w in warnings {
                    println!("  - {w}");
                }
            }
            if connect {
                println!("connections:");
                for (what, r) in connections(&settings).await {
                    match r {
                        Ok(detail) => println!("  {what}: ok ({detail})"),
                        Err(e) => {
                            println!("  {what}: FAILED");
                            problems.push(format!("{what}: {e:#}"));
                        }
                    }
                }
            }
        }
        Err(errs) => problems.extend(errs.0.iter().map(|e| e.to_string())),
    }
    if problems.is_empty() {
        println!("configuration OK");
        return Ok(());
    }
    println!("problems:");
    for p in &problems {
        println!("  - {p}");
    }
    anyhow::bail!(
        "{} configuration problem{}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    )
}

const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Reaches Postgres (and reads which migrations are applied) and Redis.
async fn connections(settings: &Settings) -> Vec<(&'static str, anyhow::Result<String>)> {
    let pg = async {
        let pool = db::pg_pool(settings.database_url(), db::CLI_POOL_SIZE)?;
        let pending = tokio::time::timeout(CONNECT_TIMEOUT, db::pending_migrations(&pool))
            .await
            .context("timed out")?
            .context("cannot query Postgres")?;
        let known = db::migrator().iter().count();
        anyhow::ensure!(
            pending == 0,
            "{pending} of {known} migrations not applied: run `origin migrate`"
        );
        Ok(format!("{known}/{known} migrations applied"))
    };
    let redis = async {
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, store::connect(&settings.redis))
            .await
            .context("timed out")?
            .context("cannot connect")?;
        let pong: String =
            tokio::time::timeout(CONNECT_TIMEOUT, redis::cmd("PING").query_async(&mut conn))
                .await
                .context("timed out")??;
        Ok(match &settings.redis {
            configuration::RedisTarget::Single(_) => format!("{pong}, one Redis"),
            configuration::RedisTarget::Cluster(n) => {
                format!("{pong}, cluster via {} seed(s)", n.len())
            }
            configuration::RedisTarget::Sentinel { nodes, master } => {
                let primary = match &conn {
                    store::RedisConn::Sentinel(c) => c.primary().1,
                    _ => "?".into(),
                };
                format!(
                    "{pong}, primary {master:?} at {primary} via {} sentinel(s)",
                    nodes.len()
                )
            }
        })
    };
    let (pg, redis) = tokio::join!(pg, redis);
    vec![("postgres", pg), ("redis", redis)]
}

/// `origin healthcheck`: GET /readyz on this host's origin.
async fn healthcheck(url: Option<String>) -> anyhow::Result<()> {
    let url = match url {
        Some(u) => u,
        None => {
            let addr = configuration::origin_addr()?;
            let host = match addr.ip() {
                std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
                std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_string(),
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            };
            format!("http://{host}:{}/readyz", addr.port())
        }
    };
    let res = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(2))
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = res.status();
    let body = res.text().await.unwrap_or_default();
    anyhow::ensure!(status.is_success(), "GET {url}: {status} {body}");
    println!("{status} {body}");
    Ok(())
}

async fn change_and_print(sale: &str, change: &SaleChange) -> anyhow::Result<()> {
    let pool = db::pg_pool(
        configuration::database_url()?.expose_secret(),
        db::CLI_POOL_SIZE,
    )?;
    let changed = change_sale(&pool, sale, change).await?;
    println!("{}", serde_json::to_string_pretty(&changed)?);
    Ok(())
}

/// `origin webhook …`.
async fn webhook(cmd: WebhookCommand) -> anyhow::Result<()> {
    use crate::events::webhooks::{guard, store};
    let pool = db::pg_pool(
        configuration::database_url()?.expose_secret(),
        db::CLI_POOL_SIZE,
    )?;
    match cmd {
        WebhookCommand::Add { url, events } => {
            let mut errors = Vec::new();
            let settings = configuration::webhook_settings(&mut errors)
                .ok_or_else(|| anyhow::anyhow!("{}", configuration::ConfigErrors(errors)))?;
            let url = guard::check_endpoint(&url, settings.allow_private).await?;
            let events = store::event_filter(events.as_deref())?;
            let added = store::add(&pool, url.as_str(), events).await?;
            println!("{}", serde_json::to_string_pretty(&added)?);
        }
        WebhookCommand::List => {
            println!(
                "{}",
                serde_json::to_string_pretty(&store::list(&pool).await?)?
            );
        }
        WebhookCommand::Remove { id } => {
            store::remove(&pool, &id).await?;
            println!("{}", serde_json::json!({"removed": id}));
        }
        WebhookCommand::Rotate { id, overlap_hours } => {
            let overlap = std::time::Duration::from_secs(overlap_hours.min(24 * 30) * 3600);
            let rotated = store::rotate(&pool, &id, overlap).await?;
            println!("{}", serde_json::to_string_pretty(&rotated)?);
        }
        WebhookCommand::Replay { id, event } => {
            let n = store::replay(&pool, &id, event.as_deref()).await?;
            println!("{}", serde_json::json!({"endpoint": id, "replayed": n}));
        }
    }
    Ok(())
}

/// `origin sale show`: one look at a sale from both stores.
async fn show_sale(id: &str) -> anyhow::Result<()> {
    use redis::AsyncCommands;
    let pool = db::pg_pool(
        configuration::database_url()?.expose_secret(),
        db::CLI_POOL_SIZE,
    )?;
    let prefix = configuration::key_prefix()?;
    let registry = SaleRegistry::new(pool.clone(), prefix);
    let sale = registry
        .get(id)
        .await?
        .with_context(|| format!("no sale {id:?}"))?;
    let (total, held, sold): (i32, i32, i32) =
        sqlx::query_as("SELECT total, held, sold FROM inventory WHERE sale_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await?;
    let mut conn = store::connect(&configuration::redis_target()?)
        .await
        .context("connecting to Redis")?;
    let mut shards = Vec::new();
    let (mut holds, mut lag, mut dead) = (0i64, 0i64, 0i64);
    let engine_stock = SkuStock::read(&conn, &sale).await?;
    let available: i64 = engine_stock.available.iter().sum();
    let skus: Vec<serde_json::Value> = sale
        .config
        .skus
        .iter()
        .zip(&engine_stock.available)
        .map(|(s, a)| serde_json::json!({"id": s.id, "available": a}))
        .collect();
    for k in &sale.shards {
        let stock: Option<i64> = conn.get(&k.stock).await?;
        let h: i64 = conn.hlen(&k.holds).await?;
        let l: i64 = conn.xlen(&k.stream).await?;
        let d: i64 = conn.xlen(&k.dead_letter).await?;
        holds += h;
        lag += l;
        dead += d;
        shards.push(serde_json::json!({
            "stock": stock, "holds": h, "settlement_lag": l, "dead_letters": d,
        }));
    }
    let out = serde_json::json!({
        "sale": &sale.config,
        "phase": sale.config.phase_by_time(Utc::now()),
        "postgres": {"total": total, "held": held, "sold": sold},
        "redis": {
            "available": available, "skus": skus, "holds": holds, "settlement_lag": lag,
            "dead_letters": dead, "shards": shards,
        },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
