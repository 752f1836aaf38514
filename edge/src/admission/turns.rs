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
//! - a place is abandoned only once its holder has had [`FIRST_SEEN_MS`]
//!   since the frontier reached it to poll (the first poll after admission
//!   may come a full waiting-poll interval later) and has not been seen for
//!   [`IDLE_MS`]: never before both;
//! - a holder of a live hold is never abandoned;
//! - nothing is abandoned while the frontier is frozen (a pause or an
//!   outage costs nobody their turn);
//! - abandoned is for good: a place once abandoned stays so (the caller
//!   stores it), and only places whose window is still open, `(expired,
//!   frontier]`, are considered;
//! - at most `limit` places per call (bounded work per alarm).

use std::collections::{HashMap, HashSet};

/// Not seen for this long, holding nothing: the turn is lost.
pub const IDLE_MS: u64 = 30_000;
/// A newly admitted person's first poll may come this long after the
/// frontier reached them: the same 30 s (waiting people near the front
/// poll every few seconds — a third of their ETA — and the pre-queue's
/// first poll after the draw comes within 30 s of the start).
pub const FIRST_SEEN_MS: u64 = IDLE_MS;

/// What the coordinator knows about the holder of one admitted place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Turn {
    /// Last status poll while admitted (wall ms; 0: never).
    pub seen_ms: u64,
    /// Made a reservation through the edge that may still be held.
    pub held: bool,
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
    // Places reached at least FIRST_SEEN_MS ago on the service clock.
    let cutoff = now.service_ms.saturating_sub(FIRST_SEEN_MS);
    let ripe = now
        .history
        .iter()
        .rev()
        .find(|(t, _)| *t <= cutoff)
        .map_or(0, |(_, a)| a.floor().max(0.0) as u64)
        .min(now.frontier);
    let mut out = Vec::new();
    let mut p = now.expired.saturating_add(1);
    while p <= ripe && out.len() < limit {
        let t = turns.get(&p).copied().unwrap_or_default();
        let idle = now.wall_ms.saturating_sub(t.seen_ms) >= IDLE_MS;
        if idle && !t.held && !already.contains(&p) {
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
        }
    }

    #[test]
    fn nobody_before_the_first_poll_could_have_come() {
        let none = HashMap::new();
        let done = HashSet::new();
        assert!(newly_abandoned(now(129_999, 129_999), &none, &done, 100).is_empty());
        let lost = newly_abandoned(now(130_000, 130_000), &none, &done, 100);
        assert_eq!(
            lost,
            (1..=10).collect::<Vec<_>>(),
            "never seen, reached 30 s ago"
        );
        let lost = newly_abandoned(now(150_000, 150_000), &none, &done, 100);
        assert_eq!(lost, (1..=30).collect::<Vec<_>>());
        assert_eq!(reached_at(&H, 11), Some(110_000));
        assert_eq!(reached_at(&H, 31), None);
    }

    #[test]
    fn seen_or_holding_people_keep_the_turn_and_abandoned_is_once() {
        let mut turns = HashMap::new();
        // Seen 29 s ago, 30 s ago, holding, and seen long ago.
        turns.insert(
            1,
            Turn {
                seen_ms: 131_000,
                held: false,
            },
        );
        turns.insert(
            2,
            Turn {
                seen_ms: 130_000,
                held: false,
            },
        );
        turns.insert(
            3,
            Turn {
                seen_ms: 0,
                held: true,
            },
        );
        turns.insert(
            4,
            Turn {
                seen_ms: 101_000,
                held: false,
            },
        );
        let mut done = HashSet::new();
        done.insert(5);
        let lost = newly_abandoned(now(160_000, 160_000), &turns, &done, 100);
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
}
