//! Timeline rows: every end kind, merged reports, the contract's example.

mod common;

use common::{assert_rows, at, audit, decode_lines};
use leaseline_audit::{AuditConfig, EndKind};
use leaseline_schema::Source;

#[test]
fn released() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000 backend=etcd",
        "h1 10:00:03.000 renewed h L b-1 7",
        "h2 10:00:05.000 released h L b-1 7",
    ]);
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.000..10:00:05.000 released ttl=10000 renewals=1 fails=0 gap=3000 writes=0 stale=0 backend=etcd"],
    );
    assert!(out.violations.is_empty());
}

#[test]
fn revoked() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c R b-1 5 ttl_ms=10000",
        "c2 10:00:04.000 revoked c R b-1 5 reason=operator",
    ]);
    assert_rows(
        out.grant_rows(),
        &["R #5 b-1 10:00:00.000..10:00:04.000 revoked ttl=10000 renewals=0 fails=0 writes=0 stale=0"],
    );
    assert!(out.violations.is_empty());
}

/// The contract's example lines, verbatim: an expiry, a handoff, a write
/// and the paused holder's refused write.
pub const CONTRACT_EXAMPLE: [&str; 6] = [
    r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"backend":"etcd","event_id":"c-0001"}"#,
    r#"{"ts":"2026-09-14T10:00:03.300Z","kind":"renewed","source":"holder","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"latency_ms":4.2,"mono_ms":3300.0,"keepalive_sent_mono_ms":3295.8}"#,
    r#"{"ts":"2026-09-14T10:00:13.300Z","kind":"expired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33}"#,
    r#"{"ts":"2026-09-14T10:00:13.500Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34,"ttl_ms":10000}"#,
    r#"{"ts":"2026-09-14T10:00:14.000Z","kind":"write_accepted","source":"resource","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34}"#,
    r#"{"ts":"2026-09-14T10:00:18.000Z","kind":"stale_write_rejected","source":"resource","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"max_token":34}"#,
];

#[test]
fn expired_and_open_in_the_contract_example() {
    let lines: Vec<String> = CONTRACT_EXAMPLE.iter().map(|s| s.to_string()).collect();
    let out = common::audit_events(AuditConfig::default(), &decode_lines(&lines));
    assert_rows(
        out.grant_rows(),
        &[
            // Expiry and TTL agree (10:00:03.300 + 10 s); the expiry names it.
            "orders/order-123 #33 worker-1 10:00:00.000..10:00:13.300 expired ttl=10000 renewals=1 fails=0 gap=3300 writes=0 stale=1 backend=etcd",
            // Valid until 10:00:23.500, after the latest event (10:00:18.000).
            "orders/order-123 #34 worker-2 10:00:13.500..- open ttl=10000 renewals=0 fails=0 writes=1 stale=0",
        ],
    );
    assert_eq!(out.timeline[1].valid_until, Some(at("10:00:23.500")));
    assert_eq!(out.timeline[1].acquired_by, Source::Coordinator);
    assert!(out.violations.is_empty(), "{:?}", out.violations);
}

#[test]
fn lapsed_is_judged_against_the_latest_time_of_the_whole_history() {
    let out = audit(&[
        "a1 10:00:00.000 acquired c A b-1 1 ttl_ms=3000",
        "a2 10:00:01.000 renewed h A b-1 1",
        // Another lease moves the latest event time to 10:00:10.
        "b1 10:00:10.000 acquired c B b-2 9 ttl_ms=3000",
    ]);
    assert_rows(
        out.grant_rows(),
        &[
            "A #1 b-1 10:00:00.000..10:00:04.000 lapsed ttl=3000 renewals=1 fails=0 gap=1000 writes=0 stale=0",
            "B #9 b-2 10:00:10.000..- open ttl=3000 renewals=0 fails=0 writes=0 stale=0",
        ],
    );
}

#[test]
fn lapsed_at_exactly_the_deadline_open_just_before() {
    let lapsed = audit(&[
        "a1 10:00:00.000 acquired c A b-1 1 ttl_ms=3000",
        "b1 10:00:03.000 acquire_requested h B b-2 -",
    ]);
    assert_eq!(lapsed.timeline[0].end_kind, EndKind::Lapsed);
    assert_eq!(lapsed.timeline[0].ended_at, Some(at("10:00:03.000")));
    let open = audit(&[
        "a1 10:00:00.000 acquired c A b-1 1 ttl_ms=3000",
        "b1 10:00:02.999 acquire_requested h B b-2 -",
    ]);
    assert_eq!(open.timeline[0].end_kind, EndKind::Open);
    assert_eq!(open.timeline[0].ended_at, None);
    assert_eq!(open.timeline[0].valid_until, Some(at("10:00:03.000")));
}

#[test]
fn ended_at_is_the_ttl_when_it_ran_out_before_the_end_event() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=2000",
        "c2 10:00:05.000 released c L b-1 7",
    ]);
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.000..10:00:02.000 released ttl=2000 renewals=0 fails=0 writes=0 stale=0"],
    );
}

#[test]
fn a_renewal_after_the_end_does_not_revive_the_grant() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:02.000 released c L b-1 7",
        "c3 10:00:05.000 renewed c L b-1 7 ttl_ms=10000",
    ]);
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.000..10:00:02.000 released ttl=10000 renewals=1 fails=0 writes=0 stale=0"],
    );
    assert_rows(
        out.violation_rows(),
        &["renew_after_end L #7 b-1 at 10:00:05.000 [c2,c3]"],
    );
}

#[test]
fn coordinator_and_holder_reports_merge_into_one_grant() {
    let out = audit(&[
        "h0 10:00:00.020 acquired h L b-1 7 ttl_ms=9000 keepalive_sent_mono_ms=100 mono_ms=120 trace_id=4bf92f3577b34da6a3ce929d0e0e4736",
        "c0 10:00:00.000 acquired c L b-1 7 ttl_ms=9000 backend=zookeeper",
        "c1 10:00:03.000 renewed c L b-1 7",
        "h1 10:00:03.004 renewed h L b-1 7 keepalive_sent_mono_ms=3100 mono_ms=3104 ttl_ms=6000",
        "h2 10:00:05.000 renew_failed h L b-1 - reason=timeout",
        "h3 10:00:05.000 drain_started h L b-1 -",
        "c2 10:00:06.000 renewed c L b-1 7",
        "h4 10:00:06.001 renewed h L b-1 7",
        "h5 10:00:07.000 released h L b-1 7",
        "c3 10:00:07.010 released c L b-1 7",
    ]);
    // One grant; the coordinator's start; two keepalives, reported twice;
    // the tokenless failure attributed by holder; the last TTL is 6 s.
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.000..10:00:07.000 released ttl=6000 renewals=2 fails=1 gap=3000 writes=0 stale=0 backend=zookeeper trace=4bf92f3577b34da6a3ce929d0e0e4736"],
    );
    assert_eq!(out.timeline[0].acquired_by, Source::Coordinator);
    assert!(out.violations.is_empty(), "{:?}", out.violations);
}

#[test]
fn a_grant_only_the_holder_reported_starts_at_the_holders_time() {
    let out = audit(&[
        "h0 10:00:00.020 acquired h L b-1 7 ttl_ms=5000",
        "h1 10:00:01.000 renewed h L b-1 7",
        "h2 10:00:04.500 renewed h L b-1 7 ttl_ms=2000",
    ]);
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.020..- open ttl=2000 renewals=2 fails=0 gap=3500 writes=0 stale=0"],
    );
    assert_eq!(out.timeline[0].valid_until, Some(at("10:00:06.500")));
    assert_eq!(out.timeline[0].acquired_by, Source::Holder);
}

#[test]
fn events_without_a_grant_make_no_row() {
    let out = audit(&[
        "x1 10:00:00.000 acquire_requested h L b-1 -",
        "x2 10:00:00.100 acquire_failed h L b-1 - reason=contention",
        "x3 10:00:01.000 renewed c L b-1 4",
        "x4 10:00:02.000 expired c L b-1 4",
    ]);
    assert!(out.timeline.is_empty());
    assert!(out.violations.is_empty());
}
