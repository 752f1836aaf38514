//! The webhook worker: claims due deliveries, POSTs each signed event to
//! its endpoint, records the outcome (delivered on any 2xx; else tried
//! again on the schedule, then dead).
//!
//! Invariants kept here: at most `PER_ENDPOINT` deliveries of one endpoint
//! are in flight, so a slow or dead endpoint (each attempt bounded by the
//! timeout) never holds up the others, and the relay never waits for any
//! endpoint (it only queues rows); the body POSTed is byte for byte the one
//! signed; redirects are not followed and every name resolves through the
//! address guard.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::events::webhooks::guard::GuardedResolver;
use crate::events::webhooks::schedule;
use crate::events::webhooks::{signing, store};
use crate::ops::configuration::WebhookSettings;

/// Deliveries in flight at once, over every endpoint.
pub const IN_FLIGHT: usize = 64;
/// Deliveries of one endpoint in flight at once.
pub const PER_ENDPOINT: usize = 8;

/// The client every delivery goes through: no redirects, names resolved
/// through the guard, the attempt's timeout.
pub fn client(settings: &WebhookSettings) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(GuardedResolver {
            allow_private: settings.allow_private,
        }))
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .user_agent(concat!("flashsale-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("the webhook client builds")
}

/// One attempt: `Ok(status)` for a 2xx, else the status (if any) and why.
async fn attempt(
    client: &reqwest::Client,
    settings: &WebhookSettings,
    d: &store::Due,
) -> Result<u16, (Option<u16>, String)> {
    // An IP literal does not go through the resolver: check it here too.
    if let Err(e) = crate::events::webhooks::guard::check_url(&d.url, settings.allow_private) {
        return Err((None, e.to_string()));
    }
    let body = d.body.to_string();
    let now = chrono::Utc::now().timestamp();
    let signature = signing::signature_header(&d.keys, &d.event_id, now, &body);
    let answer = client
        .post(&d.url)
        .header("content-type", "application/json")
        .header("webhook-id", &d.event_id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    match answer {
        Ok(r) if r.status().is_success() => Ok(r.status().as_u16()),
        Ok(r) => Err((
            Some(r.status().as_u16()),
            format!("answered {}", r.status()),
        )),
        Err(e) => {
            let mut why = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                why = format!("{why}: {s}");
                src = s.source();
            }
            Err((None, why))
        }
    }
}

/// Runs one claimed delivery to its outcome.
async fn deliver(pool: PgPool, client: reqwest::Client, settings: WebhookSettings, d: store::Due) {
    let started = Instant::now();
    let outcome = attempt(&client, &settings, &d).await;
    metrics::histogram!("flashsale_webhook_attempt_seconds")
        .record(started.elapsed().as_secs_f64());
    let recorded = match outcome {
        Ok(status) => {
            metrics::counter!("flashsale_webhook_deliveries_total", "outcome" => "delivered")
                .increment(1);
            store::delivered(&pool, d.id, status).await
        }
        Err((status, why)) => {
            let retry_in = settings
                .schedule
                .after_failure(d.attempts.max(1) as u32, schedule::jitter());
            let outcome = if retry_in.is_some() { "retry" } else { "dead" };
            metrics::counter!("flashsale_webhook_deliveries_total", "outcome" => outcome)
                .increment(1);
            tracing::info!(endpoint = %d.endpoint_id, event = %d.event_id, attempt = d.attempts, ?retry_in, %why, "webhook delivery failed");
            store::failed(&pool, d.id, status, &why, retry_in).await
        }
    };
    if let Err(e) = recorded {
        // The lease runs out and the delivery is tried again: at least once.
        tracing::warn!(delivery = d.id, error = %e, "webhook outcome not recorded; it will be tried again");
    }
}

/// Runs until cancelled: claims what is due, at most [`IN_FLIGHT`] at once
/// and [`PER_ENDPOINT`] per endpoint, each delivery on its own task.
pub async fn run(pool: PgPool, settings: WebhookSettings, stop: CancellationToken) {
    let client = client(&settings);
    // A claim's lease outlasts its attempt: no second copy while one is in
    // flight.
    let lease = settings.timeout * 2 + Duration::from_secs(5);
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    // A finished delivery makes room (maybe at an endpoint that was full):
    // claim again at once rather than after the idle pause.
    let finished = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();
    let mut measured = Instant::now() - Duration::from_secs(60);
    loop {
        while tasks.try_join_next().is_some() {}
        if measured.elapsed() >= Duration::from_secs(5) {
            measured = Instant::now();
            if let Ok((n, age)) = store::backlog(&pool).await {
                metrics::gauge!("flashsale_webhook_pending").set(n as f64);
                metrics::gauge!("flashsale_webhook_oldest_pending_seconds").set(age);
            }
        }
        let room = IN_FLIGHT.saturating_sub(tasks.len());
        let mut claimed = 0;
        if room > 0 {
            let full: Vec<String> = in_flight
                .lock()
                .expect("not poisoned")
                .iter()
                .filter(|(_, n)| **n >= PER_ENDPOINT)
                .map(|(e, _)| e.clone())
                .collect();
            match store::claim(&pool, room as i64, PER_ENDPOINT as i64, &full, lease).await {
                Ok(due) => {
                    claimed = due.len();
                    for d in due {
                        let endpoint = d.endpoint_id.clone();
                        *in_flight
                            .lock()
                            .expect("not poisoned")
                            .entry(endpoint.clone())
                            .or_default() += 1;
                        let (pool, client, settings, counts, finished) = (
                            pool.clone(),
                            client.clone(),
                            settings.clone(),
                            in_flight.clone(),
                            finished.clone(),
                        );
                        tasks.spawn(async move {
                            deliver(pool, client, settings, d).await;
                            {
                                let mut counts = counts.lock().expect("not poisoned");
                                if let Some(n) = counts.get_mut(&endpoint) {
                                    *n -= 1;
                                    if *n == 0 {
                                        counts.remove(&endpoint);
                                    }
                                }
                            }
                            finished.notify_one();
                        });
                    }
                }
                Err(e) => tracing::warn!(error = %e, "webhook claim failed; retrying"),
            }
        }
        // Back at once while work was found; else at the next finished
        // delivery or after a short pause, whichever comes first.
        if claimed > 0 {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = finished.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    // Deliveries in flight end with the process; their leases run out and
    // they are tried again (at least once, same webhook-id).
    tasks.abort_all();
}
