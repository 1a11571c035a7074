//! Every violation kind, with the tolerances' edges: skew alone never makes
//! a violation, one clock is taken as it is.

mod common;

use std::time::Duration;

use common::{assert_rows, at, audit, audit_with};
use leaseline_audit::{AuditConfig, ViolationKind};

#[test]
fn kind_names_are_the_contracts() {
    let names: Vec<&str> = ViolationKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "token_regression",
            "overlapping_ownership",
            "renew_after_end",
            "late_fence",
            "stale_write_accepted",
            "write_after_loss"
        ]
    );
    for k in ViolationKind::ALL {
        assert_eq!(ViolationKind::parse(k.as_str()), Some(k));
    }
    assert_eq!(ViolationKind::LateFence.alert_signal(), "zombie holder");
    assert_eq!(ViolationKind::RenewAfterEnd.alert_signal(), "zombie holder");
}

#[test]
fn token_regression() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=1000",
        "c2 10:00:01.000 released c L b-1 7",
        "c3 10:00:02.000 acquired c L b-2 5 ttl_ms=1000",
        "c4 10:00:02.500 released c L b-2 5",
        "c5 10:00:03.000 acquired c L b-3 6 ttl_ms=1000",
    ]);
    // Grant 6 is above 5 but not above 7: reported against 7, the highest.
    assert_rows(
        out.violation_rows(),
        &[
            "token_regression L #5 b-2 at 10:00:02.000 other #7 b-1 [c1,c3]",
            "token_regression L #6 b-3 at 10:00:03.000 other #7 b-1 [c1,c5]",
        ],
    );
    assert_eq!(
        out.violations[0].detail,
        "grant 5 to b-2 acquired at 10:00:02.000 has a token not above grant 7 to b-1 acquired earlier at 10:00:00.000"
    );
}

#[test]
fn token_regression_across_clocks_needs_more_than_the_skew() {
    // The holder reports grant 8 200 ms before the coordinator's grant 6:
    // within the skew, neither is surely earlier.
    let within = audit(&[
        "h1 10:00:00.000 acquired h L b-1 8 ttl_ms=1000",
        "h2 10:00:00.050 released h L b-1 8",
        "c1 10:00:00.200 acquired c L b-2 6 ttl_ms=1000",
    ]);
    assert_rows(within.violation_rows(), &[]);
    let beyond = audit(&[
        "h1 10:00:00.000 acquired h L b-1 8 ttl_ms=1000",
        "h2 10:00:00.050 released h L b-1 8",
        "c1 10:00:00.300 acquired c L b-2 6 ttl_ms=1000",
    ]);
    assert_rows(
        beyond.violation_rows(),
        &["token_regression L #6 b-2 at 10:00:00.300 other #8 b-1 [h1,c1]"],
    );
}

#[test]
fn overlapping_ownership() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:06.000 acquired c L b-2 8 ttl_ms=10000",
        "c3 10:00:09.000 released c L b-1 7",
    ]);
    assert_rows(
        out.violation_rows(),
        &["overlapping_ownership L #8 b-2 at 10:00:06.000 other #7 b-1 [c1,c2,c3]"],
    );
    assert_eq!(
        out.violations[0].detail,
        "grant 8 to b-2 began at 10:00:06.000 while grant 7 to b-1 was valid until 10:00:09.000 (released)"
    );
    assert_eq!(out.violations[0].at, at("10:00:06.000"));
}

#[test]
fn overlapping_ownership_until_the_ttl() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=3000",
        "c2 10:00:02.000 acquired c L b-2 8 ttl_ms=3000",
    ]);
    assert_rows(
        out.violation_rows(),
        &["overlapping_ownership L #8 b-2 at 10:00:02.000 other #7 b-1 [c1,c2]"],
    );
    assert_eq!(
        out.violations[0].detail,
        "grant 8 to b-2 began at 10:00:02.000 while grant 7 to b-1 was valid until 10:00:03.000 (TTL of 3000 ms from its acquisition at 10:00:00.000)"
    );
}

#[test]
fn overlap_of_a_coordinator_start_and_a_holder_release_must_exceed_the_skew() {
    let history = |release: &str| {
        audit(&[
            "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
            &format!("h1 {release} released h L b-1 7"),
            "c2 10:00:05.000 acquired c L b-2 8 ttl_ms=10000",
        ])
    };
    assert_rows(history("10:00:05.200").violation_rows(), &[]);
    assert_rows(history("10:00:05.250").violation_rows(), &[]);
    assert_rows(
        history("10:00:05.300").violation_rows(),
        &["overlapping_ownership L #8 b-2 at 10:00:05.000 other #7 b-1 [c1,c2,h1]"],
    );
    // A wider tolerance absorbs it.
    let wide = AuditConfig {
        clock_skew_tolerance: Duration::from_millis(400),
        ..AuditConfig::default()
    };
    let out = audit_with(
        wide,
        &[
            "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
            "h1 10:00:05.300 released h L b-1 7",
            "c2 10:00:05.000 acquired c L b-2 8 ttl_ms=10000",
        ],
    );
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn overlap_on_one_clock_is_taken_as_it_is() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:05.001 released c L b-1 7",
        "c3 10:00:05.000 acquired c L b-2 8 ttl_ms=10000",
    ]);
    assert_rows(
        out.violation_rows(),
        &["overlapping_ownership L #8 b-2 at 10:00:05.000 other #7 b-1 [c1,c3,c2]"],
    );
    // Validity is half-open: a grant starting at the instant of the release
    // does not overlap.
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:05.000 released c L b-1 7",
        "c3 10:00:05.000 acquired c L b-2 8 ttl_ms=10000",
    ]);
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn overlap_is_reported_per_pair() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 1 ttl_ms=10000",
        "c2 10:00:01.000 acquired c L b-2 2 ttl_ms=10000",
        "c3 10:00:02.000 acquired c L b-3 3 ttl_ms=10000",
    ]);
    assert_rows(
        out.violation_rows(),
        &[
            "overlapping_ownership L #2 b-2 at 10:00:01.000 other #1 b-1 [c1,c2]",
            "overlapping_ownership L #3 b-3 at 10:00:02.000 other #1 b-1 [c1,c3]",
            "overlapping_ownership L #3 b-3 at 10:00:02.000 other #2 b-2 [c2,c3]",
        ],
    );
}

#[test]
fn renew_after_end() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:04.000 revoked c L b-1 7 reason=operator",
        // Within the skew of the coordinator's revocation: not proof.
        "h1 10:00:04.200 renewed h L b-1 7",
        // Beyond it.
        "h2 10:00:04.300 renewed h L b-1 7",
        // On the coordinator's own clock, 1 ms is enough.
        "c3 10:00:04.001 renewed c L b-1 7",
    ]);
    assert_rows(
        out.violation_rows(),
        &[
            "renew_after_end L #7 b-1 at 10:00:04.001 [c2,c3]",
            "renew_after_end L #7 b-1 at 10:00:04.300 [c2,h2]",
        ],
    );
    assert_eq!(
        out.violations[1].detail,
        "grant 7 to b-1 was renewed at 10:00:04.300 (holder) after it was revoked at 10:00:04.000 (coordinator)"
    );
    assert_eq!(out.timeline[0].ended_at, Some(at("10:00:04.000")));
}

#[test]
fn renew_after_a_holder_release_on_the_holders_clock() {
    let out = audit(&[
        "- 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "- 10:00:02.000 released h L b-1 7",
        "- 10:00:02.010 renewed h L b-1 7",
    ]);
    assert_rows(
        out.violation_rows(),
        &["renew_after_end L #7 b-1 at 10:00:02.010 [(no event_id) holder released token 7 holder b-1 at 2026-09-14T10:00:02.000000Z,(no event_id) holder renewed token 7 holder b-1 at 2026-09-14T10:00:02.010000Z]"],
    );
}

#[test]
fn late_fence() {
    let history = |fence: &str| {
        audit(&[
            "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=3000",
            "h1 10:00:00.010 acquired h L b-1 7 ttl_ms=3000 keepalive_sent_mono_ms=1000 mono_ms=1010",
            "h2 10:00:01.000 renewed h L b-1 7 keepalive_sent_mono_ms=2000 mono_ms=2003",
            "h3 10:00:02.000 renew_failed h L b-1 7 reason=timeout mono_ms=3000",
            "h4 10:00:02.000 drain_started h L b-1 7 mono_ms=3000 deadline_mono_ms=4000",
            &format!("h5 10:00:03.100 fenced h L b-1 7 {fence}"),
            "c2 10:00:04.000 expired c L b-1 7",
        ])
    };
    // Safe deadline: 2000 + 3000 - 1000 = 4000 ms; tolerance 50 ms.
    assert_rows(history("mono_ms=4050").violation_rows(), &[]);
    let out = history("mono_ms=4060");
    assert_rows(
        out.violation_rows(),
        &["late_fence L #7 b-1 at 10:00:03.100 [h2,h5]"],
    );
    assert_eq!(
        out.violations[0].detail,
        "holder b-1 of grant 7 fenced at 4060 ms on its monotonic clock, 60 ms after its safe deadline 4000 ms (last successful keepalive sent at 2000 ms + TTL 3000 ms - 1000 ms), beyond the 50 ms tolerance"
    );
    // Without mono_ms, the deadline the holder computed is judged.
    assert_rows(
        history("deadline_mono_ms=4100").violation_rows(),
        &["late_fence L #7 b-1 at 10:00:03.100 [h2,h5]"],
    );
    assert_rows(history("deadline_mono_ms=3900").violation_rows(), &[]);
}

#[test]
fn late_fence_runs_from_the_send_time_not_the_reply() {
    // The reply came 900 ms after the send: a holder counting from the reply
    // fences 900 ms late.
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=3000",
        "h1 10:00:00.900 acquired h L b-1 7 ttl_ms=3000 keepalive_sent_mono_ms=500 mono_ms=1400",
        "h2 10:00:03.300 fenced h L b-1 7 mono_ms=3400",
    ]);
    assert_rows(
        out.violation_rows(),
        &["late_fence L #7 b-1 at 10:00:03.300 [h1,h2]"],
    );
    let tolerant = AuditConfig {
        late_fence_tolerance: Duration::from_secs(1),
        ..AuditConfig::default()
    };
    let out = audit_with(
        tolerant,
        &[
            "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=3000",
            "h1 10:00:00.900 acquired h L b-1 7 ttl_ms=3000 keepalive_sent_mono_ms=500 mono_ms=1400",
            "h2 10:00:03.300 fenced h L b-1 7 mono_ms=3400",
        ],
    );
    assert_rows(out.violation_rows(), &[]);
}

/// The contract's paused holder, had the storage accepted its write.
#[test]
fn stale_write_accepted_and_write_after_loss() {
    let out = audit(&[
        "c-0001 10:00:00.000 acquired c orders/order-123 worker-1 33 ttl_ms=10000 backend=etcd",
        "- 10:00:03.300 renewed h orders/order-123 worker-1 33 ttl_ms=10000 latency_ms=4.2 mono_ms=3300.0 keepalive_sent_mono_ms=3295.8",
        "c-0003 10:00:13.300 expired c orders/order-123 worker-1 33",
        "c-0004 10:00:13.500 acquired c orders/order-123 worker-2 34 ttl_ms=10000",
        "r-0005 10:00:14.000 write_accepted r orders/order-123 worker-2 34",
        "r-0006 10:00:18.000 write_accepted r orders/order-123 worker-1 33",
    ]);
    assert_rows(
        out.violation_rows(),
        &[
            "stale_write_accepted orders/order-123 #33 worker-1 at 10:00:18.000 other #34 worker-2 [r-0005,r-0006]",
            "write_after_loss orders/order-123 #33 worker-1 at 10:00:18.000 other #34 worker-2 [c-0003,c-0004,r-0006]",
        ],
    );
    assert_eq!(
        out.violations[0].detail,
        "the resource accepted a write with token 33 at 10:00:18.000 after it had already accepted token 34 at 10:00:14.000"
    );
    assert_eq!(
        out.violations[1].detail,
        "the resource accepted a write with token 33 at 10:00:18.000 after grant 33 to worker-1 ended at 10:00:13.300 (expired) and after grant 34 to worker-2 began at 10:00:13.500"
    );
}

#[test]
fn stale_write_needs_a_strictly_earlier_acceptance() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 33 ttl_ms=10000",
        "c2 10:00:01.000 released c L b-1 33",
        "c3 10:00:01.000 acquired c L b-2 34 ttl_ms=10000",
        "r1 10:00:01.100 write_accepted r L b-2 34",
        "r2 10:00:01.100 write_accepted r L b-1 33",
    ]);
    // Same resource instant: no order between the two writes. The write of
    // 33 is 100 ms after its grant ended: within the skew.
    assert_rows(out.violation_rows(), &[]);
}

#[test]
fn write_after_loss_when_the_grant_ended() {
    let history = |write: &str| {
        audit(&[
            "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
            "c2 10:00:05.000 released c L b-1 7",
            &format!("r1 {write} write_accepted r L - 7"),
        ])
    };
    assert_rows(history("10:00:05.200").violation_rows(), &[]);
    let out = history("10:00:05.300");
    assert_rows(
        out.violation_rows(),
        &["write_after_loss L #7 b-1 at 10:00:05.300 [c2,r1]"],
    );
    assert_eq!(
        out.violations[0].detail,
        "the resource accepted a write with token 7 at 10:00:05.300 after grant 7 to b-1 ended at 10:00:05.000 (released)"
    );
}

#[test]
fn write_after_loss_when_the_ttl_ran_out() {
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=1000",
        "h1 10:00:00.500 renewed h L b-1 7",
        "r1 10:00:02.000 write_accepted r L b-1 7",
    ]);
    assert_rows(
        out.violation_rows(),
        &["write_after_loss L #7 b-1 at 10:00:02.000 [h1,r1]"],
    );
    assert_eq!(
        out.violations[0].detail,
        "the resource accepted a write with token 7 at 10:00:02.000 after grant 7 to b-1 ended at 10:00:01.500 (TTL of 1000 ms from its last renewal at 10:00:00.500)"
    );
}

#[test]
fn write_after_loss_when_a_later_grant_began() {
    // Grant 7 is still valid (TTL 10 s) but grant 8 began: split brain and
    // the old holder's write after the new grant.
    let out = audit(&[
        "c1 10:00:00.000 acquired c L b-1 7 ttl_ms=10000",
        "c2 10:00:02.000 acquired c L b-2 8 ttl_ms=10000",
        "r1 10:00:02.200 write_accepted r L b-1 7",
        "r2 10:00:03.000 write_accepted r L b-1 7",
    ]);
    assert_rows(
        out.violation_rows(),
        &[
            "overlapping_ownership L #8 b-2 at 10:00:02.000 other #7 b-1 [c1,c2]",
            "write_after_loss L #7 b-1 at 10:00:03.000 other #8 b-2 [c2,r2]",
        ],
    );
    assert_eq!(
        out.violations[1].detail,
        "the resource accepted a write with token 7 at 10:00:03.000 after grant 8 to b-2 began at 10:00:02.000"
    );
}
