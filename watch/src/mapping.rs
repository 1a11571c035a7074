//! From what a watcher observes of one lock to the contract events it
//! reports: pure functions, no I/O, so the rules are pinned by unit tests.
//!
//! A lock is seen as a [`Held`] (its holder, fencing token, a hash of its
//! raw value and its deadline on the lock service's clock) or as absent.
//! Comparing what was last seen with what is seen now gives the events:
//!
//! | before | now | events |
//! |---|---|---|
//! | absent | held | `acquired`, `ttl_ms` = deadline − now |
//! | held | the same grant, another deadline | `renewed`, `ttl_ms` = new deadline − now |
//! | held | the same grant, the same deadline | nothing |
//! | held | another grant | the end of the first, then `acquired` |
//! | held | absent | the end: see [`End`] |
//!
//! Two observations are the same grant when token and value hash agree;
//! the holder alone does not decide, since one process may take a lock
//! twice. A deadline that moved earlier (a `PEXPIRE` shortening it) is a
//! renewal too: the grant now runs to `ts + ttl_ms`, which is what the
//! contract says a renewal means.
//!
//! Event ids are derived from the transition, never from the watcher's
//! run: `<scope>/<lease_id>/<token>/<value hash>/acquired`,
//! `.../renewed/<deadline ms>` and `.../end`. A watcher that reports a
//! transition again after a restart therefore sends the same id, and the
//! lake keeps it once. A grant has one end whatever it turns out to be:
//! a restarted watcher that finds a key gone past its deadline, which it
//! had already reported `released` on a `DEL`, sends the same `end` id and
//! the first report stands.

use leaseline_emit::Kind;
use serde::{Deserialize, Serialize};

/// One lock as it was seen, with what its events need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub holder: String,
    pub token: u64,
    /// A hash of the lock's raw value: the value itself may be a secret
    /// (a lock's random value is what lets its owner release it), and the
    /// state file needs only to tell values apart.
    pub value_hash: u64,
    /// When the lock expires, Unix ms on the lock service's clock.
    pub deadline_ms: i64,
}

impl Held {
    fn same_grant(&self, other: &Held) -> bool {
        self.token == other.token && self.value_hash == other.value_hash
    }
}

/// How a lock that is no longer there went away, as far as the watcher
/// knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The service said the key was deleted: `released`, now.
    Deleted,
    /// The service said the key expired: `expired`, at its deadline.
    Expired,
    /// The service dropped the key to free memory: `revoked` with reason
    /// `evicted`, now.
    Evicted,
    /// The lease under the key was revoked before its deadline (an
    /// operator's `etcdctl lease revoke`): `revoked` with reason
    /// `lease revoked`, now.
    Revoked,
    /// Found gone (or replaced) without word of how, by a read or a
    /// resync: `expired` at its deadline if that has passed, otherwise
    /// `released` now. A delete seen only after the deadline passed is
    /// therefore reported as an expiry: the grant was over either way.
    Unknown,
}

/// One event to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub kind: Kind,
    pub lease_id: String,
    pub holder: String,
    pub token: u64,
    pub ttl_ms: Option<u64>,
    /// On the lock service's clock, Unix ms.
    pub ts_ms: i64,
    pub event_id: String,
    pub reason: Option<&'static str>,
}

/// The events between `before` and `now` of one lock, seen at `now_ms` on
/// the service's clock. `end` says how a lock that went away (or was
/// replaced) ended. `scope` names the lock space in event ids (the backend
/// and its database), so that two spaces never share an id.
pub fn transitions(
    scope: &str,
    lease_id: &str,
    before: Option<&Held>,
    now: Option<&Held>,
    end: End,
    now_ms: i64,
) -> Vec<Transition> {
    let mut out = Vec::new();
    match (before, now) {
        (None, None) => {}
        (None, Some(n)) => out.push(acquired(scope, lease_id, n, now_ms)),
        (Some(b), Some(n)) if b.same_grant(n) => {
            if b.deadline_ms != n.deadline_ms {
                let id = format!("{}/renewed/{}", grant_id(scope, lease_id, n), n.deadline_ms);
                out.push(event(Kind::Renewed, lease_id, n, now_ms, id).ttl(n, now_ms));
            }
        }
        (Some(b), Some(n)) => {
            out.push(ended(scope, lease_id, b, end, now_ms));
            out.push(acquired(scope, lease_id, n, now_ms));
        }
        (Some(b), None) => out.push(ended(scope, lease_id, b, end, now_ms)),
    }
    out
}

fn grant_id(scope: &str, lease_id: &str, h: &Held) -> String {
    format!("{scope}/{lease_id}/{}/{:016x}", h.token, h.value_hash)
}

fn event(kind: Kind, lease_id: &str, h: &Held, ts_ms: i64, event_id: String) -> Transition {
    Transition {
        kind,
        lease_id: lease_id.to_string(),
        holder: h.holder.clone(),
        token: h.token,
        ttl_ms: None,
        ts_ms,
        event_id,
        reason: None,
    }
}

impl Transition {
    /// `ttl_ms` so that `ts + ttl_ms` is the deadline; at least 1 ms, the
    /// contract's lowest, for a lock read in its last millisecond.
    fn ttl(mut self, h: &Held, now_ms: i64) -> Self {
        self.ttl_ms = Some(h.deadline_ms.saturating_sub(now_ms).max(1) as u64);
        self
    }
}

fn acquired(scope: &str, lease_id: &str, h: &Held, now_ms: i64) -> Transition {
    let id = format!("{}/acquired", grant_id(scope, lease_id, h));
    event(Kind::Acquired, lease_id, h, now_ms, id).ttl(h, now_ms)
}

fn ended(scope: &str, lease_id: &str, h: &Held, end: End, now_ms: i64) -> Transition {
    let id = format!("{}/end", grant_id(scope, lease_id, h));
    let lapsed = h.deadline_ms <= now_ms;
    let (kind, ts, reason) = match end {
        End::Deleted => (Kind::Released, now_ms, None),
        End::Evicted => (Kind::Revoked, now_ms, Some("evicted")),
        End::Revoked => (Kind::Revoked, now_ms, Some("lease revoked")),
        End::Expired => (Kind::Expired, h.deadline_ms.min(now_ms), None),
        End::Unknown if lapsed => (Kind::Expired, h.deadline_ms, None),
        End::Unknown => (Kind::Released, now_ms, None),
    };
    let mut t = event(kind, lease_id, h, ts, id);
    t.reason = reason;
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, token: u64, value: u64, deadline: i64) -> Held {
        Held {
            holder: holder.into(),
            token,
            value_hash: value,
            deadline_ms: deadline,
        }
    }

    fn kinds(ts: &[Transition]) -> Vec<(Kind, i64, Option<u64>)> {
        ts.iter().map(|t| (t.kind, t.ts_ms, t.ttl_ms)).collect()
    }

    #[test]
    fn a_new_key_is_an_acquisition_whose_ttl_reaches_the_deadline() {
        let a = held("w-1", 7, 1, 11_000);
        let t = transitions("redis/0", "L", None, Some(&a), End::Unknown, 1_000);
        assert_eq!(kinds(&t), vec![(Kind::Acquired, 1_000, Some(10_000))]);
        assert_eq!(t[0].holder, "w-1");
        assert_eq!(t[0].token, 7);
        assert_eq!(t[0].event_id, "redis/0/L/7/0000000000000001/acquired");
    }

    #[test]
    fn a_moved_deadline_is_a_renewal_and_an_unmoved_one_is_nothing() {
        let a = held("w-1", 7, 1, 11_000);
        let later = held("w-1", 7, 1, 14_000);
        let t = transitions("s", "L", Some(&a), Some(&later), End::Unknown, 4_000);
        assert_eq!(kinds(&t), vec![(Kind::Renewed, 4_000, Some(10_000))]);
        assert_eq!(t[0].event_id, "s/L/7/0000000000000001/renewed/14000");
        // Seen again (a resync, a restart): no event.
        assert!(transitions("s", "L", Some(&later), Some(&later), End::Unknown, 5_000).is_empty());
        // Shortened: the grant now runs to the new deadline.
        let sooner = held("w-1", 7, 1, 9_000);
        let t = transitions("s", "L", Some(&later), Some(&sooner), End::Unknown, 5_000);
        assert_eq!(kinds(&t), vec![(Kind::Renewed, 5_000, Some(4_000))]);
    }

    #[test]
    fn a_deleted_key_is_released_now_and_an_expired_one_at_its_deadline() {
        let a = held("w-1", 7, 1, 11_000);
        let t = transitions("s", "L", Some(&a), None, End::Deleted, 3_000);
        assert_eq!(kinds(&t), vec![(Kind::Released, 3_000, None)]);
        assert_eq!(t[0].event_id, "s/L/7/0000000000000001/end");
        // Redis removes expired keys a little late: the grant ended at its
        // deadline.
        let t = transitions("s", "L", Some(&a), None, End::Expired, 11_080);
        assert_eq!(kinds(&t), vec![(Kind::Expired, 11_000, None)]);
        let t = transitions("s", "L", Some(&a), None, End::Evicted, 3_000);
        assert_eq!(kinds(&t), vec![(Kind::Revoked, 3_000, None)]);
        assert_eq!(t[0].reason, Some("evicted"));
        let t = transitions("s", "L", Some(&a), None, End::Revoked, 3_000);
        assert_eq!(kinds(&t), vec![(Kind::Revoked, 3_000, None)]);
        assert_eq!(t[0].reason, Some("lease revoked"));
    }

    #[test]
    fn a_key_found_gone_ended_by_its_deadline() {
        let a = held("w-1", 7, 1, 11_000);
        let t = transitions("s", "L", Some(&a), None, End::Unknown, 12_000);
        assert_eq!(kinds(&t), vec![(Kind::Expired, 11_000, None)]);
        let t = transitions("s", "L", Some(&a), None, End::Unknown, 10_000);
        assert_eq!(kinds(&t), vec![(Kind::Released, 10_000, None)]);
        // Both are the grant's one end: the same id, whichever is reported.
        assert_eq!(
            transitions("s", "L", Some(&a), None, End::Deleted, 1)[0].event_id,
            transitions("s", "L", Some(&a), None, End::Unknown, 20_000)[0].event_id
        );
    }

    #[test]
    fn another_grant_under_the_key_ends_the_first_then_begins() {
        let a = held("w-1", 7, 1, 11_000);
        let b = held("w-2", 8, 2, 20_000);
        let t = transitions("s", "L", Some(&a), Some(&b), End::Unknown, 12_000);
        assert_eq!(
            kinds(&t),
            vec![
                (Kind::Expired, 11_000, None),
                (Kind::Acquired, 12_000, Some(8_000))
            ]
        );
        assert_eq!((t[0].token, t[1].token), (7, 8));
        // The same holder taking the lock again is a new grant too.
        let again = held("w-1", 8, 3, 20_000);
        let t = transitions("s", "L", Some(&a), Some(&again), End::Deleted, 5_000);
        assert_eq!(
            kinds(&t),
            vec![
                (Kind::Released, 5_000, None),
                (Kind::Acquired, 5_000, Some(15_000))
            ]
        );
    }

    #[test]
    fn a_lock_read_in_its_last_millisecond_keeps_a_valid_ttl() {
        let a = held("w-1", 7, 1, 1_000);
        let t = transitions("s", "L", None, Some(&a), End::Unknown, 1_000);
        assert_eq!(t[0].ttl_ms, Some(1));
    }
}
