//! Deriving a lease's grants from its events in canonical order: the one
//! pass that merges reports, finds each grant's validity and collects what
//! the violation detectors need.

use std::ops::Range;
use std::sync::Arc;

use hashbrown::HashMap;
use leaseline_schema::{Kind, Source};

use crate::grant::{CachedGrant, EndKind, Grant};
use crate::intern::{Interner, Sym, NONE};
use crate::record::{Clock, Ev};

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
#[derive(Default, Clone)]
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
    pub fn attribute(&self, ev: &Ev, skew_us: i64) -> Option<usize> {
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
