//! How much event time a long-running audit keeps as events: its
//! configured window, narrowed while that window holds more events than
//! its budget.
//!
//! A window of event time costs memory in proportion to the fleet's event
//! rate: ten minutes of a fleet of 20,000 leases renewing every two seconds
//! is some 17 M events, and a backlog read at catch-up can hold more. So
//! the window is also bounded by a number of events held
//! ([`crate::AuditConfig::max_events_held`]).
//!
//! The rule ([`HeldWindow::settled`], a pure step):
//! - after a settle that leaves more events held than the budget, the
//!   window halves (down to [`MIN_WIDTH_US`]) and the caller settles again
//!   at once at the narrower cutoff;
//! - after a settle that leaves fewer than half the budget, the window
//!   doubles, up to the configured width;
//! - otherwise it stays.
//!
//! A settle is a pass over every lease and the events it holds, due each
//! time the clock has moved half the window. Narrowed, that is often: at
//! the floor, twice a second of event time. When the events held are
//! those of grants still open, no narrowing brings them under the budget,
//! and a settle at each of those steps would let go of the few grants
//! that ended in between at the price of the whole pass (measured: a
//! serve --ingest whose 320,000 leases held 4.3 M events spent its alert
//! engine on settling and storing, and took in a fifth fewer events in
//! five minutes; BENCHMARKS.md). So
//! while narrowed, a settle is worth its pass ([`HeldWindow::worth_settling`])
//! only once an eighth of the budget more events came in since the last
//! one left what it held, or half the configured window of event time
//! went by: a pass then comes at most once per that many events, and the
//! events held exceed what settling at every step would hold by an eighth
//! of the budget at most.
//!
//! Narrowing never costs exactness: an event older than what its lease let
//! go of makes the lease stale, and the lease is audited again from the
//! lake (`settle.rs`). It costs those re-reads when events come later than
//! the narrowed window, and a reader of the stored rows has less to audit.

use std::time::Duration;

/// The narrowest window: below it, a fleet's renewals straddle every cut.
pub const MIN_WIDTH_US: i64 = 1_000_000;

/// The event time kept as events, behind the audit's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldWindow {
    configured_us: i64,
    width_us: i64,
    budget: usize,
    /// The events the last settle left held, and its cutoff.
    left: usize,
    last_cutoff: i64,
}

impl HeldWindow {
    /// `window` as configured (none for zero: everything is kept) and the
    /// budget of events held (zero: no budget).
    pub fn new(window: Duration, budget: usize) -> Option<HeldWindow> {
        let us = i64::try_from(window.as_micros()).unwrap_or(i64::MAX);
        (us > 0).then_some(HeldWindow {
            configured_us: us,
            width_us: us,
            budget,
            left: 0,
            last_cutoff: i64::MIN,
        })
    }

    /// The width now, in microseconds.
    pub fn width_us(&self) -> i64 {
        self.width_us
    }

    /// Settles behind `now`: `settle(cutoff)` settles at a cutoff and
    /// returns the events then held. It is called at `cutoff`, then again
    /// at `now` less each narrower window while over the budget. Returns
    /// the last cutoff.
    pub fn settle_behind(
        &mut self,
        now: i64,
        mut cutoff: i64,
        mut settle: impl FnMut(i64) -> usize,
    ) -> i64 {
        loop {
            let held = settle(cutoff);
            self.left = held;
            self.last_cutoff = cutoff;
            if !self.settled(held) {
                return cutoff;
            }
            cutoff = now.saturating_sub(self.width_us);
        }
    }

    /// Whether a settle at `cutoff`, with `held` events held, is worth its
    /// pass: always at the configured width; narrowed, once the events
    /// held grew by an eighth of the budget over what the last settle
    /// left, or half the configured window went by since its cutoff (see
    /// the module docs).
    pub fn worth_settling(&self, cutoff: i64, held: usize) -> bool {
        self.width_us >= self.configured_us
            || held >= self.left.saturating_add(self.budget / 8)
            || cutoff >= self.last_cutoff.saturating_add(self.configured_us / 2)
    }

    /// After a settle that left `held` events: true when the window was
    /// narrowed and the caller should settle again at the new width.
    pub fn settled(&mut self, held: usize) -> bool {
        if self.budget == 0 {
            return false;
        }
        if held > self.budget && self.width_us > MIN_WIDTH_US {
            self.width_us = (self.width_us / 2).max(MIN_WIDTH_US);
            return true;
        }
        if held < self.budget / 2 && self.width_us < self.configured_us {
            self.width_us = self.width_us.saturating_mul(2).min(self.configured_us);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60 * 1_000_000;

    #[test]
    fn a_zero_window_keeps_everything() {
        assert_eq!(HeldWindow::new(Duration::ZERO, 10), None);
    }

    #[test]
    fn over_the_budget_halves_down_to_the_floor_and_asks_for_another_settle() {
        let mut w = HeldWindow::new(Duration::from_secs(600), 1_000).unwrap();
        assert_eq!(w.width_us(), 10 * MIN);
        assert!(w.settled(1_001));
        assert_eq!(w.width_us(), 5 * MIN);
        let mut steps = 1;
        while w.settled(5_000) {
            steps += 1;
        }
        assert_eq!(w.width_us(), MIN_WIDTH_US);
        assert_eq!(steps, 10, "600 s halves to 1 s in ten steps");
        // At the floor, more events held ask for nothing more.
        assert!(!w.settled(1_000_000));
        assert_eq!(w.width_us(), MIN_WIDTH_US);
    }

    #[test]
    fn under_half_the_budget_doubles_back_to_the_configured_width() {
        let mut w = HeldWindow::new(Duration::from_secs(600), 1_000).unwrap();
        assert!(w.settled(2_000));
        assert!(w.settled(2_000));
        assert_eq!(w.width_us(), 150 * 1_000_000);
        // Between half the budget and the budget: it stays.
        assert!(!w.settled(500));
        assert!(!w.settled(1_000));
        assert_eq!(w.width_us(), 150 * 1_000_000);
        assert!(!w.settled(499));
        assert_eq!(w.width_us(), 300 * 1_000_000);
        assert!(!w.settled(0));
        assert!(!w.settled(0));
        assert_eq!(w.width_us(), 10 * MIN, "never wider than configured");
    }

    #[test]
    fn settling_behind_narrows_until_under_the_budget() {
        let mut w = HeldWindow::new(Duration::from_secs(600), 1_000).unwrap();
        let now = 1_000 * MIN;
        let mut cutoffs = Vec::new();
        // Held: 4,000 at the first cutoff, then half as many at each.
        let last = w.settle_behind(now, now - 10 * MIN, |c| {
            cutoffs.push(c);
            4_000 >> (cutoffs.len() - 1)
        });
        assert_eq!(cutoffs, [now - 10 * MIN, now - 5 * MIN, now - 150_000_000]);
        assert_eq!(last, now - 150_000_000);
        assert_eq!(w.width_us(), 150_000_000);
    }

    #[test]
    fn narrowed_a_settle_waits_for_an_eighth_of_the_budget_more_events_or_half_the_configured_window(
    ) {
        let mut w = HeldWindow::new(Duration::from_secs(600), 1_000).unwrap();
        let now = 1_000 * MIN;
        // Open grants hold 4,000 events whatever the cutoff: the window
        // narrows to its floor and stays over the budget.
        let last = w.settle_behind(now, now - 10 * MIN, |_| 4_000);
        assert_eq!(w.width_us(), MIN_WIDTH_US);
        assert_eq!(last, now - MIN_WIDTH_US);
        // Half a (narrowed) window later, with 124 events more: not yet.
        let cutoff = last + MIN_WIDTH_US / 2;
        assert!(!w.worth_settling(cutoff, 4_124));
        // An eighth of the budget more than the last settle left: due.
        assert!(w.worth_settling(cutoff, 4_125));
        // Or half the configured window later, whatever came in.
        assert!(!w.worth_settling(last + 5 * MIN - 1, 4_000));
        assert!(w.worth_settling(last + 5 * MIN, 4_000));
    }

    #[test]
    fn at_the_configured_width_every_settle_is_worth_it() {
        let mut w = HeldWindow::new(Duration::from_secs(600), 1_000).unwrap();
        assert!(w.worth_settling(i64::MIN, 0), "before the first settle");
        let now = 1_000 * MIN;
        w.settle_behind(now, now - 10 * MIN, |_| 800);
        assert_eq!(w.width_us(), 10 * MIN);
        assert!(w.worth_settling(now - 5 * MIN, 800));
    }

    #[test]
    fn no_budget_keeps_the_configured_width() {
        let mut w = HeldWindow::new(Duration::from_secs(60), 0).unwrap();
        assert!(!w.settled(usize::MAX));
        assert_eq!(w.width_us(), MIN);
    }
}
