//! The incremental engine.

use leaseline_schema::LeaseEvent;

use crate::config::{AuditConfig, Tolerances};
use crate::grant::{Grant, LeaseHolder, Scratch};
use crate::ids::EventIds;
use crate::intern::{Interner, Sym, NONE};
use crate::lease::{LeaseAudit, LeaseState};
use crate::record::{canonical_cmp, Ev};
use crate::violation::{Violation, ViolationChanges};

/// Events logged before they are filed under their leases.
const LOG_BATCH: usize = 4096;

/// Where the event kept for an `event_id` lives.
#[derive(Clone, Copy)]
struct IdInfo {
    lease: Sym,
    fingerprint: u64,
}

/// The audit engine: push events in any order, read grants and violations.
///
/// Every read answers for the set of distinct events pushed so far,
/// whatever their arrival order. Reads take `&mut self` because they first
/// recompute the leases whose events changed since the last read.
pub struct Auditor {
    config: AuditConfig,
    tol: Tolerances,
    /// Lease ids; a lease's symbol is its index in `states`.
    leases: Interner,
    states: Vec<LeaseState>,
    strings: Interner,
    ids: EventIds,
    /// Per `event_id` symbol.
    id_info: Vec<IdInfo>,
    /// Events pushed since the last read, not yet filed under their lease.
    /// A push only appends here: filing each event into its lease at once
    /// would touch a different lease's memory on every push, which costs
    /// more than all the rest of a push.
    log: Vec<Ev>,
    events: usize,
    latest: Option<i64>,
    /// Leases to recompute before the next read.
    dirty: Vec<Sym>,
    /// Leases changed since the last `drain_changes`.
    undrained: Vec<Sym>,
    /// Lease symbols sorted by lease id, for deterministic output order.
    sorted: Vec<Sym>,
    scratch: Scratch,
}

impl Default for Auditor {
    fn default() -> Self {
        Auditor::new(AuditConfig::default())
    }
}

impl Auditor {
    pub fn new(config: AuditConfig) -> Auditor {
        Auditor {
            tol: Tolerances::from(&config),
            config,
            leases: Interner::default(),
            states: Vec::new(),
            strings: Interner::default(),
            ids: EventIds::default(),
            id_info: Vec::new(),
            log: Vec::new(),
            events: 0,
            latest: None,
            dirty: Vec::new(),
            undrained: Vec::new(),
            sorted: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// Distinct events kept (duplicates of an `event_id` count once).
    pub fn len(&self) -> usize {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// The latest event time seen in the whole history (microseconds), the
    /// instant open and lapsed grants are judged at.
    pub fn latest_ts(&self) -> Option<i64> {
        self.latest
    }

    /// Adds one event. Returns false when its `event_id` was already seen:
    /// the event is a duplicate and counts once everywhere. Should two
    /// events share an `event_id` but differ, the one first in canonical
    /// order (lease id, then event content) is kept, so the outcome does not
    /// depend on which arrived first.
    pub fn push(&mut self, event: &LeaseEvent<'_>) -> bool {
        let (lease, new_lease) = self.leases.intern(&event.lease_id);
        if new_lease {
            self.states
                .push(LeaseState::new(self.leases.get(lease).clone()));
        }
        let Some(id) = event.event_id.as_deref() else {
            let ev = Ev::new(event, lease, &mut self.strings, NONE);
            self.append(ev);
            return true;
        };
        let (sym, new_id) = self.ids.intern(id);
        let ev = Ev::new(event, lease, &mut self.strings, sym);
        let fingerprint = ev.fingerprint(self.strings.hasher());
        if new_id {
            self.id_info.push(IdInfo { lease, fingerprint });
            self.append(ev);
            return true;
        }
        if self.id_info[sym as usize].fingerprint != fingerprint {
            self.resolve_conflict(sym, ev, fingerprint);
        }
        false
    }

    fn append(&mut self, ev: Ev) {
        self.latest = Some(self.latest.map_or(ev.ts, |l| l.max(ev.ts)));
        self.events += 1;
        self.log.push(ev);
        // Filed in batches small enough to stay in cache.
        if self.log.len() >= LOG_BATCH {
            self.file_log();
        }
    }

    /// Files the logged events under their leases, marking those leases for
    /// recompute and for the next `drain_changes`.
    fn file_log(&mut self) {
        for ev in self.log.drain(..) {
            let state = &mut self.states[ev.lease as usize];
            state.push(ev);
            if !state.dirty {
                state.dirty = true;
                self.dirty.push(ev.lease);
            }
            if !state.undrained {
                state.undrained = true;
                self.undrained.push(ev.lease);
            }
        }
    }

    fn touch(&mut self, lease: Sym) {
        let state = &mut self.states[lease as usize];
        if !state.dirty {
            state.dirty = true;
            self.dirty.push(lease);
        }
        if !state.undrained {
            state.undrained = true;
            self.undrained.push(lease);
        }
    }

    /// Two different events with one `event_id`: keep the canonically
    /// smaller.
    fn resolve_conflict(&mut self, sym: Sym, ev: Ev, fingerprint: u64) {
        self.file_log();
        let old_lease = self.id_info[sym as usize].lease;
        let old_state = &self.states[old_lease as usize];
        let Some(pos) = old_state.events.iter().position(|e| e.event_id == sym) else {
            return;
        };
        let old = &old_state.events[pos];
        let order = self
            .leases
            .get(ev.lease)
            .cmp(self.leases.get(old_lease))
            .then_with(|| canonical_cmp(&ev, old, &self.strings, &self.ids));
        if order.is_ge() {
            return;
        }
        let old = self.states[old_lease as usize].remove(pos);
        self.events -= 1;
        self.touch(old_lease);
        self.id_info[sym as usize] = IdInfo {
            lease: ev.lease,
            fingerprint,
        };
        self.append(ev);
        if Some(old.ts) == self.latest {
            self.file_log();
            self.latest = self
                .states
                .iter()
                .filter(|s| !s.events.is_empty())
                .map(|s| s.max_ts)
                .max();
        }
    }

    /// Recomputes every lease whose events changed.
    fn refresh(&mut self) {
        self.file_log();
        for lease in std::mem::take(&mut self.dirty) {
            self.recompute(lease);
        }
        if self.sorted.len() != self.states.len() {
            self.sorted = (0..self.states.len() as Sym).collect();
            let states = &self.states;
            self.sorted
                .sort_unstable_by(|&a, &b| states[a as usize].id.cmp(&states[b as usize].id));
        }
    }

    fn recompute(&mut self, lease: Sym) {
        let state = &mut self.states[lease as usize];
        if state.dirty {
            state.recompute(&self.strings, &self.ids, self.tol, &mut self.scratch);
        }
    }

    fn sorted_states(&self) -> impl Iterator<Item = &LeaseState> {
        self.sorted.iter().map(|&l| &self.states[l as usize])
    }

    /// Every grant, ordered by lease id, then acquisition time, then token.
    pub fn timeline(&mut self) -> Vec<Grant> {
        self.refresh();
        let latest = self.latest.unwrap_or(i64::MIN);
        let total = self.states.iter().map(|s| s.grants.len()).sum();
        let mut out = Vec::with_capacity(total);
        for state in self.sorted_states() {
            out.extend(state.grants.iter().map(|g| g.resolve(latest)));
        }
        out
    }

    /// Every violation, ordered by lease id, then time, then kind.
    pub fn violations(&mut self) -> Vec<Violation> {
        self.refresh();
        let mut out = Vec::new();
        for state in self.sorted_states() {
            out.extend(state.violations.iter().cloned());
        }
        out
    }

    /// The last grant (by acquisition time) of every lease that has one,
    /// ordered by lease id, and whether it is still valid.
    pub fn holders(&mut self) -> Vec<LeaseHolder> {
        self.refresh();
        let latest = self.latest.unwrap_or(i64::MIN);
        self.sorted_states()
            .filter_map(|s| s.grants.last())
            .map(|g| {
                let grant = g.resolve(latest);
                LeaseHolder {
                    valid: grant.is_open(),
                    grant,
                }
            })
            .collect()
    }

    /// One lease's grants and violations; `None` when no event names it.
    pub fn lease(&mut self, lease_id: &str) -> Option<LeaseAudit> {
        let lease = self.leases.find(lease_id)?;
        self.file_log();
        self.recompute(lease);
        let latest = self.latest.unwrap_or(i64::MIN);
        let state = &self.states[lease as usize];
        if state.events.is_empty() {
            return None;
        }
        Some(LeaseAudit {
            lease_id: state.id.clone(),
            grants: state.grants.iter().map(|g| g.resolve(latest)).collect(),
            violations: state.violations.clone(),
        })
    }

    /// Lease ids with at least one event, sorted.
    pub fn lease_ids(&mut self) -> Vec<std::sync::Arc<str>> {
        self.refresh();
        self.sorted_states()
            .filter(|s| !s.events.is_empty())
            .map(|s| s.id.clone())
            .collect()
    }

    /// The violations that appeared, and those that went away, since the
    /// previous call (since the start on the first call), each list sorted
    /// like [`Auditor::violations`]. The answer depends only on the sets of
    /// events pushed before this call and before the previous one. Only
    /// leases with new events are compared, so a call costs what changed.
    pub fn drain_changes(&mut self) -> ViolationChanges {
        self.file_log();
        let mut changes = ViolationChanges::default();
        for lease in std::mem::take(&mut self.undrained) {
            self.recompute(lease);
            let state = &mut self.states[lease as usize];
            state.undrained = false;
            diff(&state.drained, &state.violations, &mut changes);
            state.drained.clone_from(&state.violations);
        }
        changes.appeared.sort_unstable();
        changes.retracted.sort_unstable();
        changes
    }
}

/// Merges two sorted lists into what is only in `new` (appeared) and only
/// in `old` (retracted).
fn diff(old: &[Violation], new: &[Violation], out: &mut ViolationChanges) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) => match o.cmp(n) {
                std::cmp::Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => {
                    out.retracted.push(o.clone());
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    out.appeared.push(n.clone());
                    j += 1;
                }
            },
            (Some(o), None) => {
                out.retracted.push(o.clone());
                i += 1;
            }
            (None, Some(n)) => {
                out.appeared.push(n.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
}
