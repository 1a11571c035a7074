//! Random histories, dense with equal timestamps, missing fields, reused
//! event ids and every kind from every source: whatever they mean, the
//! audit must answer the same in every arrival order.

mod common;

use std::borrow::Cow;

use common::{audit_events, Lcg};
use std::collections::BTreeSet;

use leaseline_audit::{AuditConfig, Auditor, EndKind, ViolationKind};
use leaseline_schema::{Kind, LeaseEvent, Source};

const T0: i64 = 1_789_380_000_000_000;

fn random_history(seed: u64, len: usize) -> Vec<LeaseEvent<'static>> {
    let mut rng = Lcg::new(seed);
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        let kind = Kind::ALL[rng.below(Kind::ALL.len())];
        // Mostly the contract's usual source for the kind, sometimes any.
        let source = match (rng.below(4), kind) {
            (0, _) => Source::ALL[rng.below(Source::ALL.len())],
            (_, Kind::Acquired | Kind::Renewed) if rng.below(2) == 0 => Source::Coordinator,
            (_, Kind::Expired | Kind::Revoked) => Source::Coordinator,
            (_, Kind::WriteAccepted | Kind::StaleWriteRejected) => Source::Resource,
            _ => Source::Holder,
        };
        let maybe = |rng: &mut Lcg, n: usize| rng.below(n) != 0;
        let event_id = match rng.below(10) {
            0 => None,
            // Reused: a retry, or a different event with the same id.
            1 => Some(format!("e{}", rng.below(i + 1))),
            _ => Some(format!("e{i}")),
        };
        out.push(LeaseEvent {
            // A 100 ms grid: many events share a timestamp.
            ts_us: T0 + rng.below(60) as i64 * 100_000,
            kind,
            source,
            lease_id: Cow::Owned(format!("L{}", rng.below(3))),
            holder_id: maybe(&mut rng, 6).then(|| Cow::Owned(format!("h{}", rng.below(3)))),
            fencing_token: maybe(&mut rng, 8).then(|| rng.below(6) as u64),
            ttl_ms: maybe(&mut rng, 3).then(|| 500 * (1 + rng.below(4) as i64)),
            event_id: event_id.map(Cow::Owned),
            backend: (rng.below(4) == 0).then_some(Cow::Borrowed("etcd")),
            latency_ms: None,
            reason: None,
            max_token: None,
            mono_ms: maybe(&mut rng, 2).then(|| rng.below(8000) as f64),
            keepalive_sent_mono_ms: maybe(&mut rng, 2).then(|| rng.below(8000) as f64),
            deadline_mono_ms: maybe(&mut rng, 2).then(|| rng.below(8000) as f64),
            trace_id: None,
            span_id: None,
            attrs: Vec::new(),
        });
    }
    out
}

#[test]
fn random_histories_answer_the_same_in_any_order() {
    let mut kinds = BTreeSet::new();
    let mut ends = BTreeSet::new();
    for seed in 1..=40 {
        let out = audit_events(AuditConfig::default(), &random_history(seed, 120));
        kinds.extend(out.violations.iter().map(|v| v.kind));
        ends.extend(out.timeline.iter().map(|g| g.end_kind));
    }
    // The histories are chaotic enough to exercise every rule.
    assert_eq!(kinds, ViolationKind::ALL.into_iter().collect());
    assert_eq!(ends, EndKind::ALL.into_iter().collect());
}

/// A read with thousands of leases to recompute spreads them over every
/// core; the answer must be the one lease-by-lease recomputes give.
#[test]
fn a_big_refresh_on_all_cores_answers_as_small_ones_do() {
    let mut history = Vec::new();
    for seed in 0..1500u64 {
        history.extend(random_history(seed, 40).into_iter().map(|mut e| {
            e.lease_id = Cow::Owned(format!("s{seed}-{}", e.lease_id));
            e.event_id = e.event_id.map(|id| Cow::Owned(format!("s{seed}-{id}")));
            e
        }));
    }
    let mut at_once = Auditor::default();
    at_once.push_all(&history);
    let (timeline, violations) = (at_once.timeline(), at_once.violations());
    // 4,500 leases at once: the parallel path.
    assert!(at_once.lease_ids().len() > 4000);

    let mut piecemeal = Auditor::default();
    for chunk in history.chunks(500) {
        piecemeal.push_all(chunk);
        // At most 500 leases dirty per read: recomputed one by one.
        piecemeal.violations();
    }
    assert_eq!(piecemeal.timeline(), timeline);
    assert_eq!(piecemeal.violations(), violations);
    assert!(!violations.is_empty());
}

/// The lake's events have distinct ids, so SQL pushes them without the
/// duplicate lookup; the answers must be the checked path's, and a later
/// checked push must still see the ids pushed unchecked.
#[test]
fn events_pushed_as_unique_answer_as_checked_ones_do() {
    let mut history = Vec::new();
    for seed in 0..200u64 {
        history.extend(
            random_history(seed, 60)
                .into_iter()
                .enumerate()
                .map(|(i, mut e)| {
                    e.lease_id = Cow::Owned(format!("s{seed}-{}", e.lease_id));
                    // Distinct ids, some events without one.
                    e.event_id = (i % 7 != 0).then(|| Cow::Owned(format!("s{seed}-{i}")));
                    e
                }),
        );
    }
    let (lake, late) = history.split_at(history.len() - 100);
    let mut checked = Auditor::default();
    assert_eq!(checked.push_all(lake), lake.len());
    let mut unique = Auditor::default();
    assert_eq!(unique.push_all_unique(lake), lake.len());
    assert_eq!(unique.timeline(), checked.timeline());
    assert_eq!(unique.violations(), checked.violations());
    assert!(!checked.violations().is_empty());

    // Re-sent lake events are duplicates for a checked push, on a clone
    // whose index was built ahead and on one that builds it itself.
    let mut indexed = unique.clone();
    indexed.index_event_ids();
    // (Events without an id are never duplicates.)
    let resent: Vec<_> = lake
        .iter()
        .filter(|e| e.event_id.is_some())
        .take(500)
        .cloned()
        .collect();
    for auditor in [&mut unique, &mut indexed] {
        assert_eq!(auditor.push_all(&resent), 0);
        assert_eq!(auditor.push_all(late), late.len());
        assert_eq!(auditor.len(), history.len());
    }
    checked.push_all(late);
    assert_eq!(unique.timeline(), checked.timeline());
    assert_eq!(indexed.violations(), checked.violations());
}
