//! Grants: one per `(lease_id, fencing_token)` with an `acquired` event,
//! with the coordinator's and the holder's reports merged.

use std::sync::Arc;

use leaseline_schema::{Kind, Source};
use serde::Serialize;

/// How a grant ended, per the contract's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndKind {
    /// Its first end event is a `released`.
    Released,
    /// Its first end event is an `expired`.
    Expired,
    /// Its first end event is a `revoked`.
    Revoked,
    /// No end event, and its TTL ran out at or before the latest event time
    /// seen.
    Lapsed,
    /// No end event, and still within its TTL at the latest event time seen.
    Open,
}

impl EndKind {
    pub const ALL: [EndKind; 5] = [
        EndKind::Released,
        EndKind::Expired,
        EndKind::Revoked,
        EndKind::Lapsed,
        EndKind::Open,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndKind::Released => "released",
            EndKind::Expired => "expired",
            EndKind::Revoked => "revoked",
            EndKind::Lapsed => "lapsed",
            EndKind::Open => "open",
        }
    }

    pub(crate) fn of_end_event(kind: Kind) -> Option<EndKind> {
        match kind {
            Kind::Released => Some(EndKind::Released),
            Kind::Expired => Some(EndKind::Expired),
            Kind::Revoked => Some(EndKind::Revoked),
            _ => None,
        }
    }
}

impl std::fmt::Display for EndKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One grant: a row of the timeline. Times are microseconds since the Unix
/// epoch, UTC.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    #[serde(serialize_with = "crate::ser::arc")]
    pub lease_id: Arc<str>,
    pub fencing_token: u64,
    /// The holder named by the coordinator's `acquired`, else by the
    /// holder's own report (empty if it named none, which the contract
    /// forbids).
    #[serde(serialize_with = "crate::ser::arc")]
    pub holder_id: Arc<str>,
    #[serde(serialize_with = "crate::ser::opt_arc")]
    pub backend: Option<Arc<str>>,
    /// When ownership started: the coordinator's `acquired` time when it
    /// reported the grant (it is authoritative), else the holder's.
    pub acquired_at: i64,
    /// Whose report `acquired_at` comes from.
    #[serde(serialize_with = "crate::ser::source")]
    pub acquired_by: Source,
    /// The end of validity: the earliest of the first end event and the last
    /// successful acquisition or renewal (up to that end event) plus its
    /// TTL; never before `acquired_at`. `None` when no TTL is known and no
    /// end event arrived.
    pub valid_until: Option<i64>,
    /// `valid_until`, unless the grant is still [`EndKind::Open`].
    pub ended_at: Option<i64>,
    pub end_kind: EndKind,
    /// The TTL in force at the last counted acquisition or renewal.
    pub ttl_ms: Option<i64>,
    /// Successful `renewed` events; when both the coordinator and the holder
    /// report keepalives, the larger of the two counts (each keepalive is
    /// then reported twice).
    pub renewals: u64,
    /// `renew_failed` events, counted like `renewals`.
    pub renew_failures: u64,
    /// The longest wait from the acquisition or a renewal to the next
    /// renewal, up to the first end event; `None` without renewals.
    pub max_renew_gap_ms: Option<f64>,
    pub writes_accepted: u64,
    pub stale_writes_rejected: u64,
    #[serde(serialize_with = "crate::ser::opt_arc")]
    pub trace_id: Option<Arc<str>>,
}

impl Grant {
    /// Whether the grant is still valid at the latest event time seen.
    pub fn is_open(&self) -> bool {
        self.end_kind == EndKind::Open
    }
}

/// The last grant of a lease (by acquisition time) and whether it is still
/// valid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseHolder {
    pub grant: Grant,
    pub valid: bool,
}

/// A derived grant as cached between pushes. Open versus lapsed depends on
/// the latest event time of the whole history, which any lease's push can
/// move, so it is settled at read time and not cached.
#[derive(Debug, Clone)]
pub(crate) struct CachedGrant {
    pub grant: Grant,
    pub has_end_event: bool,
}

impl CachedGrant {
    pub fn resolve(&self, latest: i64) -> Grant {
        let mut g = self.grant.clone();
        if !self.has_end_event {
            match g.valid_until {
                Some(v) if v <= latest => {
                    g.end_kind = EndKind::Lapsed;
                    g.ended_at = Some(v);
                }
                _ => {
                    g.end_kind = EndKind::Open;
                    g.ended_at = None;
                }
            }
        }
        g
    }
}
