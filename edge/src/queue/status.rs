//! Queue status arithmetic: from a person's ticket and a snapshot of the
//! sale's queue, the status object the API answers with.
//!
//! Role: everything a status poll needs besides checking the ticket's
//! signature. The Durable Object produces a [`Snapshot`] (cached at the edge
//! for at most a second); the ticket carries the person's place; the rest is
//! arithmetic here, so a poll in steady state never reaches the object.
//!
//! Invariants kept here:
//! - a person is `admitted` only if their place is within the frontier and
//!   their admission window (one admit-token lifetime after the frontier
//!   reached them) is still open, and the sale is neither sold out nor over;
//! - `sold_out` and `closed` win over everything else, for everyone at once;
//! - while an operator pauses the sale, everyone not yet admitted sees
//!   `paused` (keeping their place); admitted people keep their turn, and
//!   their window is measured on the frontier's service clock, which
//!   stands still while the frontier is frozen (paused, or the origin not
//!   answering), so a pause or an outage costs nobody any of their window;
//! - before the draw nobody has a position (`prequeue`);
//! - an `admit` token never outlives its holder's admission window: its
//!   expiry is clamped to one window after the first frontier checkpoint
//!   that reached the place (the same checkpoints that close the window);
//! - `poll_after_ms` is never below 1 s, grows with the distance to the
//!   front, and is jittered, so polls do not arrive in waves.

use serde::{Deserialize, Serialize};

/// Lifetime of an `admit` token (DESIGN.md default), seconds.
pub const ADMIT_TTL_SECS: u64 = 120;
/// Lifetime of a queue ticket: a day (a queue outliving it needs a re-join,
/// which returns the same place).
pub const TICKET_TTL_SECS: u64 = 24 * 3600;
/// The advised poll interval while admitted, before its ±20 % jitter: an
/// admitted person is seen at least every 10 s, so three polls fit in the
/// 30 s after which an unseen turn is given back.
pub const ADMITTED_POLL_MS: u64 = 8_000;
/// Header in which a client sends the queue ticket it holds with a repeated
/// join: the join is answered from it, at the edge, with no object call.
pub const HELD_TICKET_HEADER: &str = "x-queue-ticket";
/// Shortest and longest advised poll interval.
pub const MIN_POLL_MS: u64 = 1_000;
pub const MAX_POLL_MS: u64 = 30_000;
/// The pre-queue's first poll after the start is spread over up to this
/// long (200 people per second of it).
pub const PREQUEUE_SPREAD_MAX_MS: u64 = 30_000;
/// The longest time between two polls of a person who keeps polling, that
/// the edge can cause: the advised interval with its ±20 % jitter
/// ([`jittered`]), then the page's own ±10 % (`edge/page/app.js`
/// `jitter`); for the pre-queue, the start plus the spread. The turn rules'
/// first-seen grace is built from it (`admission::turns::FIRST_SEEN_MS`),
/// so a rising rate can never reach someone and give their turn away
/// before their next poll could come (issue 44 #4: 39.6 s against 30 s).
pub const LONGEST_POLL_GAP_MS: u64 = {
    let waiting = MAX_POLL_MS * 12 / 10 * 11 / 10;
    let prequeue = (PREQUEUE_SPREAD_MAX_MS + 250) * 11 / 10;
    if waiting > prequeue {
        waiting
    } else {
        prequeue
    }
};

/// The sale's queue as the Durable Object sees it at `now_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub sale: String,
    pub now_ms: u64,
    pub starts_at_ms: u64,
    pub ends_at_ms: Option<u64>,
    /// People per second.
    pub rate: f64,
    pub drawn: bool,
    /// Accounts in the queue (pre-queue and after start).
    pub entries: u64,
    /// Accounts that joined before the start.
    pub prequeue: u64,
    /// Accounts with a place in line.
    pub placed: u64,
    /// The frontier: places `1..=frontier` have been admitted.
    pub frontier: u64,
    /// Places `1..=expired` have had their admission window close.
    pub expired: u64,
    pub sold_out: bool,
    /// Sale over (ended, or closed by the origin).
    pub closed: bool,
    pub commitment: String,
    /// Published once drawn.
    pub seed: Option<String>,
    /// The draw's key (`SHA-256(seed ‖ entrants_root ‖ beacon)`), published
    /// once drawn: with a ticket's salt it gives the holder's draw value.
    #[serde(default)]
    pub key: Option<String>,
    /// The draw as published (`draw_v2`: commitment, entrants, root,
    /// beacon, key and seed once known).
    #[serde(default)]
    pub draw: serde_json::Value,
    /// Requests the sale's objects have served for isolates: the
    /// coordinator's own and those its shards last reported (a shard
    /// reports with its next report, a second or more later).
    pub do_requests: u64,
    /// Of those, the coordinator's own, counted as they come: what a
    /// snapshot, a second's list or a listing costs, without the shards'
    /// joins and seen reports or their reporting delay.
    #[serde(default)]
    pub coordinator_requests: u64,
    /// Queue shards (Durable Objects) of the sale.
    #[serde(default = "one")]
    pub shards: u32,
    /// Arrivals after the start stamped before this (unix ms) have been
    /// reported by every shard: their places are final.
    #[serde(default)]
    pub fifo_through_ms: u64,
    /// Frontier checkpoints `(unix ms, admitted)` younger than one window:
    /// when each place still in its window was reached (see
    /// [`admit_ttl_secs`]).
    #[serde(default)]
    pub frontier_history: Vec<(u64, f64)>,
    /// The frontier moves on from `frontier` at `now_ms` at this many places
    /// a second (0 while it cannot move) up to `frontier_cap`: an isolate
    /// extrapolates it between snapshots (`frontier_at`).
    #[serde(default)]
    pub frontier_rate: f64,
    #[serde(default)]
    pub frontier_cap: u64,
    /// The frontier's service clock at `now_ms`: wall time less every
    /// millisecond the frontier was frozen (`control::Controller`).
    /// `frontier_history` and `expired` are on this clock. None: no freeze
    /// yet (equal to `now_ms`).
    #[serde(default)]
    pub service_ms: Option<u64>,
    /// The frontier is frozen (the sale is paused or the origin does not
    /// answer): the service clock stands still.
    #[serde(default)]
    pub frozen: bool,
    /// An operator paused the sale.
    #[serde(default)]
    pub paused: bool,
    /// Places within an open window whose holder lost the turn for not
    /// being seen (`turns`), ascending: they are `closed`.
    #[serde(default)]
    pub abandoned: Vec<u64>,
}

impl Snapshot {
    /// The draw's listing is written (the draw is over and immutable).
    pub fn listed(&self) -> bool {
        self.draw["listed"].as_bool() == Some(true)
    }
}

/// The snapshot's service clock at wall time `now_ms` (see
/// [`Snapshot::service_ms`]): it stands still while the frontier is frozen.
pub fn service_at(s: &Snapshot, now_ms: u64) -> u64 {
    let base = s.service_ms.unwrap_or(s.now_ms);
    if s.frozen {
        base
    } else {
        base.saturating_add(now_ms.saturating_sub(s.now_ms))
    }
}

/// How far past a snapshot an isolate extrapolates the frontier (its
/// refresh interval): a snapshot kept longer (the coordinator slow to
/// answer) shows the frontier where it was at this horizon, no further.
pub const FRONTIER_HORIZON_MS: u64 = 2_500;

/// The frontier at `now_ms` from a snapshot taken earlier: its checkpoint
/// plus its rate for at most [`FRONTIER_HORIZON_MS`], never past its cap,
/// never below the checkpoint. The coordinator advances by the same rule
/// and never falls behind what its snapshots allowed to this horizon (it
/// keeps that promise across a freeze), so no isolate is ahead of it
/// (unless the sale sold out meanwhile, which the sold-out flag covers).
pub fn frontier_at(s: &Snapshot, now_ms: u64) -> u64 {
    Promise::of(s).at(now_ms)
}

/// What a snapshot lets isolates show: its frontier, moving at its rate up
/// to its cap for one horizon. The coordinator keeps the promises of the
/// snapshots it served and never lets the frontier fall behind any of them
/// at the same moment (a freeze stops its own clock, not theirs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Promise {
    pub at_ms: u64,
    pub frontier: u64,
    pub rate: f64,
    pub cap: u64,
}

impl Promise {
    pub fn of(s: &Snapshot) -> Self {
        Promise {
            at_ms: s.now_ms,
            frontier: s.frontier,
            rate: s.frontier_rate,
            cap: s.frontier_cap,
        }
    }

    /// The frontier it shows at `now_ms` (wall clock).
    pub fn at(&self, now_ms: u64) -> u64 {
        let rate = if self.rate.is_finite() && self.rate > 0.0 {
            self.rate
        } else {
            0.0
        };
        let dt = now_ms.saturating_sub(self.at_ms).min(FRONTIER_HORIZON_MS) as f64 / 1000.0;
        let moved = (self.frontier as f64 + rate * dt).floor();
        let cap = self.cap.max(self.frontier) as f64;
        moved.min(cap).max(self.frontier as f64) as u64
    }

    /// Whether it can still show more than it did one horizon on: after
    /// that it is a constant the frontier has already passed.
    pub fn live(&self, now_ms: u64) -> bool {
        now_ms <= self.at_ms + FRONTIER_HORIZON_MS + 1_000
    }
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Prequeue,
    /// The start has come and the pre-queue is being drawn (seconds).
    Drawing,
    Waiting,
    Admitted,
    /// An operator paused the sale: places are kept, nobody new is admitted.
    Paused,
    SoldOut,
    Closed,
}

/// Why a status is `closed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// The sale is over (ended, or closed by the origin).
    SaleEnded,
    /// The person's admission window passed without a reservation.
    WindowEnded,
    /// Admitted, then not seen for 30 s while holding nothing: the turn
    /// went to the next person. They may join again, at the back.
    Abandoned,
}

/// The status object, minus the tokens (added by the caller).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    pub status: Status,
    /// Set when `status` is `closed`.
    pub reason: Option<CloseReason>,
    /// 1-based place in line (fixed once known).
    pub place: Option<u64>,
    /// Position in the part of the line not yet admitted (1 = next).
    pub position: Option<u64>,
    /// People in front of this person not yet admitted.
    pub ahead: Option<u64>,
    pub eta_seconds: Option<u64>,
    pub poll_after_ms: u64,
}

pub(crate) fn jittered(base_ms: u64, jitter: f64) -> u64 {
    // jitter in [0, 1): ±20 %.
    let j = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.5
    };
    ((base_ms as f64) * (0.8 + 0.4 * j)) as u64
}

/// The status of the holder of a ticket with `place` (None: not known yet —
/// a pre-queue ticket before or during the draw, or an arrival after the
/// start that not every shard has reported yet, `after_start`). `jitter` is
/// a uniform random number in `[0, 1)`.
pub fn view(
    place: Option<u64>,
    after_start: bool,
    snap: &Snapshot,
    now_ms: u64,
    jitter: f64,
) -> View {
    let frontier = frontier_at(snap, now_ms);
    let s = &Snapshot {
        frontier,
        ..snap.clone()
    };
    let closed = s.closed || s.ends_at_ms.is_some_and(|e| now_ms >= e);
    let (position, ahead) = match place {
        Some(p) if p > s.frontier => (Some(p - s.frontier), Some(p - s.frontier - 1)),
        Some(_) => (Some(0), Some(0)),
        None => (None, None),
    };
    let mut v = View {
        status: Status::Waiting,
        reason: None,
        place,
        position,
        ahead,
        eta_seconds: None,
        poll_after_ms: MIN_POLL_MS,
    };
    if closed {
        v.status = Status::Closed;
        v.reason = Some(CloseReason::SaleEnded);
        v.poll_after_ms = MAX_POLL_MS * 2;
        return v;
    }
    if s.sold_out {
        // Units may come back (expired holds): keep checking, gently.
        v.status = Status::SoldOut;
        v.poll_after_ms = jittered(7_500, jitter);
        return v;
    }
    let paused = s.paused && (after_start || now_ms >= s.starts_at_ms);
    if paused && place.is_none_or(|p| p > s.frontier) {
        // Nothing moves until the operator resumes; the page says so.
        v.status = Status::Paused;
        v.poll_after_ms = jittered(5_000, jitter);
        return v;
    }
    if place.is_none() && (after_start || now_ms >= s.starts_at_ms) {
        // The place is seconds away (the draw runs in steps, arrivals are
        // reported once a second): ask again soon.
        v.status = if after_start {
            Status::Waiting
        } else {
            Status::Drawing
        };
        v.poll_after_ms = jittered(1_500, jitter);
        return v;
    }
    let Some(p) = place else {
        v.status = Status::Prequeue;
        let to_start = s.starts_at_ms.saturating_sub(now_ms);
        v.eta_seconds = Some(to_start.div_ceil(1000));
        // Spread the first poll after the draw over a window that grows with
        // the crowd (200 people per second of window, 1 to 30 s).
        let spread_ms = (s.prequeue * 5).clamp(1_000, PREQUEUE_SPREAD_MAX_MS) as f64;
        v.poll_after_ms = if to_start > MAX_POLL_MS {
            jittered(MAX_POLL_MS, jitter)
        } else {
            to_start + (spread_ms * jitter.clamp(0.0, 1.0)) as u64 + 250
        }
        .max(MIN_POLL_MS);
        return v;
    };
    if p <= s.frontier {
        if p <= s.expired {
            // Their admission window has closed without a reservation.
            v.status = Status::Closed;
            v.reason = Some(CloseReason::WindowEnded);
            v.poll_after_ms = MAX_POLL_MS * 2;
        } else if s.abandoned.binary_search(&p).is_ok() {
            v.status = Status::Closed;
            v.reason = Some(CloseReason::Abandoned);
            v.poll_after_ms = MAX_POLL_MS * 2;
        } else {
            v.status = Status::Admitted;
            v.eta_seconds = Some(0);
            // Seen at most every 10 s while admitted (issue 13 #4: a turn
            // unseen for 30 s is given back): 6.4-9.6 s with the jitter.
            v.poll_after_ms = jittered(ADMITTED_POLL_MS, jitter);
        }
        return v;
    }
    let behind = (p - s.frontier) as f64;
    let eta = if s.rate > 0.0 && s.rate.is_finite() {
        (behind / s.rate).ceil()
    } else {
        f64::INFINITY
    };
    let before_start = now_ms < s.starts_at_ms;
    let eta_ms = if before_start {
        s.starts_at_ms - now_ms + (eta * 1000.0).min(1e12) as u64
    } else {
        (eta * 1000.0).min(1e12) as u64
    };
    v.eta_seconds = eta.is_finite().then_some(eta_ms.div_ceil(1000));
    // Poll about three times before one's turn, at least every 30 s.
    v.poll_after_ms = jittered((eta_ms / 3).clamp(MIN_POLL_MS, MAX_POLL_MS), jitter);
    v
}

/// Whether the holder of `place` has a turn now: the frontier has reached
/// it, its window is open and it was not given back. A poll by such a
/// person counts as seen whatever the answer says: `sold_out` while units
/// may come back, `paused` (issue 44 #1: a sold-out spell of 30 s or more
/// gave away the turn of everyone admitted who kept polling).
pub fn holds_turn(place: u64, snap: &Snapshot, now_ms: u64) -> bool {
    let closed = snap.closed || snap.ends_at_ms.is_some_and(|e| now_ms >= e);
    !closed
        && place <= frontier_at(snap, now_ms)
        && place > snap.expired
        && snap.abandoned.binary_search(&place).is_err()
}

/// When the admission window of `place` ends, unix ms: one window
/// ([`ADMIT_TTL_SECS`]) after the first checkpoint whose frontier reached
/// the place (that is when `expired` passes it). If no checkpoint in the
/// snapshot shows it yet, the one that will is taken no earlier than the
/// snapshot, so the snapshot's time stands in — or, for a place admitted by
/// extrapolating the frontier past the snapshot (`frontier_at`), the
/// extrapolated time it was reached (never later than `now_ms`): the answer
/// can only be too early, never too late. The page counts down to this, so
/// a re-poll (which re-mints the token) never moves the countdown back up.
///
/// The window is measured on the service clock ([`service_at`]); the wall
/// time returned is when it ends if no freeze comes meanwhile. While the
/// frontier is frozen that moves on with `now_ms` (the countdown stands
/// still), so an outage or a pause extends every open window by itself.
pub fn window_ends_at_ms(place: u64, s: &Snapshot, now_ms: u64) -> u64 {
    let base = s.service_ms.unwrap_or(s.now_ms);
    let service_now = service_at(s, now_ms);
    let extrapolated = || {
        let rate = s.frontier_rate;
        if place > s.frontier && rate.is_finite() && rate > 0.0 {
            let ms = ((place - s.frontier) as f64 / rate * 1000.0)
                .ceil()
                .min(1e12) as u64;
            base.saturating_add(ms).min(service_now.max(base))
        } else {
            base
        }
    };
    let reached = s
        .frontier_history
        .iter()
        .find(|(_, admitted)| *admitted >= place as f64)
        .map_or_else(extrapolated, |(t, _)| (*t).min(base));
    let end = reached.saturating_add(ADMIT_TTL_SECS * 1000);
    if end >= service_now {
        now_ms.saturating_add(end - service_now)
    } else {
        now_ms.saturating_sub(service_now - end)
    }
}

/// Lifetime, in seconds from `now_ms`, of an `admit` token for `place`: the
/// usual [`ADMIT_TTL_SECS`] cut so that the token's `exp` never passes the
/// end of the admission window ([`window_ends_at_ms`]). 0 means the window
/// closes within the current second.
pub fn admit_ttl_secs(place: u64, s: &Snapshot, now_ms: u64) -> u64 {
    let end_secs = window_ends_at_ms(place, s, now_ms) / 1000;
    end_secs.saturating_sub(now_ms / 1000).min(ADMIT_TTL_SECS)
}

/// Whether `held` (sent with a join, [`HELD_TICKET_HEADER`]) is a ticket
/// the joining account already holds for `sale`: signed by the admission
/// ring, a ticket (not an admit token) of this sale, not expired, and the
/// account's own — another account's ticket is never answered from.
pub fn is_held_ticket(
    tickets: &token::KeyRing,
    held: &str,
    sale: &str,
    sub: &str,
    now_secs: u64,
) -> bool {
    let expect = token::Expect {
        typ: token::TokenType::Ticket,
        sale: Some(sale),
    };
    tickets
        .verify(held, expect, now_secs)
        .is_ok_and(|c| c.sub == sub)
}

/// How much earlier than the object's clock a join's arrival stamp (taken
/// by the Worker when the join reached the edge) may be and still be
/// believed: the Worker's own wait (the sale check, ≤ 2 s) and the trip to
/// the object fit well inside it.
pub const MAX_ARRIVAL_LEAD_MS: u64 = 10_000;

/// When a join arrived, for placing it: the Worker's stamp when it is
/// believable (not after the object's clock, not more than
/// [`MAX_ARRIVAL_LEAD_MS`] before it), else the object's clock on receipt.
/// A press is judged by when it was made, not by how long the edge took
/// to hand it over.
pub fn arrival_ms(object_now_ms: u64, stamped_ms: Option<u64>) -> u64 {
    stamped_ms
        .filter(|t| *t <= object_now_ms && object_now_ms - t <= MAX_ARRIVAL_LEAD_MS)
        .unwrap_or(object_now_ms)
}

/// Whether the pre-queue must be drawn before handling something that
/// happened at `at_ms` (a join's arrival, or now): the start has come and
/// the draw has not happened. A join stamped before the start is therefore
/// put in the pre-queue even when it is handled after the start, as long as
/// nothing else has drawn yet.
pub fn draw_due(at_ms: u64, starts_at_ms: Option<u64>, drawn: bool) -> bool {
    !drawn && starts_at_ms.is_some_and(|s| at_ms >= s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        Snapshot {
            sale: "s".into(),
            now_ms: 200_000,
            starts_at_ms: 100_000,
            ends_at_ms: None,
            rate: 10.0,
            drawn: true,
            entries: 1000,
            prequeue: 500,
            placed: 1000,
            frontier: 100,
            expired: 20,
            sold_out: false,
            closed: false,
            commitment: "c".into(),
            seed: Some("s".into()),
            key: None,
            draw: serde_json::Value::Null,
            do_requests: 0,
            coordinator_requests: 0,
            shards: 1,
            fifo_through_ms: 0,
            frontier_history: vec![],
            frontier_rate: 0.0,
            frontier_cap: 100,
            service_ms: None,
            frozen: false,
            paused: false,
            abandoned: vec![],
        }
    }

    #[test]
    fn an_abandoned_turn_is_closed_with_its_reason() {
        let mut s = snap();
        s.abandoned = vec![30, 90];
        let v = view(Some(90), false, &s, 200_000, 0.5);
        assert_eq!(
            (v.status, v.reason),
            (Status::Closed, Some(CloseReason::Abandoned))
        );
        let v = view(Some(91), false, &s, 200_000, 0.5);
        assert_eq!((v.status, v.reason), (Status::Admitted, None));
        let v = view(Some(20), false, &s, 200_000, 0.5);
        assert_eq!(v.reason, Some(CloseReason::WindowEnded));
        s.closed = true;
        assert_eq!(
            view(Some(91), false, &s, 200_000, 0.5).reason,
            Some(CloseReason::SaleEnded)
        );
    }

    #[test]
    fn an_admitted_person_polling_while_sold_out_still_holds_the_turn() {
        let mut s = snap();
        s.sold_out = true;
        assert_eq!(
            view(Some(90), false, &s, 200_000, 0.5).status,
            Status::SoldOut
        );
        assert!(holds_turn(90, &s, 200_000), "seen: the turn is kept");
        assert!(!holds_turn(101, &s, 200_000), "not reached yet");
        assert!(!holds_turn(20, &s, 200_000), "window closed");
        s.abandoned = vec![90];
        assert!(!holds_turn(90, &s, 200_000), "given back");
        s.abandoned = vec![];
        s.closed = true;
        assert!(!holds_turn(90, &s, 200_000), "sale ended");
    }

    #[test]
    fn a_frozen_frontier_stops_every_window_clock() {
        let mut s = snap();
        // 50 s frozen so far; place 90 was reached at service time 100 s,
        // so 70 s of its window are left however long the freeze lasts.
        s.service_ms = Some(150_000);
        s.frozen = true;
        s.frontier_history = vec![(100_000, 95.0)];
        for now in [200_000, 230_000, 500_000] {
            assert_eq!(window_ends_at_ms(90, &s, now), now + 70_000);
            assert_eq!(admit_ttl_secs(90, &s, now), 70);
            assert_eq!(view(Some(90), false, &s, now, 0.5).status, Status::Admitted);
        }
        // Thawed: the clock runs again from where it stood.
        s.frozen = false;
        assert_eq!(window_ends_at_ms(90, &s, 200_000), 270_000);
        assert_eq!(window_ends_at_ms(90, &s, 260_000), 270_000);
        assert_eq!(service_at(&s, 260_000), 210_000);
        // Without a service clock nothing changes (older snapshots).
        s.service_ms = None;
        assert_eq!(window_ends_at_ms(90, &s, 200_000), 220_000);
    }

    #[test]
    fn a_paused_sale_holds_everyone_not_yet_admitted() {
        let mut s = snap();
        s.paused = true;
        s.frozen = true;
        let w = view(Some(150), false, &s, 200_000, 0.5);
        assert_eq!(w.status, Status::Paused);
        assert_eq!(
            (w.place, w.position, w.ahead),
            (Some(150), Some(50), Some(49))
        );
        assert!((4_000..=6_000).contains(&w.poll_after_ms));
        assert_eq!(view(None, true, &s, 200_000, 0.5).status, Status::Paused);
        // Admitted people keep their turn; closed windows stay closed.
        assert_eq!(
            view(Some(100), false, &s, 200_000, 0.5).status,
            Status::Admitted
        );
        assert_eq!(
            view(Some(20), false, &s, 200_000, 0.5).status,
            Status::Closed
        );
        // Before the start the pre-queue is the pre-queue.
        s.starts_at_ms = 300_000;
        assert_eq!(view(None, false, &s, 200_000, 0.5).status, Status::Prequeue);
        // Sold out and over win.
        s.starts_at_ms = 100_000;
        s.sold_out = true;
        assert_eq!(
            view(Some(150), false, &s, 200_000, 0.5).status,
            Status::SoldOut
        );
    }

    #[test]
    fn admit_tokens_end_with_the_window() {
        let mut s = snap();
        // Place 90 was reached at the checkpoint of t = 150 s, so its window
        // ends at 270 s whenever the token is minted.
        s.frontier_history = vec![(130_000, 60.0), (150_000, 95.0), (190_000, 98.0)];
        assert_eq!(
            view(Some(90), false, &s, 200_000, 0.5).status,
            Status::Admitted
        );
        assert_eq!(admit_ttl_secs(90, &s, 200_000), 70);
        assert_eq!(admit_ttl_secs(90, &s, 269_999), 1);
        assert_eq!(admit_ttl_secs(90, &s, 270_000), 0);
        assert_eq!(admit_ttl_secs(90, &s, 400_000), 0);
        // Re-polled every second, the last token still ends at 270 s.
        for now in (200_000..270_000).step_by(1_000) {
            assert!(now / 1000 + admit_ttl_secs(90, &s, now) <= 270);
        }
        // Exactly reached counts as reached.
        assert_eq!(admit_ttl_secs(95, &s, 200_000), 70);
        assert_eq!(admit_ttl_secs(96, &s, 200_000), 110);
        // Not yet in a checkpoint: the snapshot's time stands in (the
        // checkpoint that will show it comes later), never the poll's time.
        assert_eq!(admit_ttl_secs(100, &s, 200_000), 120);
        assert_eq!(admit_ttl_secs(100, &s, 205_000), 115);
        s.frontier_history.clear();
        assert_eq!(admit_ttl_secs(100, &s, 203_500), 117);
        // Reached by extrapolation after the snapshot (10 places/s from
        // 100 at 200 s: place 110 at 201 s): the window runs from then.
        s.frontier_rate = 10.0;
        s.frontier_cap = 1_000;
        assert_eq!(admit_ttl_secs(110, &s, 201_000), 120);
        assert_eq!(admit_ttl_secs(110, &s, 203_000), 118);
        assert!(201 + 120 >= 203 + admit_ttl_secs(110, &s, 203_000));
        // A checkpoint after the snapshot (clock skew) cannot lengthen it.
        s.frontier_history = vec![(900_000, 100.0)];
        assert_eq!(admit_ttl_secs(100, &s, 200_000), 120);
        assert_eq!(admit_ttl_secs(u64::MAX, &s, u64::MAX), 0);
    }

    #[test]
    fn the_window_end_stays_put_across_polls() {
        let mut s = snap();
        s.frontier_history = vec![(130_000, 60.0), (150_000, 95.0), (190_000, 98.0)];
        assert_eq!(window_ends_at_ms(90, &s, s.now_ms), 270_000);
        assert_eq!(window_ends_at_ms(96, &s, s.now_ms), 310_000);
        // Later snapshots (the object re-polled) keep the same end while the
        // checkpoint is still carried.
        s.now_ms = 260_000;
        assert_eq!(window_ends_at_ms(90, &s, s.now_ms), 270_000);
        // Not yet in a checkpoint: no later than the snapshot's time + window.
        s.now_ms = 200_000;
        assert_eq!(window_ends_at_ms(100, &s, s.now_ms), 320_000);
        s.frontier_history = vec![(900_000, 100.0)];
        assert_eq!(
            window_ends_at_ms(100, &s, s.now_ms),
            320_000,
            "skewed checkpoint"
        );
        // The token never outlives the end it reports.
        for now in (200_000..320_000).step_by(7_000) {
            assert!(
                now / 1000 + admit_ttl_secs(100, &s, now) <= window_ends_at_ms(100, &s, now) / 1000
            );
        }
        s.frontier_history.clear();
        s.now_ms = u64::MAX;
        assert_eq!(window_ends_at_ms(1, &s, s.now_ms), u64::MAX, "saturates");
    }

    #[test]
    fn joins_are_placed_by_their_arrival_not_their_handling() {
        let start = 100_000;
        // Pressed 1.5 s before the start, handed over 0.5 s after it (the
        // object waited on the origin): still drawn with the pre-queue.
        let arrival = arrival_ms(start + 500, Some(start - 1_500));
        assert_eq!(arrival, start - 1_500);
        assert!(!draw_due(arrival, Some(start), false));
        assert!(
            draw_due(start + 500, Some(start), false),
            "the wait still draws later"
        );
        assert!(draw_due(start, Some(start), false));
        assert!(!draw_due(start + 1, Some(start), true), "drawn once");
        assert!(!draw_due(start + 1, None, false), "no start known");
        // Unbelievable stamps fall back to the object's clock.
        assert_eq!(arrival_ms(start, None), start);
        assert_eq!(arrival_ms(start, Some(start + 1)), start, "from the future");
        assert_eq!(
            arrival_ms(start, Some(start - MAX_ARRIVAL_LEAD_MS)),
            start - MAX_ARRIVAL_LEAD_MS
        );
        assert_eq!(
            arrival_ms(start, Some(start - MAX_ARRIVAL_LEAD_MS - 1)),
            start,
            "too old"
        );
        assert_eq!(arrival_ms(5, Some(0)), 0);
        assert_eq!(arrival_ms(u64::MAX, Some(0)), u64::MAX);
    }

    #[test]
    fn waiting_admitted_and_window_closed() {
        let s = snap();
        let w = view(Some(150), false, &s, 200_000, 0.5);
        assert_eq!(w.status, Status::Waiting);
        assert_eq!((w.position, w.ahead), (Some(50), Some(49)));
        assert_eq!(w.eta_seconds, Some(5));
        assert!((MIN_POLL_MS..=MAX_POLL_MS).contains(&w.poll_after_ms));
        assert_eq!(
            view(Some(100), false, &s, 200_000, 0.5).status,
            Status::Admitted
        );
        assert_eq!(
            view(Some(21), false, &s, 200_000, 0.5).status,
            Status::Admitted
        );
        assert_eq!(
            view(Some(20), false, &s, 200_000, 0.5).status,
            Status::Closed
        );
        assert_eq!(
            view(Some(101), false, &s, 200_000, 0.5).status,
            Status::Waiting
        );
    }

    #[test]
    fn sold_out_and_closed_win() {
        let mut s = snap();
        s.sold_out = true;
        assert_eq!(
            view(Some(50), false, &s, 200_000, 0.1).status,
            Status::SoldOut
        );
        assert_eq!(
            view(Some(5000), false, &s, 200_000, 0.1).status,
            Status::SoldOut
        );
        assert_eq!(view(None, false, &s, 200_000, 0.1).status, Status::SoldOut);
        s.ends_at_ms = Some(150_000);
        assert_eq!(
            view(Some(50), false, &s, 200_000, 0.1).status,
            Status::Closed
        );
    }

    #[test]
    fn prequeue_polls_spread_after_start() {
        let mut s = snap();
        s.drawn = false;
        s.starts_at_ms = 210_000;
        s.prequeue = 2000;
        let early = view(None, false, &s, 200_000, 0.0);
        assert_eq!(early.status, Status::Prequeue);
        assert_eq!(early.position, None);
        assert_eq!(early.eta_seconds, Some(10));
        assert!(early.poll_after_ms >= 10_000);
        let late = view(None, false, &s, 200_000, 0.999);
        assert!(
            late.poll_after_ms > early.poll_after_ms + 9_000,
            "spread ~10 s"
        );
        // Far from start: capped at about 30 s.
        let far = view(None, false, &s, 0, 0.5);
        assert!(far.poll_after_ms <= 36_000);
    }

    #[test]
    fn the_frontier_is_extrapolated_from_checkpoint_and_rate_up_to_its_cap() {
        let mut s = snap();
        s.frontier_rate = 10.0;
        s.frontier_cap = 130;
        assert_eq!(frontier_at(&s, 200_000), 100);
        assert_eq!(frontier_at(&s, 201_500), 115);
        assert_eq!(frontier_at(&s, 202_000), 120);
        // One horizon (2.5 s) at most past the snapshot: 125, under the cap.
        assert_eq!(frontier_at(&s, 260_000), 125, "one horizon at most");
        s.frontier_cap = 112;
        assert_eq!(frontier_at(&s, 201_500), 112, "capped");
        s.frontier_cap = 130;
        assert_eq!(frontier_at(&s, 100_000), 100, "never below the checkpoint");
        // Place 110 is admitted one second after the snapshot, not before.
        assert_eq!(
            view(Some(110), false, &s, 200_500, 0.5).status,
            Status::Waiting
        );
        assert_eq!(
            view(Some(110), false, &s, 201_000, 0.5).status,
            Status::Admitted
        );
        s.frontier_rate = f64::NAN;
        assert_eq!(frontier_at(&s, 260_000), 100);
    }

    #[test]
    fn drawing_and_unreported_arrivals_poll_again_soon() {
        let mut s = snap();
        s.drawn = false;
        let d = view(None, false, &s, 200_000, 0.5);
        assert_eq!(d.status, Status::Drawing);
        assert_eq!((d.place, d.position), (None, None));
        assert!(
            (1_000..=2_000).contains(&d.poll_after_ms),
            "{}",
            d.poll_after_ms
        );
        // Before the start it is still the pre-queue.
        assert_eq!(view(None, false, &s, 50_000, 0.5).status, Status::Prequeue);
        s.drawn = true;
        let w = view(None, true, &s, 200_000, 0.5);
        assert_eq!(w.status, Status::Waiting);
        assert_eq!(w.place, None);
        assert!(w.poll_after_ms <= 2_000);
        s.sold_out = true;
        assert_eq!(view(None, true, &s, 200_000, 0.5).status, Status::SoldOut);
    }

    #[test]
    fn the_frontier_is_extrapolated_one_horizon_at_most() {
        let mut s = snap();
        s.frontier = 10;
        s.frontier_rate = 4.0;
        s.frontier_cap = 1_000;
        let t = s.now_ms;
        assert_eq!(frontier_at(&s, t), 10);
        assert_eq!(frontier_at(&s, t + 1_000), 14);
        assert_eq!(frontier_at(&s, t + FRONTIER_HORIZON_MS), 20);
        // A snapshot kept long past its refresh (coordinator slow): no further.
        assert_eq!(frontier_at(&s, t + 60_000), 20);
    }

    #[test]
    fn a_promise_moves_with_the_clock_and_stops_one_horizon_on() {
        let p = Promise {
            at_ms: 10_000,
            frontier: 100,
            rate: 2.0,
            cap: 1_000,
        };
        // Not ahead of the time it is asked about (a floor taken at t must
        // not add the time since the snapshot twice).
        assert_eq!(p.at(10_000), 100);
        assert_eq!(p.at(11_000), 102);
        assert_eq!(p.at(12_500), 105);
        assert_eq!(p.at(60_000), 105);
        assert!(p.live(13_500) && !p.live(13_501));
        assert_eq!(Promise { cap: 103, ..p }.at(60_000), 103);
        assert_eq!(
            Promise {
                rate: f64::NAN,
                ..p
            }
            .at(60_000),
            100
        );
    }

    #[test]
    fn admitted_people_are_told_to_poll_at_least_every_10_s() {
        for j in [0.0, 0.5, 0.999, 1.0] {
            let ms = jittered(ADMITTED_POLL_MS, j);
            assert!((6_000..=10_000).contains(&ms), "{ms}");
        }
    }

    #[test]
    fn a_repeated_join_is_answered_only_from_the_accounts_own_ticket_of_this_sale() {
        use token::{Claims, KeyRing, TicketData, TokenType};
        let ring = KeyRing::from_keys(&[("a1", &[7u8; 32])]).unwrap();
        let other_ring = KeyRing::from_keys(&[("a1", &[8u8; 32])]).unwrap();
        let now = 1_800_000_000;
        let ticket = |ring: &KeyRing, typ, sub: &str, sale: &str, ttl| {
            ring.sign(
                &Claims::new(typ, sub, Some(sale.to_string()), now - 10, ttl).with_ticket(
                    TicketData {
                        shard: Some(0),
                        seq: 1,
                        ..TicketData::default()
                    },
                ),
            )
        };
        let own = ticket(&ring, TokenType::Ticket, "alice", "s1", 3600);
        assert!(is_held_ticket(&ring, &own, "s1", "alice", now));
        // Someone else's ticket, another sale's, an admit token, an expired
        // one, one signed with another key, or garbage: asked of the shard.
        assert!(!is_held_ticket(&ring, &own, "s1", "bob", now));
        assert!(!is_held_ticket(&ring, &own, "s2", "alice", now));
        let admit = ticket(&ring, TokenType::Admit, "alice", "s1", 3600);
        assert!(!is_held_ticket(&ring, &admit, "s1", "alice", now));
        let old = ticket(&ring, TokenType::Ticket, "alice", "s1", 1);
        assert!(!is_held_ticket(&ring, &old, "s1", "alice", now));
        let forged = ticket(&other_ring, TokenType::Ticket, "alice", "s1", 3600);
        assert!(!is_held_ticket(&ring, &forged, "s1", "alice", now));
        assert!(!is_held_ticket(&ring, "v1.a1.x.y", "s1", "alice", now));
    }

    #[test]
    fn polls_slow_down_far_back_and_are_jittered() {
        let s = snap();
        let near = view(Some(105), false, &s, 200_000, 0.5).poll_after_ms;
        let far = view(Some(100_000), false, &s, 200_000, 0.5).poll_after_ms;
        assert!(far > near);
        assert!(far <= MAX_POLL_MS * 6 / 5);
        let a = view(Some(100_000), false, &s, 200_000, 0.0).poll_after_ms;
        let b = view(Some(100_000), false, &s, 200_000, 0.99).poll_after_ms;
        assert!(b > a);
    }

    #[test]
    fn hostile_numbers_do_not_panic() {
        let mut s = snap();
        s.rate = 0.0;
        let v = view(Some(u64::MAX), false, &s, u64::MAX, f64::NAN);
        assert_eq!(v.status, Status::Waiting);
        assert_eq!(v.eta_seconds, None);
        s.rate = f64::NAN;
        let _ = view(Some(0), false, &s, 0, f64::INFINITY);
    }
}
