//! Histories that follow the lease discipline give no violation.

mod common;

use common::{assert_rows, audit, decode_lines};
use leaseline_audit::{AuditConfig, EndKind};

#[test]
fn normal_handoffs() {
    let out = audit(&[
        "a1 10:00:00.000 acquire_requested h L b-1 - backend=etcd",
        "c1 10:00:00.012 acquired c L b-1 1 ttl_ms=1500 latency_ms=12 backend=etcd",
        "h1 10:00:00.014 acquired h L b-1 1 ttl_ms=1500 keepalive_sent_mono_ms=100 mono_ms=114",
        "h2 10:00:00.514 renewed h L b-1 1 keepalive_sent_mono_ms=600 mono_ms=614 latency_ms=14",
        "r1 10:00:00.700 write_accepted r L b-1 1",
        "h3 10:00:01.014 renewed h L b-1 1 keepalive_sent_mono_ms=1100 mono_ms=1114",
        "h4 10:00:01.200 released h L b-1 1",
        "c2 10:00:01.201 released c L b-1 1",
        "a2 10:00:01.100 acquire_requested h L b-2 -",
        "c3 10:00:01.210 acquired c L b-2 2 ttl_ms=1500",
        "h5 10:00:01.215 acquired h L b-2 2 ttl_ms=1500 keepalive_sent_mono_ms=50 mono_ms=55",
        "r2 10:00:01.400 write_accepted r L b-2 2",
        "h6 10:00:01.500 released h L b-2 2",
        "c4 10:00:01.500 released c L b-2 2",
        "c5 10:00:01.600 acquired c L b-1 3 ttl_ms=1500",
        "r3 10:00:01.700 write_accepted r L b-1 3",
        "c6 10:00:02.000 released c L b-1 3",
    ]);
    assert_rows(
        out.grant_rows(),
        &[
            "L #1 b-1 10:00:00.012..10:00:01.200 released ttl=1500 renewals=2 fails=0 gap=502 writes=1 stale=0 backend=etcd",
            "L #2 b-2 10:00:01.210..10:00:01.500 released ttl=1500 renewals=0 fails=0 writes=1 stale=0",
            "L #3 b-1 10:00:01.600..10:00:02.000 released ttl=1500 renewals=0 fails=0 writes=1 stale=0",
        ],
    );
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn a_keepalive_blip_that_recovers() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=3000",
        "h1 10:00:00.005 acquired h L b-1 7 ttl_ms=3000 keepalive_sent_mono_ms=0 mono_ms=5",
        "h2 10:00:01.005 renewed h L b-1 7 keepalive_sent_mono_ms=1000 mono_ms=1005",
        "h3 10:00:02.200 renew_failed h L b-1 7 reason=timeout mono_ms=2200 latency_ms=200",
        "h4 10:00:02.200 drain_started h L b-1 7 mono_ms=2200 deadline_mono_ms=3000",
        "h5 10:00:02.500 renewed h L b-1 7 keepalive_sent_mono_ms=2450 mono_ms=2500",
        "c2 10:00:02.480 renewed c L b-1 7",
        "r1 10:00:02.600 write_accepted r L b-1 7",
        "h6 10:00:03.000 released h L b-1 7",
        "c3 10:00:03.001 released c L b-1 7",
    ]);
    assert_rows(
        out.grant_rows(),
        &["L #7 b-1 10:00:00.000..10:00:03.000 released ttl=3000 renewals=2 fails=1 gap=1475 writes=1 stale=0"],
    );
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn a_crash_then_a_forced_expiry_then_a_new_grant() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 10 ttl_ms=3000",
        "h1 10:00:00.010 acquired h L b-1 10 ttl_ms=3000 keepalive_sent_mono_ms=0 mono_ms=10",
        "h2 10:00:01.010 renewed h L b-1 10 keepalive_sent_mono_ms=1000 mono_ms=1010",
        "c2 10:00:01.005 renewed c L b-1 10",
        "r1 10:00:01.500 write_accepted r L b-1 10",
        // b-1 crashes; the coordinator expires it 3 s after the last renewal.
        "c3 10:00:04.005 expired c L b-1 10",
        "c4 10:00:04.100 acquired c L b-2 11 ttl_ms=3000",
        "r2 10:00:04.300 write_accepted r L b-2 11",
        "c5 10:00:05.000 renewed c L b-2 11",
    ]);
    assert_rows(
        out.grant_rows(),
        &[
            "L #10 b-1 10:00:00.000..10:00:04.005 expired ttl=3000 renewals=1 fails=0 gap=1005 writes=1 stale=0",
            "L #11 b-2 10:00:04.100..- open ttl=3000 renewals=1 fails=0 gap=900 writes=1 stale=0",
        ],
    );
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn a_holder_that_fences_in_time() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 10 ttl_ms=3000",
        "h1 10:00:00.010 acquired h L b-1 10 ttl_ms=3000 keepalive_sent_mono_ms=0 mono_ms=10",
        "h2 10:00:01.010 renewed h L b-1 10 keepalive_sent_mono_ms=1000 mono_ms=1010",
        "h3 10:00:02.010 renew_failed h L b-1 10 reason=timeout mono_ms=2010",
        "h4 10:00:02.010 drain_started h L b-1 10 mono_ms=2010 deadline_mono_ms=3000",
        "h5 10:00:03.000 fenced h L b-1 10 mono_ms=3000 deadline_mono_ms=3000",
        "c2 10:00:04.000 expired c L b-1 10",
        "c3 10:00:04.100 acquired c L b-2 11 ttl_ms=3000",
    ]);
    assert_eq!(out.timeline[0].end_kind, EndKind::Expired);
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn a_stale_write_the_resource_rejected() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 33 ttl_ms=10000",
        "c2 10:00:10.000 expired c L b-1 33",
        "c3 10:00:10.200 acquired c L b-2 34 ttl_ms=10000",
        "r1 10:00:11.000 write_accepted r L b-2 34",
        "r2 10:00:14.000 stale_write_rejected r L b-1 33 max_token=34",
        "r3 10:00:15.000 write_accepted r L b-2 34",
    ]);
    assert_rows(
        out.grant_rows(),
        &[
            "L #33 b-1 10:00:00.000..10:00:10.000 expired ttl=10000 renewals=0 fails=0 writes=0 stale=1",
            "L #34 b-2 10:00:10.200..- open ttl=10000 renewals=0 fails=0 writes=2 stale=0",
        ],
    );
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn the_bundled_sample_audits_clean() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../samples/lease-events.ndjson"
    );
    let text = std::fs::read_to_string(path).unwrap();
    // Its last lines are deliberately invalid; the audit only sees valid events.
    let lines: Vec<String> = text
        .lines()
        .filter(|l| leaseline_schema::decode(l.as_bytes()).is_ok())
        .map(str::to_string)
        .collect();
    let out = common::audit_events(AuditConfig::default(), &decode_lines(&lines));
    assert_eq!(out.timeline.len(), 14);
    assert_rows(out.violation_rows(), &[]);
    let kinds: Vec<EndKind> = out.timeline.iter().map(|g| g.end_kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == EndKind::Released).count(),
        12
    );
    assert_rows(
        out.grant_rows()[12..].to_vec(),
        &[
            "orders/order-123 #33 worker-1 10:00:00.000..10:00:13.300 expired ttl=10000 renewals=1 fails=0 gap=3300 writes=0 stale=1 backend=etcd",
            // The sample runs on to 10:01:06.900, well past its TTL.
            "orders/order-123 #34 worker-2 10:00:13.500..10:00:23.500 lapsed ttl=10000 renewals=0 fails=0 writes=1 stale=0",
        ],
    );
}
