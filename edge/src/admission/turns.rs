//! Abandoned turns (issue 13 #4): an admitted person who is no longer seen
//! gives the turn back, so the inventory cap frees it for the next person.
//!
//! Role: pure decision over what the coordinator knows — the frontier's
//! checkpoints (when each place was reached, on the service clock), and
//! per admitted place the last time its holder was seen (a status poll
//! while admitted, reported by the account's shard) and whether they hold
//! a reservation made through the edge.
//!
//! Invariants kept here:
//! - a place is abandoned only once its holder has not been seen for
//!   [`IDLE_MS`] and, if never seen since the frontier reached it, has had
//!   [`FIRST_SEEN_MS`] to poll (the first poll after admission may come the
//!   longest waiting-poll interval later): never before both;
//! - a holder of a hold that may still exist is never abandoned; the
//!   protection ends when the hold can no longer exist (its `expires_at`,
//!   or its cancel through the edge), and idleness then counts from that
//!   end at the earliest (issue 44 #2: a hold protected the turn forever,
//!   so a turn nobody used after an expired or cancelled hold was never
//!   passed on);
//! - nothing is abandoned while the frontier is frozen, and idleness counts
//!   from the end of the last freeze at the earliest (a pause or an outage
//!   costs nobody their turn, during or after it: issue 44 #0, where
//!   people admitted before an outage lost their turn right after it,
//!   their polls during it not having counted);
//! - abandoned is for good: a place once abandoned stays so (the caller
//!   stores it), and only places whose window is still open, `(expired,
//!   frontier]`, are considered;
//! - at most `limit` places per call (bounded work per alarm).

use std::collections::{HashMap, HashSet};

use crate::queue::status::LONGEST_POLL_GAP_MS;

/// Not seen for this long, holding nothing: the turn is lost (an admitted
/// person polls every 8 s ± 20 %, so three polls fit).
pub const IDLE_MS: u64 = 30_000;
/// Seen reports reach the coordinator this long after the poll at most
/// (batched per shard for 2 s, reported with the next second's arrivals).
pub const SEEN_REPORT_SLACK_MS: u64 = 5_000;
/// A newly admitted person's first poll may come this long after the
/// frontier reached them: the longest gap between two polls the edge can
/// cause, plus the report's way (issue 44 #4: the grace was 30 s while a
/// waiting person's interval could be 39.6 s). By construction, not by
/// coincidence of two numbers.
pub const FIRST_SEEN_MS: u64 = LONGEST_POLL_GAP_MS + SEEN_REPORT_SLACK_MS;

/// The longest a hold can live: the origin bounds a sale's `hold_seconds`
/// by a day (sale create and update refuse more). A hold whose end the
/// edge could not read, or a row stored before ends were recorded, is
/// taken to last this long from when it was reported: bounded, never
/// forever.
pub const MAX_HOLD_MS: u64 = 86_400_000;

/// When a hold reported at `now_ms` can no longer exist: its `expires_at`
/// when known, never later than [`MAX_HOLD_MS`] from now (an answer's
/// time cannot stretch the protection past the origin's bound).
pub fn hold_end(expires_at_ms: Option<u64>, now_ms: u64) -> u64 {
    let bound = now_ms.saturating_add(MAX_HOLD_MS);
    expires_at_ms.map_or(bound, |t| t.min(bound))
}

/// What the coordinator knows about the holder of one admitted place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Turn {
    /// Last status poll while admitted (wall ms; 0: never).
    pub seen_ms: u64,
    /// When the last hold this person made through the edge can no longer
    /// exist (wall ms; 0: none made): its `expires_at`, or the time it was
    /// cancelled through the edge. Until then the turn is protected.
    pub held_until_ms: u64,
}

/// What the coordinator knows at one alarm.
#[derive(Debug, Clone, Copy)]
pub struct Now<'a> {
    /// Frontier checkpoints `(service ms, admitted)`, oldest first.
    pub history: &'a [(u64, f64)],
    /// Places `1..=expired` have had their window close.
    pub expired: u64,
    /// Places `1..=frontier` have been admitted.
    pub frontier: u64,
    pub service_ms: u64,
    pub wall_ms: u64,
    pub frozen: bool,
    /// When the frontier last stopped being frozen (wall ms; 0: never).
    pub thawed_ms: u64,
}

/// When the frontier reached `place` (service ms), if a checkpoint shows it.
pub fn reached_at(history: &[(u64, f64)], place: u64) -> Option<u64> {
    history
        .iter()
        .find(|(_, admitted)| *admitted >= place as f64)
        .map(|(t, _)| *t)
}

/// The places newly abandoned at `now`, ascending, at most `limit`.
pub fn newly_abandoned(
    now: Now<'_>,
    turns: &HashMap<u64, Turn>,
    already: &HashSet<u64>,
    limit: usize,
) -> Vec<u64> {
    if now.frozen {
        return Vec::new();
    }
    // Places reached at least `ms` ago on the service clock.
    let reached_before = |ms: u64| {
        let cutoff = now.service_ms.saturating_sub(ms);
        now.history
            .iter()
            .rev()
            .find(|(t, _)| *t <= cutoff)
            .map_or(0, |(_, a)| a.floor().max(0.0) as u64)
            .min(now.frontier)
    };
    // A person seen since the frontier reached them is idle after IDLE_MS
    // unseen; one never seen may first poll up to FIRST_SEEN_MS late.
    let ripe_seen = reached_before(IDLE_MS);
    let ripe_unseen = reached_before(FIRST_SEEN_MS);
    let mut out = Vec::new();
    let mut p = now.expired.saturating_add(1);
    while p <= ripe_seen && out.len() < limit {
        let t = turns.get(&p).copied().unwrap_or_default();
        let ripe = t.seen_ms > 0 || p <= ripe_unseen;
        // A hold that may still exist keeps the turn; once it cannot, the
        // person is idle from its end at the earliest.
        let held = now.wall_ms < t.held_until_ms;
        let since = t.seen_ms.max(now.thawed_ms).max(t.held_until_ms);
        let idle = now.wall_ms.saturating_sub(since) >= IDLE_MS;
        if ripe && idle && !held && !already.contains(&p) {
            out.push(p);
        }
        p += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Places 1-10 reached at service 100 s, 11-20 at 110 s, 21-30 at 120 s.
    const H: [(u64, f64); 3] = [(100_000, 10.0), (110_000, 20.0), (120_000, 30.0)];

    fn now(service_ms: u64, wall_ms: u64) -> Now<'static> {
        Now {
            history: &H,
            expired: 0,
            frontier: 30,
            service_ms,
            wall_ms,
            frozen: false,
            thawed_ms: 0,
        }
    }

    #[test]
    fn nobody_before_the_first_poll_could_have_come() {
        let none = HashMap::new();
        let done = HashSet::new();
        let first = 100_000 + FIRST_SEEN_MS;
        assert!(newly_abandoned(now(first - 1, first - 1), &none, &done, 100).is_empty());
        let lost = newly_abandoned(now(first, first), &none, &done, 100);
        assert_eq!(
            lost,
            (1..=10).collect::<Vec<_>>(),
            "never seen, reached FIRST_SEEN_MS ago"
        );
        let last = 120_000 + FIRST_SEEN_MS;
        let lost = newly_abandoned(now(last, last), &none, &done, 100);
        assert_eq!(lost, (1..=30).collect::<Vec<_>>());
        assert_eq!(reached_at(&H, 11), Some(110_000));
        assert_eq!(reached_at(&H, 31), None);
    }

    #[test]
    fn seen_or_holding_people_keep_the_turn_and_abandoned_is_once() {
        let mut turns = HashMap::new();
        // Seen 29 s ago, 30 s ago, holding, and seen long ago.
        let at = 120_000 + FIRST_SEEN_MS;
        turns.insert(
            1,
            Turn {
                seen_ms: at - 29_000,
                held_until_ms: 0,
            },
        );
        turns.insert(
            2,
            Turn {
                seen_ms: at - 30_000,
                held_until_ms: 0,
            },
        );
        turns.insert(
            3,
            Turn {
                seen_ms: 0,
                held_until_ms: u64::MAX,
            },
        );
        turns.insert(
            4,
            Turn {
                seen_ms: 101_000,
                held_until_ms: 0,
            },
        );
        let mut done = HashSet::new();
        done.insert(5);
        let lost = newly_abandoned(now(at, at), &turns, &done, 100);
        assert!(!lost.contains(&1), "seen 29 s ago");
        assert!(lost.contains(&2), "not seen for 30 s");
        assert!(!lost.contains(&3), "a live hold is never closed");
        assert!(lost.contains(&4));
        assert!(!lost.contains(&5), "already abandoned");
        assert_eq!(lost.len(), 27);
    }

    #[test]
    fn nothing_while_frozen_nor_outside_the_open_window_and_bounded() {
        let none = HashMap::new();
        let done = HashSet::new();
        let mut n = now(200_000, 300_000);
        n.frozen = true;
        assert!(newly_abandoned(n, &none, &done, 100).is_empty());
        n.frozen = false;
        n.expired = 25;
        assert_eq!(
            newly_abandoned(n, &none, &done, 100),
            vec![26, 27, 28, 29, 30]
        );
        assert_eq!(newly_abandoned(n, &none, &done, 2), vec![26, 27]);
        // A frontier below the checkpoints (never the case) bounds the walk.
        n.expired = 0;
        n.frontier = 3;
        assert_eq!(newly_abandoned(n, &none, &done, 100), vec![1, 2, 3]);
        n.expired = u64::MAX;
        assert!(newly_abandoned(n, &none, &done, 100).is_empty());
    }

    /// Issue 44 #0: seen at 110 s, then an outage froze the frontier from
    /// 115 s to 160 s (polls during it never reached the coordinator). At
    /// 170 s, 60 s of wall time have passed since the last poll, but only
    /// 10 s since the outage ended: nobody loses the turn until 30 s after it.
    #[test]
    fn idleness_counts_from_the_end_of_a_freeze() {
        let mut turns = HashMap::new();
        turns.insert(
            5,
            Turn {
                seen_ms: 110_000,
                held_until_ms: 0,
            },
        );
        let done = HashSet::new();
        let at = |wall_ms: u64| Now {
            thawed_ms: 160_000,
            ..now(wall_ms, wall_ms)
        };
        assert!(
            !newly_abandoned(at(170_000), &turns, &done, 100).contains(&5),
            "10 s after the outage"
        );
        assert!(
            newly_abandoned(at(190_000), &turns, &done, 100).contains(&5),
            "30 s after the outage, unseen: the turn passes on"
        );
    }

    /// Issue 44 #2 (leftover): a hold protected the turn forever. It
    /// protects until the hold's `expires_at`; after that the ordinary rule
    /// applies, idleness counted from the hold's end (the person whose unit
    /// just came back is not abandoned the same instant).
    #[test]
    fn a_hold_protects_the_turn_until_it_expires_then_idleness_counts_from_its_end() {
        let seen = 110_000;
        let expires = seen + 600_000;
        let mut turns = HashMap::new();
        turns.insert(
            12,
            Turn {
                seen_ms: seen,
                held_until_ms: expires,
            },
        );
        let done = HashSet::new();
        let lost = |wall: u64| newly_abandoned(now(wall, wall), &turns, &done, 100).contains(&12);
        assert!(!lost(expires - 1), "the hold may still exist");
        assert!(
            !lost(expires + IDLE_MS - 1),
            "idle counted from the hold's end"
        );
        assert!(
            lost(expires + IDLE_MS),
            "the hold expired 30 s ago and nobody was seen: the turn passes on"
        );
    }

    /// A hold cancelled through the edge ends at the cancel (the shard
    /// stores that time as `held_until_ms`): 30 s unseen after it, the turn
    /// is given back, long before the hold would have expired.
    #[test]
    fn a_cancelled_hold_protects_no_longer_than_thirty_seconds_after_the_cancel() {
        let cancelled = 200_000;
        let mut turns = HashMap::new();
        turns.insert(
            7,
            Turn {
                seen_ms: 150_000,
                held_until_ms: cancelled,
            },
        );
        let done = HashSet::new();
        let lost = |turns: &HashMap<u64, Turn>, wall: u64| {
            newly_abandoned(now(wall, wall), turns, &done, 100).contains(&7)
        };
        assert!(
            !lost(&turns, cancelled + IDLE_MS - 1),
            "just got the unit back"
        );
        assert!(
            lost(&turns, cancelled + IDLE_MS),
            "unseen 30 s after the cancel"
        );
        // Seen after the cancel: idle from the later of the two.
        turns.get_mut(&7).unwrap().seen_ms = cancelled + 10_000;
        assert!(!lost(&turns, cancelled + IDLE_MS));
        assert!(lost(&turns, cancelled + 10_000 + IDLE_MS));
    }

    #[test]
    fn a_hold_ends_at_its_expiry_and_never_past_the_origins_bound() {
        assert_eq!(hold_end(Some(5_000), 1_000), 5_000);
        assert_eq!(hold_end(None, 1_000), 1_000 + MAX_HOLD_MS, "unreadable end");
        assert_eq!(hold_end(Some(u64::MAX), 1_000), 1_000 + MAX_HOLD_MS);
        assert_eq!(hold_end(None, u64::MAX), u64::MAX);
    }

    /// Issue 44 #4: the longest interval the edge hands a waiting person
    /// (30 s + 20 % + the page's 10 %) fits in the first-seen grace, with
    /// room for the seen report's way.
    #[test]
    fn the_first_seen_grace_exceeds_every_poll_interval_the_edge_hands_out() {
        use crate::queue::status::{MAX_POLL_MS, PREQUEUE_SPREAD_MAX_MS, jittered};
        let longest_waiting = jittered(MAX_POLL_MS, 0.999_999) as f64 * 1.1;
        let longest_prequeue = (PREQUEUE_SPREAD_MAX_MS + 250) as f64 * 1.1;
        for gap in [longest_waiting, longest_prequeue] {
            assert!(
                gap + SEEN_REPORT_SLACK_MS as f64 <= FIRST_SEEN_MS as f64,
                "a {gap} ms gap between polls outlasts the {FIRST_SEEN_MS} ms grace"
            );
        }
    }
}
