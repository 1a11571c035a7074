//! One alert: what it is about, its labels, its state.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::config::Severity;

/// The built-in rules, by the `alertname` label they raise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum AlertName {
    LeaseAcquisitionLatencyHigh,
    LeaseRenewalFailuresHigh,
    LeaseForcedExpiry,
    LeaseStaleWriteRejected,
    LeaseTokenChurn,
    LeaseSafetyViolation,
}

impl AlertName {
    pub const ALL: [AlertName; 6] = [
        AlertName::LeaseAcquisitionLatencyHigh,
        AlertName::LeaseRenewalFailuresHigh,
        AlertName::LeaseForcedExpiry,
        AlertName::LeaseStaleWriteRejected,
        AlertName::LeaseTokenChurn,
        AlertName::LeaseSafetyViolation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertName::LeaseAcquisitionLatencyHigh => "LeaseAcquisitionLatencyHigh",
            AlertName::LeaseRenewalFailuresHigh => "LeaseRenewalFailuresHigh",
            AlertName::LeaseForcedExpiry => "LeaseForcedExpiry",
            AlertName::LeaseStaleWriteRejected => "LeaseStaleWriteRejected",
            AlertName::LeaseTokenChurn => "LeaseTokenChurn",
            AlertName::LeaseSafetyViolation => "LeaseSafetyViolation",
        }
    }
}

impl std::fmt::Display for AlertName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an alert is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// The condition holds but has not yet held long enough (its rule's
    /// `for`), or a violation awaits the lateness bound to be confirmed.
    /// Not sent to receivers.
    Pending,
    Firing,
    Resolved,
}

impl AlertState {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }
}

/// What identifies one alert: its name and its labels. Two updates with the
/// same key are the same alert, for Alertmanager too.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AlertKey {
    pub name: AlertName,
    pub lease_id: Option<Arc<str>>,
    pub holder_id: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
    /// The violation kind of a safety alert; `lease` or `fleet` for churn.
    pub kind: Option<&'static str>,
}

/// One alert as of one state change. Times are event time, microseconds
/// since the Unix epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    pub key: AlertKey,
    pub severity: Severity,
    pub state: AlertState,
    /// When the condition began: the first event that raised it, or the
    /// evaluation step at which a windowed condition first held.
    pub starts_at: i64,
    /// Set once resolved.
    pub ends_at: Option<i64>,
    pub summary: String,
    /// Cites the evidence: events, times, counts.
    pub description: String,
    /// The lease's timeline around the alert, when the alert is about a
    /// lease and an external URL is known.
    pub timeline_url: Option<String>,
}

impl Alert {
    /// The labels receivers see: `alertname`, `severity`, and whichever of
    /// `lease_id`, `holder_id`, `backend`, `kind` the alert has.
    pub fn labels(&self) -> BTreeMap<&'static str, String> {
        let k = &self.key;
        let mut labels = BTreeMap::new();
        labels.insert("alertname", k.name.as_str().to_string());
        labels.insert("severity", self.severity.as_str().to_string());
        for (name, value) in [
            ("lease_id", k.lease_id.as_deref()),
            ("holder_id", k.holder_id.as_deref()),
            ("backend", k.backend.as_deref()),
            ("kind", k.kind),
        ] {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                labels.insert(name, v.to_string());
            }
        }
        labels
    }

    /// A stable text form of the key, for queues, logs and the history.
    pub fn fingerprint(&self) -> String {
        let k = &self.key;
        fingerprint(
            k.name.as_str(),
            [
                ("lease_id", k.lease_id.as_deref()),
                ("holder_id", k.holder_id.as_deref()),
                ("backend", k.backend.as_deref()),
                ("kind", k.kind),
            ],
        )
    }
}

/// The text form of an alert's key from its name and key labels, as
/// [`Alert::fingerprint`] gives it and as a `lease_alerts` row gives it
/// back: labels in name order, empty ones left out.
pub(crate) fn fingerprint<'a>(
    alertname: &str,
    labels: impl IntoIterator<Item = (&'static str, Option<&'a str>)>,
) -> String {
    let mut labels: BTreeMap<&str, &str> = labels
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.filter(|v| !v.is_empty())?)))
        .collect();
    labels.insert("alertname", alertname);
    let mut s = String::new();
    for (k, v) in labels {
        s.push_str(k);
        s.push('=');
        s.push_str(v);
        s.push(';');
    }
    s
}
