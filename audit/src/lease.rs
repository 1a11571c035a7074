//! One lease's events and what was last derived from them.

use std::sync::Arc;

use serde::Serialize;

use crate::config::Tolerances;
use crate::grant::{CachedGrant, Grant, Scratch};
use crate::ids::EventIds;
use crate::intern::Interner;
use crate::record::{canonical_cmp, Ev};
use crate::violation::{Detect, Violation};

/// One lease's audit: its grants in acquisition order and its violations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseAudit {
    pub lease_id: Arc<str>,
    pub grants: Vec<Grant>,
    pub violations: Vec<Violation>,
}

pub(crate) struct LeaseState {
    pub id: Arc<str>,
    /// De-duplicated events; the first `sorted_len` are in canonical order,
    /// the rest arrived since the last recompute.
    pub events: Vec<Ev>,
    sorted_len: usize,
    pub max_ts: i64,
    /// Events changed since the last recompute.
    pub dirty: bool,
    /// Events changed since the last `drain_changes`.
    pub undrained: bool,
    pub grants: Vec<CachedGrant>,
    pub violations: Vec<Violation>,
    /// The violations as of the last `drain_changes`.
    pub drained: Vec<Violation>,
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
            grants: Vec::new(),
            violations: Vec::new(),
            drained: Vec::new(),
        }
    }

    pub fn push(&mut self, ev: Ev) {
        self.max_ts = self.max_ts.max(ev.ts);
        self.events.push(ev);
    }

    pub fn remove(&mut self, pos: usize) -> Ev {
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
        self.dirty = false;
    }

    /// Streams mostly append in time order, so sorting the new tail and
    /// checking that it follows the sorted part makes the common recompute
    /// linear; only a late arrival pays for a merge.
    fn sort(&mut self, strings: &Interner, ids: &EventIds) {
        let cmp = |a: &Ev, b: &Ev| canonical_cmp(a, b, strings, ids);
        let (sorted, tail) = self.events.split_at_mut(self.sorted_len);
        tail.sort_unstable_by(cmp);
        if let (Some(last), Some(first)) = (sorted.last(), tail.first()) {
            if cmp(last, first).is_gt() {
                // Two sorted runs: the stable sort merges them in linear time.
                self.events.sort_by(cmp);
            }
        }
        self.sorted_len = self.events.len();
    }
}
