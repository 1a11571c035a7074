//! The alert engine: rules evaluated by event time over a stream of events.
//!
//! Events go in with [`AlertEngine::push`] in any order; time moves with
//! [`AlertEngine::advance`], which takes a watermark: the event time below
//! which everything is taken to have arrived (in a running service, the
//! slowest input partition's newest event time minus the configured
//! lateness, see [`crate::clock`]; at the end of a file, its last event
//! time). What comes out are state changes ([`Alert`]s), taken with
//! [`AlertEngine::take_changes`].
//!
//! The engine is four parts, each in its module:
//! - **intake** (here): de-duplicates events and interns their strings
//!   through the audit engine ([`leaseline_audit::Auditor`]), which it
//!   shares with the process's SQL tables ([`SharedAuditor`]),
//!   counts them into evaluation steps, and confirms the audit's
//!   violations once the watermark has passed them;
//! - **rules** ([`rules`]) behind one interface: event rules (forced
//!   expiry, stale write rejected) give evidence as soon as their event
//!   arrives, since the event alone proves the condition; the safety rule
//!   gives evidence for each confirmed violation (the audit can retract a
//!   violation when an earlier event arrives late, the release that ended
//!   the "overlapped" grant, so a violation waits for the watermark);
//!   windowed rules (acquisition latency, renewal failures, token churn)
//!   give verdicts at each step boundary the watermark passes, over the
//!   steps of their window;
//! - **the lifecycle** ([`lifecycle`]): raise, merge and resolve, written
//!   once for every rule;
//! - **an observer** ([`observer`]) that is told what happened: the lease
//!   metrics, or nobody.
//!
//! So an event that arrives within the lateness bound counts exactly as if
//! it had arrived in order, and the alerts of a history depend on its
//! events, not on their arrival order.

mod history;
mod lifecycle;
mod observer;
mod rules;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use leaseline_audit::{AuditConfig, Settled, SharedAuditor, StoredFiles, Violation};
use leaseline_schema::{Kind, LeaseEvent};

use crate::alert::Alert;
use crate::config::AlertsConfig;
use crate::metrics::LeaseMetrics;
use history::Steps;
use lifecycle::{Lifecycle, Verdict};
use observer::{Observer, Unobserved};
use rules::Rule;

type Name = Arc<str>;

const US: i64 = 1_000_000;

/// How much later in event time than a grant's first report a second one
/// (the holder's and the coordinator's) still counts as the same grant.
/// They come within seconds; this is a wide margin over clock skew, and
/// what it costs is this much of the fleet's grants held in memory (held
/// for an hour, the grants of a 20,000-lease fleet's first 27 minutes took
/// 274 MiB of `serve --ingest`'s heap, BENCHMARKS.md). A second report
/// later than that is counted again, in its own step.
const GRANT_REPORT_SPAN: i64 = 5 * 60 * US;

/// How far the watermark moves between two sweeps of the grants
/// reported: each sweep visits every grant held.
const GRANT_SWEEP_EVERY: i64 = 60 * US;

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// One event as the rules see it, its strings shared with the audit.
pub(crate) struct Intake<'a> {
    pub ev: &'a LeaseEvent<'a>,
    pub lease: Name,
    pub holder: Option<Name>,
    pub backend: Option<Name>,
}

/// The alert engine. See the module docs.
pub struct AlertEngine {
    cfg: AlertsConfig,
    skew_us: i64,
    auditor: SharedAuditor,
    rules: Vec<Box<dyn Rule>>,
    observer: Box<dyn Observer>,
    lifecycle: Lifecycle,
    steps: Steps,
    max_ts: Option<i64>,
    watermark: i64,
    next_eval: Option<i64>,
    last_eval: i64,
    /// Violations the audit reports that the watermark has not yet passed.
    /// Keyed by the whole violation: two can share a lease, time, kind and
    /// token (one grant overlapping two others), and a retraction of one
    /// must not take the other with it.
    unconfirmed: BTreeSet<Violation>,
    /// The violations the audit settled, by lease: handed back to it when
    /// the lease is re-audited ([`AlertEngine::reload`]), so that only what
    /// the late event changed comes out as appeared or retracted.
    settled_violations: HashMap<Name, Vec<Violation>>,
    late_events: u64,
    /// The horizon of the last sweep of the grants reported.
    grants_swept: i64,
}

impl AlertEngine {
    /// A new engine. `cfg` must have passed [`AlertsConfig::validate`].
    pub fn new(cfg: AlertsConfig, audit: AuditConfig, metrics: Option<LeaseMetrics>) -> Self {
        Self::with_auditor(cfg, SharedAuditor::new(audit), metrics)
    }

    /// A new engine that pushes into `auditor`, an empty one or one
    /// holding only events this engine is not given again.
    pub fn with_auditor(
        cfg: AlertsConfig,
        auditor: SharedAuditor,
        metrics: Option<LeaseMetrics>,
    ) -> Self {
        let skew = auditor.lock().config().clock_skew_tolerance;
        let observer: Box<dyn Observer> = match metrics {
            Some(m) => Box::new(m),
            None => Box::new(Unobserved),
        };
        AlertEngine {
            steps: Steps::new(micros(cfg.evaluation_interval).max(1)),
            skew_us: micros(skew),
            rules: rules::build(&cfg.rules),
            lifecycle: Lifecycle::new(cfg.external_url.clone()),
            cfg,
            auditor,
            observer,
            max_ts: None,
            watermark: i64::MIN,
            next_eval: None,
            last_eval: i64::MIN,
            unconfirmed: BTreeSet::new(),
            settled_violations: HashMap::new(),
            late_events: 0,
            grants_swept: i64::MIN,
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

    /// The engine has been given every event of lake snapshot `version`
    /// (`lake_rows` rows of `lease_events`) that it will hold (see
    /// [`SharedAuditor`]).
    pub fn mark(&self, version: u64, lake_rows: u64) {
        self.auditor.mark(version, lake_rows);
    }

    /// Lets the audit forget the grants and violations that end before
    /// `cutoff` (event time, microseconds; see [`leaseline_audit::Auditor::settle`]),
    /// after taking its new violations in. Returns the grants settled.
    ///
    /// Only for an engine whose auditor no SQL table reads (a replay's):
    /// the settled rows are dropped, the alerts keep what they need. The
    /// caller first re-audits every lease [`AlertEngine::take_stale`]
    /// names.
    pub fn settle(&mut self, cutoff: i64) -> usize {
        self.take_violations();
        let settled = self.auditor.lock().settle(cutoff);
        let mut grants = 0;
        for s in settled {
            grants += s.grants.len();
            if !s.violations.is_empty() {
                self.settled_violations
                    .entry(s.lease_id)
                    .or_default()
                    .extend(s.violations);
            }
        }
        grants
    }

    /// Lets the audit hold the grants and violations that end before
    /// `cutoff` as rows rather than as their events, after taking its new
    /// violations in (see [`leaseline_audit::Auditor::settle_keeping`]):
    /// for an engine whose auditor SQL reads (the live one). The caller
    /// re-audits every lease [`AlertEngine::take_stale`] names. Returns
    /// the grants settled.
    pub fn settle_keeping(&mut self, cutoff: i64) -> usize {
        self.take_violations();
        self.auditor.lock().settle_keeping(cutoff)
    }

    /// The rows settled and kept, not stored yet.
    pub fn kept(&mut self) -> Vec<Settled> {
        self.auditor.lock().kept()
    }

    /// The kept rows, and the voiding of the rows of leases audited again,
    /// are committed to the stored tables, which are now `stored`.
    pub fn release_kept(&mut self, stored: Arc<StoredFiles>) {
        let released = self.auditor.lock().release_kept(stored);
        for v in released {
            self.settled_violations
                .entry(v.lease_id.clone())
                .or_default()
                .push(v);
        }
    }

    /// The stored files as they are now (see
    /// [`leaseline_audit::Auditor::set_stored`]).
    pub fn publish_stored(&mut self, stored: Arc<StoredFiles>) {
        self.auditor.lock().set_stored(stored);
    }

    /// Leases whose stored rows are void (see
    /// [`leaseline_audit::Auditor::voided`]).
    pub fn voided(&self) -> Vec<Name> {
        self.auditor.lock().voided()
    }

    /// Settles each of `leases` at its cut, where its rows are stored
    /// already (part way through a replay of the lake's history), having
    /// taken the audit's violations in first. A lease whose cut cannot be
    /// made is voided. Returns the leases settled.
    pub fn resume<'a>(&mut self, leases: impl IntoIterator<Item = (&'a str, i64)>) -> usize {
        self.take_violations();
        let mut auditor = self.auditor.lock();
        let mut resumed = 0;
        let mut dropped = Vec::new();
        for (lease, cut) in leases {
            if let Some(v) = auditor.resume(lease, cut) {
                resumed += 1;
                if !v.is_empty() {
                    dropped.push((Name::from(lease), v));
                }
            }
        }
        drop(auditor);
        for (lease, v) in dropped {
            self.settled_violations.entry(lease).or_default().extend(v);
        }
        resumed
    }

    /// The leases given an event that changes what their audit settled
    /// (one older than what was let go of): each must be re-audited from
    /// its whole history with [`AlertEngine::reload`].
    pub fn take_stale(&mut self) -> Vec<Name> {
        self.auditor.lock().take_stale()
    }

    /// Re-audits `lease_id` from `events`, its whole history (distinct
    /// event ids, as the lake holds them). Violations the history now
    /// makes or unmakes come out as the audit's changes, to be confirmed
    /// by the watermark like any other.
    pub fn reload<'e>(&mut self, lease_id: &str, events: &'e [LeaseEvent<'e>]) {
        let void = self.settled_violations.remove(lease_id).unwrap_or_default();
        self.auditor.lock().reload(lease_id, events, &void);
    }

    /// Leases the audit has seen.
    pub fn leases_known(&self) -> usize {
        self.auditor.lock().lease_count()
    }

    /// Events the audit holds in memory (what settling bounds).
    pub fn held_events(&self) -> usize {
        self.auditor.lock().held()
    }

    /// Counts a lease whose events came from more than one input partition.
    pub fn count_lease_on_several_partitions(&self) {
        self.observer.several_partitions();
    }

    /// Events that arrived below the watermark.
    pub fn late_events(&self) -> u64 {
        self.late_events
    }

    /// Takes one event. Returns false for a duplicate (an `event_id` the
    /// audit has already seen).
    pub fn push(&mut self, ev: &LeaseEvent<'_>) -> bool {
        let mut auditor = self.auditor.lock();
        if !auditor.push(ev) {
            drop(auditor);
            self.observer.duplicate();
            return false;
        }
        let lease = auditor
            .lease_name(&ev.lease_id)
            .expect("the audit interned the lease it was just given");
        let named = ev.backend.as_deref().map(|b| auditor.intern(b));
        let holder = ev.holder_id.as_deref().map(|h| auditor.intern(h));
        drop(auditor);
        let ts = ev.ts_us;
        if ts < self.watermark {
            self.late_events += 1;
            self.observer.late();
        }
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        let backend = self.steps.backend(&lease, named);
        self.steps.saw(ts);
        let next = (self.steps.floor(ts) + self.steps.step)
            .max(self.last_eval.saturating_add(self.steps.step));
        self.next_eval = Some(self.next_eval.map_or(next, |n| n.min(next)));
        let mut first_grant = false;
        match ev.kind {
            Kind::Acquired => {
                if let Some(lat) = ev.latency_ms {
                    let s = self.steps.at(ts);
                    s.latency.entry(backend.clone()).or_default().push(lat);
                }
                if let Some(token) = ev.fencing_token {
                    first_grant = self
                        .steps
                        .count_grant(lease.clone(), token, ts, self.last_eval);
                }
            }
            Kind::Renewed | Kind::RenewFailed => {
                let s = self.steps.at(ts);
                let counts = if ev.kind == Kind::Renewed {
                    &mut s.renew_ok
                } else {
                    &mut s.renew_failed
                };
                *counts.entry(backend.clone()).or_default() += 1;
            }
            _ => {}
        }
        let intake = Intake {
            ev,
            lease,
            holder,
            backend,
        };
        self.observer.event(&intake, first_grant);
        for rule in &self.rules {
            if let Some(e) = rule.on_event(&intake) {
                self.lifecycle.raise(e);
            }
        }
        true
    }

    /// Feeds the audit's new and retracted violations in.
    fn take_violations(&mut self) {
        let changes = self.auditor.lock().drain_changes();
        for v in changes.retracted {
            self.unconfirmed.remove(&v);
        }
        self.unconfirmed.extend(changes.appeared);
    }

    /// Hands the violations the watermark has passed (plus the clock-skew
    /// tolerance the audit allows) to the rules.
    fn confirm_violations(&mut self) {
        let w = self.watermark;
        let skew = self.skew_us;
        let ready: Vec<Violation> = self
            .unconfirmed
            .iter()
            .filter(|v| v.at.saturating_add(skew) <= w)
            .cloned()
            .collect();
        for v in ready {
            self.unconfirmed.remove(&v);
            self.observer.violation(&v);
            let backend = self.steps.backend_of(&v.lease_id).cloned();
            for rule in &self.rules {
                if let Some(e) = rule.on_violation(&v, backend.clone()) {
                    self.lifecycle.raise(e);
                }
            }
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
        self.steps.close_before(self.last_eval);
        self.lifecycle.resolve_due(self.watermark);
        self.prune();
        self.observer.active(&mut self.lifecycle.active());
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

    /// The longest window a rule's verdict reads.
    fn max_window(&self) -> i64 {
        self.rules.iter().map(|r| r.window()).max().unwrap_or(0)
    }

    fn next_boundary(&self, b: i64) -> Option<i64> {
        let step = self.steps.step;
        let next = b + step;
        if self.lifecycle.any_windowed() {
            return Some(next);
        }
        // Nothing is open: skip to the first boundary whose window holds a
        // step with data.
        self.steps
            .first_from(next - self.max_window())
            .map(|s| next.max(s + step))
    }

    fn evaluate(&mut self, b: i64) {
        let mut verdicts: Vec<Verdict> = Vec::new();
        for rule in &self.rules {
            rule.judge(&self.steps, b, &*self.observer, &mut verdicts);
        }
        self.lifecycle.judge(verdicts, b);
    }

    fn prune(&mut self) {
        let keep = self.rules.iter().map(|r| r.history()).max().unwrap_or(0) + self.steps.step;
        let floor = self.last_eval.saturating_sub(keep);
        let horizon = self
            .watermark
            .saturating_sub(GRANT_REPORT_SPAN + micros(self.cfg.lateness));
        let grants = (horizon > self.grants_swept.saturating_add(GRANT_SWEEP_EVERY)).then(|| {
            self.grants_swept = horizon;
            horizon
        });
        self.steps.prune(floor, grants);
    }

    /// The state changes since the last call, in the order they happened.
    pub fn take_changes(&mut self) -> Vec<Alert> {
        self.lifecycle.take_changes()
    }

    /// Every alert now pending or firing.
    pub fn active(&self) -> Vec<Alert> {
        self.lifecycle.active().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{AlertEngine, GRANT_REPORT_SPAN, US};
    use crate::config::AlertsConfig;
    use leaseline_audit::AuditConfig;

    const START: i64 = 1_789_380_000 * US; // 2026-09-14T10:00:00Z

    fn acquired(
        source: &str,
        lease: usize,
        token: u64,
        ts: i64,
    ) -> leaseline_schema::LeaseEvent<'static> {
        let at = crate::text::fmt_ts(ts);
        let line = format!(
            r#"{{"event_id":"{source}-{lease}-{token}","ts":"{at}","kind":"acquired","source":"{source}","lease_id":"L{lease}","holder_id":"h","fencing_token":{token},"ttl_ms":10000}}"#
        );
        leaseline_schema::decode(line.as_bytes())
            .expect("a contract event")
            .into_owned()
    }

    /// Grants are remembered for their second report only as long as one
    /// may come: what the engine holds does not grow with the grants of
    /// the whole history, and a grant reported twice still counts once.
    #[test]
    fn grants_reported_are_let_go_once_their_second_report_is_past() {
        let mut e = AlertEngine::new(AlertsConfig::default(), AuditConfig::default(), None);
        let lateness = super::micros(AlertsConfig::default().lateness);
        let mut held = Vec::new();
        // 40 minutes, a new grant of each of 10 leases every 10 s.
        for step in 0..240u64 {
            let ts = START + step as i64 * 10 * US;
            for lease in 0..10 {
                assert!(e.push(&acquired("coordinator", lease, 100 + step, ts)));
            }
            // The holder's report, 2 s later: the same grant.
            for lease in 0..10 {
                assert!(e.push(&acquired("holder", lease, 100 + step, ts + 2 * US)));
            }
            e.advance(ts - lateness);
            held.push(e.steps.grants_len());
        }
        let newest = START + 239 * 10 * US - lateness;
        // What was first reported within the span of the horizon (the
        // watermark, itself the lateness behind the newest event, less the
        // lateness again), and a sweep's step, is held; nothing older.
        let span = GRANT_REPORT_SPAN + 2 * lateness + super::GRANT_SWEEP_EVERY;
        let span_grants = (span / (10 * US) + 1) as usize * 10;
        assert!(
            held.iter().all(|&n| n <= span_grants),
            "held {:?}",
            held.iter().max()
        );
        // 40 minutes of grants were reported; a fraction of them is held.
        assert!(*held.last().unwrap() < 2400 / 3);
        assert!(*held.last().unwrap() >= (GRANT_REPORT_SPAN / (10 * US)) as usize * 10);
        // Each grant was counted once, in the step of its first report.
        let counted: u32 = e
            .steps
            .range(newest - 60 * US..newest)
            .map(|s| s.fleet_grants)
            .sum();
        assert_eq!(counted, 60);
    }
}
