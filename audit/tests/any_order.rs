//! Random histories, dense with equal timestamps, missing fields, reused
//! event ids and every kind from every source: whatever they mean, the
//! audit must answer the same in every arrival order.

mod common;

use std::borrow::Cow;

use common::{audit_events, Lcg};
use std::collections::BTreeSet;

use leaseline_audit::{AuditConfig, EndKind, ViolationKind};
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
