//! What the windowed rules look at: per evaluation step, the acquisition
//! latencies, keepalive outcomes and grants of the events in it.
//!
//! The token-churn rule reads each lease's grants over its baseline window
//! (an hour by default), that is over hundreds of steps, each naming most
//! of a busy fleet's leases. A step's grants per lease are counted in a map
//! while the step is open (not evaluated yet: a grant's second report may
//! still move it); once the engine has evaluated past it, they become a
//! sorted list of (lease number, count), 8 bytes a lease rather than a map
//! entry of about 40, with one [`LeaseNumbers`] table for every step. A
//! late grant reported into a closed step is inserted into its list.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::Name;

/// Counts of one evaluation step.
#[derive(Default)]
pub(crate) struct Step {
    pub latency: HashMap<Option<Name>, Vec<f64>>,
    pub renew_ok: HashMap<Option<Name>, u64>,
    pub renew_failed: HashMap<Option<Name>, u64>,
    lease_grants: LeaseGrants,
    pub fleet_grants: u32,
}

impl Step {
    /// An empty step; a closed one keeps its grants as a list.
    fn new(closed: bool) -> Step {
        Step {
            lease_grants: if closed {
                LeaseGrants::Closed(Vec::new())
            } else {
                LeaseGrants::Open(HashMap::new())
            },
            ..Step::default()
        }
    }
}

/// A step's grants per lease: see the module docs.
enum LeaseGrants {
    Open(HashMap<Name, u32>),
    /// (lease number, grants), sorted by number.
    Closed(Vec<(u32, u32)>),
}

impl Default for LeaseGrants {
    fn default() -> Self {
        LeaseGrants::Open(HashMap::new())
    }
}

/// The numbers closed steps name leases by. A number is given back once
/// the last step that uses it is pruned, so the table holds the leases of
/// the steps kept, not of the whole history.
#[derive(Default)]
struct LeaseNumbers {
    of: HashMap<Name, u32>,
    /// By number: the lease, and the newest step that names it.
    names: Vec<(Option<Name>, i64)>,
    free: Vec<u32>,
}

impl LeaseNumbers {
    /// `lease`'s number, noting that the step at `step` names it.
    fn number(&mut self, lease: &Name, step: i64) -> u32 {
        if let Some(&n) = self.of.get(lease) {
            let newest = &mut self.names[n as usize].1;
            *newest = (*newest).max(step);
            return n;
        }
        let n = match self.free.pop() {
            Some(n) => {
                self.names[n as usize] = (Some(lease.clone()), step);
                n
            }
            None => {
                self.names.push((Some(lease.clone()), step));
                (self.names.len() - 1) as u32
            }
        };
        self.of.insert(lease.clone(), n);
        n
    }

    fn name(&self, n: u32) -> &Name {
        self.names[n as usize]
            .0
            .as_ref()
            .expect("a closed step names only numbers in use")
    }

    /// Gives back the numbers no step from `floor` on names.
    fn release_before(&mut self, floor: i64) {
        for (n, (lease, newest)) in self.names.iter_mut().enumerate() {
            if *newest < floor {
                if let Some(l) = lease.take() {
                    self.of.remove(&l);
                    self.free.push(n as u32);
                }
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.of.len()
    }
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
    /// Steps before this are closed: evaluated, their grants in lists.
    closed_before: i64,
    numbers: LeaseNumbers,
}

impl Steps {
    pub fn new(step: i64) -> Steps {
        Steps {
            step,
            steps: BTreeMap::new(),
            first: None,
            grants: HashMap::new(),
            backends: HashMap::new(),
            closed_before: i64::MIN,
            numbers: LeaseNumbers::default(),
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
        let closed = at < self.closed_before;
        self.steps.entry(at).or_insert_with(|| Step::new(closed))
    }

    /// Adds `by` (1 or -1) to `lease`'s grants in the step `ts` falls in,
    /// and to the fleet's.
    fn add_grant(&mut self, lease: &Name, ts: i64, by: i32) {
        let at = self.floor(ts);
        let closed = at < self.closed_before;
        let s = self.steps.entry(at).or_insert_with(|| Step::new(closed));
        s.fleet_grants = s.fleet_grants.saturating_add_signed(by);
        match &mut s.lease_grants {
            LeaseGrants::Open(m) if by < 0 => {
                if let Some(c) = m.get_mut(lease) {
                    *c = c.saturating_add_signed(by);
                }
            }
            LeaseGrants::Open(m) => {
                let c = m.entry(lease.clone()).or_default();
                *c = c.saturating_add_signed(by);
            }
            LeaseGrants::Closed(v) => {
                let n = self.numbers.number(lease, at);
                match v.binary_search_by_key(&n, |e| e.0) {
                    Ok(i) => v[i].1 = v[i].1.saturating_add_signed(by),
                    Err(i) => v.insert(i, (n, by.max(0) as u32)),
                }
            }
        }
    }

    /// The grants of each lease in each step starting in `range`, a lease
    /// once per step that has any.
    pub fn lease_grants(&self, range: Range<i64>) -> impl Iterator<Item = (&Name, u32)> {
        self.steps.range(range).flat_map(
            move |(_, s)| -> Box<dyn Iterator<Item = (&Name, u32)> + '_> {
                match &s.lease_grants {
                    LeaseGrants::Open(m) => Box::new(m.iter().map(|(l, n)| (l, *n))),
                    LeaseGrants::Closed(v) => {
                        Box::new(v.iter().map(|&(l, n)| (self.numbers.name(l), n)))
                    }
                }
            },
        )
    }

    /// Closes the steps before `boundary` (the engine evaluated them): no
    /// grant moves out of them any more, so their grants become lists.
    pub fn close_before(&mut self, boundary: i64) {
        if boundary <= self.closed_before {
            return;
        }
        let numbers = &mut self.numbers;
        for (&at, s) in self.steps.range_mut(self.closed_before..boundary) {
            if let LeaseGrants::Open(m) = &mut s.lease_grants {
                let mut v: Vec<(u32, u32)> = m
                    .drain()
                    .map(|(l, n)| (numbers.number(&l, at), n))
                    .collect();
                v.sort_unstable();
                s.lease_grants = LeaseGrants::Closed(v);
            }
        }
        self.closed_before = boundary;
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
                    if self.steps.contains_key(&old_at) {
                        self.add_grant(&lease, old, -1);
                    }
                    self.add_grant(&lease, ts, 1);
                }
                self.grants.insert((lease, token), ts);
                false
            }
            None => {
                self.add_grant(&lease, ts, 1);
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
        let mut pruned = false;
        while let Some((&s, _)) = self.steps.first_key_value() {
            if s >= floor {
                break;
            }
            self.steps.pop_first();
            pruned = true;
        }
        if pruned {
            self.numbers.release_before(floor);
        }
        if let Some(h) = grant_horizon {
            self.grants.retain(|_, ts| *ts >= h);
        }
    }

    #[cfg(test)]
    pub fn grants_len(&self) -> usize {
        self.grants.len()
    }

    #[cfg(test)]
    pub fn numbered_leases(&self) -> usize {
        self.numbers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const STEP: i64 = 10_000_000;

    fn counts(steps: &Steps, range: Range<i64>) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for (l, n) in steps.lease_grants(range) {
            *out.entry(l.to_string()).or_default() += n;
        }
        out
    }

    fn grant(steps: &mut Steps, lease: &str, token: u64, ts: i64, last_eval: i64) -> bool {
        steps.count_grant(Arc::from(lease), token, ts, last_eval)
    }

    #[test]
    fn closed_steps_answer_as_open_ones_and_take_late_grants() {
        let mut s = Steps::new(STEP);
        let open = i64::MIN;
        assert!(grant(&mut s, "a", 1, 0, open));
        assert!(grant(&mut s, "b", 1, 1, open));
        assert!(grant(&mut s, "a", 2, STEP, open));
        // A second report, earlier: the grant moves to its step.
        assert!(grant(&mut s, "b", 2, STEP + 5, open));
        assert!(!grant(&mut s, "b", 2, 7, open));
        let before = (counts(&s, 0..STEP), counts(&s, STEP..2 * STEP));
        let want = |pairs: &[(&str, u32)]| -> BTreeMap<String, u32> {
            pairs.iter().map(|(l, n)| (l.to_string(), *n)).collect()
        };
        assert_eq!(before.0, want(&[("a", 1), ("b", 2)]));
        // The moved grant leaves its lease at 0 in the later step.
        assert_eq!(before.1, want(&[("a", 1), ("b", 0)]));
        s.close_before(2 * STEP);
        assert_eq!((counts(&s, 0..STEP), counts(&s, STEP..2 * STEP)), before);
        // Late first reports into a closed step, one of a lease it had.
        assert!(grant(&mut s, "c", 1, 5, 2 * STEP));
        assert!(grant(&mut s, "a", 3, 6, 2 * STEP));
        assert_eq!(counts(&s, 0..STEP), want(&[("a", 2), ("b", 2), ("c", 1)]));
        let fleet: u32 = s.range(0..2 * STEP).map(|st| st.fleet_grants).sum();
        assert_eq!(fleet, 6);
    }

    #[test]
    fn a_lease_number_is_given_back_once_its_steps_are_pruned() {
        let mut s = Steps::new(STEP);
        for l in 0..100 {
            grant(&mut s, &format!("early-{l}"), 1, 0, i64::MIN);
        }
        for k in 1..10 {
            grant(&mut s, "steady", k as u64, k * STEP, i64::MIN);
        }
        s.close_before(10 * STEP);
        assert_eq!(s.numbered_leases(), 101);
        s.prune(5 * STEP, None);
        assert_eq!(s.numbered_leases(), 1);
        assert_eq!(
            counts(&s, 0..10 * STEP),
            BTreeMap::from([("steady".to_string(), 5)])
        );
        // A number given back is used again.
        grant(&mut s, "late", 1, 6 * STEP + 1, 10 * STEP);
        assert_eq!(s.numbered_leases(), 2);
        assert_eq!(counts(&s, 6 * STEP..7 * STEP).len(), 2);
    }
}
