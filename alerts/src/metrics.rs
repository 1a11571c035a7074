//! The lease metrics of `/metrics`, and the alert pipeline's own.
//!
//! Series are labelled by `backend` (and `kind` for violations), which keeps
//! their number bounded by the number of lock services; a lease gets its
//! own `lease_id` label only when its id starts with a prefix named in
//! `[metrics] per_lease_prefixes`.
//!
//! Label values come from the events, which any producer writes, so both
//! labels have a cap ([`LabelBudget`]): a value first seen after the cap is
//! full is folded (`backend="_other"`, or no `lease_id` label) and counted
//! in `leaseline_metric_labels_folded_total`. Values already admitted keep
//! their series, so a burst of junk cannot move a real backend's counts.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::config::MetricsConfig;

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    Histogram::new([
        5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
    ])
}

/// Fleet-wide totals of the lease counters, for exporters that read plain
/// numbers (OTLP): renewals, renewal failures, forced expiries, grants,
/// stale writes rejected, violations, in that order.
#[derive(Debug, Default)]
pub struct LeaseTotals([AtomicU64; 6]);

impl LeaseTotals {
    pub const RENEWALS: usize = 0;
    pub const RENEWAL_FAILURES: usize = 1;
    pub const EXPIRIES: usize = 2;
    pub const GRANTS: usize = 3;
    pub const STALE_WRITES: usize = 4;
    pub const VIOLATIONS: usize = 5;

    pub fn get(&self, i: usize) -> u64 {
        self.0[i].load(Ordering::Relaxed)
    }

    pub(crate) fn inc(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The backend value counted for backends past `[metrics] max_backends`.
pub const OTHER_BACKEND: &str = "_other";

/// The distinct values admitted for one label, at most `cap`, first come
/// first kept.
#[derive(Debug)]
pub struct LabelBudget {
    cap: usize,
    admitted: Mutex<HashSet<String>>,
}

impl LabelBudget {
    pub fn new(cap: usize) -> LabelBudget {
        LabelBudget {
            cap,
            admitted: Mutex::default(),
        }
    }

    /// Whether `value` has (or now gets) a series of its own.
    pub fn admit(&self, value: &str) -> bool {
        let mut set = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        if set.contains(value) {
            return true;
        }
        if set.len() >= self.cap {
            return false;
        }
        set.insert(value.to_string());
        true
    }
}

/// Every counter and gauge the alert engine and the delivery update. Cheap
/// to clone: the families are shared.
#[derive(Clone)]
pub struct LeaseMetrics {
    prefixes: Vec<String>,
    backends: Arc<LabelBudget>,
    leases: Arc<LabelBudget>,
    pub(crate) labels_folded: Family<Labels, Counter>,
    pub(crate) totals: Arc<LeaseTotals>,
    pub(crate) acquisition_latency: Family<Labels, Histogram, fn() -> Histogram>,
    pub(crate) acquisition_latency_p99: Family<Labels, FloatGauge>,
    pub(crate) renewals: Family<Labels, Counter>,
    pub(crate) renewal_failures: Family<Labels, Counter>,
    pub(crate) renewal_failure_rate: Family<Labels, FloatGauge>,
    pub(crate) expiry_forced: Family<Labels, Counter>,
    pub(crate) token_increments: Family<Labels, Counter>,
    pub(crate) token_increment_rate: Family<Labels, FloatGauge>,
    pub(crate) stale_writes: Family<Labels, Counter>,
    pub(crate) violations: Family<Labels, Counter>,
    pub(crate) alerts_firing: Family<Labels, Gauge>,
    pub(crate) late_events: Counter,
    pub(crate) leases_on_several_partitions: Counter,
    pub(crate) duplicate_events: Counter,
    pub(crate) deliveries: Family<Labels, Counter>,
    pub(crate) delivery_failures: Family<Labels, Counter>,
    pub(crate) queue_overflow: Family<Labels, Counter>,
}

impl LeaseMetrics {
    pub fn new(cfg: &MetricsConfig) -> LeaseMetrics {
        LeaseMetrics {
            prefixes: cfg.per_lease_prefixes.clone(),
            backends: Arc::new(LabelBudget::new(cfg.max_backends)),
            leases: Arc::new(LabelBudget::new(cfg.max_labelled_leases)),
            labels_folded: Family::default(),
            totals: Arc::default(),
            acquisition_latency: Family::new_with_constructor(latency_histogram),
            acquisition_latency_p99: Family::default(),
            renewals: Family::default(),
            renewal_failures: Family::default(),
            renewal_failure_rate: Family::default(),
            expiry_forced: Family::default(),
            token_increments: Family::default(),
            token_increment_rate: Family::default(),
            stale_writes: Family::default(),
            violations: Family::default(),
            alerts_firing: Family::default(),
            late_events: Counter::default(),
            leases_on_several_partitions: Counter::default(),
            duplicate_events: Counter::default(),
            deliveries: Family::default(),
            delivery_failures: Family::default(),
            queue_overflow: Family::default(),
        }
    }

    pub fn totals(&self) -> Arc<LeaseTotals> {
        self.totals.clone()
    }

    /// Adds every series to `registry`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "lease_acquisition_latency_ms",
            "Time from the first acquisition attempt to the grant (acquired.latency_ms)",
            self.acquisition_latency.clone(),
        );
        r.register(
            "lease_acquisition_latency_p99_ms",
            "The acquisition latency quantile of the latency rule over its window, at the last evaluation",
            self.acquisition_latency_p99.clone(),
        );
        r.register(
            "lease_renewals",
            "Successful keepalives (renewed events)",
            self.renewals.clone(),
        );
        r.register(
            "lease_renewal_failures",
            "Failed keepalives (renew_failed events)",
            self.renewal_failures.clone(),
        );
        r.register(
            "lease_renewal_failure_rate",
            "renew_failed / (renewed + renew_failed) over the renewal rule's window, at the last evaluation",
            self.renewal_failure_rate.clone(),
        );
        r.register(
            "lease_expiry_forced",
            "Forced expiries (expired events)",
            self.expiry_forced.clone(),
        );
        r.register(
            "fencing_token_increments",
            "Grants: distinct new fencing tokens",
            self.token_increments.clone(),
        );
        r.register(
            "fencing_token_increment_rate",
            "Grants per second over the churn rule's window, at the last evaluation",
            self.token_increment_rate.clone(),
        );
        r.register(
            "stale_write_rejected",
            "Writes the resource refused for a stale token",
            self.stale_writes.clone(),
        );
        r.register(
            "lease_violations",
            "Safety violations the audit confirmed, by kind",
            self.violations.clone(),
        );
        r.register(
            "leaseline_alerts_active",
            "Alerts currently pending or firing, by alertname and state",
            self.alerts_firing.clone(),
        );
        r.register(
            "leaseline_alert_late_events",
            "Events that arrived later than the lateness bound (alerts may have missed them)",
            self.late_events.clone(),
        );
        r.register(
            "leaseline_leases_on_several_partitions",
            "Leases whose events came from more than one input partition: their producers do not key messages by lease_id, which only delays their alerts",
            self.leases_on_several_partitions.clone(),
        );
        r.register(
            "leaseline_alert_duplicate_events",
            "Events the alert engine ignored because their event_id was already seen",
            self.duplicate_events.clone(),
        );
        r.register(
            "leaseline_alert_deliveries",
            "Alert batches a receiver accepted",
            self.deliveries.clone(),
        );
        r.register(
            "leaseline_alert_delivery_failures",
            "Alert deliveries that failed and will be retried",
            self.delivery_failures.clone(),
        );
        r.register(
            "leaseline_alert_queue_overflow",
            "Alert updates dropped because a receiver's queue was full",
            self.queue_overflow.clone(),
        );
        r.register(
            "leaseline_metric_labels_folded",
            "Lease counter updates whose backend or lease_id label value was past its cap ([metrics] max_backends, max_labelled_leases) and was folded (backend=\"_other\", or no lease_id label)",
            self.labels_folded.clone(),
        );
    }

    /// The label set of a lease counter: its backend, and its id when a
    /// configured prefix asks for it, each within its cap.
    pub(crate) fn lease_labels(&self, backend: Option<&str>, lease_id: &str) -> Labels {
        let mut l = self.backend_labels(backend);
        if self
            .prefixes
            .iter()
            .any(|p| lease_id.starts_with(p.as_str()))
        {
            if self.leases.admit(lease_id) {
                l.push(("lease_id", lease_id.to_string()));
            } else {
                self.folded("lease_id");
            }
        }
        l
    }

    /// The `backend` label, folded to [`OTHER_BACKEND`] past the cap.
    pub(crate) fn backend_labels(&self, backend: Option<&str>) -> Labels {
        let b = backend.unwrap_or("");
        if self.backends.admit(b) {
            vec![("backend", b.to_string())]
        } else {
            self.folded("backend");
            vec![("backend", OTHER_BACKEND.to_string())]
        }
    }

    fn folded(&self, label: &'static str) {
        self.labels_folded
            .get_or_create(&vec![("label", label.to_string())])
            .inc();
    }

    pub(crate) fn receiver_labels(receiver: &str) -> Labels {
        vec![("receiver", receiver.to_string())]
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn series(m: &LeaseMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn label_values_past_the_cap_are_folded_and_counted() {
        let m = LeaseMetrics::new(&MetricsConfig {
            per_lease_prefixes: vec!["db/".into()],
            max_backends: 2,
            max_labelled_leases: 1,
        });
        for b in ["etcd", "redis", "junk-1", "junk-2", "etcd"] {
            m.renewals
                .get_or_create(&m.lease_labels(Some(b), "x"))
                .inc();
        }
        for lease in ["db/a", "db/b", "db/a"] {
            m.renewals
                .get_or_create(&m.lease_labels(Some("etcd"), lease))
                .inc();
        }
        let text = series(&m);
        let count = |needle: &str| {
            text.lines()
                .find(|l| l.starts_with(needle))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        // Admitted values keep their own series, first come first kept.
        assert_eq!(
            count(r#"lease_renewals_total{backend="etcd"}"#).as_deref(),
            Some("3")
        );
        assert_eq!(
            count(r#"lease_renewals_total{backend="redis"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            count(r#"lease_renewals_total{backend="_other"}"#).as_deref(),
            Some("2")
        );
        assert!(!text.contains("junk"), "{text}");
        assert_eq!(
            count(r#"lease_renewals_total{backend="etcd",lease_id="db/a"}"#).as_deref(),
            Some("2")
        );
        assert!(!text.contains("db/b"), "{text}");
        assert_eq!(
            count(r#"leaseline_metric_labels_folded_total{label="backend"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            count(r#"leaseline_metric_labels_folded_total{label="lease_id"}"#).as_deref(),
            Some("1")
        );
    }
}
