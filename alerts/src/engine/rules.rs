//! The built-in rules, behind one interface.
//!
//! A rule turns what the engine sees into alert input: [`Evidence`] from
//! an event or a confirmed violation (the lifecycle raises and merges it),
//! or [`Verdict`]s at each evaluation step over the [`Steps`] in its
//! window (the lifecycle moves the windowed alert). A rule holds no state
//! of its own; a disabled rule is not built at all.

use std::collections::{BTreeMap, HashMap};

use leaseline_audit::Violation;
use leaseline_schema::Kind;

use super::history::Steps;
use super::lifecycle::{Evidence, Verdict};
use super::observer::Observer;
use super::{micros, Intake, Name};
use crate::alert::{AlertKey, AlertName};
use crate::config::{
    ChurnRule, EventRule, LatencyRule, RenewalFailureRule, RulesConfig, ViolationRule,
};
use crate::text::{fmt_ms, fmt_ts};

pub(crate) trait Rule: Send {
    /// Evidence that this event alone gives.
    fn on_event(&self, _e: &Intake<'_>) -> Option<Evidence> {
        None
    }

    /// Evidence that a violation, once confirmed, gives.
    fn on_violation(&self, _v: &Violation, _backend: Option<Name>) -> Option<Evidence> {
        None
    }

    /// The span of steps before a boundary that the rule's verdict reads,
    /// microseconds (0: the rule has no verdicts).
    fn window(&self) -> i64 {
        0
    }

    /// How much history before a boundary the rule needs kept.
    fn history(&self) -> i64 {
        self.window()
    }

    /// The rule's verdicts at step boundary `b`.
    fn judge(&self, _steps: &Steps, _b: i64, _obs: &dyn Observer, _out: &mut Vec<Verdict>) {}
}

/// The enabled rules of `cfg`.
pub(crate) fn build(cfg: &RulesConfig) -> Vec<Box<dyn Rule>> {
    let mut rules: Vec<Box<dyn Rule>> = Vec::new();
    if cfg.forced_expiry.enabled {
        rules.push(Box::new(ForcedExpiry(cfg.forced_expiry.clone())));
    }
    if cfg.stale_write_rejected.enabled {
        rules.push(Box::new(StaleWrite(cfg.stale_write_rejected.clone())));
    }
    if cfg.safety_violation.enabled {
        rules.push(Box::new(Safety(cfg.safety_violation.clone())));
    }
    if cfg.acquisition_latency.enabled {
        rules.push(Box::new(Latency(cfg.acquisition_latency.clone())));
    }
    if cfg.renewal_failures.enabled {
        rules.push(Box::new(Renewals(cfg.renewal_failures.clone())));
    }
    if cfg.token_churn.enabled {
        rules.push(Box::new(Churn(cfg.token_churn.clone())));
    }
    rules
}

fn lease_key(name: AlertName, e: &Intake<'_>) -> AlertKey {
    AlertKey {
        name,
        lease_id: Some(e.lease.clone()),
        holder_id: e.holder.clone(),
        backend: e.backend.clone(),
        kind: None,
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

/// The coordinator expired a grant: its TTL ran out without a renewal.
struct ForcedExpiry(EventRule);

impl Rule for ForcedExpiry {
    fn on_event(&self, e: &Intake<'_>) -> Option<Evidence> {
        if e.ev.kind != Kind::Expired {
            return None;
        }
        let holder = e.holder.as_deref().unwrap_or("?");
        Some(Evidence {
            key: lease_key(AlertName::LeaseForcedExpiry, e),
            severity: self.0.severity,
            at: e.ev.ts_us,
            quiet: micros(self.0.window),
            noun: "events",
            summary: format!("Lease {} held by {holder} was force-expired", e.lease),
            text: format!(
                "the coordinator expired grant {} of {} held by {holder} at {} (its TTL ran out without a renewal)",
                e.ev.fencing_token.unwrap_or(0),
                e.lease,
                fmt_ts(e.ev.ts_us)
            ),
        })
    }
}

/// A fenced resource refused a write carrying a stale token.
struct StaleWrite(EventRule);

impl Rule for StaleWrite {
    fn on_event(&self, e: &Intake<'_>) -> Option<Evidence> {
        if e.ev.kind != Kind::StaleWriteRejected {
            return None;
        }
        let writer = e.holder.as_deref().unwrap_or("an unnamed writer");
        Some(Evidence {
            key: lease_key(AlertName::LeaseStaleWriteRejected, e),
            severity: self.0.severity,
            at: e.ev.ts_us,
            quiet: micros(self.0.window),
            noun: "events",
            summary: format!("A stale write to {} by {writer} was rejected", e.lease),
            text: format!(
                "the resource rejected a write to {} by {writer} at {}: its token {} is below {} (a holder acting on a lease it had lost)",
                e.lease,
                fmt_ts(e.ev.ts_us),
                e.ev.fencing_token.unwrap_or(0),
                e.ev.max_token
                    .map(|t| format!("the highest token seen, {t}"))
                    .unwrap_or_else(|| "a token already seen".into()),
            ),
        })
    }
}

/// A safety violation the audit found and the watermark confirmed.
struct Safety(ViolationRule);

impl Rule for Safety {
    fn on_violation(&self, v: &Violation, backend: Option<Name>) -> Option<Evidence> {
        Some(Evidence {
            key: AlertKey {
                name: AlertName::LeaseSafetyViolation,
                lease_id: Some(v.lease_id.clone()),
                holder_id: v.holder_id.clone(),
                backend,
                kind: Some(v.kind.as_str()),
            },
            severity: self.0.severity,
            at: v.at,
            quiet: micros(self.0.resolve_after),
            noun: "violations",
            summary: format!(
                "Safety violation on {}: {} (token {})",
                v.lease_id, v.kind, v.fencing_token
            ),
            text: format!(
                "{} ({}): {} Evidence: {}.",
                v.kind,
                v.kind.alert_signal(),
                v.detail,
                v.evidence.join(", ")
            ),
        })
    }
}

/// A quantile of acquisition latency above a threshold, per backend.
struct Latency(LatencyRule);

impl Rule for Latency {
    fn window(&self) -> i64 {
        micros(self.0.window)
    }

    fn judge(&self, steps: &Steps, b: i64, obs: &dyn Observer, out: &mut Vec<Verdict>) {
        let r = &self.0;
        let mut by_backend: BTreeMap<Option<Name>, Vec<f64>> = BTreeMap::new();
        for s in steps.range(b - self.window()..b) {
            for (be, v) in &s.latency {
                by_backend.entry(be.clone()).or_default().extend(v);
            }
        }
        for (backend, mut v) in by_backend {
            let n = v.len() as u64;
            let q = quantile(&mut v, r.quantile);
            if let Some(q) = q {
                obs.rule_value(
                    AlertName::LeaseAcquisitionLatencyHigh,
                    backend.as_deref(),
                    q,
                );
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
}

/// Too large a share of keepalives failing, per backend.
struct Renewals(RenewalFailureRule);

impl Rule for Renewals {
    fn window(&self) -> i64 {
        micros(self.0.window)
    }

    fn judge(&self, steps: &Steps, b: i64, obs: &dyn Observer, out: &mut Vec<Verdict>) {
        let r = &self.0;
        let mut by_backend: BTreeMap<Option<Name>, (u64, u64)> = BTreeMap::new();
        for s in steps.range(b - self.window()..b) {
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
            obs.rule_value(
                AlertName::LeaseRenewalFailuresHigh,
                backend.as_deref(),
                ratio,
            );
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
}

/// Grants far above their baseline rate, per lease and for the fleet.
struct Churn(ChurnRule);

impl Rule for Churn {
    fn window(&self) -> i64 {
        micros(self.0.window)
    }

    fn history(&self) -> i64 {
        micros(self.0.window) + micros(self.0.baseline_window)
    }

    fn judge(&self, steps: &Steps, b: i64, obs: &dyn Observer, out: &mut Vec<Verdict>) {
        let r = &self.0;
        let win = self.window();
        let base = micros(r.baseline_window);
        let mut now: BTreeMap<Name, u32> = BTreeMap::new();
        let mut fleet = 0u64;
        for s in steps.range(b - win..b) {
            fleet += u64::from(s.fleet_grants);
        }
        for (l, n) in steps.lease_grants(b - win..b) {
            *now.entry(l.clone()).or_default() += n;
        }
        let mut by_backend: BTreeMap<Option<&Name>, u64> = BTreeMap::new();
        for (l, n) in &now {
            *by_backend.entry(steps.backend_of(l)).or_default() += u64::from(*n);
        }
        for (be, n) in &by_backend {
            obs.rule_value(
                AlertName::LeaseTokenChurn,
                be.map(|b| &**b),
                *n as f64 / r.window.as_secs_f64(),
            );
        }
        // The baseline covers the history before the window, up to
        // `baseline_window`, scaled to one window.
        let start = b - win;
        let covered = (start - steps.first.unwrap_or(start)).clamp(0, base);
        // Until the engine has seen one whole window of history there is
        // no baseline at all, and an ordinary start-up (every lease
        // acquired at once) must not read as churn: the rule waits.
        if covered < win {
            return;
        }
        let scale = win as f64 / covered as f64;
        let mut base_lease: HashMap<&Name, u64> = HashMap::new();
        let mut base_fleet = 0u64;
        for s in steps.range(start - covered..start) {
            base_fleet += u64::from(s.fleet_grants);
        }
        for (l, n) in steps.lease_grants(start - covered..start) {
            if now.contains_key(l) {
                *base_lease.entry(l).or_default() += u64::from(n);
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
                    backend: steps.backend_of(lease).cloned(),
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
