//! What the windowed rules look at: per evaluation step, the acquisition
//! latencies, keepalive outcomes and grants of the events in it.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::Name;

/// Counts of one evaluation step.
#[derive(Default)]
pub(crate) struct Step {
    pub latency: HashMap<Option<Name>, Vec<f64>>,
    pub renew_ok: HashMap<Option<Name>, u64>,
    pub renew_failed: HashMap<Option<Name>, u64>,
    pub lease_grants: HashMap<Name, u32>,
    pub fleet_grants: u32,
}

/// The steps still inside some rule's window, and what they are about.
pub(crate) struct Steps {
    /// Step length, microseconds.
    pub step: i64,
    steps: BTreeMap<i64, Step>,
    /// The first step that saw an event: how much history a baseline has.
    pub first: Option<i64>,
    /// The earliest report of each grant (lease, token), so a grant
    /// reported twice (holder and coordinator) counts once, in the step of
    /// its first report.
    grants: HashMap<(Name, u64), i64>,
    /// The backend a lease was first seen with.
    backends: HashMap<Name, Name>,
}

impl Steps {
    pub fn new(step: i64) -> Steps {
        Steps {
            step,
            steps: BTreeMap::new(),
            first: None,
            grants: HashMap::new(),
            backends: HashMap::new(),
        }
    }

    /// The start of the step `ts` falls in.
    pub fn floor(&self, ts: i64) -> i64 {
        ts.div_euclid(self.step) * self.step
    }

    /// Notes an event at `ts`: history now reaches back to its step.
    pub fn saw(&mut self, ts: i64) {
        let at = self.floor(ts);
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
    }

    /// The step `ts` falls in, created if new.
    pub fn at(&mut self, ts: i64) -> &mut Step {
        let at = self.floor(ts);
        self.steps.entry(at).or_default()
    }

    /// The lease's backend: the event's, or the one the lease was first
    /// seen with when the event names none.
    pub fn backend(&mut self, lease: &Name, named: Option<Name>) -> Option<Name> {
        match named {
            Some(b) => {
                self.backends
                    .entry(lease.clone())
                    .or_insert_with(|| b.clone());
                Some(b)
            }
            None => self.backends.get(lease).cloned(),
        }
    }

    pub fn backend_of(&self, lease: &Name) -> Option<&Name> {
        self.backends.get(lease)
    }

    /// Counts a grant once, at its earliest report, while that report's
    /// step is still open (after `last_eval`). Returns whether this is the
    /// grant's first report.
    pub fn count_grant(&mut self, lease: Name, token: u64, ts: i64, last_eval: i64) -> bool {
        let at = self.floor(ts);
        match self.grants.get(&(lease.clone(), token)).copied() {
            Some(old) if old <= ts => false,
            Some(old) => {
                let old_at = self.floor(old);
                if old_at != at && old_at + self.step > last_eval {
                    if let Some(s) = self.steps.get_mut(&old_at) {
                        s.fleet_grants = s.fleet_grants.saturating_sub(1);
                        if let Some(c) = s.lease_grants.get_mut(&lease) {
                            *c = c.saturating_sub(1);
                        }
                    }
                    let s = self.at(ts);
                    s.fleet_grants += 1;
                    *s.lease_grants.entry(lease.clone()).or_default() += 1;
                }
                self.grants.insert((lease, token), ts);
                false
            }
            None => {
                let s = self.at(ts);
                s.fleet_grants += 1;
                *s.lease_grants.entry(lease.clone()).or_default() += 1;
                self.grants.insert((lease, token), ts);
                true
            }
        }
    }

    /// The steps whose start lies in `range`.
    pub fn range(&self, range: Range<i64>) -> impl Iterator<Item = &Step> {
        self.steps.range(range).map(|(_, s)| s)
    }

    /// The start of the first step at or after `from` that holds data.
    pub fn first_from(&self, from: i64) -> Option<i64> {
        self.steps.range(from..).next().map(|(s, _)| *s)
    }

    /// Drops the steps before `floor`, and (every so often, as the
    /// caller decides) grants first reported before `grant_horizon`: a
    /// second report of a grant comes within seconds.
    pub fn prune(&mut self, floor: i64, grant_horizon: Option<i64>) {
        while let Some((&s, _)) = self.steps.first_key_value() {
            if s >= floor {
                break;
            }
            self.steps.pop_first();
        }
        if let Some(h) = grant_horizon {
            self.grants.retain(|_, ts| *ts >= h);
        }
    }

    #[cfg(test)]
    pub fn grants_len(&self) -> usize {
        self.grants.len()
    }
}
