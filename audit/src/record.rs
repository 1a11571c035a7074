//! The compact form an event is kept in, and the one order every derivation
//! walks events in.

use std::cmp::Ordering;
use std::hash::BuildHasher;

use leaseline_schema::{Kind, LeaseEvent, Source};

use crate::ids::EventIds;
use crate::intern::{Interner, Sym, NONE};

/// One de-duplicated event, with only the fields the audit reads, in one
/// cache line: pushes and recomputes are bound by memory traffic.
///
/// Fields the audit never reads (latency, reason, max_token, span, attrs)
/// are dropped, so two events that differ only there are indistinguishable
/// here, which is what makes the canonical order total in effect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ev {
    pub ts: i64,
    token: u64,
    /// `i64::MIN` when absent (the contract's TTL is positive).
    ttl_ms: i64,
    /// The holder's monotonic clock when it happened; NaN when absent, which
    /// keeps the record small and still totally ordered by `total_cmp`.
    pub mono_ms: f64,
    /// `keepalive_sent_mono_ms` on `acquired` and `renewed`, else
    /// `deadline_mono_ms`: the contract sends each only on those kinds, and
    /// the audit reads each only there.
    aux_mono_ms: f64,
    pub holder: Sym,
    pub backend: Sym,
    pub trace: Sym,
    pub event_id: Sym,
    pub lease: Sym,
    pub kind: Kind,
    pub source: Source,
    has_token: bool,
}

fn mono(v: Option<f64>) -> f64 {
    v.filter(|v| !v.is_nan()).unwrap_or(f64::NAN)
}

fn carries_keepalive(kind: Kind) -> bool {
    matches!(kind, Kind::Acquired | Kind::Renewed)
}

impl Ev {
    pub fn new(
        e: &LeaseEvent<'_>,
        lease: Sym,
        holder: Sym,
        strings: &mut Interner,
        event_id: Sym,
    ) -> Ev {
        let aux = if carries_keepalive(e.kind) {
            e.keepalive_sent_mono_ms
        } else {
            e.deadline_mono_ms
        };
        Ev {
            ts: e.ts_us,
            token: e.fencing_token.unwrap_or(0),
            has_token: e.fencing_token.is_some(),
            ttl_ms: e.ttl_ms.unwrap_or(i64::MIN),
            mono_ms: mono(e.mono_ms),
            aux_mono_ms: mono(aux),
            holder,
            backend: strings.intern_opt(e.backend.as_deref()),
            trace: strings.intern_opt(e.trace_id.as_deref()),
            event_id,
            lease,
            kind: e.kind,
            source: e.source,
        }
    }

    /// The event again, with the fields the audit reads (those this record
    /// dropped are absent): what the stored context holds
    /// (`alerts/src/stored.rs`).
    pub fn to_event(
        self,
        lease_id: &str,
        strings: &Interner,
        event_id: Option<&str>,
    ) -> LeaseEvent<'static> {
        let (keepalive, deadline) = if carries_keepalive(self.kind) {
            (Ev::opt(self.aux_mono_ms), None)
        } else {
            (None, Ev::opt(self.aux_mono_ms))
        };
        let owned = |sym: Sym| {
            strings
                .get_opt(sym)
                .map(|s| std::borrow::Cow::Owned(s.to_string()))
        };
        LeaseEvent {
            ts_us: self.ts,
            kind: self.kind,
            source: self.source,
            lease_id: std::borrow::Cow::Owned(lease_id.to_string()),
            holder_id: owned(self.holder),
            fencing_token: self.token(),
            ttl_ms: self.ttl_ms(),
            event_id: event_id.map(|s| std::borrow::Cow::Owned(s.to_string())),
            backend: owned(self.backend),
            latency_ms: None,
            reason: None,
            max_token: None,
            mono_ms: Ev::opt(self.mono_ms),
            keepalive_sent_mono_ms: keepalive,
            deadline_mono_ms: deadline,
            trace_id: owned(self.trace),
            span_id: None,
            attrs: Vec::new(),
        }
    }

    pub fn token(&self) -> Option<u64> {
        self.has_token.then_some(self.token)
    }

    pub fn ttl_ms(&self) -> Option<i64> {
        (self.ttl_ms != i64::MIN).then_some(self.ttl_ms)
    }

    /// NaN when absent.
    pub fn keepalive_sent_mono_ms(&self) -> f64 {
        if carries_keepalive(self.kind) {
            self.aux_mono_ms
        } else {
            f64::NAN
        }
    }

    /// NaN when absent.
    pub fn deadline_mono_ms(&self) -> f64 {
        if carries_keepalive(self.kind) {
            f64::NAN
        } else {
            self.aux_mono_ms
        }
    }

    pub fn opt(v: f64) -> Option<f64> {
        (!v.is_nan()).then_some(v)
    }

    /// The clock this event's `ts` was read from.
    pub fn clock(&self) -> Clock {
        Clock::of(self.source, self.holder)
    }

    /// A fingerprint of the stored content within one auditor (symbols are
    /// stable there), so an exact retry is recognised without finding the
    /// first copy.
    pub fn fingerprint(&self, hasher: &impl BuildHasher) -> u64 {
        hasher.hash_one((
            (self.lease, self.ts, self.token, self.has_token, self.ttl_ms),
            (self.mono_ms.to_bits(), self.aux_mono_ms.to_bits()),
            (self.holder, self.backend, self.trace),
            (kind_rank(self.kind), self.source as u8),
        ))
    }
}

/// Whose wall clock a timestamp comes from. The coordinator is one clock and
/// the resource is one clock; every holder process has its own, because two
/// holders are two machines even though the contract calls both `holder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clock {
    source: Source,
    holder: Sym,
}

impl Clock {
    pub fn of(source: Source, holder: Sym) -> Clock {
        let holder = if source == Source::Holder {
            holder
        } else {
            NONE
        };
        Clock { source, holder }
    }

    /// The slack a comparison between these two clocks allows.
    pub fn tolerance(self, other: Clock, skew_us: i64) -> i64 {
        if self == other {
            0
        } else {
            skew_us
        }
    }
}

/// Where a kind sorts among events of the same timestamp: acquisitions
/// first, then keepalive outcomes, then resource events, then ends. A
/// renewal and an end at the same instant therefore read as renew-then-end,
/// the benign order.
pub(crate) fn kind_rank(kind: Kind) -> u8 {
    match kind {
        Kind::AcquireRequested => 0,
        Kind::AcquireFailed => 1,
        Kind::Acquired => 2,
        Kind::Renewed => 3,
        Kind::RenewFailed => 4,
        Kind::DrainStarted => 5,
        Kind::Fenced => 6,
        Kind::WriteAccepted => 7,
        Kind::StaleWriteRejected => 8,
        Kind::Released => 9,
        Kind::Expired => 10,
        Kind::Revoked => 11,
    }
}

fn cmp_opt(a: Option<&str>, b: Option<&str>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, _) => Ordering::Less,
        (_, None) => Ordering::Greater,
        (Some(a), Some(b)) => a.cmp(b),
    }
}

fn cmp_sym(strings: &Interner, a: Sym, b: Sym) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    cmp_opt(
        strings.get_opt(a).map(|s| &**s),
        strings.get_opt(b).map(|s| &**s),
    )
}

/// The order of a lease's events: by timestamp, then by content only, never
/// by arrival, so every derivation sees the same sequence whatever order the
/// events were pushed in. Records equal under it are identical (the lease
/// aside, which callers compare first when it can differ).
pub(crate) fn canonical_cmp(a: &Ev, b: &Ev, strings: &Interner, ids: &EventIds) -> Ordering {
    a.ts.cmp(&b.ts)
        .then_with(|| kind_rank(a.kind).cmp(&kind_rank(b.kind)))
        .then_with(|| a.source.cmp(&b.source))
        .then_with(|| a.token().cmp(&b.token()))
        .then_with(|| cmp_sym(strings, a.holder, b.holder))
        .then_with(|| {
            if a.event_id == b.event_id {
                Ordering::Equal
            } else {
                cmp_opt(ids.get_opt(a.event_id), ids.get_opt(b.event_id))
            }
        })
        .then_with(|| a.ttl_ms.cmp(&b.ttl_ms))
        .then_with(|| a.mono_ms.total_cmp(&b.mono_ms))
        .then_with(|| a.aux_mono_ms.total_cmp(&b.aux_mono_ms))
        .then_with(|| cmp_sym(strings, a.backend, b.backend))
        .then_with(|| cmp_sym(strings, a.trace, b.trace))
}
