//! Settling: how a long-running auditor lets go of history and stays
//! exact.
//!
//! A lease's old grants stop changing once the events that could change
//! them can no longer arrive. [`crate::Auditor::settle`] hands their rows
//! (grants and violations) to the caller, who keeps them (the stored audit
//! tables), and drops their events from memory. What stays answers for the
//! rest, so that the rows handed out before plus the rows the auditor
//! answers now are, at every moment, the rows an auditor holding the whole
//! history would answer.
//!
//! # The cut
//!
//! A lease is settled up to a time `T`, its *cut*: the rows about what
//! happened before `T` (a grant's `acquired_at`, a violation's `at`) are
//! handed out, those from `T` on stay. A cut at `T` is taken only when:
//!
//! 1. `T <= cutoff`, the caller's watermark minus its lateness horizon:
//!    the caller expects no event older than that any more;
//! 2. every token's events (a grant's, or an orphan token's) are all before
//!    `T` or all from `T` on, and so is every tokenless `renew_failed` with
//!    the grant it counts against: no grant straddles the cut;
//! 3. the last event before `T` is more than the clock-skew tolerance
//!    before `T`, so every comparison across the cut ("surely earlier",
//!    "surely after its end") is decided by the order alone;
//! 4. every grant before `T` stopped being valid more than the skew
//!    tolerance before `T`, but those that never stop (neither an end
//!    event nor a TTL): no other overlap can reach across, and no settled
//!    end kind depends on the latest time seen any more;
//! 5. the lease's last grant is after `T`: `lease_holders` keeps answering
//!    from memory.
//!
//! The latest such `T` is taken.
//!
//! # What stays in memory
//!
//! The events from `T` on, and a few before it that the detectors read
//! across the cut (the *context*):
//! - every event of the grant with the highest token before `T`:
//!   `token_regression` judges each later grant against it;
//! - every event of each grant before `T` that never ends: each later
//!   grant overlaps it (a protocol fault, so these are few);
//! - the first `write_accepted` carrying the highest token accepted before
//!   `T`: `stale_write_accepted` judges each later write against it.
//!
//! Given conditions 2 to 4, nothing else before the cut changes a row from
//! `T` on; the context's own rows are before `T` and are not answered
//! again (a lease's rows are filtered at its cut when recomputed).
//!
//! # What the cut cannot absorb
//!
//! An event that would change a settled row marks its lease *stale*
//! ([`crate::Auditor::take_stale`]): one older than the cut, one carrying
//! a token in the range of tokens settled, or a tokenless `renew_failed`
//! of a holder whose grant before the cut it would count against (it has
//! no grant of its own from the cut on). The test is a superset (a token
//! range, not a set), which costs a needless reload at worst. The caller
//! then replays the lease's whole history from the lake
//! ([`crate::Auditor::reload`]), and the next settle hands out all of its
//! rows again, marked as replacing what was handed out before.

use crate::config::Tolerances;
use crate::derive::Scratch;
use crate::ids::EventIds;
use crate::intern::{Interner, Sym};
use crate::lease::LeaseState;
use crate::record::Ev;
use crate::violation::Violation;
use leaseline_schema::Kind;

/// Where a lease's events are cut, and which events before it stay.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Events before this position are settled.
    pub index: usize,
    /// The cut's time: the first remaining event's.
    pub ts: i64,
    /// Positions before `index` kept as context, ascending.
    pub context: Vec<usize>,
}

/// The latest cut of a lease at or before `cutoff`, past `after`; `None`
/// when there is none. `events` are the lease's events in canonical order
/// and `scratch` holds the grants derived from them.
pub(crate) fn find_cut(
    events: &[Ev],
    scratch: &Scratch,
    tol: Tolerances,
    cutoff: i64,
    after: i64,
) -> Option<Cut> {
    let works = &scratch.works;
    // Condition 5: the last grant's acquisition bounds the cut.
    let last_acquired = works.iter().map(|w| w.acquired).max()?;
    // The last position of each token's events (condition 2).
    let mut last_of: hashbrown::HashMap<u64, usize> = hashbrown::HashMap::new();
    for (i, ev) in events.iter().enumerate() {
        if let Some(t) = ev.token() {
            last_of.insert(t, i);
        }
    }
    // The earliest acquisition, from each position on, of a grant that a
    // tokenless `renew_failed` there counts against: a cut after that
    // acquisition would settle the grant while the event stays.
    let mut attributed = vec![usize::MAX; events.len() + 1];
    for (j, ev) in events.iter().enumerate().rev() {
        let mut earliest = attributed[j + 1];
        if ev.kind == Kind::RenewFailed && ev.token().is_none() {
            if let Some(g) = scratch.attribute(ev, tol.skew_us) {
                earliest = earliest.min(works[g].acquired);
            }
        }
        attributed[j] = earliest;
    }
    let mut best = None;
    let mut needed = 0; // every position before this is a prefix token's
    let mut valid_until = i64::MIN; // the latest end of a prefix grant
    for i in 1..=last_acquired.min(events.len() - 1) {
        let prev = &events[i - 1];
        if let Some(t) = prev.token() {
            needed = needed.max(last_of[&t] + 1);
            if let Some(until) = scratch
                .grant_of_token(Some(t))
                .and_then(|g| works[g].valid_until)
            {
                valid_until = valid_until.max(until);
            }
        }
        let ts = events[i].ts;
        if ts > cutoff {
            break;
        }
        let quiet = prev.ts.saturating_add(tol.skew_us) < ts;
        let ended = valid_until.saturating_add(tol.skew_us) < ts;
        if needed <= i && quiet && ended && attributed[i] >= i && ts > after {
            best = Some((i, ts));
        }
    }
    let (index, ts) = best?;
    Some(Cut {
        index,
        ts,
        context: context(events, scratch, index),
    })
}

/// The context kept from the events before position `index`.
fn context(events: &[Ev], scratch: &Scratch, index: usize) -> Vec<usize> {
    let mut keep = Vec::new();
    // The grant with the highest token (tokens are one grant each).
    let top =
        scratch
            .works
            .iter()
            .filter(|w| w.acquired < index)
            .fold(None, |best: Option<u64>, w| match best {
                Some(b) if b >= w.token => Some(b),
                _ => Some(w.token),
            });
    // With the grants that never end (no end event, no TTL): every later
    // grant overlaps them.
    let kept: Vec<u64> = scratch
        .works
        .iter()
        .filter(|w| w.acquired < index && (Some(w.token) == top || w.valid_until.is_none()))
        .map(|w| w.token)
        .collect();
    keep.extend((0..index).filter(|&i| events[i].token().is_some_and(|t| kept.contains(&t))));
    // The first accepted write with the highest token.
    let mut write: Option<(u64, usize)> = None;
    for (i, ev) in events[..index].iter().enumerate() {
        if let (Kind::WriteAccepted, Some(t)) = (ev.kind, ev.token()) {
            if write.is_none_or(|(best, _)| t > best) {
                write = Some((t, i));
            }
        }
    }
    if let Some((_, i)) = write {
        keep.push(i);
    }
    keep.sort_unstable();
    keep.dedup();
    keep
}

impl LeaseState {
    /// Whether `ev`, about to be added, would change a row settled before
    /// this lease's cut (see the module doc).
    pub(crate) fn would_unsettle(&self, ev: &Ev, tol: Tolerances) -> bool {
        if self.cut == i64::MIN {
            return false;
        }
        if ev.ts < self.cut {
            return true;
        }
        if let Some(t) = ev.token() {
            return self.settled.is_some_and(|(lo, hi)| lo <= t && t <= hi);
        }
        if ev.kind != Kind::RenewFailed || !self.settled_holders.contains(&ev.holder) {
            return false;
        }
        // It counts against its holder's latest grant acquired by then:
        // one from the cut on, unless there is none.
        let limit = ev.ts.saturating_add(tol.skew_us);
        !self
            .holders_from_cut
            .iter()
            .any(|&(h, at)| h == ev.holder && at <= limit)
    }

    /// Settles the lease at exactly `cut` if the events it holds allow
    /// that cut (found as [`crate::Auditor::settle`] finds one), dropping
    /// its rows from before it; returns the violations dropped. The lease
    /// is left to be recomputed (`dirty`) unless the cut dropped no event.
    pub(crate) fn cut_at(
        &mut self,
        cut: i64,
        strings: &Interner,
        ids: &EventIds,
        tol: Tolerances,
        scratch: &mut Scratch,
    ) -> Option<Vec<Violation>> {
        if self.stale || self.events.is_empty() || self.cut >= cut {
            return None;
        }
        self.recompute(strings, ids, tol, scratch);
        let found = find_cut(&self.events, scratch, tol, cut, self.cut).filter(|c| c.ts == cut)?;
        let dropped = self
            .violations
            .iter()
            .filter(|v| v.at < cut)
            .cloned()
            .collect();
        // A reader of the stored rows holds only the context before the
        // cut, so the cut keeps every event: the answers just derived from
        // them stand, filtered at the cut, and the lease needs no second
        // derivation (it was half of a stored read's resume).
        let keeps_all = found.context.len() == found.index;
        self.apply_cut(found, scratch);
        if keeps_all {
            self.grants.retain(|g| g.grant.acquired_at >= cut);
            self.violations.retain(|v| v.at >= cut);
            self.holders_from_cut = holders_from(scratch, cut);
            self.dirty = false;
        }
        // Kept rows are before any cut, so before this one: stored.
        self.kept_grants = Vec::new();
        self.kept_violations = Vec::new();
        Some(dropped)
    }

    /// Takes the cut: drops the settled events but the context, and
    /// records what [`LeaseState::would_unsettle`] tests.
    pub(crate) fn apply_cut(&mut self, cut: Cut, scratch: &Scratch) {
        let settled = &self.events[..cut.index];
        for ev in settled {
            if let Some(t) = ev.token() {
                self.settled = Some(match self.settled {
                    Some((lo, hi)) => (lo.min(t), hi.max(t)),
                    None => (t, t),
                });
            }
        }
        for w in scratch.works.iter().filter(|w| w.acquired < cut.index) {
            if !self.settled_holders.contains(&w.holder) {
                self.settled_holders.push(w.holder);
            }
        }
        // A cut that keeps every event before it as context (a reader of
        // the stored rows) leaves the events as they are.
        if cut.context.len() < cut.index {
            let mut kept: Vec<Ev> = cut.context.iter().map(|&i| self.events[i]).collect();
            kept.extend_from_slice(&self.events[cut.index..]);
            kept.shrink_to_fit();
            self.events = kept;
        }
        self.mark_sorted();
        self.cut = cut.ts;
        self.drained.retain(|v| v.at >= cut.ts);
        self.dirty = true;
    }
}

/// The holders of the grants from the cut on, with their acquisition
/// times, for [`LeaseState::would_unsettle`].
pub(crate) fn holders_from(scratch: &Scratch, cut: i64) -> Vec<(Sym, i64)> {
    scratch
        .works
        .iter()
        .filter(|w| w.acquired_at >= cut)
        .map(|w| (w.holder, w.acquired_at))
        .collect()
}
