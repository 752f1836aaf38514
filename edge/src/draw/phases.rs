//! The order of the draw v2 at the coordinator (DESIGN.md "The draw, v2"):
//! which step its alarm takes next, from what it has stored.
//!
//! Role: the sequence as a pure function, so that it is host-tested and the
//! Wasm shell (`sale_queue.rs`) only does each step's I/O.
//!
//! Invariants kept here:
//! - nothing happens before the freeze time (`starts_at` plus the shards'
//!   grace): the set is read only once no join can still enter it;
//! - the key is made only after the set is frozen (its root known) and the
//!   beacon is settled (a value, or given up): nobody, the coordinator
//!   included, can compute a value before both exist;
//! - the listing is merged only once every shard has drawn with that key,
//!   `LISTING_DELAY_MS` after the last did (the first polls after the draw
//!   come in a crowd and want the shards' buckets: the listing, which is
//!   for audits, does not compete with them), and once listed nothing more
//!   is done.

/// The draw begins this long after the start, so that a join pressed just
/// before the start and still on its way from the Worker lands in the
/// pre-queue it belongs to (its arrival is stamped when it reached the
/// edge). The Worker answers from cached sale settings when it has seen
/// the sale in the last minute, else waits for the origin's summary at
/// most `SUMMARY_TIMEOUT_MS` (2 s; `http::origin` asserts the grace
/// covers it): the grace covers that wait and the trip here. (A Turnstile
/// sale's siteverify call may take up to 5 s more; a join that slow near
/// the start is placed after the pre-queue.)
pub const DRAW_GRACE_MS: u64 = 3_000;

/// How long after the draw the listing's merge begins.
pub const LISTING_DELAY_MS: u64 = 3_000;

/// What the coordinator knows, from its storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Facts {
    pub now_ms: u64,
    /// When the shards freeze their pre-queues (`starts_at` + grace).
    pub freeze_at_ms: u64,
    /// The entrant set's Merkle root is known.
    pub frozen: bool,
    /// The key is made (seed, root, beacon).
    pub keyed: bool,
    /// Every shard has drawn its values with the key and sent its index.
    pub drawn: bool,
    /// When the last shard did (0 if unknown: no delay).
    pub drawn_at_ms: u64,
    pub listed: bool,
}

/// The coordinator's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the freeze time, or waiting for the shards to draw.
    Wait,
    /// Merge the shards' sorted leaves (one bounded step).
    Freeze,
    /// Settle the beacon (if the sale names one) and make the key.
    Key,
    /// Merge the shards' values into the listing (one bounded step).
    List,
    /// Listed: nothing more to do.
    Done,
}

pub fn next(f: &Facts) -> Phase {
    if f.listed {
        Phase::Done
    } else if f.now_ms < f.freeze_at_ms {
        Phase::Wait
    } else if !f.frozen {
        Phase::Freeze
    } else if !f.keyed {
        Phase::Key
    } else if !f.drawn || f.now_ms < f.drawn_at_ms.saturating_add(LISTING_DELAY_MS) {
        Phase::Wait
    } else {
        Phase::List
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeze_then_key_then_the_shards_then_the_listing() {
        let mut f = Facts {
            now_ms: 999,
            freeze_at_ms: 1_000,
            ..Facts::default()
        };
        assert_eq!(next(&f), Phase::Wait, "before the freeze time");
        f.now_ms = 1_000;
        assert_eq!(next(&f), Phase::Freeze);
        // Facts out of order never skip a step: no key without the root,
        // no listing without the key and every shard drawn.
        f.drawn = true;
        assert_eq!(next(&f), Phase::Freeze);
        f.drawn = false;
        f.frozen = true;
        assert_eq!(next(&f), Phase::Key);
        f.keyed = true;
        assert_eq!(next(&f), Phase::Wait, "the shards draw with the key");
        f.drawn = true;
        f.drawn_at_ms = 2_000;
        f.now_ms = 2_000 + LISTING_DELAY_MS - 1;
        assert_eq!(
            next(&f),
            Phase::Wait,
            "the first polls after the draw go first"
        );
        f.now_ms = 2_000 + LISTING_DELAY_MS;
        assert_eq!(next(&f), Phase::List);
        f.listed = true;
        assert_eq!(next(&f), Phase::Done);
        f.now_ms = 0;
        assert_eq!(next(&f), Phase::Done, "listed is final");
    }
}
