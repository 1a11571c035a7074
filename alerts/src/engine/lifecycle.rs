//! The life of an alert, written once for every rule: raise, merge,
//! resolve.
//!
//! Two shapes of alert:
//! - **raised** alerts stand on evidence: an event that alone proves the
//!   condition, or a confirmed violation. Evidence within the rule's quiet
//!   window of the alert's last evidence merges into the open alert (one
//!   more count, the earliest start); evidence a whole quiet window later
//!   starts a new alert, even before the watermark has resolved the old
//!   one, so alerts are the clusters of their evidence in event time
//!   whatever the arrival order. An alert resolves once the watermark is
//!   a quiet window past its last evidence. It always goes out as firing
//!   first: evidence that arrives after its resolve time already passed
//!   (a backlog read late) gives a firing update then a resolved one,
//!   never a resolved one alone.
//! - **windowed** alerts follow a rule's [`Verdict`] at each evaluation
//!   step: pending when the condition first holds (firing at once if the
//!   rule has no `for`), firing once it has held for `for`, resolved when
//!   it stops holding. A pending alert that clears was never sent, so it
//!   leaves no update.
//!
//! Every state change is queued, in order, for [`Lifecycle::take_changes`].

use std::collections::{BTreeMap, HashSet};

use url::Url;

use crate::alert::{Alert, AlertKey, AlertState};
use crate::config::Severity;
use crate::text::fmt_ts;

const US: i64 = 1_000_000;

/// A piece of evidence for a raised alert.
pub(crate) struct Evidence {
    pub key: AlertKey,
    pub severity: Severity,
    /// Event time of the evidence, microseconds.
    pub at: i64,
    /// How long after its last evidence the alert resolves.
    pub quiet: i64,
    /// What one piece of evidence is called in a merged description.
    pub noun: &'static str,
    pub summary: String,
    pub text: String,
}

/// What a windowed rule concluded about one alert at one step.
pub(crate) struct Verdict {
    pub key: AlertKey,
    pub holds: bool,
    pub severity: Severity,
    /// The rule's `for`, microseconds.
    pub for_us: i64,
    pub summary: String,
    pub description: String,
}

impl Verdict {
    /// The condition no longer holds (only the key matters then).
    fn cleared(key: AlertKey) -> Verdict {
        Verdict {
            key,
            holds: false,
            severity: Severity::Warning,
            for_us: 0,
            summary: String::new(),
            description: String::new(),
        }
    }
}

struct Raised {
    alert: Alert,
    /// Event time of the newest evidence.
    last: i64,
    quiet: i64,
    count: u64,
}

impl Raised {
    fn resolves_at(&self) -> i64 {
        self.last.saturating_add(self.quiet)
    }
}

struct Windowed {
    alert: Alert,
    since: i64,
}

/// Every open alert and the state changes not yet taken.
#[derive(Default)]
pub(crate) struct Lifecycle {
    external_url: Option<Url>,
    raised: BTreeMap<AlertKey, Raised>,
    windowed: BTreeMap<AlertKey, Windowed>,
    changes: Vec<Alert>,
}

impl Lifecycle {
    /// `external_url` is where leaseline's HTTP API is reached from
    /// outside, for the timeline link of alerts about a lease.
    pub fn new(external_url: Option<Url>) -> Lifecycle {
        Lifecycle {
            external_url,
            ..Lifecycle::default()
        }
    }

    /// The lease's timeline around `[from, to]`, with a minute of context
    /// on each side (three minutes after `from` while the alert is open).
    fn timeline_url(&self, key: &AlertKey, from: i64, to: Option<i64>) -> Option<String> {
        let lease = key.lease_id.as_deref()?;
        let mut url = self.external_url.clone()?;
        url.path_segments_mut()
            .ok()?
            .pop_if_empty()
            .extend(["api", "v1", "leases", lease, "timeline"]);
        let from = from - 60 * US;
        let to = to.unwrap_or(from + 180 * US) + 60 * US;
        url.query_pairs_mut()
            .append_pair("from", &fmt_ts(from))
            .append_pair("to", &fmt_ts(to));
        Some(url.to_string())
    }

    /// Adds evidence: merges it into its open alert, or raises a new one.
    pub fn raise(&mut self, e: Evidence) {
        if self
            .raised
            .get(&e.key)
            .is_some_and(|r| e.at >= r.resolves_at())
        {
            self.resolve_raised(e.key.clone());
        }
        if let Some(r) = self.raised.get_mut(&e.key) {
            r.count += 1;
            r.last = r.last.max(e.at);
            r.alert.starts_at = r.alert.starts_at.min(e.at);
            r.alert.description = format!(
                "{} {} since {}; the latest: {}",
                r.count,
                e.noun,
                fmt_ts(r.alert.starts_at),
                e.text
            );
            return;
        }
        let alert = Alert {
            timeline_url: self.timeline_url(&e.key, e.at, None),
            key: e.key.clone(),
            severity: e.severity,
            state: AlertState::Firing,
            starts_at: e.at,
            ends_at: None,
            summary: e.summary,
            description: e.text,
        };
        self.changes.push(alert.clone());
        self.raised.insert(
            e.key,
            Raised {
                alert,
                last: e.at,
                quiet: e.quiet,
                count: 1,
            },
        );
    }

    /// Resolves every raised alert the watermark is a quiet window past.
    pub fn resolve_due(&mut self, watermark: i64) {
        let due: Vec<AlertKey> = self
            .raised
            .iter()
            .filter(|(_, r)| r.resolves_at() <= watermark)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.resolve_raised(k);
        }
    }

    fn resolve_raised(&mut self, k: AlertKey) {
        let r = self.raised.remove(&k).expect("caller checked");
        let end = r.resolves_at();
        let mut a = r.alert;
        a.state = AlertState::Resolved;
        a.ends_at = Some(end);
        if a.timeline_url.is_some() {
            a.timeline_url = self.timeline_url(&k, a.starts_at, a.ends_at);
        }
        self.changes.push(a);
    }

    /// Whether some windowed alert is open (so every step must be
    /// evaluated until it clears).
    pub fn any_windowed(&self) -> bool {
        !self.windowed.is_empty()
    }

    /// Applies the verdicts of step `b`. A windowed alert no verdict spoke
    /// of (no data left in its window, a rule waiting for history) has
    /// cleared.
    pub fn judge(&mut self, verdicts: Vec<Verdict>, b: i64) {
        let judged: HashSet<AlertKey> = verdicts.iter().map(|v| v.key.clone()).collect();
        let cleared: Vec<AlertKey> = self
            .windowed
            .keys()
            .filter(|k| !judged.contains(*k))
            .cloned()
            .collect();
        for v in verdicts
            .into_iter()
            .chain(cleared.into_iter().map(Verdict::cleared))
        {
            self.transition(v, b);
        }
    }

    fn transition(&mut self, v: Verdict, b: i64) {
        let Verdict {
            key,
            holds,
            severity,
            for_us,
            summary,
            description,
        } = v;
        match (self.windowed.get_mut(&key), holds) {
            (None, false) => {}
            (None, true) => {
                let state = if for_us == 0 {
                    AlertState::Firing
                } else {
                    AlertState::Pending
                };
                let alert = Alert {
                    timeline_url: self.timeline_url(&key, b, None),
                    key: key.clone(),
                    severity,
                    state,
                    starts_at: b,
                    ends_at: None,
                    summary,
                    description,
                };
                self.changes.push(alert.clone());
                self.windowed.insert(key, Windowed { alert, since: b });
            }
            (Some(w), true) => {
                w.alert.description = description;
                if w.alert.state == AlertState::Pending && b - w.since >= for_us {
                    w.alert.state = AlertState::Firing;
                    self.changes.push(w.alert.clone());
                }
            }
            (Some(_), false) => {
                let w = self.windowed.remove(&key).expect("matched above");
                let mut a = w.alert;
                if a.state == AlertState::Firing {
                    a.state = AlertState::Resolved;
                    a.ends_at = Some(b);
                    if a.timeline_url.is_some() {
                        a.timeline_url = self.timeline_url(&key, a.starts_at, a.ends_at);
                    }
                    self.changes.push(a);
                }
            }
        }
    }

    /// The state changes since the last call, in the order they happened.
    pub fn take_changes(&mut self) -> Vec<Alert> {
        std::mem::take(&mut self.changes)
    }

    /// Every alert now pending or firing.
    pub fn active(&self) -> impl Iterator<Item = &Alert> {
        self.raised
            .values()
            .map(|r| &r.alert)
            .chain(self.windowed.values().map(|w| &w.alert))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::alert::AlertName;

    const S: i64 = US;

    fn evidence(at: i64) -> Evidence {
        Evidence {
            key: AlertKey {
                name: AlertName::LeaseForcedExpiry,
                lease_id: Some(Arc::from("l")),
                holder_id: Some(Arc::from("h")),
                backend: None,
                kind: None,
            },
            severity: Severity::Warning,
            at,
            quiet: 30 * S,
            noun: "events",
            summary: "s".into(),
            text: "t".into(),
        }
    }

    fn states(l: &mut Lifecycle) -> Vec<(AlertState, i64, Option<i64>)> {
        l.take_changes()
            .into_iter()
            .map(|a| (a.state, a.starts_at, a.ends_at))
            .collect()
    }

    #[test]
    fn evidence_within_the_quiet_window_merges_and_resolves_once() {
        let mut l = Lifecycle::default();
        l.raise(evidence(10 * S));
        l.raise(evidence(5 * S));
        l.raise(evidence(20 * S));
        l.resolve_due(49 * S);
        assert_eq!(states(&mut l), [(AlertState::Firing, 10 * S, None)]);
        l.resolve_due(50 * S);
        assert_eq!(
            states(&mut l),
            [(AlertState::Resolved, 5 * S, Some(50 * S))]
        );
        assert_eq!(l.active().count(), 0);
    }

    #[test]
    fn evidence_already_past_its_resolve_time_still_fires_first() {
        let mut l = Lifecycle::default();
        l.raise(evidence(0));
        l.resolve_due(100 * S);
        assert_eq!(
            states(&mut l),
            [
                (AlertState::Firing, 0, None),
                (AlertState::Resolved, 0, Some(30 * S))
            ]
        );
    }

    #[test]
    fn evidence_a_quiet_window_later_starts_a_new_alert() {
        let mut l = Lifecycle::default();
        l.raise(evidence(0));
        l.raise(evidence(30 * S));
        assert_eq!(
            states(&mut l),
            [
                (AlertState::Firing, 0, None),
                (AlertState::Resolved, 0, Some(30 * S)),
                (AlertState::Firing, 30 * S, None)
            ]
        );
    }

    fn verdict(holds: bool, for_us: i64) -> Verdict {
        Verdict {
            key: evidence(0).key,
            holds,
            severity: Severity::Warning,
            for_us,
            summary: String::new(),
            description: String::new(),
        }
    }

    #[test]
    fn a_windowed_alert_is_pending_for_its_for_then_fires_then_resolves() {
        let mut l = Lifecycle::default();
        l.judge(vec![verdict(true, 2 * S)], S);
        l.judge(vec![verdict(true, 2 * S)], 2 * S);
        l.judge(vec![verdict(true, 2 * S)], 3 * S);
        l.judge(vec![], 4 * S);
        assert_eq!(
            states(&mut l),
            [
                (AlertState::Pending, S, None),
                (AlertState::Firing, S, None),
                (AlertState::Resolved, S, Some(4 * S))
            ]
        );
    }

    #[test]
    fn a_pending_alert_that_clears_leaves_no_update() {
        let mut l = Lifecycle::default();
        l.judge(vec![verdict(true, 2 * S)], S);
        l.judge(vec![verdict(false, 2 * S)], 2 * S);
        assert_eq!(states(&mut l), [(AlertState::Pending, S, None)]);
        assert!(!l.any_windowed());
    }
}
