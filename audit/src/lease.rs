//! One lease's events and what was last derived from them.

use std::sync::Arc;

use serde::Serialize;

use crate::config::Tolerances;
use crate::derive::Scratch;
use crate::detect::Detect;
use crate::grant::{CachedGrant, Grant};
use crate::ids::EventIds;
use crate::intern::{Interner, Sym};
use crate::record::{canonical_cmp, Ev};
use crate::violation::Violation;

/// One lease's audit: its grants in acquisition order and its violations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseAudit {
    #[serde(serialize_with = "crate::ser::arc")]
    pub lease_id: Arc<str>,
    pub grants: Vec<Grant>,
    pub violations: Vec<Violation>,
}

/// `repr(C)` keeps the fields a push touches in the first cache line.
#[derive(Clone)]
#[repr(C)]
pub(crate) struct LeaseState {
    /// De-duplicated events; the first `sorted_len` are in canonical order,
    /// the rest arrived since the last recompute.
    pub events: Vec<Ev>,
    pub max_ts: i64,
    sorted_len: usize,
    /// Events changed since the last recompute.
    pub dirty: bool,
    /// Events changed since the last `drain_changes`.
    pub undrained: bool,
    /// In the auditor's list of leases to recompute at the next refresh.
    /// Apart from `dirty`: a lease recomputed outside a refresh (by
    /// `drain_changes`, a settle, one lease's answer) is no longer dirty
    /// but still listed, and must not be listed again when next touched.
    pub listed: bool,
    pub id: Arc<str>,
    pub grants: Vec<CachedGrant>,
    pub violations: Vec<Violation>,
    /// The violations as of the last `drain_changes`.
    pub drained: Vec<Violation>,
    /// Rows before this time were settled (`crate::settle`); `i64::MIN`
    /// until the first cut.
    pub cut: i64,
    /// The range of tokens of the settled events, if any.
    pub settled: Option<(u64, u64)>,
    /// Holders of settled grants.
    pub settled_holders: Vec<Sym>,
    /// Holders of the grants from the cut on, and when each acquired.
    pub holders_from_cut: Vec<(Sym, i64)>,
    /// Distinct events ever filed here, settled ones included.
    pub count: usize,
    /// Given an event that changes what was settled: not settled again
    /// until replayed.
    pub stale: bool,
    /// Settled rows the auditor keeps answering
    /// ([`crate::Auditor::settle_keeping`]): what a grant costs as a row
    /// rather than as its events.
    pub kept_grants: Vec<Grant>,
    pub kept_violations: Vec<Violation>,
}

impl LeaseState {
    pub fn new(id: Arc<str>) -> LeaseState {
        LeaseState {
            id,
            events: Vec::new(),
            sorted_len: 0,
            max_ts: i64::MIN,
            dirty: false,
            undrained: false,
            listed: false,
            grants: Vec::new(),
            violations: Vec::new(),
            drained: Vec::new(),
            cut: i64::MIN,
            settled: None,
            settled_holders: Vec::new(),
            holders_from_cut: Vec::new(),
            count: 0,
            stale: false,
            kept_grants: Vec::new(),
            kept_violations: Vec::new(),
        }
    }

    /// Forgets every event and what was settled, for a replay of the whole
    /// history; the violations drained so far stay.
    pub fn reset(&mut self) {
        let drained = std::mem::take(&mut self.drained);
        let (dirty, undrained, listed) = (self.dirty, self.undrained, self.listed);
        *self = LeaseState::new(self.id.clone());
        self.drained = drained;
        self.dirty = dirty;
        self.undrained = undrained;
        self.listed = listed;
    }

    /// Declares the events in canonical order.
    pub fn mark_sorted(&mut self) {
        self.sorted_len = self.events.len();
    }

    pub fn push(&mut self, ev: Ev) {
        self.count += 1;
        self.max_ts = self.max_ts.max(ev.ts);
        if self.events.len() == self.events.capacity() {
            // Leases see many events: skip the smallest reallocations.
            self.events.reserve(self.events.len().max(16));
        }
        self.events.push(ev);
    }

    /// Gives back what the lease's vectors hold beyond their contents.
    /// [`LeaseState::push`] grows by at least 16 events, so a lease of a
    /// few events that has gone quiet would keep most of a kilobyte empty
    /// for as long as the process runs; a fleet that names a new lease per
    /// job leaves one such lease per job.
    pub fn shrink(&mut self) {
        self.events.shrink_to_fit();
        self.grants.shrink_to_fit();
        self.violations.shrink_to_fit();
        self.drained.shrink_to_fit();
        self.settled_holders.shrink_to_fit();
        self.holders_from_cut.shrink_to_fit();
    }

    pub fn remove(&mut self, pos: usize) -> Ev {
        self.count -= 1;
        let ev = self.events.remove(pos);
        if pos < self.sorted_len {
            self.sorted_len -= 1;
        }
        if ev.ts == self.max_ts {
            self.max_ts = self.events.iter().map(|e| e.ts).max().unwrap_or(i64::MIN);
        }
        ev
    }

    pub fn recompute(
        &mut self,
        strings: &Interner,
        ids: &EventIds,
        tol: Tolerances,
        scratch: &mut Scratch,
    ) {
        self.sort(strings, ids);
        scratch.derive_grants(&self.events, tol.skew_us);
        self.grants = scratch.grants(&self.id, &self.events, strings);
        self.violations.clear();
        Detect {
            lease_id: &self.id,
            events: &self.events,
            scratch,
            strings,
            ids,
            tol,
        }
        .run(&mut self.violations);
        if self.cut > i64::MIN {
            // The rows before the cut were handed out when it was taken;
            // the context's are among them.
            let cut = self.cut;
            self.grants.retain(|g| g.grant.acquired_at >= cut);
            self.violations.retain(|v| v.at >= cut);
            self.holders_from_cut = crate::settle::holders_from(scratch, cut);
        }
        self.dirty = false;
    }

    /// Streams mostly append in time order, so sorting the new tail and
    /// checking that it follows the sorted part makes the common recompute
    /// linear; only a late arrival pays for a merge.
    fn sort(&mut self, strings: &Interner, ids: &EventIds) {
        let cmp = |a: &Ev, b: &Ev| canonical_cmp(a, b, strings, ids);
        let (sorted, tail) = self.events.split_at_mut(self.sorted_len);
        if !insertion_sort(tail, cmp, 4 * tail.len() + 16) {
            tail.sort_unstable_by(cmp);
        }
        if let (Some(last), Some(first)) = (sorted.last(), tail.first()) {
            if cmp(last, first).is_gt() {
                // Two sorted runs: the stable sort merges them in linear time.
                self.events.sort_by(cmp);
            }
        }
        self.sorted_len = self.events.len();
    }
}

/// Sorts `v` by insertion, giving up (false) after `budget` moves. Events
/// arrive nearly in time order, where this is linear; anything more shuffled
/// falls back to a general sort.
fn insertion_sort<T: Copy>(
    v: &mut [T],
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
    mut budget: usize,
) -> bool {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && cmp(&v[j - 1], &x).is_gt() {
            if budget == 0 {
                v[j] = x;
                return false;
            }
            budget -= 1;
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
    true
}
