//! The `[alerts]` and `[metrics]` tables of the configuration file.
//!
//! Every rule has the contract's default ("Alert defaults" in
//! `docs/event-contract.md`); [`AlertsConfig::validate`] refuses
//! impossible values at start-up with a message naming the field.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use crate::error::{AlertError, Result};

/// How urgent an alert is: its `severity` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// The alert engine: when it evaluates, its rules, where alerts go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// How late, by event time, an event may arrive and still count as if it
    /// had come in order. Windows close, and safety violations are
    /// confirmed, only once the watermark (newest event time or wall clock,
    /// minus this) has passed them. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub lateness: Duration,
    /// How long an input partition that has nothing left to read and
    /// brings no event may hold the watermark back (see [`crate::clock`]).
    /// Default 10 s.
    #[serde(with = "humantime_serde")]
    pub partition_idle_timeout: Duration,
    /// The step at which windowed rules (latency, renewal failures, token
    /// churn) are evaluated, in event time. Windows are whole steps.
    /// Default 10 s.
    #[serde(with = "humantime_serde")]
    pub evaluation_interval: Duration,
    /// How often firing alerts are sent again to Alertmanager, which forgets
    /// an alert that is not re-sent. Default 1 min.
    #[serde(with = "humantime_serde")]
    pub resend_interval: Duration,
    /// The base URL that alert links (the lease's timeline) start with, for
    /// example `https://leaseline.example.com`. Default: the HTTP API's own
    /// address.
    pub external_url: Option<Url>,
    /// Undelivered alert updates kept per receiver while it is down. Updates
    /// of one alert replace each other, so this bounds distinct alerts;
    /// beyond it the oldest update is dropped, counted and logged.
    /// Default 10000.
    pub queue_capacity: usize,
    /// Where alerts go; several at once. Default: none (the console and the
    /// `lease_alerts` table only).
    pub receivers: Vec<ReceiverConfig>,
    /// How far behind its newest event a replay (`import`) keeps the
    /// audit's events in memory: older grants are settled and let go of,
    /// and a lease given an event later than this is audited again from
    /// the lake at the end (see [`crate::Settling`]). `0s` keeps the whole
    /// history. Default 10 min.
    #[serde(with = "humantime_serde")]
    pub replay_audit_window: Duration,
    pub rules: RulesConfig,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            lateness: Duration::from_secs(30),
            partition_idle_timeout: Duration::from_secs(10),
            evaluation_interval: Duration::from_secs(10),
            resend_interval: Duration::from_secs(60),
            external_url: None,
            queue_capacity: 10_000,
            receivers: Vec::new(),
            replay_audit_window: Duration::from_secs(600),
            rules: RulesConfig::default(),
        }
    }
}

/// What a receiver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiverKind {
    /// Prometheus Alertmanager: `POST {url}/api/v2/alerts`.
    Alertmanager,
    /// A generic JSON webhook, in Alertmanager's webhook format (version 4).
    Webhook,
}

/// One destination for alerts (`[[alerts.receivers]]`).
///
/// Secrets are named by file, never written here: the configuration can be
/// shown, logged and kept in version control, and the files are read when
/// delivery starts and again before each attempt, so a rotated password or
/// token is picked up without a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConfig {
    #[serde(rename = "type")]
    pub kind: ReceiverKind,
    /// A name for logs and metrics.
    pub name: String,
    /// Alertmanager's base URL (e.g. `https://alertmanager:9093`), or the
    /// webhook's URL.
    pub url: Url,
    /// Labels added to every alert sent to this receiver, e.g.
    /// `{ cluster = "eu-1", env = "prod" }`. They cannot replace an
    /// alert's own labels. Default none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// HTTP basic authentication. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// A file whose first line is sent as `Authorization: Bearer <token>`.
    /// Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<PathBuf>,
    /// Whom to trust and who to be over HTTPS. Default: the system's
    /// trusted roots, no client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ReceiverTls>,
}

/// `basic_auth = { username = "...", password_file = "..." }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    /// A file whose first line is the password.
    pub password_file: PathBuf,
}

/// A receiver's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverTls {
    /// PEM certificates of the CAs to trust for this receiver, instead of
    /// the system's roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain) to present, for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl ReceiverConfig {
    /// A receiver with no authentication, TLS settings or labels.
    pub fn new(kind: ReceiverKind, name: impl Into<String>, url: Url) -> ReceiverConfig {
        ReceiverConfig {
            kind,
            name: name.into(),
            url,
            labels: BTreeMap::new(),
            basic_auth: None,
            bearer_token_file: None,
            tls: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<()> {
        let what = format!("alert receiver {:?}", self.name);
        if !self.url.password().unwrap_or("").is_empty() || !self.url.username().is_empty() {
            // A URL is logged and shown in errors: credentials in it would be too.
            return Err(AlertError::Config(format!(
                "{what}: the url carries credentials; put them in basic_auth (username, password_file) instead"
            )));
        }
        if self.basic_auth.is_some() && self.bearer_token_file.is_some() {
            return Err(AlertError::Config(format!(
                "{what}: basic_auth and bearer_token_file both set; choose one"
            )));
        }
        if let Some(b) = &self.basic_auth {
            if b.username.is_empty() || b.username.contains(':') {
                return Err(AlertError::Config(format!(
                    "{what}: basic_auth.username must be non-empty and without ':'"
                )));
            }
        }
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(AlertError::Config(format!(
                    "{what}: tls.cert_file and tls.key_file go together"
                )));
            }
        }
        for (name, value) in &self.labels {
            let mut chars = name.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid || name.starts_with("__") {
                return Err(AlertError::Config(format!(
                    "{what}: {name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
                )));
            }
            if ALERT_LABELS.contains(&name.as_str()) {
                return Err(AlertError::Config(format!(
                    "{what}: the label {name:?} is an alert's own; choose another name"
                )));
            }
            if value.is_empty() {
                // Alertmanager drops empty labels: the alert would arrive without it.
                return Err(AlertError::Config(format!(
                    "{what}: the label {name:?} is empty"
                )));
            }
        }
        Ok(())
    }
}

/// The labels alerts set themselves ([`crate::Alert::labels`]).
pub(crate) const ALERT_LABELS: [&str; 6] = [
    "alertname",
    "severity",
    "lease_id",
    "holder_id",
    "backend",
    "kind",
];

/// The built-in rules.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    pub acquisition_latency: LatencyRule,
    pub renewal_failures: RenewalFailureRule,
    pub forced_expiry: EventRule,
    pub stale_write_rejected: EventRule,
    pub token_churn: ChurnRule,
    pub safety_violation: ViolationRule,
}

/// Fires per backend when a quantile of `acquired.latency_ms` over the
/// window exceeds the threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencyRule {
    pub enabled: bool,
    /// Default 0.99.
    pub quantile: f64,
    /// Default 200 ms.
    pub threshold_ms: f64,
    /// Default 5 min.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Fewer acquisitions than this in the window say nothing. Default 20.
    pub min_samples: u64,
    /// How long the condition must hold before the alert fires (it is
    /// pending meanwhile). Default 0.
    #[serde(rename = "for", with = "humantime_serde")]
    pub for_duration: Duration,
    /// Default warning.
    pub severity: Severity,
}

impl Default for LatencyRule {
    fn default() -> Self {
        LatencyRule {
            enabled: true,
            quantile: 0.99,
            threshold_ms: 200.0,
            window: Duration::from_secs(300),
            min_samples: 20,
            for_duration: Duration::ZERO,
            severity: Severity::Warning,
        }
    }
}

/// Fires per backend when `renew_failed / (renewed + renew_failed)` over the
/// window exceeds the ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RenewalFailureRule {
    pub enabled: bool,
    /// Default 0.01 (1 %).
    pub max_failure_ratio: f64,
    /// Default 60 s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Fewer keepalives than this in the window say nothing: one blip among
    /// ten renewals is not a 10 % failure rate. Default 100.
    pub min_attempts: u64,
    #[serde(rename = "for", with = "humantime_serde")]
    pub for_duration: Duration,
    /// Default warning.
    pub severity: Severity,
}

impl Default for RenewalFailureRule {
    fn default() -> Self {
        RenewalFailureRule {
            enabled: true,
            max_failure_ratio: 0.01,
            window: Duration::from_secs(60),
            min_attempts: 100,
            for_duration: Duration::ZERO,
            severity: Severity::Warning,
        }
    }
}

/// Fires, per lease and holder, on any event of its kind (`expired`,
/// `stale_write_rejected`) and resolves once a window passes without
/// another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventRule {
    pub enabled: bool,
    /// Default 1 min.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Default warning.
    pub severity: Severity,
}

impl Default for EventRule {
    fn default() -> Self {
        EventRule {
            enabled: true,
            window: Duration::from_secs(60),
            severity: Severity::Warning,
        }
    }
}

/// Fires when grants (new fencing tokens) in the window exceed `factor`
/// times the baseline: the mean number of grants per window over the
/// `baseline_window` before it, per lease and for the whole fleet. The
/// baseline never counts for less than the floor, so a quiet lease must
/// still see `factor * min_lease_grants` grants to alert. The rule starts
/// once the engine has seen one window of history (before that there is
/// no baseline, and a start-up storm of acquisitions is not churn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChurnRule {
    pub enabled: bool,
    /// Default 10.
    pub factor: f64,
    /// Default 1 min.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Default 1 h.
    #[serde(with = "humantime_serde")]
    pub baseline_window: Duration,
    /// The per-lease baseline's floor, in grants per window. Default 1.
    pub min_lease_grants: f64,
    /// The fleet baseline's floor, in grants per window. Default 10.
    pub min_fleet_grants: f64,
    #[serde(rename = "for", with = "humantime_serde")]
    pub for_duration: Duration,
    /// Default warning.
    pub severity: Severity,
}

impl Default for ChurnRule {
    fn default() -> Self {
        ChurnRule {
            enabled: true,
            factor: 10.0,
            window: Duration::from_secs(60),
            baseline_window: Duration::from_secs(3600),
            min_lease_grants: 1.0,
            min_fleet_grants: 10.0,
            for_duration: Duration::ZERO,
            severity: Severity::Warning,
        }
    }
}

/// Fires on any violation the audit confirms, per lease, kind and holder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ViolationRule {
    pub enabled: bool,
    /// A violation is history, not a state: its alert resolves once this
    /// much event time passes without another of its kind on the lease.
    /// Default 15 min.
    #[serde(with = "humantime_serde")]
    pub resolve_after: Duration,
    /// Default critical.
    pub severity: Severity,
}

impl Default for ViolationRule {
    fn default() -> Self {
        ViolationRule {
            enabled: true,
            resolve_after: Duration::from_secs(900),
            severity: Severity::Critical,
        }
    }
}

/// The `[metrics]` table: what `/metrics` labels by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Lease ids starting with one of these get their own `lease_id` label
    /// on the lease counters; all others are counted per backend only, so
    /// the number of series stays bounded. Default: none.
    pub per_lease_prefixes: Vec<String>,
    /// Distinct `backend` label values kept; events naming further backends
    /// are counted under `backend="_other"`. Label values come from the
    /// events, so without a cap one producer sending random backend names
    /// would grow `/metrics` (and the process) without end. Default 100.
    pub max_backends: usize,
    /// Distinct leases given their own `lease_id` label (through
    /// `per_lease_prefixes`); leases past the cap are counted per backend
    /// only. Default 1000.
    pub max_labelled_leases: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            per_lease_prefixes: Vec::new(),
            max_backends: 100,
            max_labelled_leases: 1000,
        }
    }
}

fn positive(name: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(AlertError::Config(format!("{name} must be more than zero")));
    }
    Ok(())
}

impl AlertsConfig {
    /// Checks what serde cannot: ranges, and that windows are whole
    /// evaluation steps.
    pub fn validate(&self) -> Result<()> {
        positive("alerts.evaluation_interval", self.evaluation_interval)?;
        positive("alerts.resend_interval", self.resend_interval)?;
        if self.queue_capacity == 0 {
            return Err(AlertError::Config(
                "alerts.queue_capacity must be at least 1".into(),
            ));
        }
        let step = self.evaluation_interval.as_micros();
        let whole = |name: &str, d: Duration| -> Result<()> {
            positive(name, d)?;
            if !d.as_micros().is_multiple_of(step) {
                return Err(AlertError::Config(format!(
                    "{name} ({}) must be a whole number of alerts.evaluation_interval ({})",
                    humantime::format_duration(d),
                    humantime::format_duration(self.evaluation_interval)
                )));
            }
            Ok(())
        };
        let r = &self.rules;
        whole(
            "alerts.rules.acquisition_latency.window",
            r.acquisition_latency.window,
        )?;
        whole(
            "alerts.rules.renewal_failures.window",
            r.renewal_failures.window,
        )?;
        whole("alerts.rules.token_churn.window", r.token_churn.window)?;
        whole(
            "alerts.rules.token_churn.baseline_window",
            r.token_churn.baseline_window,
        )?;
        positive("alerts.rules.forced_expiry.window", r.forced_expiry.window)?;
        positive(
            "alerts.rules.stale_write_rejected.window",
            r.stale_write_rejected.window,
        )?;
        positive(
            "alerts.rules.safety_violation.resolve_after",
            r.safety_violation.resolve_after,
        )?;
        let q = r.acquisition_latency.quantile;
        if !(q > 0.0 && q <= 1.0) {
            return Err(AlertError::Config(format!(
                "alerts.rules.acquisition_latency.quantile must be in (0, 1], not {q}"
            )));
        }
        if r.acquisition_latency.threshold_ms.is_nan() || r.acquisition_latency.threshold_ms < 0.0 {
            return Err(AlertError::Config(
                "alerts.rules.acquisition_latency.threshold_ms must be zero or more".into(),
            ));
        }
        let ratio = r.renewal_failures.max_failure_ratio;
        if !(0.0..1.0).contains(&ratio) {
            return Err(AlertError::Config(format!(
                "alerts.rules.renewal_failures.max_failure_ratio must be in [0, 1), not {ratio}"
            )));
        }
        if r.token_churn.factor.is_nan() || r.token_churn.factor < 1.0 {
            return Err(AlertError::Config(format!(
                "alerts.rules.token_churn.factor must be at least 1, not {}",
                r.token_churn.factor
            )));
        }
        if [
            r.token_churn.min_lease_grants,
            r.token_churn.min_fleet_grants,
        ]
        .iter()
        .any(|g| g.is_nan() || *g < 0.0)
        {
            return Err(AlertError::Config(
                "alerts.rules.token_churn floors must be zero or more".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for rc in &self.receivers {
            rc.validate()?;
            if !names.insert(rc.name()) {
                return Err(AlertError::Config(format!(
                    "two alert receivers are named {:?}",
                    rc.name()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(receiver: &str) -> Result<AlertsConfig> {
        let cfg: AlertsConfig = toml::from_str(&format!("[[receivers]]\n{receiver}"))
            .map_err(|e| AlertError::Config(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    #[test]
    fn a_receiver_takes_auth_tls_and_labels() {
        let cfg = parse(
            r#"
type = "alertmanager"
name = "am"
url = "https://am.example.com:9093"
labels = { cluster = "eu-1", env = "prod" }
basic_auth = { username = "leaseline", password_file = "/etc/leaseline/am-password" }
tls = { ca_file = "/etc/leaseline/ca.pem", cert_file = "/etc/leaseline/c.pem", key_file = "/etc/leaseline/k.pem" }
"#,
        )
        .unwrap();
        let r = &cfg.receivers[0];
        assert_eq!(r.kind, ReceiverKind::Alertmanager);
        assert_eq!(r.labels["cluster"], "eu-1");
        let b = r.basic_auth.as_ref().unwrap();
        assert_eq!(b.username, "leaseline");
        assert_eq!(b.password_file, PathBuf::from("/etc/leaseline/am-password"));
        let tls = r.tls.as_ref().unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/leaseline/ca.pem")));

        let hook = parse(
            "type = \"webhook\"\nname = \"h\"\nurl = \"https://h\"\nbearer_token_file = \"/t\"\n",
        )
        .unwrap();
        assert_eq!(
            hook.receivers[0],
            ReceiverConfig {
                bearer_token_file: Some("/t".into()),
                ..ReceiverConfig::new(ReceiverKind::Webhook, "h", "https://h".parse().unwrap())
            }
        );
    }

    #[test]
    fn impossible_receivers_are_refused_naming_what_to_change() {
        let base = "type = \"webhook\"\nname = \"h\"\n";
        for (extra, expected) in [
            (
                "url = \"https://u:p@h\"\n",
                "the url carries credentials; put them in basic_auth",
            ),
            (
                "url = \"https://h\"\nbearer_token_file = \"/t\"\nbasic_auth = { username = \"u\", password_file = \"/p\" }\n",
                "basic_auth and bearer_token_file both set",
            ),
            (
                "url = \"https://h\"\ntls = { cert_file = \"/c\" }\n",
                "tls.cert_file and tls.key_file go together",
            ),
            (
                "url = \"https://h\"\nlabels = { \"bad-name\" = \"x\" }\n",
                "\"bad-name\" is not a label name",
            ),
            (
                "url = \"https://h\"\nlabels = { lease_id = \"x\" }\n",
                "the label \"lease_id\" is an alert's own",
            ),
            (
                "url = \"https://h\"\nlabels = { env = \"\" }\n",
                "the label \"env\" is empty",
            ),
            ("url = \"https://h\"\npassword = \"x\"\n", "unknown field `password`"),
        ] {
            let err = parse(&format!("{base}{extra}")).unwrap_err().to_string();
            assert!(err.contains(expected), "{extra}: {err}");
        }
    }
}
