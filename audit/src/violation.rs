//! Safety violations: the rows the audit reports.

use std::cmp::Ordering;
use std::sync::Arc;

use serde::Serialize;

/// The kinds of violation of the contract's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    TokenRegression,
    OverlappingOwnership,
    RenewAfterEnd,
    LateFence,
    StaleWriteAccepted,
    WriteAfterLoss,
}

impl ViolationKind {
    pub const ALL: [ViolationKind; 6] = [
        ViolationKind::TokenRegression,
        ViolationKind::OverlappingOwnership,
        ViolationKind::RenewAfterEnd,
        ViolationKind::LateFence,
        ViolationKind::StaleWriteAccepted,
        ViolationKind::WriteAfterLoss,
    ];

    /// The contract's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::TokenRegression => "token_regression",
            ViolationKind::OverlappingOwnership => "overlapping_ownership",
            ViolationKind::RenewAfterEnd => "renew_after_end",
            ViolationKind::LateFence => "late_fence",
            ViolationKind::StaleWriteAccepted => "stale_write_accepted",
            ViolationKind::WriteAfterLoss => "write_after_loss",
        }
    }

    pub fn parse(s: &str) -> Option<ViolationKind> {
        ViolationKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The "safety violation" alert signal of the contract's alert defaults
    /// this kind falls under. The contract names a "zombie holder" there but
    /// no such violation kind: it is a holder acting on a lease it has lost,
    /// which the audit sees as `renew_after_end` (it kept renewing) or
    /// `late_fence` (it kept working past its safe deadline). A zombie's
    /// write that reached the data is `write_after_loss`, its own signal.
    pub fn alert_signal(self) -> &'static str {
        match self {
            ViolationKind::TokenRegression => "token regression",
            ViolationKind::OverlappingOwnership => "overlapping ownership",
            ViolationKind::RenewAfterEnd | ViolationKind::LateFence => "zombie holder",
            ViolationKind::StaleWriteAccepted => "stale write accepted",
            ViolationKind::WriteAfterLoss => "write after loss",
        }
    }
}

impl std::fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One violation, reported against one grant. Times are microseconds since
/// the Unix epoch, UTC.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    #[serde(serialize_with = "crate::ser::arc")]
    pub lease_id: Arc<str>,
    /// The grant it is reported against, per the contract's table: the new
    /// grant, the later grant, the renewed grant, the fenced grant, or the
    /// token the write carried.
    pub fencing_token: u64,
    /// The holder of that grant (for a write whose token was never granted:
    /// the write's `holder_id`).
    #[serde(serialize_with = "crate::ser::opt_arc")]
    pub holder_id: Option<Arc<str>>,
    /// When the revealing event happened: the grant's acquisition, the
    /// renewal, the fence, the write.
    pub at: i64,
    /// The other party: the earlier grant (regression, overlap), the higher
    /// token already accepted (stale write), the later grant (write after
    /// loss).
    pub other_fencing_token: Option<u64>,
    #[serde(serialize_with = "crate::ser::opt_arc")]
    pub other_holder_id: Option<Arc<str>>,
    /// Why, in plain English, naming the events and times that prove it.
    pub detail: String,
    /// The proving events, in canonical event order: `event_id`s, or a
    /// description for events sent without one.
    pub evidence: Vec<String>,
}

impl Ord for Violation {
    fn cmp(&self, other: &Self) -> Ordering {
        self.lease_id
            .cmp(&other.lease_id)
            .then_with(|| self.at.cmp(&other.at))
            .then_with(|| self.kind.cmp(&other.kind))
            .then_with(|| self.fencing_token.cmp(&other.fencing_token))
            .then_with(|| self.other_fencing_token.cmp(&other.other_fencing_token))
            .then_with(|| self.holder_id.cmp(&other.holder_id))
            .then_with(|| self.other_holder_id.cmp(&other.other_holder_id))
            .then_with(|| self.evidence.cmp(&other.evidence))
            .then_with(|| self.detail.cmp(&other.detail))
    }
}

impl PartialOrd for Violation {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What [`crate::Auditor::drain_changes`] reports: violations that appeared
/// and ones that disappeared since the previous call. A violation can
/// disappear when a late event corrects the picture (a `released` that
/// arrives after the next grant ends an apparent overlap); a violation whose
/// detail changed is retracted and appears again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ViolationChanges {
    pub appeared: Vec<Violation>,
    pub retracted: Vec<Violation>,
}

impl ViolationChanges {
    pub fn is_empty(&self) -> bool {
        self.appeared.is_empty() && self.retracted.is_empty()
    }
}
