//! Admission numbers for operators (issue 13 #5): a sale's coordinator
//! figures as Prometheus text (exposition format 0.0.4), served at
//! `GET /api/sales/{sale}/metrics` for a scraper.
//!
//! Role: pure formatting of [`AdmissionFigures`] (what the coordinator
//! reports) — no runtime, host-tested.
//!
//! Invariants: every sample carries the `sale` label; label values are
//! escaped as the format requires; non-finite numbers are written as the
//! format spells them (`NaN`, `+Inf`), never as Rust's `inf`; every reason
//! of [`Reason::ALL`] is listed (0 when not current), so a query never
//! finds a series missing.

use serde::{Deserialize, Serialize};

use crate::admission::control::Reason;

/// What the coordinator knows about admission, at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionFigures {
    /// People admitted so far (the frontier, in places).
    pub admitted: u64,
    /// People whose admission window has ended (reserved or not).
    pub windows_ended: u64,
    /// Admitted people who lost the turn for not being seen (issue 13 #4).
    #[serde(default)]
    pub abandoned: u64,
    /// Of those, turns revoked by an operator or after a purchase (issue 47).
    #[serde(default)]
    pub revoked: u64,
    /// Joins that failed the bot check and got a shadow ticket (issue 47).
    #[serde(default)]
    pub shadowed: u64,
    /// Joins that failed the bot check and were refused with its error (a
    /// sale without a shadow queue).
    #[serde(default)]
    pub bot_refused: u64,
    /// People with a place in line, and those not yet admitted.
    pub placed: u64,
    pub waiting: u64,
    /// The controller's rate (people/s) and the sale's ceiling.
    pub rate: f64,
    pub ceiling: f64,
    /// Whether the frontier is held, and why the rate is what it is.
    pub frozen: bool,
    pub paused: bool,
    pub reason: Reason,
    /// Milliseconds the frontier has been frozen in all.
    pub frozen_ms: u64,
    /// How often the controller's reason changed, to each reason.
    #[serde(default)]
    pub rate_changes: Vec<(Reason, u64)>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x == f64::INFINITY {
        "+Inf".into()
    } else if x == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{x}")
    }
}

/// The figures of `sale` as Prometheus text.
pub fn render(sale: &str, f: &AdmissionFigures) -> String {
    let sale = escape(sale);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in samples {
            out.push_str(&format!(
                "{name}{{sale=\"{sale}\"{labels}}} {}\n",
                number(*v)
            ));
        }
    };
    let one = |v: f64| vec![(String::new(), v)];
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    family(
        "edge_admission_admitted_total",
        "counter",
        "People admitted (the admission frontier, in places).",
        &one(f.admitted as f64),
    );
    family(
        "edge_admission_windows_ended_total",
        "counter",
        "Admitted people whose admission window has ended (reserved or not).",
        &one(f.windows_ended as f64),
    );
    family(
        "edge_admission_abandoned_total",
        "counter",
        "Admitted people whose turn was passed on: not polling for 30 s while holding nothing, or revoked.",
        &one(f.abandoned as f64),
    );
    family(
        "edge_admission_revoked_total",
        "counter",
        "Turns passed on at once because an operator or the origin revoked the admission.",
        &one(f.revoked as f64),
    );
    family(
        "edge_queue_shadowed_total",
        "counter",
        "Joins that failed the bot check and were given a place in the shadow queue, which never moves.",
        &one(f.shadowed as f64),
    );
    family(
        "edge_queue_bot_refused_total",
        "counter",
        "Joins that failed the bot check and were refused with its error (no shadow queue).",
        &one(f.bot_refused as f64),
    );
    family(
        "edge_queue_placed",
        "gauge",
        "People with a place in line.",
        &one(f.placed as f64),
    );
    family(
        "edge_queue_waiting",
        "gauge",
        "People placed and not yet admitted.",
        &one(f.waiting as f64),
    );
    family(
        "edge_admission_rate",
        "gauge",
        "People per second the admission controller lets in (0 while frozen: see edge_admission_frozen).",
        &one(if f.frozen { 0.0 } else { f.rate }),
    );
    family(
        "edge_admission_rate_target",
        "gauge",
        "The controller's rate, held while frozen (people per second).",
        &one(f.rate),
    );
    family(
        "edge_admission_rate_ceiling",
        "gauge",
        "The sale's admission_rate: the most the controller lets in (people per second).",
        &one(f.ceiling),
    );
    family(
        "edge_admission_frozen",
        "gauge",
        "1 while the frontier is held (sale paused or origin not answering).",
        &one(flag(f.frozen)),
    );
    family(
        "edge_admission_paused",
        "gauge",
        "1 while an operator has paused the sale.",
        &one(flag(f.paused)),
    );
    family(
        "edge_admission_frozen_seconds_total",
        "counter",
        "Seconds the frontier has been held in all (admission windows are extended by them).",
        &one(f.frozen_ms as f64 / 1000.0),
    );
    let reasons: Vec<(String, f64)> = Reason::ALL
        .iter()
        .map(|r| (format!(",reason=\"{}\"", r.label()), flag(*r == f.reason)))
        .collect();
    family(
        "edge_admission_rate_reason",
        "gauge",
        "Why the rate is what it is now (1 for the current reason).",
        &reasons,
    );
    let changes: Vec<(String, f64)> = Reason::ALL
        .iter()
        .map(|r| {
            let n = f
                .rate_changes
                .iter()
                .find(|(x, _)| x == r)
                .map_or(0, |(_, n)| *n);
            (format!(",reason=\"{}\"", r.label()), n as f64)
        })
        .collect();
    family(
        "edge_admission_rate_changes_total",
        "counter",
        "Times the controller's reason changed, by the reason it changed to.",
        &changes,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> AdmissionFigures {
        AdmissionFigures {
            admitted: 17,
            windows_ended: 3,
            abandoned: 2,
            revoked: 1,
            shadowed: 4,
            bot_refused: 6,
            placed: 40,
            waiting: 23,
            rate: 0.5,
            ceiling: 2.0,
            frozen: true,
            paused: false,
            reason: Reason::OriginDown,
            frozen_ms: 20_500,
            rate_changes: vec![(Reason::OriginDown, 1), (Reason::Shedding, 4)],
        }
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
    }

    #[test]
    fn every_family_typed_and_labelled_by_sale() {
        let t = render("drop-1", &figures());
        assert_eq!(
            value(&t, "edge_admission_admitted_total{sale=\"drop-1\"}"),
            17.0
        );
        assert_eq!(
            value(&t, "edge_admission_abandoned_total{sale=\"drop-1\"}"),
            2.0
        );
        assert_eq!(
            value(&t, "edge_admission_rate{sale=\"drop-1\"}"),
            0.0,
            "frozen"
        );
        assert_eq!(
            value(&t, "edge_admission_rate_target{sale=\"drop-1\"}"),
            0.5
        );
        assert_eq!(
            value(&t, "edge_admission_frozen_seconds_total{sale=\"drop-1\"}"),
            20.5
        );
        assert_eq!(
            value(
                &t,
                "edge_admission_rate_reason{sale=\"drop-1\",reason=\"origin_down\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &t,
                "edge_admission_rate_reason{sale=\"drop-1\",reason=\"shedding\"}"
            ),
            0.0
        );
        assert_eq!(
            value(
                &t,
                "edge_admission_rate_changes_total{sale=\"drop-1\",reason=\"shedding\"}"
            ),
            4.0
        );
        assert_eq!(
            value(
                &t,
                "edge_admission_rate_changes_total{sale=\"drop-1\",reason=\"paused\"}"
            ),
            0.0
        );
        // Every sample line belongs to a family declared just before it.
        let mut declared = String::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared = rest.split(' ').next().unwrap().to_string();
            } else if !l.starts_with('#') {
                assert!(l.starts_with(&format!("{declared}{{sale=")), "{l}");
            }
        }
        assert_eq!(
            t.lines().filter(|l| l.starts_with("# TYPE")).count(),
            16,
            "families"
        );
    }

    #[test]
    fn hostile_labels_and_numbers_stay_in_the_format() {
        let mut f = figures();
        f.frozen = false;
        f.rate = f64::INFINITY;
        f.ceiling = f64::NAN;
        let t = render("a\"b\\c\nd", &f);
        assert!(t.contains("sale=\"a\\\"b\\\\c\\nd\""), "{t}");
        assert!(t.contains(" +Inf\n") && t.contains(" NaN\n"), "{t}");
        assert!(!t.contains(" inf"));
    }
}
