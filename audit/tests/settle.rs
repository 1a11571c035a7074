//! Settling (`Auditor::settle`): rows handed out as they settle, plus
//! what the auditor still answers, are what an auditor holding every event
//! answers; late events replay their lease and correct the rows, and what
//! is held stays bounded while history grows.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;

use common::{events, grant_row, settling, violation_row, Lcg};
use std::sync::Arc;

use leaseline_audit::{AuditConfig, Auditor, Grant, StoredFiles, Violation};
use leaseline_schema::{Kind, LeaseEvent, Source};

const T0: i64 = 1_789_380_000_000_000;
const SEC: i64 = 1_000_000;

/// A fleet's history: on each lease, grants one after another (a token
/// more each time), renewed, written with, ended in every way, with the
/// faults the audit exists for mixed in (overlaps, regressions, stale and
/// late writes, renewals after the end, tokenless failures, a grant with
/// no TTL); then delivered in time order but for some events held back
/// well past the lateness horizon.
fn fleet(seed: u64, leases: usize, grants: usize) -> Vec<LeaseEvent<'static>> {
    let mut rng = Lcg::new(seed);
    let mut out = Vec::new();
    let mut id = 0;
    for l in 0..leases {
        let lease = format!("L{l}");
        let mut t = T0 + rng.below(5) as i64 * SEC;
        let mut token = 10u64;
        for _ in 0..grants {
            let holder = format!("h{}", rng.below(4));
            token = match rng.below(30) {
                0 => token.saturating_sub(1), // a regression
                _ => token + 1,
            };
            let ttl = 2_000 + 1_000 * rng.below(3) as i64;
            let mut ev = |ts: i64, kind: Kind, source: Source, token: Option<u64>, holder: &str| {
                id += 1;
                LeaseEvent {
                    ts_us: ts,
                    kind,
                    source,
                    lease_id: Cow::Owned(lease.clone()),
                    holder_id: Some(Cow::Owned(holder.to_string())),
                    fencing_token: token,
                    ttl_ms: matches!(kind, Kind::Acquired | Kind::Renewed).then_some(ttl),
                    event_id: Some(Cow::Owned(format!("e{id}"))),
                    backend: None,
                    latency_ms: None,
                    reason: None,
                    max_token: None,
                    mono_ms: None,
                    keepalive_sent_mono_ms: None,
                    deadline_mono_ms: None,
                    trace_id: None,
                    span_id: None,
                    attrs: Vec::new(),
                }
            };
            let mut grant = vec![ev(
                t,
                Kind::Acquired,
                Source::Coordinator,
                Some(token),
                &holder,
            )];
            if rng.below(40) == 0 {
                // No TTL, no end: valid for ever.
                grant[0].ttl_ms = None;
            }
            let mut at = t;
            for _ in 0..rng.below(4) {
                at += ttl * 1000 / 3;
                grant.push(ev(at, Kind::Renewed, Source::Holder, Some(token), &holder));
                if rng.below(3) == 0 {
                    grant.push(ev(
                        at + 100_000,
                        Kind::WriteAccepted,
                        Source::Resource,
                        Some(token),
                        &holder,
                    ));
                }
            }
            if rng.below(8) == 0 {
                grant.push(ev(
                    at + 200_000,
                    Kind::RenewFailed,
                    Source::Holder,
                    None,
                    &holder,
                ));
            }
            let end = at + 500_000;
            match rng.below(6) {
                0 => {} // lapses
                1 => grant.push(ev(
                    end,
                    Kind::Expired,
                    Source::Coordinator,
                    Some(token),
                    &holder,
                )),
                2 => grant.push(ev(
                    end,
                    Kind::Revoked,
                    Source::Coordinator,
                    Some(token),
                    &holder,
                )),
                _ => grant.push(ev(
                    end,
                    Kind::Released,
                    Source::Holder,
                    Some(token),
                    &holder,
                )),
            }
            if rng.below(15) == 0 {
                // A zombie: renews and writes after its end.
                grant.push(ev(
                    end + SEC,
                    Kind::Renewed,
                    Source::Holder,
                    Some(token),
                    &holder,
                ));
                grant.push(ev(
                    end + SEC,
                    Kind::WriteAccepted,
                    Source::Resource,
                    Some(token),
                    &holder,
                ));
            }
            out.extend(grant);
            // The next grant: usually after a pause, sometimes overlapping.
            t = match rng.below(12) {
                0 => t + SEC,
                _ => end + (1 + rng.below(20) as i64) * SEC,
            };
        }
    }
    out.sort_by_key(|e| e.ts_us);
    // Some events held back by up to a minute.
    let mut delivered: Vec<(i64, LeaseEvent<'static>)> = out
        .into_iter()
        .map(|e| {
            let delay = match rng.below(25) {
                0 => rng.below(60) as i64 * SEC,
                _ => 0,
            };
            (e.ts_us + delay, e)
        })
        .collect();
    delivered.sort_by_key(|(at, _)| *at);
    delivered.into_iter().map(|(_, e)| e).collect()
}

fn full(events: &[LeaseEvent<'static>]) -> (Vec<String>, Vec<String>) {
    let mut a = Auditor::default();
    a.push_all(events);
    (
        a.timeline().iter().map(grant_row).collect(),
        a.violations().iter().map(violation_row).collect(),
    )
}

#[test]
fn fleets_delivered_late_settle_to_the_whole_historys_answer() {
    let mut reloads_seen = false;
    for seed in 1..=30 {
        let history = fleet(seed, 6, 40);
        let (grants, violations) = full(&history);
        for (lag, keep) in [0, 2 * SEC, 30 * SEC]
            .into_iter()
            .flat_map(|lag| [(lag, false), (lag, true)])
        {
            let out = settling(AuditConfig::default(), &history, lag, keep);
            let rows: Vec<String> = out.timeline.iter().map(grant_row).collect();
            assert_eq!(
                rows, grants,
                "seed {seed}, horizon {lag} us, keep {keep}: timeline"
            );
            let rows: Vec<String> = out.violations.iter().map(violation_row).collect();
            assert_eq!(
                rows, violations,
                "seed {seed}, horizon {lag} us, keep {keep}: violations"
            );
        }
        // Every kind of violation turns up across the seeds; reloads too.
        let mut a = Auditor::default();
        for e in &history {
            a.push(e);
            reloads_seen |= !a.take_stale().is_empty();
            a.settle(a.latest_ts().unwrap());
        }
    }
    assert!(reloads_seen, "no late event ever reached settled rows");
}

/// What the lake's stored audit tables hold in this test: per lease, its
/// cut and the rows stored.
type Stored = BTreeMap<String, (i64, Vec<Grant>, Vec<Violation>, Vec<LeaseEvent<'static>>)>;

/// The live engine's commit: the voided leases' rows go, the kept rows
/// come with their lease's cut, and the auditor releases them.
fn store(a: &mut Auditor, stored: &mut Stored) {
    for lease in a.voided() {
        stored.remove(&*lease);
    }
    for s in a.kept() {
        let rows = stored.entry(s.lease_id.to_string()).or_default();
        rows.0 = s.cut;
        rows.1.extend(s.grants);
        rows.2.extend(s.violations);
        rows.3 = s.context;
    }
    a.release_kept(Arc::new(StoredFiles::default()));
    assert!(a.voided().is_empty() && a.kept().is_empty());
}

/// What a reader of the lake's stored tables audits (`query/src/stored.rs`)
/// when the stored rows account for every event: each lease's stored
/// context and its events from its cut on, every event of a lease with no
/// stored rows, each lease settled at its stored cut.
fn reader(stored: &Stored, lake: &[LeaseEvent<'static>]) -> Auditor {
    let mut r = Auditor::default();
    for (_, (_, _, _, context)) in stored.iter() {
        r.push_all(context);
    }
    r.push_all(
        lake.iter()
            .filter(|e| stored.get(&*e.lease_id).is_none_or(|s| e.ts_us >= s.0)),
    );
    let failed = r.resume_all(stored.iter().map(|(l, s)| (l.as_str(), s.0)));
    assert!(failed.is_empty(), "cuts not made again: {failed:?}");
    r
}

/// The protocol of `serve --ingest` with the lake's stored tables
/// (`alerts/src/stored.rs`): settle keeping the rows, now and then store
/// the kept rows and release them, void the stored rows of a lease
/// replayed for a late event; a restart half-way pushes the whole history
/// into a new auditor and resumes each lease at its stored cut. The stored
/// rows and what the auditor answers are, together, the whole history's
/// answer, none twice, after the restart and at the end.
#[test]
fn stored_rows_and_a_restart_at_their_cuts_answer_the_whole_history() {
    let (mut resumed, mut voided) = (0, 0);
    for seed in 1..=20 {
        let history = fleet(seed, 6, 40);
        let horizon = 2 * SEC;
        let restart = history.len() / 2;
        let mut stored = Stored::new();
        let mut a = Auditor::default();
        let mut lake: Vec<LeaseEvent<'static>> = Vec::new();
        let whole = |a: &mut Auditor, stored: &Stored| {
            let mut grants: Vec<String> = stored
                .values()
                .flat_map(|r| r.1.iter().map(grant_row))
                .chain(a.timeline().iter().map(grant_row))
                .collect();
            let mut violations: Vec<String> = stored
                .values()
                .flat_map(|r| r.2.iter().map(violation_row))
                .chain(a.violations().iter().map(violation_row))
                .collect();
            grants.sort();
            violations.sort();
            (grants, violations)
        };
        let expect = |events: &[LeaseEvent<'static>]| {
            let (mut g, mut v) = full(events);
            g.sort();
            v.sort();
            (g, v)
        };
        // How many of the lake's events the stored rows answer for (the
        // position a commit records).
        let mut position = 0;
        let reaudit = |a: &mut Auditor, lake: &[LeaseEvent<'static>]| {
            for lease in a.take_stale() {
                let h: Vec<_> = lake.iter().filter(|x| *x.lease_id == *lease).collect();
                a.reload(&lease, h, &[]);
            }
        };
        for (i, e) in history.iter().enumerate() {
            if i == restart {
                // The replay: the events the stored rows answer for, each
                // lease at its stored cut, then the rest as they came.
                a = Auditor::default();
                a.push_all(&lake[..position]);
                for (lease, (cut, ..)) in &stored {
                    match a.resume(lease, *cut) {
                        Some(_) => resumed += 1,
                        None => voided += 1,
                    }
                }
                for e in &lake[position..] {
                    a.push(e);
                    reaudit(&mut a, &lake);
                }
                store(&mut a, &mut stored);
                position = lake.len();
                assert_eq!(
                    whole(&mut a, &stored),
                    expect(&lake),
                    "seed {seed}: restarted"
                );
            }
            a.push(e);
            lake.push(e.clone());
            reaudit(&mut a, &lake);
            a.settle_keeping(a.latest_ts().unwrap() - horizon);
            if i % 50 == 0 {
                store(&mut a, &mut stored);
                position = lake.len();
                assert_eq!(
                    whole(&mut reader(&stored, &lake), &stored),
                    expect(&lake),
                    "seed {seed}: a reader of the stored rows after {i} events"
                );
            }
        }
        store(&mut a, &mut stored);
        assert_eq!(
            whole(&mut reader(&stored, &lake), &stored),
            expect(&history),
            "seed {seed}: a reader of the stored rows at the end"
        );
        assert_eq!(
            whole(&mut a, &stored),
            expect(&history),
            "seed {seed}: at the end"
        );
        assert!(
            stored.values().any(|r| !r.1.is_empty()),
            "seed {seed}: nothing was stored"
        );
    }
    assert!(resumed > 0, "no lease resumed at its cut");
    // The events below the recorded position are those the stored rows
    // were settled from, so every stored cut can be made again.
    assert_eq!(voided, 0, "a stored cut the replay could not make");
}

/// Drives an auditor as a service would: push, replay stale leases from
/// the lake, drain, settle at `latest - horizon`. Returns the stored rows
/// per lease and the drained alert set.
struct Service {
    auditor: Auditor,
    lake: Vec<LeaseEvent<'static>>,
    stored: BTreeMap<String, (Vec<Grant>, Vec<Violation>)>,
    reloads: usize,
}

impl Service {
    fn new() -> Service {
        Service {
            auditor: Auditor::default(),
            lake: Vec::new(),
            stored: BTreeMap::new(),
            reloads: 0,
        }
    }

    /// Pushes `events`; returns the violation changes drained.
    fn feed(
        &mut self,
        events: &[LeaseEvent<'static>],
        horizon: i64,
    ) -> leaseline_audit::ViolationChanges {
        for e in events {
            self.auditor.push(e);
            self.lake.push(e.clone());
        }
        for lease in self.auditor.take_stale() {
            self.reloads += 1;
            let void = self.stored.remove(&*lease).unwrap_or_default();
            let history: Vec<_> = self.lake.iter().filter(|e| *e.lease_id == *lease).collect();
            self.auditor.reload(&lease, history, &void.1);
        }
        let changes = self.auditor.drain_changes();
        let cutoff = self.auditor.latest_ts().unwrap() - horizon;
        for s in self.auditor.settle(cutoff) {
            let rows = self.stored.entry(s.lease_id.to_string()).or_default();
            rows.0.extend(s.grants);
            rows.1.extend(s.violations);
        }
        changes
    }

    /// The rows stored plus those the auditor answers are the whole
    /// history's, row for row.
    fn assert_answers(&mut self, history: &[LeaseEvent<'static>]) {
        let (mut grants, mut violations) = full(history);
        let mut rows: Vec<String> = self
            .stored
            .values()
            .flat_map(|r| r.0.iter().map(grant_row))
            .collect();
        rows.extend(self.auditor.timeline().iter().map(grant_row));
        rows.sort();
        grants.sort();
        assert_eq!(rows, grants);
        let mut rows = self.stored_violations();
        rows.extend(self.auditor.violations().iter().map(violation_row));
        rows.sort();
        violations.sort();
        assert_eq!(rows, violations);
    }

    fn stored_violations(&self) -> Vec<String> {
        self.stored
            .values()
            .flat_map(|r| r.1.iter().map(violation_row))
            .collect()
    }
}

/// `n` grants of `lease` from token `from`, one every 10 s from `start`
/// seconds past 10:00, each released after 2 s.
fn grants(lease: &str, from: u64, n: u64, start: u64) -> Vec<String> {
    let time = |s: u64| format!("10:{:02}:{:02}.000", s / 60, s % 60);
    (0..n)
        .flat_map(|k| {
            let token = from + k;
            let s = start + 10 * k;
            [
                format!(
                    "{lease}-a{token} {} acquired c {lease} h-{token} {token} ttl_ms=5000",
                    time(s)
                ),
                format!(
                    "{lease}-r{token} {} released c {lease} h-{token} {token}",
                    time(s + 2)
                ),
            ]
        })
        .collect()
}

#[test]
fn a_late_event_past_the_horizon_that_makes_a_violation_is_alerted_and_stored() {
    let specs = grants("L", 1, 12, 0);
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let mut svc = Service::new();
    for e in events(&specs) {
        assert!(svc.feed(&[e], 5 * SEC).is_empty());
    }
    // The first grants settled, and left memory.
    assert!(svc.stored["L"].0.len() >= 8, "{:?}", svc.stored);
    assert!(svc.auditor.held() < 8, "held {}", svc.auditor.held());

    // A write with grant 2's token that the resource accepted at
    // 10:00:25, after grant 3 began, reported a minute and a half late.
    let late = events(&["x 10:00:25.000 write_accepted r L h-2 2"]);
    let changes = svc.feed(&late, 5 * SEC);
    assert_eq!(svc.reloads, 1);
    let appeared: Vec<String> = changes.appeared.iter().map(violation_row).collect();
    assert_eq!(
        appeared,
        vec!["write_after_loss L #2 h-2 at 10:00:25.000 other #3 h-3 [L-r2,L-a3,x]".to_string()]
    );
    assert!(changes.retracted.is_empty());
    // Once it settles, the stored rows are the whole history's.
    svc.feed(&[], 5 * SEC);
    let mut all = svc.lake.clone();
    all.sort_by_key(|e| e.ts_us);
    let (_, whole) = full(&all);
    let mut now = svc.stored_violations();
    now.extend(svc.auditor.violations().iter().map(violation_row));
    now.sort();
    let mut whole = whole;
    whole.sort();
    assert_eq!(now, whole);
}

#[test]
fn a_late_release_that_removes_an_overlap_retracts_it_and_corrects_the_rows() {
    // Grant 1 had no release: valid until its TTL ran out at 10:00:05,
    // so grant 2 at 10:00:03 overlapped it.
    let mut specs = vec![
        "a1 10:00:00.000 acquired c L h-1 1 ttl_ms=5000".to_string(),
        "a2 10:00:03.000 acquired c L h-2 2 ttl_ms=5000".to_string(),
        "r2 10:00:04.000 released c L h-2 2".to_string(),
    ];
    specs.extend(grants("L", 3, 10, 60));
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let mut svc = Service::new();
    let mut alerts = Vec::new();
    for e in events(&specs) {
        alerts.extend(svc.feed(&[e], 5 * SEC).appeared);
    }
    let overlap = "overlapping_ownership L #2 h-2 at 10:00:03.000 other #1 h-1 [a1,a2]";
    let alerted: Vec<String> = alerts.iter().map(violation_row).collect();
    assert_eq!(alerted, vec![overlap.to_string()]);
    assert_eq!(
        svc.stored_violations(),
        vec![overlap.to_string()],
        "settled"
    );

    // The release that proves grant 1 had ended at 10:00:02.
    let late = events(&["late 10:00:02.000 released h L h-1 1"]);
    let changes = svc.feed(&late, 5 * SEC);
    assert_eq!(svc.reloads, 1);
    let retracted: Vec<String> = changes.retracted.iter().map(violation_row).collect();
    assert_eq!(retracted, vec![overlap.to_string()]);
    assert!(changes.appeared.is_empty());
    svc.feed(&[], 5 * SEC);
    assert!(svc.stored_violations().is_empty());
    assert!(svc.auditor.violations().is_empty());
    let g1 = svc.stored["L"]
        .0
        .iter()
        .find(|g| g.fencing_token == 1)
        .unwrap();
    assert_eq!(g1.end_kind.as_str(), "released");
}

#[test]
fn memory_holds_the_unsettled_tail_not_the_history() {
    let mut svc = Service::new();
    let history = fleet(7, 40, 400);
    let mut peak = (0, 0);
    for chunk in history.chunks(500) {
        svc.feed(chunk, 120 * SEC);
        peak.0 = peak.0.max(svc.auditor.held());
        peak.1 = peak.1.max(svc.auditor.ids_known());
    }
    // The ids of settled events are forgotten as well.
    assert!(
        peak.1 < history.len() / 2,
        "ids known at most {} of {}",
        peak.1,
        history.len()
    );
    // And the answer is still the whole history's.
    svc.assert_answers(&history);
    let peak = peak.0;
    assert_eq!(svc.auditor.len(), history.len());
    assert!(svc.stored.values().map(|r| r.0.len()).sum::<usize>() > 5000);
    // Two minutes of lateness over a fleet of 20 leases: a small part.
    assert!(
        peak * 10 < history.len(),
        "held at most {peak} of {} ({} reloads)",
        history.len(),
        svc.reloads
    );
}

#[test]
fn trace_ids_of_settled_events_are_forgotten_and_the_answer_stays_whole() {
    // Every event in its own trace, as an instrumented client sends them:
    // the strings the audit interns would otherwise grow with the history.
    let mut history = fleet(11, 40, 400);
    for (i, e) in history.iter_mut().enumerate() {
        e.trace_id = Some(Cow::Owned(format!("{i:032x}")));
    }
    let mut svc = Service::new();
    let mut peak = 0;
    for chunk in history.chunks(500) {
        svc.feed(chunk, 120 * SEC);
        peak = peak.max(svc.auditor.strings_known());
    }
    assert!(
        peak * 3 < history.len(),
        "strings interned at most {peak} of {} traces",
        history.len()
    );
    svc.assert_answers(&history);
}

#[test]
fn a_stale_write_after_the_cut_names_the_first_write_of_the_highest_token() {
    // Grant 8 is the highest before the cut; the highest token written is
    // 5, first by w1. After the cut, a write with token 4 is stale.
    let out = common::audit_events(
        AuditConfig::default(),
        &events(&[
            "a5 10:00:00.000 acquired c L h-5 5 ttl_ms=2000",
            "w1 10:00:00.500 write_accepted r L h-5 5",
            "w2 10:00:01.000 write_accepted r L h-5 5",
            "r5 10:00:01.500 released c L h-5 5",
            "a8 10:00:05.000 acquired c L h-8 8 ttl_ms=2000",
            "r8 10:00:06.000 released c L h-8 8",
            "a9 10:00:10.000 acquired c L h-9 9 ttl_ms=2000",
            "w4 10:00:11.000 write_accepted r L h-4 4",
            "r9 10:00:12.000 released c L h-9 9",
            "a10 10:00:20.000 acquired c L h-10 10 ttl_ms=2000",
        ]),
    );
    let rows: Vec<String> = out.violations.iter().map(violation_row).collect();
    assert_eq!(
        rows,
        vec!["stale_write_accepted L #4 h-4 at 10:00:11.000 other #5 h-5 [w1,w4]".to_string()]
    );
}
