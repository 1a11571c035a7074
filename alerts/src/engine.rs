//! The alert engine: rules evaluated by event time over a stream of events.
//!
//! Events go in with [`AlertEngine::push`] in any order; time moves with
//! [`AlertEngine::advance`], which takes a watermark: the event time below
//! which everything is taken to have arrived (in a running service, the
//! slowest input partition's newest event time minus the configured
//! lateness, see [`crate::clock`]; at the end of a file, its last event
//! time). What comes out are state
//! changes ([`Alert`]s), taken with [`AlertEngine::take_changes`].
//!
//! Three kinds of rule:
//! - **event rules** (forced expiry, stale write rejected) fire as soon as
//!   their event arrives, since the event alone proves the condition, and
//!   resolve once the watermark is a window past the last such event;
//! - **safety violations** come from the audit engine ([`Auditor`]) shared
//!   with SQL. The audit can retract a violation when an earlier event
//!   arrives late (the release that ended the "overlapped" grant), so a
//!   violation is pending until the watermark passes it, then fires;
//! - **windowed rules** (acquisition latency, renewal failures, token churn)
//!   are evaluated at each step boundary once the watermark passes it, over
//!   the steps of their window.
//!
//! So an event that arrives within the lateness bound counts exactly as if
//! it had arrived in order, and the alerts of a history depend on its
//! events, not on their arrival order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use leaseline_audit::{AuditConfig, Auditor, Violation};
use leaseline_schema::{Kind, LeaseEvent};

use crate::alert::{Alert, AlertKey, AlertName, AlertState};
use crate::config::{AlertsConfig, Severity};
use crate::metrics::{LeaseMetrics, LeaseTotals};
use crate::text::{fmt_ms, fmt_ts};

type Name = Arc<str>;

/// Counts of one evaluation step.
#[derive(Default)]
struct Step {
    latency: HashMap<Option<Name>, Vec<f64>>,
    renew_ok: HashMap<Option<Name>, u64>,
    renew_failed: HashMap<Option<Name>, u64>,
    lease_grants: HashMap<Name, u32>,
    fleet_grants: u32,
}

/// An alert raised by events (event rules, violations).
struct Raised {
    alert: Alert,
    /// Event time of the newest event behind it; it resolves a window later.
    last: i64,
    count: u64,
}

/// What a windowed rule concluded about one alert at one step.
struct Verdict {
    key: AlertKey,
    holds: bool,
    severity: Severity,
    /// The rule's `for`, microseconds.
    for_us: i64,
    summary: String,
    description: String,
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

impl AlertKey {
    /// A key not about one lease: per backend, or for the whole fleet.
    fn fleet(name: AlertName, backend: Option<Name>, kind: Option<&'static str>) -> AlertKey {
        AlertKey {
            name,
            lease_id: None,
            holder_id: None,
            backend,
            kind,
        }
    }
}

/// A windowed rule's alert.
struct Windowed {
    alert: Alert,
    since: i64,
}

/// The alert engine. See the module docs.
pub struct AlertEngine {
    cfg: AlertsConfig,
    step: i64,
    skew_us: i64,
    auditor: Auditor,
    metrics: Option<LeaseMetrics>,
    seen_ids: HashMap<Box<str>, i64>,
    grants: HashMap<(Name, u64), i64>,
    backends: HashMap<Name, Name>,
    names: HashMap<Box<str>, Name>,
    max_ts: Option<i64>,
    watermark: i64,
    next_eval: Option<i64>,
    last_eval: i64,
    first_step: Option<i64>,
    steps: BTreeMap<i64, Step>,
    raised: BTreeMap<AlertKey, Raised>,
    /// Violations the audit reports that the watermark has not yet passed.
    /// Keyed by the whole violation: two can share a lease, time, kind and
    /// token (one grant overlapping two others), and a retraction of one
    /// must not take the other with it.
    unconfirmed: BTreeSet<Violation>,
    windowed: BTreeMap<AlertKey, Windowed>,
    changes: Vec<Alert>,
    pushed: u64,
    late_events: u64,
}

const US: i64 = 1_000_000;

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl AlertEngine {
    /// A new engine. `cfg` must have passed [`AlertsConfig::validate`].
    pub fn new(cfg: AlertsConfig, audit: AuditConfig, metrics: Option<LeaseMetrics>) -> Self {
        AlertEngine {
            step: micros(cfg.evaluation_interval).max(1),
            skew_us: micros(audit.clock_skew_tolerance),
            cfg,
            auditor: Auditor::new(audit),
            metrics,
            seen_ids: HashMap::new(),
            grants: HashMap::new(),
            backends: HashMap::new(),
            names: HashMap::new(),
            max_ts: None,
            watermark: i64::MIN,
            next_eval: None,
            last_eval: i64::MIN,
            first_step: None,
            steps: BTreeMap::new(),
            raised: BTreeMap::new(),
            unconfirmed: BTreeSet::new(),
            windowed: BTreeMap::new(),
            changes: Vec::new(),
            pushed: 0,
            late_events: 0,
        }
    }

    pub fn config(&self) -> &AlertsConfig {
        &self.cfg
    }

    /// The newest event time pushed, microseconds.
    pub fn max_ts(&self) -> Option<i64> {
        self.max_ts
    }

    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Counts a lease whose events came from more than one input partition.
    pub fn count_lease_on_several_partitions(&self) {
        if let Some(m) = &self.metrics {
            m.leases_on_several_partitions.inc();
        }
    }

    /// Events that arrived below the watermark.
    pub fn late_events(&self) -> u64 {
        self.late_events
    }

    fn lateness(&self) -> i64 {
        micros(self.cfg.lateness)
    }

    fn intern(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.names.insert(s.into(), n.clone());
        n
    }

    fn align_up(&self, ts: i64) -> i64 {
        ts.div_euclid(self.step) * self.step + self.step
    }

    /// Takes one event. Returns false for a duplicate (same `event_id`).
    pub fn push(&mut self, ev: &LeaseEvent<'_>) -> bool {
        if let Some(id) = ev.event_id.as_deref() {
            if self.seen_ids.contains_key(id) {
                if let Some(m) = &self.metrics {
                    m.duplicate_events.inc();
                }
                return false;
            }
            self.seen_ids.insert(id.into(), ev.ts_us);
        }
        self.pushed += 1;
        self.auditor.push(ev);
        let ts = ev.ts_us;
        if ts < self.watermark {
            self.late_events += 1;
            if let Some(m) = &self.metrics {
                m.late_events.inc();
            }
        }
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        let lease = self.intern(&ev.lease_id);
        let backend = match ev.backend.as_deref() {
            Some(b) => {
                let b = self.intern(b);
                self.backends
                    .entry(lease.clone())
                    .or_insert_with(|| b.clone());
                Some(b)
            }
            None => self.backends.get(&lease).cloned(),
        };
        let holder = ev.holder_id.as_deref().map(|h| self.intern(h));
        let at = ts.div_euclid(self.step) * self.step;
        self.first_step = Some(self.first_step.map_or(at, |f| f.min(at)));
        let next = self
            .align_up(ts)
            .max(self.last_eval.saturating_add(self.step));
        self.next_eval = Some(self.next_eval.map_or(next, |n| n.min(next)));
        let metrics = self.metrics.clone();
        let labels = || {
            metrics
                .as_ref()
                .map(|m| (m, m.lease_labels(backend.as_deref(), &lease)))
        };
        match ev.kind {
            Kind::Acquired => {
                if let Some(lat) = ev.latency_ms {
                    let step = self.steps.entry(at).or_default();
                    step.latency.entry(backend.clone()).or_default().push(lat);
                    if let Some((m, l)) = labels() {
                        m.acquisition_latency.get_or_create(&l).observe(lat);
                    }
                }
                if let Some(token) = ev.fencing_token {
                    self.count_grant(lease.clone(), token, ts);
                    if let Some((m, l)) = labels() {
                        if self.grants.get(&(lease.clone(), token)) == Some(&ts) {
                            m.token_increments.get_or_create(&l).inc();
                            m.totals.inc(LeaseTotals::GRANTS);
                        }
                    }
                }
            }
            Kind::Renewed | Kind::RenewFailed => {
                let ok = ev.kind == Kind::Renewed;
                let step = self.steps.entry(at).or_default();
                let counts = if ok {
                    &mut step.renew_ok
                } else {
                    &mut step.renew_failed
                };
                *counts.entry(backend.clone()).or_default() += 1;
                if let Some((m, l)) = labels() {
                    let (family, total) = if ok {
                        (&m.renewals, LeaseTotals::RENEWALS)
                    } else {
                        (&m.renewal_failures, LeaseTotals::RENEWAL_FAILURES)
                    };
                    family.get_or_create(&l).inc();
                    m.totals.inc(total);
                }
            }
            Kind::Expired => {
                if let Some((m, l)) = labels() {
                    m.expiry_forced.get_or_create(&l).inc();
                    m.totals.inc(LeaseTotals::EXPIRIES);
                }
                if self.cfg.rules.forced_expiry.enabled {
                    let text = format!(
                        "the coordinator expired grant {} of {} held by {} at {} (its TTL ran out without a renewal)",
                        ev.fencing_token.unwrap_or(0),
                        lease,
                        holder.as_deref().unwrap_or("?"),
                        fmt_ts(ts)
                    );
                    self.raise_event(
                        AlertName::LeaseForcedExpiry,
                        lease,
                        holder,
                        backend,
                        ts,
                        text,
                    );
                }
            }
            Kind::StaleWriteRejected => {
                if let Some((m, l)) = labels() {
                    m.stale_writes.get_or_create(&l).inc();
                    m.totals.inc(LeaseTotals::STALE_WRITES);
                }
                if self.cfg.rules.stale_write_rejected.enabled {
                    let text = format!(
                        "{} rejected a write to {} by {} at {}: its token {} is below {} (a holder acting on a lease it had lost)",
                        "the resource",
                        lease,
                        holder.as_deref().unwrap_or("an unnamed writer"),
                        fmt_ts(ts),
                        ev.fencing_token.unwrap_or(0),
                        ev.max_token
                            .map(|t| format!("the highest token seen, {t}"))
                            .unwrap_or_else(|| "a token already seen".into()),
                    );
                    self.raise_event(
                        AlertName::LeaseStaleWriteRejected,
                        lease,
                        holder,
                        backend,
                        ts,
                        text,
                    );
                }
            }
            _ => {}
        }
        true
    }

    /// Counts a grant once, at the earliest report of it, while its step is
    /// still open.
    fn count_grant(&mut self, lease: Name, token: u64, ts: i64) {
        let at = ts.div_euclid(self.step) * self.step;
        match self.grants.get(&(lease.clone(), token)).copied() {
            Some(old) if old <= ts => {}
            Some(old) => {
                let old_at = old.div_euclid(self.step) * self.step;
                if old_at != at && old_at + self.step > self.last_eval {
                    if let Some(s) = self.steps.get_mut(&old_at) {
                        s.fleet_grants = s.fleet_grants.saturating_sub(1);
                        if let Some(c) = s.lease_grants.get_mut(&lease) {
                            *c = c.saturating_sub(1);
                        }
                    }
                    let s = self.steps.entry(at).or_default();
                    s.fleet_grants += 1;
                    *s.lease_grants.entry(lease.clone()).or_default() += 1;
                }
                self.grants.insert((lease, token), ts);
            }
            None => {
                let s = self.steps.entry(at).or_default();
                s.fleet_grants += 1;
                *s.lease_grants.entry(lease.clone()).or_default() += 1;
                self.grants.insert((lease, token), ts);
            }
        }
    }

    fn timeline_url(&self, lease: &str, from: i64, to: Option<i64>) -> Option<String> {
        let base = self.cfg.external_url.as_ref()?;
        let mut url = base.clone();
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

    fn raise_event(
        &mut self,
        name: AlertName,
        lease: Name,
        holder: Option<Name>,
        backend: Option<Name>,
        ts: i64,
        text: String,
    ) {
        let rule = match name {
            AlertName::LeaseForcedExpiry => &self.cfg.rules.forced_expiry,
            _ => &self.cfg.rules.stale_write_rejected,
        };
        let severity = rule.severity;
        let key = AlertKey {
            name,
            lease_id: Some(lease.clone()),
            holder_id: holder.clone(),
            backend,
            kind: None,
        };
        let summary = match name {
            AlertName::LeaseForcedExpiry => format!(
                "Lease {lease} held by {} was force-expired",
                holder.as_deref().unwrap_or("?")
            ),
            _ => format!(
                "A stale write to {lease} by {} was rejected",
                holder.as_deref().unwrap_or("an unnamed writer")
            ),
        };
        let url = self.timeline_url(&lease, ts, None);
        self.split_if_cleared(&key, ts);
        if let Some(r) = self.raised.get_mut(&key) {
            r.count += 1;
            r.last = r.last.max(ts);
            r.alert.starts_at = r.alert.starts_at.min(ts);
            r.alert.description = format!(
                "{} events since {}; the latest: {text}",
                r.count,
                fmt_ts(r.alert.starts_at)
            );
            return;
        }
        let alert = Alert {
            key: key.clone(),
            severity,
            state: AlertState::Firing,
            starts_at: ts,
            ends_at: None,
            summary,
            description: text,
            timeline_url: url,
        };
        self.changes.push(alert.clone());
        self.raised.insert(
            key,
            Raised {
                alert,
                last: ts,
                count: 1,
            },
        );
    }

    /// Feeds the audit's new and retracted violations in.
    fn take_violations(&mut self) {
        let changes = self.auditor.drain_changes();
        if !self.cfg.rules.safety_violation.enabled {
            return;
        }
        for v in changes.retracted {
            self.unconfirmed.remove(&v);
        }
        for v in changes.appeared {
            self.unconfirmed.insert(v);
        }
    }

    fn confirm_violations(&mut self) {
        let w = self.watermark;
        let skew = self.skew_us;
        let ready: Vec<Violation> = self
            .unconfirmed
            .iter()
            .filter(|v| v.at.saturating_add(skew) <= w)
            .cloned()
            .collect();
        let rule = self.cfg.rules.safety_violation.clone();
        for v in ready {
            self.unconfirmed.remove(&v);
            if let Some(m) = &self.metrics {
                m.violations
                    .get_or_create(&vec![("kind", v.kind.as_str().to_string())])
                    .inc();
                m.totals.inc(LeaseTotals::VIOLATIONS);
            }
            let lease = v.lease_id.clone();
            let backend = self.backends.get(&lease).cloned();
            let key = AlertKey {
                name: AlertName::LeaseSafetyViolation,
                lease_id: Some(lease.clone()),
                holder_id: v.holder_id.clone(),
                backend,
                kind: Some(v.kind.as_str()),
            };
            let text = format!(
                "{} ({}): {} Evidence: {}.",
                v.kind,
                v.kind.alert_signal(),
                v.detail,
                v.evidence.join(", ")
            );
            self.split_if_cleared(&key, v.at);
            if let Some(r) = self.raised.get_mut(&key) {
                r.count += 1;
                r.last = r.last.max(v.at);
                r.alert.starts_at = r.alert.starts_at.min(v.at);
                r.alert.description = format!(
                    "{} violations since {}; the latest: {text}",
                    r.count,
                    fmt_ts(r.alert.starts_at)
                );
                continue;
            }
            let alert = Alert {
                summary: format!(
                    "Safety violation on {lease}: {} (token {})",
                    v.kind, v.fencing_token
                ),
                timeline_url: self.timeline_url(&lease, v.at, None),
                key: key.clone(),
                severity: rule.severity,
                state: AlertState::Firing,
                starts_at: v.at,
                ends_at: None,
                description: text,
            };
            self.changes.push(alert.clone());
            self.raised.insert(
                key,
                Raised {
                    alert,
                    last: v.at,
                    count: 1,
                },
            );
        }
    }

    /// Moves time to `watermark` (never backwards): confirms violations,
    /// evaluates every step boundary it passes, resolves what has cleared.
    pub fn advance(&mut self, watermark: i64) {
        self.take_violations();
        if watermark > self.watermark {
            self.watermark = watermark;
        }
        self.confirm_violations();
        while let Some(b) = self.next_eval.filter(|b| *b <= self.watermark) {
            self.evaluate(b);
            self.last_eval = b;
            self.next_eval = self.next_boundary(b);
        }
        self.resolve_raised();
        self.prune();
        if let Some(m) = &self.metrics {
            self.update_active_gauge(m.clone());
        }
    }

    /// The end of the input (a file, a replay of stored history): nothing
    /// can arrive late any more, so the lateness window closes. The
    /// watermark moves to the newest event time (plus the clock-skew
    /// tolerance, which a violation waits out): every violation the
    /// history holds fires, and every step boundary up to its end is
    /// evaluated. Alerts still active at the end stay active, as they
    /// were when the history ended.
    pub fn finish_replay(&mut self) {
        match self.max_ts {
            Some(t) => self.advance(t.saturating_add(self.skew_us)),
            None => self.take_violations(),
        }
    }

    fn update_active_gauge(&self, m: LeaseMetrics) {
        let mut counts: BTreeMap<(&'static str, &'static str), i64> = BTreeMap::new();
        for name in AlertName::ALL {
            counts.insert((name.as_str(), "firing"), 0);
            counts.insert((name.as_str(), "pending"), 0);
        }
        for a in self
            .raised
            .values()
            .map(|r| &r.alert)
            .chain(self.windowed.values().map(|w| &w.alert))
        {
            *counts
                .entry((a.key.name.as_str(), a.state.as_str()))
                .or_default() += 1;
        }
        for ((name, state), n) in counts {
            m.alerts_firing
                .get_or_create(&vec![
                    ("alertname", name.to_string()),
                    ("state", state.to_string()),
                ])
                .set(n);
        }
    }

    fn max_window(&self) -> i64 {
        let r = &self.cfg.rules;
        micros(r.acquisition_latency.window)
            .max(micros(r.renewal_failures.window))
            .max(micros(r.token_churn.window))
    }

    fn next_boundary(&self, b: i64) -> Option<i64> {
        let next = b + self.step;
        if !self.windowed.is_empty() {
            return Some(next);
        }
        // Nothing is firing: skip to the first boundary whose window holds
        // a step with data.
        self.steps
            .range(next - self.max_window()..)
            .next()
            .map(|(s, _)| next.max(s + self.step))
    }

    /// How long after its last event an event-raised alert resolves.
    fn quiet_window(&self, name: AlertName) -> i64 {
        let rules = &self.cfg.rules;
        match name {
            AlertName::LeaseForcedExpiry => micros(rules.forced_expiry.window),
            AlertName::LeaseStaleWriteRejected => micros(rules.stale_write_rejected.window),
            _ => micros(rules.safety_violation.resolve_after),
        }
    }

    /// An event a whole quiet window after the alert's last one starts a
    /// new alert, even when the watermark has not yet resolved the old one:
    /// alerts are the clusters of their events in event time, whatever the
    /// order the events came in.
    fn split_if_cleared(&mut self, key: &AlertKey, ts: i64) {
        let window = self.quiet_window(key.name);
        if self
            .raised
            .get(key)
            .is_some_and(|r| ts >= r.last.saturating_add(window))
        {
            self.resolve_one(key.clone());
        }
    }

    fn resolve_raised(&mut self) {
        let w = self.watermark;
        let done: Vec<AlertKey> = self
            .raised
            .iter()
            .filter(|(k, r)| r.last.saturating_add(self.quiet_window(k.name)) <= w)
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            self.resolve_one(k);
        }
    }

    fn resolve_one(&mut self, k: AlertKey) {
        {
            let r = self.raised.remove(&k).expect("caller checked");
            let mut a = r.alert;
            a.state = AlertState::Resolved;
            a.ends_at = Some(r.last.saturating_add(self.quiet_window(k.name)));
            if a.timeline_url.is_some() {
                a.timeline_url =
                    self.timeline_url(k.lease_id.as_deref().unwrap_or(""), a.starts_at, a.ends_at);
            }
            self.changes.push(a);
        }
    }

    /// The steps of the window of length `len` that ends at `b`.
    fn window(&self, b: i64, len: i64) -> impl Iterator<Item = &Step> {
        self.steps.range(b - len..b).map(|(_, s)| s)
    }

    fn evaluate(&mut self, b: i64) {
        let mut verdicts = Vec::new();
        self.latency_verdicts(b, &mut verdicts);
        self.renewal_verdicts(b, &mut verdicts);
        self.churn_verdicts(b, &mut verdicts);
        // A windowed alert whose rule said nothing of it this step (no
        // data in its window, a rule waiting for history) has cleared.
        let judged: HashSet<&AlertKey> = verdicts.iter().map(|v| &v.key).collect();
        let cleared: Vec<AlertKey> = self
            .windowed
            .keys()
            .filter(|k| !judged.contains(k))
            .cloned()
            .collect();
        verdicts.extend(cleared.into_iter().map(Verdict::cleared));
        for v in verdicts {
            self.transition(v, b);
        }
    }

    fn latency_verdicts(&self, b: i64, out: &mut Vec<Verdict>) {
        let r = &self.cfg.rules.acquisition_latency;
        if !r.enabled {
            return;
        }
        let mut by_backend: BTreeMap<Option<Name>, Vec<f64>> = BTreeMap::new();
        for s in self.window(b, micros(r.window)) {
            for (be, v) in &s.latency {
                by_backend.entry(be.clone()).or_default().extend(v);
            }
        }
        for (backend, mut v) in by_backend {
            let n = v.len() as u64;
            let q = quantile(&mut v, r.quantile);
            if let (Some(m), Some(q)) = (&self.metrics, q) {
                m.acquisition_latency_p99
                    .get_or_create(&LeaseMetrics::backend_labels(backend.as_deref()))
                    .set(q);
            }
            out.push(Verdict {
                holds: n >= r.min_samples && q.is_some_and(|q| q > r.threshold_ms),
                severity: r.severity,
                for_us: micros(r.for_duration),
                summary: format!(
                    "Lease acquisition is slow on {}",
                    backend.as_deref().unwrap_or("an unnamed backend")
                ),
                description: format!(
                    "p{} of acquired.latency_ms over the {} before {} is {} (threshold {} ms, {} acquisitions)",
                    r.quantile * 100.0,
                    humantime::format_duration(r.window),
                    fmt_ts(b),
                    q.map(fmt_ms).unwrap_or_else(|| "unknown".into()),
                    r.threshold_ms,
                    n
                ),
                key: AlertKey::fleet(AlertName::LeaseAcquisitionLatencyHigh, backend, None),
            });
        }
    }

    fn renewal_verdicts(&self, b: i64, out: &mut Vec<Verdict>) {
        let r = &self.cfg.rules.renewal_failures;
        if !r.enabled {
            return;
        }
        let mut by_backend: BTreeMap<Option<Name>, (u64, u64)> = BTreeMap::new();
        for s in self.window(b, micros(r.window)) {
            for (be, n) in &s.renew_ok {
                by_backend.entry(be.clone()).or_default().0 += n;
            }
            for (be, n) in &s.renew_failed {
                by_backend.entry(be.clone()).or_default().1 += n;
            }
        }
        for (backend, (ok, failed)) in by_backend {
            let attempts = ok + failed;
            let ratio = if attempts == 0 {
                0.0
            } else {
                failed as f64 / attempts as f64
            };
            if let Some(m) = &self.metrics {
                m.renewal_failure_rate
                    .get_or_create(&LeaseMetrics::backend_labels(backend.as_deref()))
                    .set(ratio);
            }
            out.push(Verdict {
                holds: attempts >= r.min_attempts && ratio > r.max_failure_ratio,
                severity: r.severity,
                for_us: micros(r.for_duration),
                summary: format!(
                    "Lease keepalives are failing on {}",
                    backend.as_deref().unwrap_or("an unnamed backend")
                ),
                description: format!(
                    "{failed} of {attempts} keepalives failed in the {} before {} ({:.2} %, threshold {:.2} %)",
                    humantime::format_duration(r.window),
                    fmt_ts(b),
                    ratio * 100.0,
                    r.max_failure_ratio * 100.0
                ),
                key: AlertKey::fleet(AlertName::LeaseRenewalFailuresHigh, backend, None),
            });
        }
    }

    fn churn_verdicts(&self, b: i64, out: &mut Vec<Verdict>) {
        let r = &self.cfg.rules.token_churn;
        if !r.enabled {
            return;
        }
        let win = micros(r.window);
        let base = micros(r.baseline_window);
        let mut now: BTreeMap<Name, u32> = BTreeMap::new();
        let mut fleet = 0u64;
        for s in self.window(b, win) {
            fleet += u64::from(s.fleet_grants);
            for (l, n) in &s.lease_grants {
                *now.entry(l.clone()).or_default() += n;
            }
        }
        if let Some(m) = &self.metrics {
            let mut by_backend: BTreeMap<Option<&Name>, u64> = BTreeMap::new();
            for (l, n) in &now {
                *by_backend.entry(self.backends.get(l)).or_default() += u64::from(*n);
            }
            for (be, n) in &by_backend {
                m.token_increment_rate
                    .get_or_create(&LeaseMetrics::backend_labels(be.map(|b| &**b)))
                    .set(*n as f64 / r.window.as_secs_f64());
            }
        }
        // The baseline covers the history before the window, up to
        // `baseline_window`, scaled to one window.
        let start = b - win;
        let covered = (start - self.first_step.unwrap_or(start)).clamp(0, base);
        // Until the engine has seen one whole window of history there is
        // no baseline at all, and an ordinary start-up (every lease
        // acquired at once) must not read as churn: the rule waits.
        if covered < win {
            return;
        }
        let scale = win as f64 / covered as f64;
        let mut base_lease: HashMap<&Name, u64> = HashMap::new();
        let mut base_fleet = 0u64;
        for (_, s) in self.steps.range(start - covered..start) {
            base_fleet += u64::from(s.fleet_grants);
            for (l, n) in &s.lease_grants {
                if now.contains_key(l) {
                    *base_lease.entry(l).or_default() += u64::from(*n);
                }
            }
        }
        for (lease, n) in &now {
            let baseline = base_lease.get(lease).copied().unwrap_or(0) as f64 * scale;
            out.push(Verdict {
                holds: f64::from(*n) > r.factor * baseline.max(r.min_lease_grants),
                severity: r.severity,
                for_us: micros(r.for_duration),
                summary: format!("Lease {lease} changes hands too often"),
                description: format!(
                    "{n} grants of {lease} in the {} before {}: more than {} × its baseline of {:.1} per window (floor {})",
                    humantime::format_duration(r.window),
                    fmt_ts(b),
                    r.factor,
                    baseline,
                    r.min_lease_grants
                ),
                key: AlertKey {
                    name: AlertName::LeaseTokenChurn,
                    lease_id: Some(lease.clone()),
                    holder_id: None,
                    backend: self.backends.get(lease).cloned(),
                    kind: Some("lease"),
                },
            });
        }
        let baseline = base_fleet as f64 * scale;
        out.push(Verdict {
            holds: fleet as f64 > r.factor * baseline.max(r.min_fleet_grants),
            severity: r.severity,
            for_us: micros(r.for_duration),
            summary: "Leases across the fleet change hands too often".to_string(),
            description: format!(
                "{fleet} grants in the {} before {}: more than {} × the fleet's baseline of {:.1} per window (floor {})",
                humantime::format_duration(r.window),
                fmt_ts(b),
                r.factor,
                baseline,
                r.min_fleet_grants
            ),
            key: AlertKey::fleet(AlertName::LeaseTokenChurn, None, Some("fleet")),
        });
    }

    /// Applies one verdict of step `b` to its windowed alert.
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
                    timeline_url: key
                        .lease_id
                        .as_deref()
                        .and_then(|l| self.timeline_url(l, b, None)),
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
                    if let Some(l) = key.lease_id.as_deref() {
                        a.timeline_url = self.timeline_url(l, a.starts_at, a.ends_at);
                    }
                    self.changes.push(a);
                }
            }
        }
    }

    fn prune(&mut self) {
        let r = &self.cfg.rules;
        let keep = self
            .max_window()
            .max(micros(r.token_churn.window) + micros(r.token_churn.baseline_window))
            + self.step;
        let floor = self.last_eval.saturating_sub(keep);
        while let Some((&s, _)) = self.steps.first_key_value() {
            if s >= floor {
                break;
            }
            self.steps.pop_first();
        }
        // Duplicates and second reports of a grant come within seconds;
        // an hour past the watermark, ids are let go in bulk.
        if self.pushed.is_multiple_of(65_536) || self.seen_ids.len() > 4 * 65_536 {
            let horizon = self.watermark.saturating_sub(3600 * US + self.lateness());
            if self.seen_ids.len() > 65_536 {
                self.seen_ids.retain(|_, ts| *ts >= horizon);
            }
            if self.grants.len() > 65_536 {
                self.grants.retain(|_, ts| *ts >= horizon);
            }
        }
    }

    /// The state changes since the last call, in the order they happened.
    pub fn take_changes(&mut self) -> Vec<Alert> {
        std::mem::take(&mut self.changes)
    }

    /// Every alert now pending or firing.
    pub fn active(&self) -> Vec<Alert> {
        self.raised
            .values()
            .map(|r| r.alert.clone())
            .chain(self.windowed.values().map(|w| w.alert.clone()))
            .collect()
    }
}

/// The `q` quantile by the nearest-rank method; `None` for no samples.
fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    let (_, x, _) = v.select_nth_unstable_by(rank - 1, f64::total_cmp);
    Some(*x)
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantile() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.99), Some(99.0));
        assert_eq!(quantile(&mut v, 1.0), Some(100.0));
        assert_eq!(quantile(&mut [5.0], 0.99), Some(5.0));
        assert_eq!(quantile(&mut [], 0.99), None);
    }
}
