//! The violation detectors: how a lease's events, in canonical order and
//! with its grants derived, reveal each kind.

use std::sync::Arc;

use crate::config::Tolerances;
use crate::derive::{Keepalive, Scratch};
use crate::ids::EventIds;
use crate::intern::{Interner, Sym};
use crate::record::{Clock, Ev};
use crate::text;
use crate::violation::{Violation, ViolationKind};

/// One end of a grant's validity: an end event, or the TTL running out
/// after a success.
#[derive(Clone, Copy)]
struct Bound {
    ts: i64,
    clock: Clock,
}

/// A violation before it becomes a row.
struct Finding {
    kind: ViolationKind,
    /// The grant it is reported against.
    token: u64,
    holder_id: Option<Arc<str>>,
    at: i64,
    /// The other grant's token and holder.
    other: Option<(u64, Option<Arc<str>>)>,
    /// Positions of the proving events.
    evidence: Vec<usize>,
    detail: String,
}

/// Everything the detectors read while one lease is recomputed.
pub(crate) struct Detect<'a> {
    pub lease_id: &'a Arc<str>,
    pub events: &'a [Ev],
    pub scratch: &'a Scratch,
    pub strings: &'a Interner,
    pub ids: &'a EventIds,
    pub tol: Tolerances,
}

impl Detect<'_> {
    /// Appends the lease's violations to `out`, sorted.
    pub fn run(&self, out: &mut Vec<Violation>) {
        let start = out.len();
        self.token_regression(out);
        self.overlapping_ownership(out);
        self.renew_after_end(out);
        self.late_fence(out);
        self.writes(out);
        out[start..].sort_unstable();
    }

    fn skew(&self, a: Clock, b: Clock) -> i64 {
        a.tolerance(b, self.tol.skew_us)
    }

    fn holder(&self, g: usize) -> Option<Arc<str>> {
        self.strings.get_opt(self.scratch.works[g].holder).cloned()
    }

    fn holder_name(&self, sym: Sym) -> &str {
        self.strings.get_opt(sym).map_or("an unnamed holder", |h| h)
    }

    /// `grant 7 to b-1`
    fn grant_name(&self, g: usize) -> String {
        let w = &self.scratch.works[g];
        format!("grant {} to {}", w.token, self.holder_name(w.holder))
    }

    fn bounds(&self, g: usize) -> impl Iterator<Item = Bound> + '_ {
        let w = &self.scratch.works[g];
        let ttl = w.last_success.zip(w.success_ttl).map(|(s, ttl)| Bound {
            ts: self.events[s].ts.saturating_add(ttl.saturating_mul(1000)),
            clock: self.events[s].clock(),
        });
        self.scratch
            .ends_of(g)
            .map(|e| Bound {
                ts: self.events[e].ts,
                clock: self.events[e].clock(),
            })
            .chain(ttl)
    }

    /// Whether `ts` on `clock` is before grant `g` ended by more than the
    /// clocks can disagree, against every sign of its end.
    fn surely_before_end(&self, ts: i64, clock: Clock, g: usize) -> bool {
        self.bounds(g)
            .all(|b| ts.saturating_add(self.skew(clock, b.clock)) < b.ts)
    }

    /// Whether `ts` on `clock` is after grant `g` ended by more than the
    /// clocks can disagree, against some sign of its end.
    fn surely_after_end(&self, ts: i64, clock: Clock, g: usize) -> bool {
        self.bounds(g)
            .any(|b| ts > b.ts.saturating_add(self.skew(clock, b.clock)))
    }

    /// When grant `g` stopped being valid and why: `(10:00:09.000,
    /// "released")`; `None` when it has neither an end event nor a TTL.
    fn end_of(&self, g: usize) -> Option<(String, String)> {
        let w = &self.scratch.works[g];
        let (until, cause) = w.valid_until.zip(w.cause)?;
        let ev = &self.events[cause];
        let why = if ev.kind.is_end() {
            ev.kind.as_str().to_string()
        } else {
            let what = match ev.kind {
                leaseline_schema::Kind::Acquired => "acquisition",
                _ => "last renewal",
            };
            format!(
                "TTL of {} ms from its {what} at {}",
                w.success_ttl.unwrap_or_default(),
                text::time(ev.ts)
            )
        };
        Some((text::time(until), why))
    }

    fn push(&self, out: &mut Vec<Violation>, finding: Finding) {
        let Finding {
            kind,
            token,
            holder_id,
            at,
            other,
            mut evidence,
            detail,
        } = finding;
        evidence.sort_unstable();
        evidence.dedup();
        let (other_fencing_token, other_holder_id) = other.unzip();
        out.push(Violation {
            kind,
            lease_id: self.lease_id.clone(),
            fencing_token: token,
            holder_id,
            at,
            other_fencing_token,
            other_holder_id: other_holder_id.flatten(),
            detail,
            evidence: evidence
                .into_iter()
                .map(|e| text::evidence(&self.events[e], self.strings, self.ids))
                .collect(),
        });
    }

    /// Against each grant, the highest-token grant acquired surely earlier.
    /// Surely earlier: before it on the same clock, or before it by more
    /// than the skew tolerance across clocks.
    fn token_regression(&self, out: &mut Vec<Violation>) {
        let works = &self.scratch.works;
        if works.len() < 2 {
            return;
        }
        // best[i]: the highest token among works[..=i], the first on ties.
        let mut best: Vec<usize> = Vec::with_capacity(works.len());
        for (i, w) in works.iter().enumerate() {
            let prev = best.last().copied();
            best.push(match prev {
                Some(p) if works[p].token >= w.token => p,
                _ => i,
            });
        }
        let higher = |a: Option<usize>, b: usize| match a {
            Some(a) if works[a].token >= works[b].token => Some(a),
            _ => Some(b),
        };
        for (g, w) in works.iter().enumerate() {
            let cross_limit = w.acquired_at.saturating_sub(self.tol.skew_us);
            let n = works[..g].partition_point(|e| e.acquired_at < cross_limit);
            let mut other = n.checked_sub(1).map(|i| best[i]);
            // Grants within the skew before this one count only on its clock.
            for (e, ew) in works.iter().enumerate().take(g).skip(n) {
                if ew.acquired_at < w.acquired_at && ew.clock == w.clock {
                    other = higher(other, e);
                }
            }
            let Some(e) = other.filter(|&e| works[e].token >= w.token) else {
                continue;
            };
            let detail = format!(
                "{} acquired at {} has a token not above {} acquired earlier at {}",
                self.grant_name(g),
                text::time(w.acquired_at),
                self.grant_name(e),
                text::time(works[e].acquired_at),
            );
            self.push(
                out,
                Finding {
                    kind: ViolationKind::TokenRegression,
                    token: w.token,
                    holder_id: self.holder(g),
                    at: w.acquired_at,
                    other: Some((works[e].token, self.holder(e))),
                    evidence: vec![works[e].acquired, w.acquired],
                    detail,
                },
            );
        }
    }

    /// Each grant against every earlier grant still surely valid when it
    /// began.
    fn overlapping_ownership(&self, out: &mut Vec<Violation>) {
        let works = &self.scratch.works;
        let mut active: Vec<usize> = Vec::new();
        for (g, w) in works.iter().enumerate() {
            // Grants start in order, so one over before this start is over
            // before every later one.
            active.retain(|&e| works[e].valid_until.is_none_or(|v| v > w.acquired_at));
            for &e in &active {
                if !self.surely_before_end(w.acquired_at, w.clock, e) {
                    continue;
                }
                let validity = match self.end_of(e) {
                    Some((until, why)) => format!("was valid until {until} ({why})"),
                    None => "had not ended (no end event, no TTL)".to_string(),
                };
                let detail = format!(
                    "{} began at {} while {} {validity}",
                    self.grant_name(g),
                    text::time(w.acquired_at),
                    self.grant_name(e),
                );
                let mut evidence = vec![works[e].acquired, w.acquired];
                evidence.extend(works[e].cause);
                self.push(
                    out,
                    Finding {
                        kind: ViolationKind::OverlappingOwnership,
                        token: w.token,
                        holder_id: self.holder(g),
                        at: w.acquired_at,
                        other: Some((works[e].token, self.holder(e))),
                        evidence,
                        detail,
                    },
                );
            }
            active.push(g);
        }
    }

    /// Renewals surely after one of the grant's end events; the earliest
    /// such end event is the one named.
    fn renew_after_end(&self, out: &mut Vec<Violation>) {
        for &(g, r) in &self.scratch.late_renewals {
            let (g, r) = (g as usize, r as usize);
            let rev = &self.events[r];
            let end = self.scratch.ends_of(g).find(|&e| {
                let eev = &self.events[e];
                rev.ts > eev.ts.saturating_add(self.skew(rev.clock(), eev.clock()))
            });
            let Some(e) = end else { continue };
            let eev = &self.events[e];
            let detail = format!(
                "{} was renewed at {} ({}) after it was {} at {} ({})",
                self.grant_name(g),
                text::time(rev.ts),
                rev.source,
                eev.kind,
                text::time(eev.ts),
                eev.source,
            );
            let w = &self.scratch.works[g];
            self.push(
                out,
                Finding {
                    kind: ViolationKind::RenewAfterEnd,
                    token: w.token,
                    holder_id: self.holder(g),
                    at: rev.ts,
                    other: None,
                    evidence: vec![e, r],
                    detail,
                },
            );
        }
    }

    /// Each `fenced` against the holder's last successful keepalive before
    /// it, both on the holder's monotonic clock.
    fn late_fence(&self, out: &mut Vec<Violation>) {
        for &(g, f) in &self.scratch.fences {
            let f = f as usize;
            let fev = &self.events[f];
            // When it fenced; failing that, when it meant to.
            let (fence_ms, what) = match (Ev::opt(fev.mono_ms), Ev::opt(fev.deadline_mono_ms())) {
                (Some(m), _) => (m, "fenced at"),
                (None, Some(d)) => (d, "set its fence deadline to"),
                (None, None) => continue,
            };
            let last = self
                .scratch
                .keepalives
                .iter()
                .filter(|k| {
                    k.grant == g
                        && k.sent_mono_ms <= fence_ms
                        && self.events[k.event as usize].holder == fev.holder
                })
                .fold(None, |best: Option<&Keepalive>, k| match best {
                    Some(b) if b.sent_mono_ms >= k.sent_mono_ms => Some(b),
                    _ => Some(k),
                });
            let Some((k, ttl)) = last.and_then(|k| Some((k, k.ttl_ms?))) else {
                continue;
            };
            let safe = k.sent_mono_ms + ttl as f64 - 1000.0;
            if fence_ms - safe <= self.tol.late_fence_ms {
                continue;
            }
            let g = g as usize;
            let w = &self.scratch.works[g];
            let detail = format!(
                "holder {} of grant {} {what} {} on its monotonic clock, {} after its safe \
                 deadline {} (last successful keepalive sent at {} + TTL {ttl} ms - 1000 ms), \
                 beyond the {} tolerance",
                self.holder_name(fev.holder),
                w.token,
                text::ms(fence_ms),
                text::ms(fence_ms - safe),
                text::ms(safe),
                text::ms(k.sent_mono_ms),
                text::ms(self.tol.late_fence_ms),
            );
            self.push(
                out,
                Finding {
                    kind: ViolationKind::LateFence,
                    token: w.token,
                    holder_id: self.holder(g),
                    at: fev.ts,
                    other: None,
                    evidence: vec![k.event as usize, f],
                    detail,
                },
            );
        }
    }

    /// Accepted writes, in the resource's time order: stale against tokens
    /// accepted strictly earlier, and after the loss of their grant.
    fn writes(&self, out: &mut Vec<Violation>) {
        let works = &self.scratch.works;
        // The highest token accepted at an earlier timestamp, and the write
        // that first carried it; `group` collects the current timestamp's.
        let mut before: Option<(u64, usize)> = None;
        let mut group: Option<(u64, usize)> = None;
        let mut group_ts = i64::MIN;
        let higher = |a: Option<(u64, usize)>, b: (u64, usize)| match a {
            Some(a) if a.0 >= b.0 => Some(a),
            _ => Some(b),
        };
        for &w in &self.scratch.writes {
            let w = w as usize;
            let ev = &self.events[w];
            let Some(token) = ev.token() else { continue };
            if ev.ts != group_ts {
                if let Some(g) = group.take() {
                    before = higher(before, g);
                }
                group_ts = ev.ts;
            }
            group = higher(group, (token, w));
            let grant = self.scratch.grant_of_token(Some(token));
            let holder = grant
                .and_then(|g| self.holder(g))
                .or_else(|| self.strings.get_opt(ev.holder).cloned());

            if let Some((high, hw)) = before.filter(|&(high, _)| high > token) {
                let other_holder = self
                    .scratch
                    .grant_of_token(Some(high))
                    .and_then(|g| self.holder(g))
                    .or_else(|| self.strings.get_opt(self.events[hw].holder).cloned());
                let detail = format!(
                    "the resource accepted a write with token {token} at {} after it had \
                     already accepted token {high} at {}",
                    text::time(ev.ts),
                    text::time(self.events[hw].ts),
                );
                self.push(
                    out,
                    Finding {
                        kind: ViolationKind::StaleWriteAccepted,
                        token,
                        holder_id: holder.clone(),
                        at: ev.ts,
                        other: Some((high, other_holder)),
                        evidence: vec![hw, w],
                        detail,
                    },
                );
            }

            let Some(g) = grant else { continue };
            let ended = self.surely_after_end(ev.ts, ev.clock(), g);
            let superseded = works
                .get(g + 1)
                .filter(|n| ev.ts > n.acquired_at.saturating_add(self.skew(ev.clock(), n.clock)));
            if !ended && superseded.is_none() {
                continue;
            }
            let mut why = Vec::new();
            let mut evidence = vec![w];
            if let Some((until, cause)) = self.end_of(g).filter(|_| ended) {
                why.push(format!("{} ended at {until} ({cause})", self.grant_name(g)));
                evidence.extend(works[g].cause);
            }
            if let Some(n) = superseded {
                why.push(format!(
                    "{} began at {}",
                    self.grant_name(g + 1),
                    text::time(n.acquired_at)
                ));
                evidence.push(n.acquired);
            }
            let detail = format!(
                "the resource accepted a write with token {token} at {} after {}",
                text::time(ev.ts),
                why.join(" and after "),
            );
            self.push(
                out,
                Finding {
                    kind: ViolationKind::WriteAfterLoss,
                    token,
                    holder_id: holder,
                    at: ev.ts,
                    other: superseded.map(|_| (works[g + 1].token, self.holder(g + 1))),
                    evidence,
                    detail,
                },
            );
        }
    }
}
