//! Shared test helpers: a compact event notation decoded through the real
//! decoder, and a runner that checks every answer is the same in many
//! arrival orders, with duplicates, and when read incrementally.

#![allow(dead_code)]

use std::collections::BTreeSet;

use chrono::{DateTime, NaiveDate, NaiveTime};
use leaseline_audit::{AuditConfig, Auditor, Grant, Violation};
use leaseline_schema::LeaseEvent;

/// One event in a line: `id time kind source lease holder token key=value...`
/// where `id`, `holder` and `token` may be `-` (absent), `time` is a UTC
/// time of day on 2026-09-14 (`10:00:06.000`) and source is `c`, `h` or `r`.
/// Values that parse as numbers are numbers. The result is a contract JSON
/// line.
pub fn json(spec: &str) -> String {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    assert!(parts.len() >= 7, "short event spec: {spec}");
    let mut fields = Vec::new();
    fields.push(format!("\"ts\":\"2026-09-14T{}Z\"", parts[1]));
    fields.push(format!("\"kind\":\"{}\"", parts[2]));
    let source = match parts[3] {
        "c" => "coordinator",
        "h" => "holder",
        "r" => "resource",
        other => other,
    };
    fields.push(format!("\"source\":\"{source}\""));
    fields.push(format!("\"lease_id\":\"{}\"", parts[4]));
    if parts[5] != "-" {
        fields.push(format!("\"holder_id\":\"{}\"", parts[5]));
    }
    if parts[6] != "-" {
        fields.push(format!("\"fencing_token\":{}", parts[6]));
    }
    if parts[0] != "-" {
        fields.push(format!("\"event_id\":\"{}\"", parts[0]));
    }
    for kv in &parts[7..] {
        let (k, v) = kv.split_once('=').expect("key=value");
        if v.parse::<f64>().is_ok() {
            fields.push(format!("\"{k}\":{v}"));
        } else {
            fields.push(format!("\"{k}\":\"{v}\""));
        }
    }
    format!("{{{}}}", fields.join(","))
}

/// Decodes contract JSON lines with the schema's decoder.
pub fn decode_lines(lines: &[String]) -> Vec<LeaseEvent<'static>> {
    lines
        .iter()
        .map(|l| {
            leaseline_schema::decode(l.as_bytes())
                .unwrap_or_else(|e| panic!("{l}: {e:?}"))
                .into_owned()
        })
        .collect()
}

pub fn events(specs: &[&str]) -> Vec<LeaseEvent<'static>> {
    let lines: Vec<String> = specs.iter().map(|s| json(s)).collect();
    decode_lines(&lines)
}

/// Microseconds of a UTC time of day on 2026-09-14.
pub fn at(time: &str) -> i64 {
    let t = NaiveTime::parse_from_str(time, "%H:%M:%S%.f").expect(time);
    NaiveDate::from_ymd_opt(2026, 9, 14)
        .unwrap()
        .and_time(t)
        .and_utc()
        .timestamp_micros()
}

fn hms(us: i64) -> String {
    DateTime::from_timestamp_micros(us)
        .unwrap()
        .format("%H:%M:%S%.3f")
        .to_string()
}

/// A grant as one comparable line.
pub fn grant_row(g: &Grant) -> String {
    let mut s = format!(
        "{} #{} {} {}..{} {}",
        g.lease_id,
        g.fencing_token,
        g.holder_id,
        hms(g.acquired_at),
        g.ended_at.map_or("-".to_string(), hms),
        g.end_kind,
    );
    if let Some(t) = g.ttl_ms {
        s.push_str(&format!(" ttl={t}"));
    }
    s.push_str(&format!(
        " renewals={} fails={}",
        g.renewals, g.renew_failures
    ));
    if let Some(gap) = g.max_renew_gap_ms {
        s.push_str(&format!(" gap={gap}"));
    }
    s.push_str(&format!(
        " writes={} stale={}",
        g.writes_accepted, g.stale_writes_rejected
    ));
    if let Some(b) = &g.backend {
        s.push_str(&format!(" backend={b}"));
    }
    if let Some(t) = &g.trace_id {
        s.push_str(&format!(" trace={t}"));
    }
    s
}

/// A violation as one comparable line (without its detail).
pub fn violation_row(v: &Violation) -> String {
    let mut s = format!(
        "{} {} #{} {} at {}",
        v.kind,
        v.lease_id,
        v.fencing_token,
        v.holder_id.as_deref().unwrap_or("-"),
        hms(v.at)
    );
    if let Some(t) = v.other_fencing_token {
        s.push_str(&format!(
            " other #{} {}",
            t,
            v.other_holder_id.as_deref().unwrap_or("-")
        ));
    }
    s.push_str(&format!(" [{}]", v.evidence.join(",")));
    s
}

/// A small deterministic generator (Knuth's MMIX LCG).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// What the audit answered, for comparison across orders.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub timeline: Vec<Grant>,
    pub violations: Vec<Violation>,
}

impl Outcome {
    pub fn grant_rows(&self) -> Vec<String> {
        self.timeline.iter().map(grant_row).collect()
    }

    pub fn violation_rows(&self) -> Vec<String> {
        self.violations.iter().map(violation_row).collect()
    }
}

/// Arrival orders of `events`: as given, reversed, and shuffled, each
/// shuffled one also with duplicates of events that have an `event_id`.
fn orders(events: &[LeaseEvent<'static>]) -> Vec<(String, Vec<LeaseEvent<'static>>)> {
    let mut out = vec![
        ("given".to_string(), events.to_vec()),
        (
            "reversed".to_string(),
            events.iter().rev().cloned().collect(),
        ),
    ];
    for seed in 1..=6u64 {
        let mut rng = Lcg::new(seed);
        let mut v = events.to_vec();
        rng.shuffle(&mut v);
        out.push((format!("shuffle {seed}"), v.clone()));
        for e in events.iter().filter(|e| e.event_id.is_some()) {
            for _ in 0..rng.below(3) {
                let pos = rng.below(v.len() + 1);
                v.insert(pos, e.clone());
            }
        }
        out.push((format!("shuffle {seed} with duplicates"), v));
    }
    out
}

pub fn audit(specs: &[&str]) -> Outcome {
    audit_events(AuditConfig::default(), &events(specs))
}

pub fn audit_with(config: AuditConfig, specs: &[&str]) -> Outcome {
    audit_events(config, &events(specs))
}

/// Audits `events` in every order of [`orders`], checks the answers agree
/// (also with what `drain_changes` accumulated after every push, and with
/// `lease` and `holders`), and returns the answer.
pub fn audit_events(config: AuditConfig, events: &[LeaseEvent<'static>]) -> Outcome {
    let distinct = {
        let ids: BTreeSet<&str> = events
            .iter()
            .filter_map(|e| e.event_id.as_deref())
            .collect();
        ids.len() + events.iter().filter(|e| e.event_id.is_none()).count()
    };
    let mut first: Option<Outcome> = None;
    for (name, order) in orders(events) {
        let mut auditor = Auditor::new(config);
        let mut alerts: BTreeSet<Violation> = BTreeSet::new();
        let mut seen_ids = BTreeSet::new();
        for (i, e) in order.iter().enumerate() {
            let fresh = e
                .event_id
                .as_deref()
                .is_none_or(|id| seen_ids.insert(id.to_string()));
            assert_eq!(auditor.push(e), fresh, "{name}: push return of event {i}");
            let changes = auditor.drain_changes();
            for v in changes.retracted {
                assert!(
                    alerts.remove(&v),
                    "{name}: retracted unknown violation {v:?}"
                );
            }
            for v in changes.appeared {
                assert!(alerts.insert(v), "{name}: violation appeared twice");
            }
        }
        assert_eq!(auditor.len(), distinct, "{name}: distinct events");
        let outcome = Outcome {
            timeline: auditor.timeline(),
            violations: auditor.violations(),
        };
        assert_eq!(
            alerts.into_iter().collect::<Vec<_>>(),
            outcome.violations,
            "{name}: drained changes disagree with violations()"
        );
        assert!(auditor.drain_changes().is_empty(), "{name}: second drain");
        let mut batch = Auditor::new(config);
        assert_eq!(
            batch.push_all(&order),
            seen_ids.len() + order.iter().filter(|e| e.event_id.is_none()).count(),
            "{name}: push_all count"
        );
        assert_eq!(
            batch.timeline(),
            outcome.timeline,
            "{name}: push_all timeline"
        );
        assert_eq!(
            batch.violations(),
            outcome.violations,
            "{name}: push_all violations"
        );
        for holder in auditor.holders() {
            let last = outcome
                .timeline
                .iter()
                .rfind(|g| g.lease_id == holder.grant.lease_id)
                .unwrap();
            assert_eq!(&holder.grant, last, "{name}: holders()");
            assert_eq!(holder.valid, last.is_open());
        }
        for lease in auditor.lease_ids() {
            let one = auditor.lease(&lease).unwrap();
            let grants: Vec<_> = outcome
                .timeline
                .iter()
                .filter(|g| g.lease_id == lease)
                .cloned()
                .collect();
            let violations: Vec<_> = outcome
                .violations
                .iter()
                .filter(|v| v.lease_id == lease)
                .cloned()
                .collect();
            assert_eq!(one.grants, grants, "{name}: lease({lease}) grants");
            assert_eq!(
                one.violations, violations,
                "{name}: lease({lease}) violations"
            );
        }
        // Distinct ids are what a lake holds (ingest keeps one event per
        // id), and what settling assumes.
        if seen_ids.len() + order.iter().filter(|e| e.event_id.is_none()).count() == order.len() {
            for (cutoff_lag, keep) in [(0, false), (1_000_000, false), (0, true), (1_000_000, true)]
            {
                let settled = settling(config, &order, cutoff_lag, keep);
                assert_eq!(
                    settled.grant_rows(),
                    outcome.grant_rows(),
                    "{name}: settling (cutoff {cutoff_lag} us behind, keeping rows: {keep}): timeline differs"
                );
                assert_eq!(
                    settled.violations, outcome.violations,
                    "{name}: settling (cutoff {cutoff_lag} us behind, keeping rows: {keep}): violations differ"
                );
                assert_eq!(settled.timeline, outcome.timeline, "{name}: settling");
            }
        }
        match &first {
            None => first = Some(outcome),
            Some(f) => {
                assert_eq!(
                    f.grant_rows(),
                    outcome.grant_rows(),
                    "{name}: timeline differs"
                );
                assert_eq!(
                    f.violations, outcome.violations,
                    "{name}: violations differ"
                );
                assert_eq!(f, &outcome, "{name}: outcome differs");
            }
        }
    }
    first.unwrap()
}

/// Asserts the rows equal, with a readable diff.
pub fn assert_rows(actual: Vec<String>, expected: &[&str]) {
    let expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    assert!(
        actual == expected,
        "rows differ\nactual:\n  {}\nexpected:\n  {}",
        actual.join("\n  "),
        expected.join("\n  ")
    );
}

/// What a settling auditor answers for `order` (distinct event ids), as a
/// long-running one would be driven: after each event, the leases it
/// made stale are replayed from everything pushed so far (the lake), and
/// everything `cutoff_lag` behind the latest time is settled. The answer
/// is the rows handed out plus what the auditor still answers; the
/// violations `drain_changes` accumulated must be the same. With `keep`,
/// the auditor keeps the settled rows (`settle_keeping`) and the answer is
/// its own, in its own order, lease by lease too.
pub fn settling(
    config: AuditConfig,
    order: &[LeaseEvent<'static>],
    cutoff_lag: i64,
    keep: bool,
) -> Outcome {
    use std::collections::BTreeMap;
    let mut auditor = Auditor::new(config);
    let mut lake: Vec<LeaseEvent<'static>> = Vec::new();
    let mut stored: BTreeMap<String, (Vec<Grant>, Vec<Violation>)> = BTreeMap::new();
    let mut alerts: BTreeSet<Violation> = BTreeSet::new();
    for e in order {
        auditor.push(e);
        lake.push(e.clone());
        for lease in auditor.take_stale() {
            let void = stored.remove(&*lease).unwrap_or_default();
            let history: Vec<&LeaseEvent<'static>> =
                lake.iter().filter(|e| *e.lease_id == *lease).collect();
            auditor.reload(&lease, history, &void.1);
        }
        if keep {
            // Violations settled are not drained again: keep the alert set
            // as a long-running engine would.
            let changes = auditor.drain_changes();
            for v in changes.retracted {
                assert!(alerts.remove(&v), "keeping: retracted unknown {v:?}");
            }
            for v in changes.appeared {
                assert!(alerts.insert(v), "keeping: appeared twice");
            }
            auditor.settle_keeping(auditor.latest_ts().unwrap() - cutoff_lag);
            continue;
        }
        let changes = auditor.drain_changes();
        for v in changes.retracted {
            assert!(alerts.remove(&v), "settling: retracted unknown {v:?}");
        }
        for v in changes.appeared {
            assert!(alerts.insert(v), "settling: appeared twice");
        }
        let cutoff = auditor.latest_ts().unwrap() - cutoff_lag;
        for s in auditor.settle(cutoff) {
            let rows = stored.entry(s.lease_id.to_string()).or_default();
            rows.0.extend(s.grants);
            rows.1.extend(s.violations);
        }
    }
    if keep {
        let timeline = auditor.timeline();
        let violations = auditor.violations();
        assert_eq!(
            alerts.into_iter().collect::<Vec<_>>(),
            violations,
            "keeping: drained changes disagree with the rows"
        );
        for lease in auditor.lease_ids() {
            let one = auditor.lease(&lease).unwrap();
            let grants: Vec<_> = timeline
                .iter()
                .filter(|g| g.lease_id == lease)
                .cloned()
                .collect();
            assert_eq!(one.grants, grants, "keeping: lease({lease})");
        }
        return Outcome {
            timeline,
            violations,
        };
    }
    let mut timeline: Vec<Grant> = stored.values().flat_map(|r| r.0.clone()).collect();
    let mut violations: Vec<Violation> = stored.values().flat_map(|r| r.1.clone()).collect();
    // Open and lapsed are judged at the latest time seen: a settled grant
    // has ended for good, a kept one is judged now.
    timeline.extend(auditor.timeline());
    violations.extend(auditor.violations());
    timeline.sort_by(|a, b| {
        (&a.lease_id, a.acquired_at, a.fencing_token).cmp(&(
            &b.lease_id,
            b.acquired_at,
            b.fencing_token,
        ))
    });
    violations.sort();
    assert_eq!(
        alerts.into_iter().collect::<Vec<_>>(),
        violations,
        "settling: drained changes disagree with the rows"
    );
    Outcome {
        timeline,
        violations,
    }
}
