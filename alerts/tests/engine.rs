//! The alert rules by event time: each fires on the history that should
//! raise it, resolves when it clears, and the alerts of a history do not
//! depend on the order its events arrive in within the lateness bound.

use std::collections::BTreeSet;
use std::time::Duration;

use leaseline_alerts::{Alert, AlertEngine, AlertName, AlertState, AlertsConfig, Settling};
use leaseline_audit::AuditConfig;
use leaseline_schema::{decode_str, LeaseEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const T0: i64 = 1_789_380_000_000; // 2026-09-14T10:00:00Z, in ms

fn ev(v: serde_json::Value) -> LeaseEvent<'static> {
    decode_str(&v.to_string())
        .expect("valid event")
        .into_owned()
}

fn acquired(ms: i64, lease: &str, holder: &str, token: u64) -> LeaseEvent<'static> {
    ev(
        json!({"ts": T0 + ms, "kind": "acquired", "source": "coordinator", "lease_id": lease,
        "holder_id": holder, "fencing_token": token, "ttl_ms": 10_000, "backend": "etcd",
        "event_id": format!("a-{lease}-{token}")}),
    )
}

fn released(ms: i64, lease: &str, holder: &str, token: u64) -> LeaseEvent<'static> {
    ev(
        json!({"ts": T0 + ms, "kind": "released", "source": "coordinator", "lease_id": lease,
        "holder_id": holder, "fencing_token": token, "event_id": format!("r-{lease}-{token}")}),
    )
}

fn renewed(ms: i64, lease: &str, holder: &str, token: u64, ok: bool) -> LeaseEvent<'static> {
    let kind = if ok { "renewed" } else { "renew_failed" };
    ev(
        json!({"ts": T0 + ms, "kind": kind, "source": "holder", "lease_id": lease,
        "holder_id": holder, "fencing_token": token, "backend": "etcd", "reason": "timeout",
        "event_id": format!("{kind}-{lease}-{token}-{ms}")}),
    )
}

fn config() -> AlertsConfig {
    let mut c = AlertsConfig {
        lateness: Duration::from_secs(5),
        evaluation_interval: Duration::from_secs(1),
        ..AlertsConfig::default()
    };
    c.rules.forced_expiry.window = Duration::from_secs(30);
    c.rules.stale_write_rejected.window = Duration::from_secs(30);
    c.rules.safety_violation.resolve_after = Duration::from_secs(60);
    c.rules.token_churn.window = Duration::from_secs(10);
    c.rules.token_churn.baseline_window = Duration::from_secs(60);
    c.rules.renewal_failures.window = Duration::from_secs(10);
    c.rules.renewal_failures.min_attempts = 50;
    c.validate().unwrap();
    c
}

fn engine() -> AlertEngine {
    AlertEngine::new(config(), AuditConfig::default(), None)
}

/// The watermark of one input partition with nothing waiting, at wall time
/// `now_us`: the later of its newest event and the clock, minus the
/// lateness (see `leaseline_alerts::clock`).
fn wall_clock_watermark(e: &AlertEngine, now_us: i64) -> i64 {
    let lateness = e.config().lateness.as_micros() as i64;
    e.max_ts().unwrap_or(i64::MIN).max(now_us) - lateness
}

/// Feeds events in the given order as a live service would: after each
/// arrival the watermark is the arrival time minus the lateness. Returns
/// every change, then runs the clock a long way on.
fn live(events: &[(i64, LeaseEvent<'static>)]) -> Vec<Alert> {
    let mut e = engine();
    let mut out = Vec::new();
    for (arrival_ms, ev) in events {
        e.push(ev);
        e.advance(wall_clock_watermark(&e, (T0 + arrival_ms) * 1000));
        out.extend(e.take_changes());
    }
    let last = events.iter().map(|(a, _)| *a).max().unwrap_or(0);
    e.advance(wall_clock_watermark(&e, (T0 + last + 3_600_000) * 1000));
    out.extend(e.take_changes());
    out
}

fn in_order(events: Vec<LeaseEvent<'static>>) -> Vec<Alert> {
    let timed: Vec<_> = events
        .into_iter()
        .map(|e| ((e.ts_us / 1000) - T0, e))
        .collect();
    live(&timed)
}

fn firing(changes: &[Alert], name: AlertName) -> Vec<&Alert> {
    changes
        .iter()
        .filter(|a| a.key.name == name && a.state == AlertState::Firing)
        .collect()
}

fn resolved(changes: &[Alert], name: AlertName) -> Vec<&Alert> {
    changes
        .iter()
        .filter(|a| a.key.name == name && a.state == AlertState::Resolved)
        .collect()
}

#[test]
fn forced_expiry_fires_at_once_and_resolves_a_window_later() {
    let mut e = engine();
    e.push(&acquired(0, "orders/1", "w-1", 7));
    e.push(&ev(
        json!({"ts": T0 + 10_000, "kind": "expired", "source": "coordinator",
        "lease_id": "orders/1", "holder_id": "w-1", "fencing_token": 7}),
    ));
    let changes = e.take_changes();
    let fired = firing(&changes, AlertName::LeaseForcedExpiry);
    assert_eq!(
        fired.len(),
        1,
        "fires on arrival, before any watermark: {changes:?}"
    );
    let labels = fired[0].labels();
    assert_eq!(labels["lease_id"], "orders/1");
    assert_eq!(labels["holder_id"], "w-1");
    assert_eq!(labels["backend"], "etcd");
    assert_eq!(labels["severity"], "warning");
    assert!(
        fired[0].description.contains("grant 7"),
        "{}",
        fired[0].description
    );

    e.advance((T0 + 39_000) * 1000);
    assert!(resolved(&e.take_changes(), AlertName::LeaseForcedExpiry).is_empty());
    e.advance((T0 + 40_000) * 1000);
    let changes = e.take_changes();
    let done = resolved(&changes, AlertName::LeaseForcedExpiry);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].ends_at, Some((T0 + 40_000) * 1000));
}

#[test]
fn stale_write_rejection_fires_per_lease_and_writer() {
    let changes = in_order(vec![
        acquired(0, "orders/1", "w-2", 34),
        ev(
            json!({"ts": T0 + 1000, "kind": "stale_write_rejected", "source": "resource",
            "lease_id": "orders/1", "holder_id": "w-1", "fencing_token": 33, "max_token": 34}),
        ),
    ]);
    let fired = firing(&changes, AlertName::LeaseStaleWriteRejected);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].labels()["holder_id"], "w-1");
    assert!(fired[0].description.contains("33") && fired[0].description.contains("34"));
    assert_eq!(
        resolved(&changes, AlertName::LeaseStaleWriteRejected).len(),
        1
    );
}

#[test]
fn a_violation_waits_for_the_lateness_bound_then_fires_critical() {
    let mut e = engine();
    // Grant 8 begins while grant 7 is valid: overlapping ownership.
    e.push(&acquired(0, "orders/2", "w-1", 7));
    e.push(&acquired(2_000, "orders/2", "w-2", 8));
    e.advance(wall_clock_watermark(&e, (T0 + 2_000) * 1000));
    let changes = e.take_changes();
    assert!(
        firing(&changes, AlertName::LeaseSafetyViolation).is_empty(),
        "not before the watermark passes it: {changes:?}"
    );
    e.advance(wall_clock_watermark(&e, (T0 + 8_000) * 1000));
    let changes = e.take_changes();
    let fired = firing(&changes, AlertName::LeaseSafetyViolation);
    assert_eq!(fired.len(), 1, "{changes:?}");
    let labels = fired[0].labels();
    assert_eq!(labels["severity"], "critical");
    assert_eq!(labels["kind"], "overlapping_ownership");
    assert_eq!(labels["holder_id"], "w-2");
    assert!(
        fired[0].description.contains("a-orders/2-7"),
        "cites evidence: {}",
        fired[0].description
    );
}

#[test]
fn a_late_release_within_the_bound_retracts_the_violation_before_it_fires() {
    // The release of grant 7 arrives after grant 8, but within the bound.
    let changes = live(&[
        (0, acquired(0, "orders/3", "w-1", 7)),
        (2_000, acquired(2_000, "orders/3", "w-2", 8)),
        (3_000, released(1_500, "orders/3", "w-1", 7)),
    ]);
    assert!(
        firing(&changes, AlertName::LeaseSafetyViolation).is_empty(),
        "{changes:?}"
    );
}

#[test]
fn token_churn_fires_on_a_burst_and_resolves_after_it() {
    // Quiet history first: the rule needs one window of it.
    let mut events = vec![acquired(0, "jobs/calm", "w", 1)];
    for i in 0..30u64 {
        let t = 15_000 + i as i64 * 200;
        events.push(acquired(t, "jobs/hot", &format!("w-{i}"), 100 + i));
        events.push(released(t + 100, "jobs/hot", &format!("w-{i}"), 100 + i));
    }
    let changes = in_order(events);
    let fired = firing(&changes, AlertName::LeaseTokenChurn);
    let lease: Vec<_> = fired
        .iter()
        .filter(|a| a.key.kind == Some("lease"))
        .collect();
    assert_eq!(lease.len(), 1, "{changes:?}");
    assert_eq!(lease[0].labels()["lease_id"], "jobs/hot");
    assert!(!resolved(&changes, AlertName::LeaseTokenChurn).is_empty());
}

#[test]
fn renewal_failure_ratio_needs_volume_and_a_real_ratio() {
    // 100 keepalives a second with one blip: 1 of 1000 is under 1 %.
    let mut healthy = vec![acquired(0, "l/1", "w", 1)];
    for i in 0..1000 {
        healthy.push(renewed(i * 10, "l/1", "w", 1, i != 500));
    }
    let changes = in_order(healthy);
    assert!(
        firing(&changes, AlertName::LeaseRenewalFailuresHigh).is_empty(),
        "{changes:?}"
    );

    let mut failing = vec![acquired(0, "l/1", "w", 1)];
    for i in 0..1000 {
        failing.push(renewed(i * 10, "l/1", "w", 1, i % 20 != 0));
    }
    let changes = in_order(failing);
    let fired = firing(&changes, AlertName::LeaseRenewalFailuresHigh);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].labels()["backend"], "etcd");
}

#[test]
fn slow_acquisitions_fire_the_latency_rule() {
    let mut events = Vec::new();
    for i in 0..40u64 {
        let mut e = acquired(i as i64 * 1000, &format!("l/{i}"), "w", 1);
        e.latency_ms = Some(if i < 35 { 20.0 } else { 900.0 });
        events.push(e);
    }
    let changes = in_order(events);
    let fired = firing(&changes, AlertName::LeaseAcquisitionLatencyHigh);
    assert_eq!(fired.len(), 1, "{changes:?}");
}

/// What a history's alerts are, independent of when they were computed:
/// resolved alerts with their whole span, and those still active.
fn outcome(changes: &[Alert]) -> BTreeSet<String> {
    changes
        .iter()
        .filter(|a| a.state == AlertState::Resolved)
        .map(|a| format!("{:?} {} {:?}", a.labels(), a.starts_at, a.ends_at))
        .collect()
}

fn history(rng: &mut StdRng) -> Vec<LeaseEvent<'static>> {
    let mut events = Vec::new();
    for lease in 0..20 {
        let name = format!("orders/{lease}");
        let mut t = rng.random_range(0..5_000);
        let mut token = 1;
        while t < 120_000 {
            let holder = format!("w-{}", rng.random_range(0..4));
            events.push(acquired(t, &name, &holder, token));
            for k in 1..4 {
                events.push(renewed(
                    t + k * 3_000,
                    &name,
                    &holder,
                    token,
                    rng.random_bool(0.97),
                ));
            }
            match rng.random_range(0..10) {
                0 => events.push(ev(json!({"ts": T0 + t + 20_000, "kind": "expired",
                    "source": "coordinator", "lease_id": name, "holder_id": holder,
                    "fencing_token": token}))),
                1 => {
                    // Overlap: the next grant starts before this one ends.
                    events.push(released(t + 11_000, &name, &holder, token));
                    t -= 2_000;
                }
                2 => events.push(ev(
                    json!({"ts": T0 + t + 10_500, "kind": "stale_write_rejected",
                    "source": "resource", "lease_id": name, "holder_id": "w-old",
                    "fencing_token": token.saturating_sub(1), "max_token": token}),
                )),
                _ => events.push(released(t + 10_000, &name, &holder, token)),
            }
            t += 12_000 + rng.random_range(0..500);
            token += 1;
        }
    }
    events.sort_by_key(|e| e.ts_us);
    events
}

#[test]
fn shuffled_within_the_lateness_bound_gives_the_same_alerts() {
    let lateness_ms = config().lateness.as_millis() as i64;
    for seed in 0..5 {
        let mut rng = StdRng::seed_from_u64(seed);
        let events = history(&mut rng);
        let ordered = in_order(events.clone());
        // Each event arrives up to (not including) the lateness bound after
        // it happened, so arrival order shuffles.
        let mut shuffled: Vec<(i64, LeaseEvent<'static>)> = events
            .into_iter()
            .map(|e| {
                (
                    (e.ts_us / 1000) - T0 + rng.random_range(0..lateness_ms - 300),
                    e,
                )
            })
            .collect();
        shuffled.sort_by_key(|(arrival, _)| *arrival);
        let reordered = live(&shuffled);
        assert!(
            ordered.iter().any(|a| a.state == AlertState::Resolved),
            "the history raises alerts"
        );
        let (a, b) = (outcome(&ordered), outcome(&reordered));
        let only_ordered: Vec<_> = a.difference(&b).collect();
        let only_shuffled: Vec<_> = b.difference(&a).collect();
        assert!(
            only_ordered.is_empty() && only_shuffled.is_empty(),
            "seed {seed}: only in order {only_ordered:#?}, only shuffled {only_shuffled:#?}"
        );
    }
}

/// The safety-violation alerts a history fires, fed as `feed` says.
fn violation_alerts(
    feed: impl FnOnce(&mut AlertEngine, &mut dyn FnMut(&mut AlertEngine)),
) -> BTreeSet<String> {
    let mut e = engine();
    let mut fired = BTreeSet::new();
    let mut take = |e: &mut AlertEngine| {
        for a in e.take_changes() {
            if a.key.name == AlertName::LeaseSafetyViolation && a.state == AlertState::Firing {
                fired.insert(format!(
                    "{}|{}|{}",
                    a.key.lease_id.as_deref().unwrap_or(""),
                    a.key.holder_id.as_deref().unwrap_or(""),
                    a.key.kind.unwrap_or("")
                ));
            }
        }
    };
    feed(&mut e, &mut take);
    e.finish_replay();
    take(&mut e);
    fired
}

/// A simulated history with every fault, read as six partitions round robin
/// (one lease's events spread over all of them) at uneven speeds, with the
/// watermark of the slowest partition: the violation alerts are those of a
/// replay of the file, whatever the batch size. A grant that overlaps two
/// others makes two violations of one lease, time, kind and token; the
/// retraction of one must not drop the other.
#[test]
fn partitions_read_at_uneven_speeds_fire_the_violations_of_a_replay() {
    use leaseline_alerts::clock::EventClock;
    use std::sync::Arc;

    for seed in 1..=3 {
        let sim = leaseline_sim::SimConfig {
            seed,
            leases: 16,
            events: 8000,
            start_ms: T0,
            ttl_ms: 6000,
            crash: 0.05,
            pause: 0.05,
            double_grant: 0.05,
            late_fence: 0.05,
            ..leaseline_sim::SimConfig::default()
        };
        let events: Vec<LeaseEvent<'static>> = leaseline_sim::simulate(&sim)
            .events
            .iter()
            .map(|(_, line)| {
                decode_str(line)
                    .expect("simulated events are valid")
                    .into_owned()
            })
            .collect();
        let replayed = violation_alerts(|e, take| {
            for ev in &events {
                e.push(ev);
            }
            take(e);
        });
        assert!(replayed.len() > 10, "{replayed:?}");
        let lateness = config().lateness;
        for batch in [1usize, 7, 50, 500] {
            let live = violation_alerts(|e, take| {
                let mut clock = EventClock::new(lateness, Duration::from_secs(2));
                let parts: Vec<Vec<&LeaseEvent<'static>>> = (0..6)
                    .map(|p| events.iter().skip(p).step_by(6).collect())
                    .collect();
                let key = |p: usize| (Arc::<str>::from("t"), p as i32);
                for p in 0..6 {
                    clock.assigned(key(p), 0);
                }
                let mut pos = [0usize; 6];
                for round in 0.. {
                    let mut any = false;
                    for p in 0..6 {
                        // Partitions in turn, each at its own speed.
                        for _ in 0..batch * (1 + (p + round) % 3) {
                            if let Some(ev) = parts[p].get(pos[p]) {
                                clock.event(key(p), ev.ts_us, 0);
                                e.push(ev);
                                pos[p] += 1;
                                any = true;
                            }
                        }
                        e.advance(clock.watermark(0).unwrap_or(i64::MIN));
                        take(e);
                    }
                    if !any {
                        break;
                    }
                }
            });
            assert_eq!(live, replayed, "seed {seed}, batches of {batch}");
        }
    }
}

/// Audits every stale lease again from `lake`; returns how many.
fn reload_stale(e: &mut AlertEngine, lake: &[LeaseEvent<'static>]) -> usize {
    let stale = e.take_stale();
    for lease in &stale {
        let history: Vec<LeaseEvent<'static>> = lake
            .iter()
            .filter(|x| *x.lease_id == **lease)
            .cloned()
            .collect();
        e.reload(lease, &history);
    }
    stale.len()
}

/// A replay as `import` runs it, the whole history pushed before time
/// moves: every change, the most events its audit held at once, and the
/// leases re-audited. With a `window` (µs) the audit settles what is that
/// far behind the newest event, and a lease given an event older than
/// what it let go of is re-audited from the events given so far (the
/// lake's rows): at once, or at the end of the input as `import` does.
fn replay(
    order: &[LeaseEvent<'static>],
    window: Option<i64>,
    reload_at_end: bool,
) -> (Vec<String>, usize, usize) {
    let mut e = engine();
    let mut lake: Vec<LeaseEvent<'static>> = Vec::new();
    let mut reloads = 0;
    for (i, ev) in order.iter().enumerate() {
        assert!(e.push(ev));
        lake.push(ev.clone());
        if let Some(w) = window {
            if !reload_at_end {
                reloads += reload_stale(&mut e, &lake);
            }
            if i % 25 == 0 {
                e.settle(e.max_ts().unwrap() - w);
            }
        }
    }
    let held = e.held_events();
    reloads += reload_stale(&mut e, &lake);
    (finished(&mut e), held, reloads)
}

/// The changes of a replay at its end, sorted.
fn finished(e: &mut AlertEngine) -> Vec<String> {
    e.finish_replay();
    let mut changes: Vec<String> = e
        .take_changes()
        .iter()
        .map(|a| {
            format!(
                "{:?} {:?} {} {:?}",
                a.state,
                a.labels(),
                a.starts_at,
                a.ends_at
            )
        })
        .collect();
    changes.sort();
    changes
}

#[test]
fn a_replay_whose_audit_settles_fires_the_alerts_of_one_that_keeps_everything() {
    const WINDOW_US: i64 = 20_000_000;
    let mut reloads = 0;
    for seed in 0..6 {
        let mut rng = StdRng::seed_from_u64(seed);
        let in_order = history(&mut rng);
        // In order, the audit lets go of most of the history (20 s of
        // 120 s are in the window; grants that overlap or end late, and
        // the few events later grants are judged against, stay longer).
        let (whole, whole_held, _) = replay(&in_order, None, false);
        let (settled, settled_held, n) = replay(&in_order, Some(WINDOW_US), false);
        assert!(
            whole.iter().any(|c| c.contains("SafetyViolation")),
            "seed {seed}: the history makes violations"
        );
        assert_eq!(whole, settled, "seed {seed}, in order");
        assert_eq!((whole_held, n), (in_order.len(), 0));
        assert!(
            settled_held * 2 < whole_held,
            "seed {seed}: the settling audit held {settled_held} of {whole_held} events"
        );
        // One event in twenty arrives up to a minute late: past the
        // window, so its lease is audited again, and it may make or
        // unmake an overlap.
        let mut arrivals: Vec<(i64, LeaseEvent<'static>)> = in_order
            .into_iter()
            .map(|e| {
                let late = if rng.random_bool(0.05) {
                    rng.random_range(0..60_000_000)
                } else {
                    0
                };
                (e.ts_us + late, e)
            })
            .collect();
        arrivals.sort_by_key(|(at, _)| *at);
        let order: Vec<LeaseEvent<'static>> = arrivals.into_iter().map(|(_, e)| e).collect();
        let (whole, _, _) = replay(&order, None, false);
        for at_end in [false, true] {
            let (settled, _, n) = replay(&order, Some(WINDOW_US), at_end);
            reloads += n;
            assert_eq!(
                whole, settled,
                "seed {seed}, late events, reloaded at the end: {at_end}"
            );
        }
    }
    assert!(reloads > 0, "no late event made a lease stale");
}

/// A replay through `Settling` (as `import` runs it) with a window of
/// `window` and a budget of `budget` events held: its changes and the most
/// events held after a step, past the first third of the input.
fn replay_settling(
    order: &[LeaseEvent<'static>],
    window: Duration,
    budget: usize,
) -> (Vec<String>, usize) {
    let mut settling = Settling::new(window, budget).unwrap();
    let mut e = engine();
    let mut lake: Vec<LeaseEvent<'static>> = Vec::new();
    let mut peak = 0;
    for (i, ev) in order.iter().enumerate() {
        assert!(e.push(ev));
        lake.push(ev.clone());
        reload_stale(&mut e, &lake);
        if i % 25 == 0 {
            settling.step(&mut e);
            // Past the first settles, which find the window full.
            if i >= order.len() / 3 {
                peak = peak.max(e.held_events());
            }
        }
    }
    reload_stale(&mut e, &lake);
    (finished(&mut e), peak)
}

#[test]
fn an_audit_over_its_budget_of_events_narrows_its_window_and_fires_the_same_alerts() {
    for seed in 0..4 {
        let mut rng = StdRng::seed_from_u64(seed);
        let in_order = history(&mut rng);
        let (whole, _, _) = replay(&in_order, None, false);
        let window = Duration::from_secs(60);
        let (wide, wide_peak) = replay_settling(&in_order, window, 0);
        // A budget of a quarter of what the window holds at its fullest.
        let budget = wide_peak / 4;
        let (narrowed, peak) = replay_settling(&in_order, window, budget);
        assert_eq!(whole, wide, "seed {seed}: the window alone");
        assert_eq!(whole, narrowed, "seed {seed}: the window narrowed");
        // Each lease keeps its open grant and the grant later ones are
        // judged against whatever the window (20 leases here), so the
        // budget bounds what the window adds to those, not them.
        assert!(
            peak * 2 < wide_peak,
            "seed {seed}: held {peak} after a step against a budget of {budget}; the window alone held {wide_peak}"
        );
    }
}
