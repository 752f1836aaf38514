//! What a status poll (and a join, which answers like one) decides (pure,
//! host-tested): where a ticket's place comes from, whether an abandoned
//! turn is joined again, and the answer's body with the `admit` token.
//!
//! Invariants kept here:
//! - an `admit` token is minted only for a person whose status is
//!   `admitted` (`status::view`: place within the frontier, window open,
//!   sale neither sold out nor over), only for their own account and sale,
//!   and never outlives their admission window (`status::admit_ttl_secs`);
//! - a place is computed once it is final: from the drawn pre-queue (the
//!   ticket's salt) once drawn, or from a complete second of arrivals;
//!   never guessed before;
//! - only a place the coordinator lists as abandoned joins again.

use serde_json::{Value, json};
use token::{Claims, KeyRing, TicketData, TokenType};

use crate::api::error::{ApiError, ApiResult};
use crate::draw::freeze::LISTING_MAX;
use crate::queue::places::Arrival;
use crate::queue::shards;
use crate::queue::status::{self, Snapshot, Status};

/// Where a ticket holder's place comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceFrom<'a> {
    /// The ticket carries it.
    Ticket(u64),
    /// Their arrival's complete second (after the start).
    Arrivals(Arrival),
    /// The drawn pre-queue: their leaf from the ticket's salt, on `shard`.
    Draw { salt: &'a str, shard: u32 },
    /// Not final yet (the draw or the second is not complete).
    NotYet,
}

/// Where the place of the holder of a ticket `tkt` of account `sub` comes
/// from, given the coordinator's snapshot.
pub fn place_from<'a>(sub: &str, tkt: &'a TicketData, snap: &Snapshot) -> PlaceFrom<'a> {
    if let Some(p) = tkt.place {
        return PlaceFrom::Ticket(p);
    }
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(sub, snap.shards));
    match (tkt.t_ms, tkt.salt.as_deref()) {
        (Some(t), _) if t < snap.fifo_through_ms => PlaceFrom::Arrivals(Arrival {
            t_ms: t,
            shard,
            seq: tkt.seq,
        }),
        (None, Some(salt)) if snap.drawn => PlaceFrom::Draw { salt, shard },
        _ => PlaceFrom::NotYet,
    }
}

/// The place a shadow ticket (a failed bot check of a sale with
/// `bot_shadow`) is shown: behind everyone placed and behind the frontier,
/// at a distance its arrival number fixes, recomputed at every poll, so it
/// is never reached; `None` before the start (the pre-queue has no places).
pub fn shadow_place(s: &Snapshot, seq: u64, now: u64) -> Option<u64> {
    (now >= s.starts_at_ms)
        .then(|| s.placed.max(status::frontier_at(s, now)).max(s.frontier) + 1 + seq % 64)
}

/// Whether the holder of `place` gave their turn up (abandoned: listed by
/// the coordinator), so their join puts them in line again.
pub fn abandoned(place: u64, snap: &Snapshot) -> bool {
    snap.abandoned.binary_search(&place).is_ok()
}

/// The status answer of the holder of `ticket` (account `sub`, place if
/// known) at `now`, with an `admit` token signed by `admits` when they
/// are admitted. `jitter` in `[0, 1)` spreads the polls.
#[allow(clippy::too_many_arguments)]
pub fn status_body(
    admits: impl FnOnce() -> ApiResult<std::rc::Rc<KeyRing>>,
    sale: &str,
    sub: &str,
    ticket: &str,
    place: Option<u64>,
    after_start: bool,
    s: &Snapshot,
    now: u64,
    jitter: f64,
) -> ApiResult<Value> {
    let v = status::view(place, after_start, s, now, jitter);
    let mut body = json!({
        "ticket": ticket,
        "status": v.status,
        "place": v.place,
        "position": v.position,
        "ahead": v.ahead,
        "eta_seconds": v.eta_seconds,
        "poll_after_ms": v.poll_after_ms,
        "starts_at_ms": s.starts_at_ms,
    });
    if let Some(why) = v.reason {
        body["reason"] = json!(why);
    }
    if v.status == Status::Admitted
        && let Some(p) = place
    {
        let ring = admits()?;
        // Never past the end of the admission window, however often the
        // person re-polls.
        let claims = Claims::new(
            TokenType::Admit,
            sub,
            Some(sale.to_string()),
            now / 1000,
            status::admit_ttl_secs(p, s, now),
        );
        body["admission_token"] = json!(ring.sign(&claims));
        body["admission_expires_at"] = json!(claims.exp);
        // The page counts down to the window's end, not the token's.
        body["window_ends_at_ms"] = json!(status::window_ends_at_ms(p, s, now));
    }
    Ok(body)
}

/// The page of the draw's listing asked for by `?from=&limit=` (`from`
/// 1 or more, `limit` `1..=LISTING_MAX`; absent: 1 and the most).
pub fn listing_page(from: Option<String>, limit: Option<String>) -> ApiResult<(u64, u64)> {
    let max = LISTING_MAX;
    let bad = || {
        ApiError::new(
            400,
            "bad_request",
            format!("from must be a place (1 or more) and limit 1..={max}"),
        )
    };
    let from: u64 = from
        .unwrap_or_else(|| "1".into())
        .parse()
        .ok()
        .filter(|f| *f >= 1)
        .ok_or_else(bad)?;
    let limit: u64 = limit
        .unwrap_or_else(|| max.to_string())
        .parse()
        .ok()
        .filter(|l| (1..=max).contains(l))
        .ok_or_else(bad)?;
    Ok((from, limit))
}

/// The listing pages that cover places `from .. from + limit`, by their
/// first place: pages of [`LISTING_MAX`] aligned at 1, 513, 1025, … The
/// coordinator is only ever asked for these, so however many `from`/`limit`
/// pairs anonymous callers try, a sale's cache holds one entry per page of
/// entrants, and a page costs one coordinator call per location (issue 44
/// #3: each distinct pair was a new cache entry and a `/listing` call).
pub fn aligned_pages(from: u64, limit: u64) -> Vec<u64> {
    let page = LISTING_MAX;
    let first = (from.max(1) - 1) / page * page + 1;
    let last = (from.max(1) + limit.max(1) - 2) / page * page + 1;
    (0..)
        .map(|i| first + i * page)
        .take_while(|p| *p <= last)
        .collect()
}

/// The entries of `pages` (coordinator answers `{"entries": [{place, …}]}`)
/// whose place is in `from .. from + limit`, in place order, as the listing
/// answer.
pub fn listing_slice(pages: &[Value], from: u64, limit: u64) -> Value {
    let end = from.saturating_add(limit);
    let entries: Vec<&Value> = pages
        .iter()
        .filter_map(|p| p["entries"].as_array())
        .flatten()
        .filter(|e| e["place"].as_u64().is_some_and(|pl| pl >= from && pl < end))
        .collect();
    json!({ "entries": entries })
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_listing_request_maps_to_at_most_two_aligned_pages() {
        assert_eq!(aligned_pages(1, 512), vec![1]);
        assert_eq!(aligned_pages(1, 1), vec![1]);
        assert_eq!(aligned_pages(512, 1), vec![1]);
        assert_eq!(aligned_pages(513, 512), vec![513]);
        assert_eq!(aligned_pages(500, 100), vec![1, 513]);
        for from in [1u64, 2, 77, 511, 512, 513, 10_000, u64::MAX / 4] {
            for limit in [1u64, 2, 100, 511, 512] {
                let pages = aligned_pages(from, limit);
                assert!((1..=2).contains(&pages.len()), "{from} {limit}: {pages:?}");
                assert!(pages.iter().all(|p| (p - 1) % LISTING_MAX == 0));
                assert!(pages[0] <= from && from + limit <= pages.last().unwrap() + LISTING_MAX);
            }
        }
        let page = |start: u64| json!({"entries": (start..start + LISTING_MAX).map(|p| json!({"place": p})).collect::<Vec<_>>()});
        let v = listing_slice(&[page(1), page(513)], 510, 5);
        let places: Vec<u64> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["place"].as_u64().unwrap())
            .collect();
        assert_eq!(places, vec![510, 511, 512, 513, 514]);
    }

    use std::rc::Rc;

    use super::*;
    use token::Expect;

    const NOW: u64 = 1_800_000_100_000;

    fn keys() -> ApiResult<Rc<KeyRing>> {
        Ok(Rc::new(KeyRing::from_keys(&[("a1", &[7u8; 32])]).unwrap()))
    }

    /// A drawn sale of 100 whose frontier is at 10, admitting now.
    fn snap() -> Snapshot {
        serde_json::from_value(json!({
            "sale": "drop", "now_ms": NOW, "starts_at_ms": NOW - 60_000, "rate": 1.0,
            "drawn": true, "entries": 100, "prequeue": 100, "placed": 100, "frontier": 10,
            "expired": 0, "sold_out": false, "closed": false, "commitment": "c",
            "draw": null, "do_requests": 0, "shards": 4, "fifo_through_ms": NOW - 1_000,
            "frontier_history": [[NOW - 5_000, 10.0]], "frontier_rate": 0.0,
            "frontier_cap": 100, "abandoned": [3, 7],
        }))
        .unwrap()
    }

    #[test]
    fn an_admit_token_is_minted_for_admitted_people_only() {
        let s = snap();
        let admitted =
            status_body(keys, "drop", "alice", "t", Some(4), false, &s, NOW, 0.5).unwrap();
        assert_eq!(admitted["status"], "admitted");
        let token = admitted["admission_token"].as_str().unwrap();
        let expect = Expect {
            typ: TokenType::Admit,
            sale: Some("drop"),
        };
        let c = keys().unwrap().verify(token, expect, NOW / 1000).unwrap();
        assert_eq!(c.sub, "alice");
        assert!(c.exp * 1000 <= status::window_ends_at_ms(4, &s, NOW) + 1_000);
        // Waiting, not yet placed, sold out: no token, and no key asked for.
        let no_keys = || -> ApiResult<Rc<KeyRing>> { panic!("no token may be minted") };
        let waiting =
            status_body(no_keys, "drop", "bob", "t", Some(50), false, &s, NOW, 0.5).unwrap();
        assert_eq!(waiting["status"], "waiting");
        assert!(waiting.get("admission_token").is_none());
        let unplaced = status_body(no_keys, "drop", "bob", "t", None, false, &s, NOW, 0.5).unwrap();
        assert!(unplaced.get("admission_token").is_none());
        let mut gone = snap();
        gone.sold_out = true;
        let sold = status_body(
            no_keys,
            "drop",
            "alice",
            "t",
            Some(4),
            false,
            &gone,
            NOW,
            0.5,
        )
        .unwrap();
        assert_eq!(sold["status"], "sold_out");
    }

    #[test]
    fn a_place_is_computed_only_once_final() {
        let s = snap();
        let t = |place, t_ms, salt: Option<&str>| TicketData {
            seq: 9,
            place,
            shard: Some(2),
            t_ms,
            salt: salt.map(str::to_string),
            shadow: false,
        };
        assert_eq!(
            place_from("a", &t(Some(5), None, None), &s),
            PlaceFrom::Ticket(5)
        );
        let pre = t(None, None, Some("ab"));
        assert_eq!(
            place_from("a", &pre, &s),
            PlaceFrom::Draw {
                salt: "ab",
                shard: 2
            }
        );
        let mut undrawn = snap();
        undrawn.drawn = false;
        assert_eq!(place_from("a", &pre, &undrawn), PlaceFrom::NotYet);
        let early = t(None, Some(NOW - 2_000), None);
        assert_eq!(
            place_from("a", &early, &s),
            PlaceFrom::Arrivals(Arrival {
                t_ms: NOW - 2_000,
                shard: 2,
                seq: 9
            })
        );
        let recent = t(None, Some(NOW - 500), None);
        assert_eq!(
            place_from("a", &recent, &s),
            PlaceFrom::NotYet,
            "second not complete"
        );
        assert!(abandoned(7, &s) && !abandoned(4, &s));
    }

    #[test]
    fn a_shadow_place_is_never_admitted_whatever_the_frontier_does() {
        let no_keys = || -> ApiResult<Rc<KeyRing>> { panic!("no token for a shadow") };
        let mut s = snap();
        for (placed, frontier, cap, rate) in [
            (100, 10, 100, 1.0),
            (100, 100, 100, 0.0),
            (100, 99, 100, 50.0),
            (0, 0, 0, 0.0),
            (5_000, 4_990, 5_000, 1_000.0),
        ] {
            s.placed = placed;
            s.frontier = frontier;
            s.frontier_cap = cap;
            s.frontier_rate = rate;
            for seq in [0, 1, 63, 64, 1_000_003] {
                // Polls over the next minute, against this snapshot.
                for later in [0, 1_000, 10_000, 60_000] {
                    let now = NOW + later;
                    let p = shadow_place(&s, seq, now).unwrap();
                    assert!(p > placed && p > status::frontier_at(&s, now), "{p}");
                    let b = status_body(no_keys, "drop", "bot", "t", Some(p), true, &s, now, 0.5)
                        .unwrap();
                    assert_ne!(b["status"], "admitted", "{b}");
                    assert!(b.get("admission_token").is_none());
                }
            }
        }
        // Before the start, no place, like the real pre-queue.
        s.starts_at_ms = NOW + 1;
        assert_eq!(shadow_place(&s, 3, NOW), None);
    }

    #[test]
    fn listing_pages_are_bounded() {
        assert_eq!(listing_page(None, None).unwrap(), (1, LISTING_MAX));
        assert_eq!(
            listing_page(Some("3".into()), Some("10".into())).unwrap(),
            (3, 10)
        );
        for (f, l) in [("0", "1"), ("1", "0"), ("x", "1"), ("1", "513")] {
            assert!(
                listing_page(Some(f.into()), Some(l.into())).is_err(),
                "{f} {l}"
            );
        }
    }
}
