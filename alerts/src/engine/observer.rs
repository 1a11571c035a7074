//! What the engine reports as it goes, for whoever watches: the lease
//! metrics of `/metrics` ([`LeaseMetrics`]) or nobody. The engine decides
//! nothing from an observer; it only tells it.

use std::collections::BTreeMap;

use leaseline_audit::Violation;
use leaseline_schema::Kind;

use super::Intake;
use crate::alert::{Alert, AlertName, AlertState};
use crate::metrics::{LeaseMetrics, LeaseTotals};

pub(crate) trait Observer: Send {
    /// An event taken in; `first_grant` when it is the first report of a
    /// new fencing token.
    fn event(&self, _e: &Intake<'_>, _first_grant: bool) {}
    /// An event ignored: its `event_id` was already seen.
    fn duplicate(&self) {}
    /// An event that arrived below the watermark.
    fn late(&self) {}
    /// A lease seen on a second input partition.
    fn several_partitions(&self) {}
    /// A violation the watermark confirmed.
    fn violation(&self, _v: &Violation) {}
    /// The value a windowed rule computed at its last evaluation.
    fn rule_value(&self, _rule: AlertName, _backend: Option<&str>, _value: f64) {}
    /// The alerts open after a step.
    fn active(&self, _alerts: &mut dyn Iterator<Item = &Alert>) {}
}

/// Nobody watches.
pub(crate) struct Unobserved;

impl Observer for Unobserved {}

impl Observer for LeaseMetrics {
    fn event(&self, e: &Intake<'_>, first_grant: bool) {
        let labels = || self.lease_labels(e.backend.as_deref(), &e.lease);
        match e.ev.kind {
            Kind::Acquired => {
                if let Some(lat) = e.ev.latency_ms {
                    self.acquisition_latency
                        .get_or_create(&labels())
                        .observe(lat);
                }
                if first_grant {
                    self.token_increments.get_or_create(&labels()).inc();
                    self.totals.inc(LeaseTotals::GRANTS);
                }
            }
            Kind::Renewed => {
                self.renewals.get_or_create(&labels()).inc();
                self.totals.inc(LeaseTotals::RENEWALS);
            }
            Kind::RenewFailed => {
                self.renewal_failures.get_or_create(&labels()).inc();
                self.totals.inc(LeaseTotals::RENEWAL_FAILURES);
            }
            Kind::Expired => {
                self.expiry_forced.get_or_create(&labels()).inc();
                self.totals.inc(LeaseTotals::EXPIRIES);
            }
            Kind::StaleWriteRejected => {
                self.stale_writes.get_or_create(&labels()).inc();
                self.totals.inc(LeaseTotals::STALE_WRITES);
            }
            _ => {}
        }
    }

    fn duplicate(&self) {
        self.duplicate_events.inc();
    }

    fn late(&self) {
        self.late_events.inc();
    }

    fn several_partitions(&self) {
        self.leases_on_several_partitions.inc();
    }

    fn violation(&self, v: &Violation) {
        self.violations
            .get_or_create(&vec![("kind", v.kind.as_str().to_string())])
            .inc();
        self.totals.inc(LeaseTotals::VIOLATIONS);
    }

    fn rule_value(&self, rule: AlertName, backend: Option<&str>, value: f64) {
        let family = match rule {
            AlertName::LeaseAcquisitionLatencyHigh => &self.acquisition_latency_p99,
            AlertName::LeaseRenewalFailuresHigh => &self.renewal_failure_rate,
            AlertName::LeaseTokenChurn => &self.token_increment_rate,
            _ => return,
        };
        family
            .get_or_create(&self.backend_labels(backend))
            .set(value);
    }

    fn active(&self, alerts: &mut dyn Iterator<Item = &Alert>) {
        let mut counts: BTreeMap<(AlertName, AlertState), i64> = BTreeMap::new();
        for name in AlertName::ALL {
            counts.insert((name, AlertState::Firing), 0);
            counts.insert((name, AlertState::Pending), 0);
        }
        for a in alerts {
            *counts.entry((a.key.name, a.state)).or_default() += 1;
        }
        for ((name, state), n) in counts {
            self.alerts_firing
                .get_or_create(&vec![
                    ("alertname", name.as_str().to_string()),
                    ("state", state.as_str().to_string()),
                ])
                .set(n);
        }
    }
}
