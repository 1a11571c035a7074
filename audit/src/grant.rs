//! Grants: one per `(lease_id, fencing_token)` with an `acquired` event,
//! with the coordinator's and the holder's reports merged.

use std::ops::Range;
use std::sync::Arc;

use hashbrown::HashMap;
use leaseline_schema::{Kind, Source};
use serde::{Serialize, Serializer};

use crate::intern::{Interner, Sym, NONE};
use crate::record::{Clock, Ev};

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

    fn of_end_event(kind: Kind) -> Option<EndKind> {
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

fn source_str<S: Serializer>(s: &Source, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// One grant: a row of the timeline. Times are microseconds since the Unix
/// epoch, UTC.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    pub lease_id: Arc<str>,
    pub fencing_token: u64,
    /// The holder named by the coordinator's `acquired`, else by the
    /// holder's own report.
    pub holder_id: Arc<str>,
    pub backend: Option<Arc<str>>,
    /// When ownership started: the coordinator's `acquired` time when it
    /// reported the grant (it is authoritative), else the holder's.
    pub acquired_at: i64,
    /// Whose report `acquired_at` comes from.
    #[serde(serialize_with = "source_str")]
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

/// A grant while a lease is being recomputed. Event positions index the
/// lease's events in canonical order.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    pub token: u64,
    /// The `acquired` event that sets `acquired_at`.
    pub acquired: usize,
    pub acquired_at: i64,
    pub clock: Clock,
    pub holder: Sym,
    pub backend: Sym,
    pub trace: Sym,
    /// The TTL carried by the latest success seen so far.
    pub ttl: Option<i64>,
    pub first_end: Option<usize>,
    /// The success the TTL runs from.
    pub last_success: Option<usize>,
    pub success_ttl: Option<i64>,
    prev_success_ts: i64,
    max_gap_us: Option<i64>,
    renewals: [u64; 3],
    renew_failures: [u64; 3],
    writes_accepted: u64,
    stale_writes_rejected: u64,
    pub valid_until: Option<i64>,
    /// The event `valid_until` comes from: the first end event, or the
    /// success whose TTL ran out first.
    pub cause: Option<usize>,
    /// This grant's end events in `Scratch::ends`.
    pub ends: Range<usize>,
}

impl Work {
    fn new(i: usize, ev: &Ev, token: u64) -> Work {
        Work {
            token,
            acquired: i,
            acquired_at: ev.ts,
            clock: ev.clock(),
            holder: ev.holder,
            backend: ev.backend,
            trace: ev.trace,
            ttl: None,
            first_end: None,
            last_success: None,
            success_ttl: None,
            prev_success_ts: ev.ts,
            max_gap_us: None,
            renewals: [0; 3],
            renew_failures: [0; 3],
            writes_accepted: 0,
            stale_writes_rejected: 0,
            valid_until: None,
            cause: None,
            ends: 0..0,
        }
    }
}

/// A holder-reported success that carries the send time of its keepalive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keepalive {
    pub grant: u32,
    pub sent_mono_ms: f64,
    pub ttl_ms: Option<i64>,
    pub event: u32,
}

/// Buffers reused across recomputes, so recomputing a lease allocates
/// nothing once they have grown.
#[derive(Default)]
pub(crate) struct Scratch {
    by_token: HashMap<u64, u32>,
    pub works: Vec<Work>,
    /// `(grant, event)` for every end event, grouped by grant.
    pub ends: Vec<(u32, u32)>,
    pub keepalives: Vec<Keepalive>,
    /// `(grant, event)` of `fenced` events.
    pub fences: Vec<(u32, u32)>,
    /// `(grant, event)` of renewals later than the grant's first end event.
    pub late_renewals: Vec<(u32, u32)>,
    /// Every `write_accepted` carrying a token, in canonical order.
    pub writes: Vec<u32>,
}

impl Scratch {
    pub fn grant_of_token(&self, token: Option<u64>) -> Option<usize> {
        token
            .and_then(|t| self.by_token.get(&t))
            .map(|&g| g as usize)
    }

    /// Builds the grants of one lease from its events in canonical order,
    /// ordered by `(acquired_at, fencing_token)`.
    pub fn derive_grants(&mut self, events: &[Ev], skew_us: i64) {
        self.by_token.clear();
        self.works.clear();
        self.ends.clear();
        self.keepalives.clear();
        self.fences.clear();
        self.late_renewals.clear();
        self.writes.clear();

        for (i, ev) in events.iter().enumerate() {
            let (Kind::Acquired, Some(token)) = (ev.kind, ev.token()) else {
                continue;
            };
            match self.by_token.get(&token) {
                None => {
                    self.by_token.insert(token, self.works.len() as u32);
                    self.works.push(Work::new(i, ev, token));
                }
                Some(&g) => {
                    // The coordinator is authoritative for ownership; between
                    // reports of one source the earliest (first seen) wins.
                    let w = &mut self.works[g as usize];
                    let current = events[w.acquired].source;
                    if current != Source::Coordinator && ev.source == Source::Coordinator {
                        let (backend, trace) = (w.backend, w.trace);
                        *w = Work::new(i, ev, token);
                        if w.backend == NONE {
                            w.backend = backend;
                        }
                        if w.trace == NONE {
                            w.trace = trace;
                        }
                    }
                }
            }
        }
        self.works
            .sort_unstable_by_key(|w| (w.acquired_at, w.token));
        for (g, w) in self.works.iter().enumerate() {
            self.by_token.insert(w.token, g as u32);
        }

        for (i, ev) in events.iter().enumerate() {
            let g = self.grant_of_token(ev.token());
            let src = ev.source as usize;
            match ev.kind {
                Kind::Acquired | Kind::Renewed => {
                    let Some(g) = g else { continue };
                    let w = &mut self.works[g];
                    let ttl = ev.ttl_ms().or(w.ttl);
                    w.ttl = ttl;
                    if w.backend == NONE {
                        w.backend = ev.backend;
                    }
                    if w.trace == NONE {
                        w.trace = ev.trace;
                    }
                    if ev.source == Source::Holder && !ev.keepalive_sent_mono_ms().is_nan() {
                        self.keepalives.push(Keepalive {
                            grant: g as u32,
                            sent_mono_ms: ev.keepalive_sent_mono_ms(),
                            ttl_ms: ttl,
                            event: i as u32,
                        });
                    }
                    if ev.kind == Kind::Acquired {
                        // An acquisition always counts: a skewed end report
                        // may precede it, and it cannot revive anything.
                        w.last_success = Some(i);
                        w.success_ttl = ttl;
                        continue;
                    }
                    w.renewals[src] += 1;
                    let after_end = w.first_end.is_some_and(|e| ev.ts > events[e].ts);
                    if after_end {
                        self.late_renewals.push((g as u32, i as u32));
                    } else {
                        w.last_success = Some(i);
                        w.success_ttl = ttl;
                        let gap = (ev.ts - w.prev_success_ts).max(0);
                        w.max_gap_us = Some(w.max_gap_us.map_or(gap, |m| m.max(gap)));
                        w.prev_success_ts = w.prev_success_ts.max(ev.ts);
                    }
                }
                Kind::RenewFailed => {
                    let g = g.or_else(|| self.attribute(ev, skew_us));
                    if let Some(g) = g {
                        self.works[g].renew_failures[src] += 1;
                    }
                }
                Kind::Fenced => {
                    if let Some(g) = g {
                        self.fences.push((g as u32, i as u32));
                    }
                }
                Kind::Released | Kind::Expired | Kind::Revoked => {
                    if let Some(g) = g {
                        let w = &mut self.works[g];
                        w.first_end.get_or_insert(i);
                        self.ends.push((g as u32, i as u32));
                    }
                }
                Kind::WriteAccepted => {
                    if let Some(g) = g {
                        self.works[g].writes_accepted += 1;
                    }
                    if ev.token().is_some() {
                        self.writes.push(i as u32);
                    }
                }
                Kind::StaleWriteRejected => {
                    if let Some(g) = g {
                        self.works[g].stale_writes_rejected += 1;
                    }
                }
                Kind::AcquireRequested | Kind::AcquireFailed | Kind::DrainStarted => {}
            }
        }

        self.ends.sort_unstable();
        let mut at = 0;
        for (g, w) in self.works.iter_mut().enumerate() {
            let start = at;
            while at < self.ends.len() && self.ends[at].0 as usize == g {
                at += 1;
            }
            w.ends = start..at;

            let ttl_bound = w
                .last_success
                .zip(w.success_ttl)
                .map(|(s, ttl)| (events[s].ts.saturating_add(ttl.saturating_mul(1000)), s));
            let end = w.first_end.map(|e| (events[e].ts, e));
            let bound = match (end, ttl_bound) {
                (Some(e), Some(t)) => Some(if t.0 < e.0 { t } else { e }),
                (e, t) => e.or(t),
            };
            // A grant ends no earlier than it began, even when a skewed end
            // report predates the acquisition.
            w.valid_until = bound.map(|(ts, _)| ts.max(w.acquired_at));
            w.cause = bound.map(|(_, e)| e);
        }
    }

    /// The grant a tokenless holder event belongs to: the latest grant of
    /// the same holder acquired no later than the event (with the skew
    /// tolerance, as the two times may come from different clocks).
    fn attribute(&self, ev: &Ev, skew_us: i64) -> Option<usize> {
        if ev.holder == NONE {
            return None;
        }
        let limit = ev.ts.saturating_add(skew_us);
        let n = self.works.partition_point(|w| w.acquired_at <= limit);
        (0..n).rev().find(|&g| self.works[g].holder == ev.holder)
    }

    /// The end events of grant `g`.
    pub fn ends_of(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        self.ends[self.works[g].ends.clone()]
            .iter()
            .map(|&(_, e)| e as usize)
    }

    /// The cached grants, in `(acquired_at, fencing_token)` order.
    pub fn grants(
        &self,
        lease_id: &Arc<str>,
        events: &[Ev],
        strings: &Interner,
    ) -> Vec<CachedGrant> {
        self.works
            .iter()
            .map(|w| {
                let end_kind = w
                    .first_end
                    .and_then(|e| EndKind::of_end_event(events[e].kind));
                let max = |counts: [u64; 3]| counts.into_iter().max().unwrap_or(0);
                CachedGrant {
                    has_end_event: end_kind.is_some(),
                    grant: Grant {
                        lease_id: lease_id.clone(),
                        fencing_token: w.token,
                        holder_id: strings
                            .get_opt(w.holder)
                            .cloned()
                            .unwrap_or_else(|| Arc::from("")),
                        backend: strings.get_opt(w.backend).cloned(),
                        acquired_at: w.acquired_at,
                        acquired_by: events[w.acquired].source,
                        valid_until: w.valid_until,
                        ended_at: end_kind.and(w.valid_until),
                        end_kind: end_kind.unwrap_or(EndKind::Open),
                        ttl_ms: w.success_ttl,
                        renewals: max(w.renewals),
                        renew_failures: max(w.renew_failures),
                        max_renew_gap_ms: w.max_gap_us.map(|us| us as f64 / 1000.0),
                        writes_accepted: w.writes_accepted,
                        stale_writes_rejected: w.stale_writes_rejected,
                        trace_id: strings.get_opt(w.trace).cloned(),
                    },
                }
            })
            .collect()
    }
}
