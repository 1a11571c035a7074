//! The engine's incremental behaviour: duplicates, conflicting ids,
//! retractions, configuration.

mod common;

use std::time::Duration;

use common::{assert_rows, at, events, violation_row};
use leaseline_audit::{AuditConfig, Auditor, EndKind, ViolationKind};

#[test]
fn duplicates_count_once() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "h1 10:00:01.000 renewed h L b-1 7",
        "r1 10:00:02.000 write_accepted r L b-1 7",
    ]);
    let mut a = Auditor::default();
    for e in &evs {
        assert!(a.push(e));
    }
    for e in &evs {
        assert!(!a.push(e));
    }
    assert_eq!(a.len(), 3);
    let t = a.timeline();
    assert_eq!((t[0].renewals, t[0].writes_accepted), (1, 1));
}

#[test]
fn events_without_event_id_are_all_kept() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "- 10:00:01.000 renewed c L b-1 7",
    ]);
    let mut a = Auditor::default();
    a.push(&evs[0]);
    assert!(a.push(&evs[1]));
    assert!(a.push(&evs[1]));
    assert_eq!(a.len(), 3);
    assert_eq!(a.timeline()[0].renewals, 2);
}

#[test]
fn an_event_id_reused_for_different_events_keeps_the_same_one_in_any_order() {
    // Same id, different lease and content: the first in canonical order
    // (lease id "A" < "B") is kept whichever arrives first.
    let evs = events(&[
        "x 10:00:05.000 acquired c B b-2 8 ttl_ms=10000",
        "x 10:00:00.000 acquired c A b-1 7 ttl_ms=10000",
        "y 10:00:01.000 renewed c A b-1 7",
        "y 10:00:02.000 renewed c A b-1 7",
    ]);
    for order in [[0, 1, 2, 3], [1, 0, 3, 2], [3, 1, 2, 0]] {
        let mut a = Auditor::default();
        for i in order {
            a.push(&evs[i]);
        }
        assert_eq!(a.len(), 2);
        let t = a.timeline();
        assert_eq!(t.len(), 1, "{order:?}");
        assert_eq!(&*t[0].lease_id, "A");
        assert_eq!(t[0].renewals, 1);
        assert_eq!(t[0].max_renew_gap_ms, Some(1000.0));
        assert!(a.lease("B").is_none());
        // The latest time is that of the kept events only.
        assert_eq!(a.latest_ts(), Some(at("10:00:01.000")));
        assert_eq!(a.holders()[0].grant.end_kind, EndKind::Open);
    }
}

#[test]
fn a_late_release_retracts_an_apparent_overlap() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:06.000 acquired c L b-2 8 ttl_ms=10000",
        "c3 10:00:04.000 released c L b-1 7",
    ]);
    let mut a = Auditor::default();
    a.push(&evs[0]);
    a.push(&evs[1]);
    let first = a.drain_changes();
    assert_rows(
        first.appeared.iter().map(violation_row).collect(),
        &["overlapping_ownership L #8 b-2 at 10:00:06.000 other #7 b-1 [c1,c2]"],
    );
    assert!(first.retracted.is_empty());
    assert!(a.drain_changes().is_empty());
    a.push(&evs[2]);
    let second = a.drain_changes();
    assert!(second.appeared.is_empty());
    assert_eq!(second.retracted, first.appeared);
    assert!(a.violations().is_empty());
}

#[test]
fn drain_changes_only_reports_new_violations() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=1000",
        "c2 10:00:01.000 released c L b-1 7",
        "c3 10:00:02.000 acquired c L b-2 5 ttl_ms=1000",
        "c4 10:00:03.000 acquired c M b-2 5 ttl_ms=1000",
        "c5 10:00:03.500 renewed c L b-2 5",
    ]);
    let mut a = Auditor::default();
    for e in &evs[..3] {
        a.push(e);
    }
    let c = a.drain_changes();
    assert_eq!(c.appeared.len(), 1);
    assert_eq!(c.appeared[0].kind, ViolationKind::TokenRegression);
    a.push(&evs[3]);
    a.push(&evs[4]);
    assert!(a.drain_changes().is_empty());
    assert_eq!(a.violations().len(), 1);
}

#[test]
fn lease_and_holders() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c A b-1 1 ttl_ms=1000",
        "c2 10:00:00.500 released c A b-1 1",
        "c3 10:00:01.000 acquired c A b-2 2 ttl_ms=5000",
        "c4 10:00:02.000 acquired c B b-3 9 ttl_ms=1000",
        "c5 10:00:04.000 acquire_requested h C b-4 -",
    ]);
    let mut a = Auditor::default();
    for e in evs.iter().rev() {
        a.push(e);
    }
    let holders = a.holders();
    let rows: Vec<(String, u64, bool)> = holders
        .iter()
        .map(|h| (h.grant.lease_id.to_string(), h.grant.fencing_token, h.valid))
        .collect();
    assert_eq!(
        rows,
        [("A".to_string(), 2, true), ("B".to_string(), 9, false)]
    );
    let lease = a.lease("A").unwrap();
    assert_eq!(lease.grants.len(), 2);
    assert!(lease.violations.is_empty());
    assert!(a.lease("C").unwrap().grants.is_empty());
    assert!(a.lease("D").is_none());
    assert_eq!(a.lease_ids().len(), 3);
}

#[test]
fn config_reads_humantime_and_refuses_unknown_keys() {
    let c: AuditConfig = toml::from_str("late_fence_tolerance = \"100ms\"").unwrap();
    assert_eq!(c.late_fence_tolerance, Duration::from_millis(100));
    assert_eq!(c.clock_skew_tolerance, Duration::from_millis(250));
    let c: AuditConfig = toml::from_str("").unwrap();
    assert_eq!(c, AuditConfig::default());
    assert_eq!(c.late_fence_tolerance, Duration::from_millis(50));
    assert!(toml::from_str::<AuditConfig>("clock_skew = \"1s\"").is_err());
}

#[test]
fn rows_serialise_with_the_contracts_names() {
    let evs = events(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=1000 backend=etcd",
        "c2 10:00:01.000 released c L b-1 7",
        "c3 10:00:02.000 acquired c L b-2 5 ttl_ms=1000",
    ]);
    let mut a = Auditor::default();
    a.push_all(&evs);
    let grant = serde_json::to_value(&a.timeline()[0]).unwrap();
    assert_eq!(grant["lease_id"], "L");
    assert_eq!(grant["end_kind"], "released");
    assert_eq!(grant["acquired_by"], "coordinator");
    assert_eq!(grant["backend"], "etcd");
    assert_eq!(grant["trace_id"], serde_json::Value::Null);
    let v = serde_json::to_value(&a.violations()[0]).unwrap();
    assert_eq!(v["kind"], "token_regression");
    assert_eq!(v["other_holder_id"], "b-1");
    assert_eq!(v["evidence"], serde_json::json!(["c1", "c3"]));
}
