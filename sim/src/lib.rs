//! A lease traffic simulator that follows the lease discipline of
//! `docs/event-contract.md`.
//!
//! What enters: a [`SimConfig`] (seed, fleet size, timing, fault rates).
//! What leaves: [`Simulation`]: the events as contract JSON lines in event
//! time order, and the ground truth: every safety violation it injected,
//! as `(kind, lease_id, fencing_token)`, the way the audit reports them.
//!
//! Each lease runs its own timeline: a holder acquires (after backoff on
//! contention: base 50 ms, doubling, cap 2 s, jitter up to 100 ms), renews
//! every TTL/3 with jitter, drains on the first failed keepalive and
//! resumes when the next one succeeds (a blip), writes to the fenced
//! resource, and releases at the end of its work; the coordinator reports
//! grants, renewals, releases and expiries beside the holder. The same
//! seed gives the same events.
//!
//! Faults, each with its own rate per grant:
//! - `crash`: the holder dies; the coordinator expires the grant a TTL
//!   after its last keepalive (a forced expiry, no violation);
//! - `pause`: a stop-the-world pause longer than the TTL. The lease
//!   expires, another holder takes it with a higher token and writes; the
//!   paused holder wakes up and writes with its old token, which the
//!   resource rejects (`stale_write_rejected`, no violation), or accepts
//!   when the resource is `unchecked_storage` (`stale_write_accepted` and
//!   `write_after_loss`);
//! - `double_grant`: a faulty coordinator grants the lease again while the
//!   current grant is valid (`overlapping_ownership`);
//! - `token_reuse`: a faulty coordinator issues a token below one it issued
//!   before (`token_regression`);
//! - `late_fence`: a client that fences later than its safe deadline
//!   (`late_fence`);
//! - `blip`: a keepalive that fails and the next one succeeds (no
//!   violation);
//! - `partition`: the holder is cut off from the coordinator: its
//!   keepalives fail, it drains and fences on time, the coordinator expires
//!   the grant (a forced expiry, no violation);
//! - `clock_skew_ms`: every holder's host clock is off by up to this much,
//!   either way, on the wall-clock times it reports (within the audit's
//!   tolerance, no violation).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

pub const BACKENDS: [&str; 6] = [
    "etcd",
    "redis",
    "postgres",
    "zookeeper",
    "kubernetes",
    "consul",
];

/// What to simulate. Rates are per grant (`blip`: per keepalive).
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    pub leases: usize,
    pub holders_per_lease: usize,
    /// Stop after about this many events.
    pub events: usize,
    /// Event time of the first event, ms since the epoch.
    pub start_ms: i64,
    pub ttl_ms: i64,
    pub blip: f64,
    pub crash: f64,
    pub pause: f64,
    pub unchecked_storage: bool,
    pub double_grant: f64,
    pub token_reuse: f64,
    pub late_fence: f64,
    /// Rate of network partitions (per grant): the holder's keepalives
    /// fail, it drains and fences on time, the lease expires. No violation.
    pub partition: f64,
    /// Each holder's host clock is off by up to this much (ms, either way);
    /// within the audit's clock-skew tolerance this makes no violation.
    pub clock_skew_ms: i64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            leases: 100,
            holders_per_lease: 3,
            events: 10_000,
            start_ms: 1_789_380_000_000,
            ttl_ms: 6_000,
            blip: 0.002,
            crash: 0.0,
            pause: 0.0,
            unchecked_storage: false,
            double_grant: 0.0,
            token_reuse: 0.0,
            late_fence: 0.0,
            partition: 0.0,
            clock_skew_ms: 0,
        }
    }
}

/// One violation the simulator injected.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Injected {
    pub kind: &'static str,
    pub lease_id: String,
    pub fencing_token: u64,
}

/// The simulated history.
#[derive(Debug, Default)]
pub struct Simulation {
    /// `(ts_ms, json)` in event time order.
    pub events: Vec<(i64, String)>,
    pub truth: Vec<Injected>,
    /// Forced expiries it caused (crashes and pauses).
    pub expiries: usize,
    pub stale_rejections: usize,
}

struct Lease<'a> {
    id: String,
    backend: &'static str,
    rng: &'a mut StdRng,
    out: Vec<(i64, Value)>,
    seq: u64,
    run: i64,
    skew: std::collections::HashMap<String, i64>,
}

impl Lease<'_> {
    fn emit(&mut self, ts: i64, mut v: Value) {
        self.seq += 1;
        let o = v.as_object_mut().expect("object");
        // A holder reports wall-clock times by its own host's clock.
        let ts = match (
            o.get("source").and_then(Value::as_str),
            o.get("holder_id").and_then(Value::as_str),
        ) {
            (Some("holder"), Some(h)) => ts + self.skew.get(h).copied().unwrap_or(0),
            _ => ts,
        };
        o.insert("ts".into(), json!(ts));
        o.insert("lease_id".into(), json!(self.id));
        // The run's start is part of the id: two runs are two histories,
        // not duplicates of each other.
        o.insert(
            "event_id".into(),
            json!(format!("{}#{}@{}", self.id, self.seq, self.run)),
        );
        if o.get("source").and_then(Value::as_str) != Some("resource") {
            o.insert("backend".into(), json!(self.backend));
        }
        self.out.push((ts, v));
    }

    fn jitter(&mut self, max: i64) -> i64 {
        self.rng.random_range(0..=max)
    }
}

/// Runs the simulation.
pub fn simulate(cfg: &SimConfig) -> Simulation {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut sim = Simulation::default();
    let per_lease = cfg.events.div_ceil(cfg.leases.max(1));
    let ttl = cfg.ttl_ms;
    for l in 0..cfg.leases {
        let mut lease = Lease {
            id: format!("{}/{l:05}", ["orders", "jobs", "shards", "leader"][l % 4]),
            backend: BACKENDS[l % BACKENDS.len()],
            rng: &mut rng,
            out: Vec::new(),
            seq: 0,
            run: cfg.start_ms,
            skew: Default::default(),
        };
        let holders: Vec<String> = (0..cfg.holders_per_lease.max(1))
            .map(|h| format!("worker-{l}-{h}"))
            .collect();
        if cfg.clock_skew_ms > 0 {
            for h in &holders {
                let off = lease
                    .rng
                    .random_range(-cfg.clock_skew_ms..=cfg.clock_skew_ms);
                lease.skew.insert(h.clone(), off);
            }
        }
        let mut t = cfg.start_ms + lease.jitter(2_000);
        let mut token: u64 = 100 + lease.rng.random_range(0..1000);
        let mut max_token = token;
        let mut h = 0usize;
        let mut overlap_next = false;
        let mut last_regressed: Option<u64> = None;
        // The holder's monotonic clock starts at 0 on its own host.
        while lease.out.len() < per_lease {
            let holder = holders[h % holders.len()].clone();
            h += 1;
            // Acquisition with backoff after contention.
            // Most acquisitions win at once; some meet contention and win
            // on the first retry (healthy traffic stays well under the
            // 200 ms p99 of the latency rule).
            let attempts = u32::from(lease.rng.random_bool(0.05));
            let mut latency = lease.rng.random_range(2..20) as i64;
            let mut backoff = 50i64;
            for _ in 0..attempts {
                latency += backoff + lease.jitter(100);
                backoff = (backoff * 2).min(2_000);
            }
            lease.emit(
                t - latency,
                json!({"kind": "acquire_requested", "source": "holder", "holder_id": holder}),
            );
            // A grant overlapping the one before is not also a regression:
            // each injected fault shows as exactly one violation.
            let regression = h > 1
                && !overlap_next
                && last_regressed != Some(max_token - 1)
                && lease.rng.random_bool(cfg.token_reuse);
            if overlap_next {
                sim.truth.push(Injected {
                    kind: "overlapping_ownership",
                    lease_id: lease.id.clone(),
                    fencing_token: token,
                });
            }
            if regression {
                // A fresh token below one already issued.
                token = max_token - 1;
                last_regressed = Some(token);
                sim.truth.push(Injected {
                    kind: "token_regression",
                    lease_id: lease.id.clone(),
                    fencing_token: token,
                });
            }
            max_token = max_token.max(token);
            let mono0 = 1_000_000.0 + (t % 100_000) as f64;
            lease.emit(t, json!({"kind": "acquired", "source": "coordinator", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl}));
            lease.emit(t + 1, json!({"kind": "acquired", "source": "holder", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl,
                "latency_ms": latency as f64, "mono_ms": mono0 + 1.0, "keepalive_sent_mono_ms": mono0 - latency as f64}));

            let renewals = lease.rng.random_range(4..8);
            let crash = lease.rng.random_bool(cfg.crash);
            let pause = !crash && lease.rng.random_bool(cfg.pause);
            let double = !crash && !pause && lease.rng.random_bool(cfg.double_grant);
            let late = !crash && !pause && !double && lease.rng.random_bool(cfg.late_fence);
            let cut_off =
                !crash && !pause && !double && !late && lease.rng.random_bool(cfg.partition);
            let fault_at = lease.rng.random_range(1..renewals);
            let mut last_good = t; // coordinator time of the last successful keepalive
            let mut last_sent_mono = mono0 - latency as f64;
            let mut end: Option<i64> = None;
            for k in 1..=renewals {
                let rt = last_good + ttl / 3 + lease.jitter(100) - 50;
                let mono = mono0 + (rt - t) as f64;
                if k == fault_at && (crash || pause) {
                    let expiry = last_good + ttl;
                    lease.emit(expiry, json!({"kind": "expired", "source": "coordinator", "holder_id": holder, "fencing_token": token}));
                    sim.expiries += 1;
                    if pause {
                        // The next holder takes over and writes; the paused
                        // one wakes up after it and writes with its old token.
                        let next_t = expiry + 100 + lease.jitter(200);
                        let next_token = max_token + 2 + lease.rng.random_range(0..3);
                        let next_holder = holders[h % holders.len()].clone();
                        h += 1;
                        lease.emit(next_t, json!({"kind": "acquired", "source": "coordinator", "holder_id": next_holder, "fencing_token": next_token, "ttl_ms": ttl}));
                        lease.emit(next_t + 200, json!({"kind": "write_accepted", "source": "resource", "holder_id": next_holder, "fencing_token": next_token}));
                        let wake = next_t + 500 + lease.jitter(500);
                        if cfg.unchecked_storage {
                            lease.emit(wake, json!({"kind": "write_accepted", "source": "resource", "holder_id": holder, "fencing_token": token}));
                            sim.truth.push(Injected {
                                kind: "stale_write_accepted",
                                lease_id: lease.id.clone(),
                                fencing_token: token,
                            });
                            sim.truth.push(Injected {
                                kind: "write_after_loss",
                                lease_id: lease.id.clone(),
                                fencing_token: token,
                            });
                        } else {
                            lease.emit(wake, json!({"kind": "stale_write_rejected", "source": "resource", "holder_id": holder, "fencing_token": token, "max_token": next_token}));
                            sim.stale_rejections += 1;
                        }
                        let release = wake + 1_000;
                        lease.emit(release, json!({"kind": "released", "source": "holder", "holder_id": next_holder, "fencing_token": next_token}));
                        lease.emit(release + 3, json!({"kind": "released", "source": "coordinator", "holder_id": next_holder, "fencing_token": next_token}));
                        token = next_token;
                        max_token = max_token.max(token);
                        end = Some(release + 3);
                    } else {
                        end = Some(expiry);
                    }
                    break;
                }
                if k == fault_at && (late || cut_off) {
                    // The keepalive fails (a partition, or the network of a
                    // late client); the client fences at its safe deadline
                    // (last send + TTL - 1 s), or a late one 500 ms past
                    // it; the coordinator expires the lease.
                    lease.emit(rt, json!({"kind": "renew_failed", "source": "holder", "holder_id": holder, "fencing_token": token, "reason": "timeout", "mono_ms": mono}));
                    lease.emit(rt + 1, json!({"kind": "drain_started", "source": "holder", "holder_id": holder, "fencing_token": token, "mono_ms": mono + 1.0,
                        "deadline_mono_ms": last_sent_mono + ttl as f64 - 1000.0}));
                    let deadline = last_sent_mono + ttl as f64 - 1000.0;
                    let fence_mono = if late { deadline + 500.0 } else { deadline };
                    let fence_ts = t + (fence_mono - mono0) as i64;
                    lease.emit(fence_ts, json!({"kind": "fenced", "source": "holder", "holder_id": holder, "fencing_token": token, "mono_ms": fence_mono, "deadline_mono_ms": deadline}));
                    if late {
                        sim.truth.push(Injected {
                            kind: "late_fence",
                            lease_id: lease.id.clone(),
                            fencing_token: token,
                        });
                    }
                    let expiry = last_good + ttl;
                    lease.emit(expiry, json!({"kind": "expired", "source": "coordinator", "holder_id": holder, "fencing_token": token}));
                    sim.expiries += 1;
                    end = Some(expiry.max(fence_ts));
                    break;
                }
                if lease.rng.random_bool(cfg.blip) {
                    // A blip: drain, then the retry succeeds within the TTL.
                    lease.emit(rt, json!({"kind": "renew_failed", "source": "holder", "holder_id": holder, "fencing_token": token, "reason": "timeout", "mono_ms": mono}));
                    lease.emit(rt + 1, json!({"kind": "drain_started", "source": "holder", "holder_id": holder, "fencing_token": token, "mono_ms": mono + 1.0,
                        "deadline_mono_ms": last_sent_mono + ttl as f64 - 1000.0}));
                    let retry = rt + 300;
                    let rtt = lease.rng.random_range(2..20) as f64;
                    lease.emit(retry, json!({"kind": "renewed", "source": "coordinator", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl}));
                    lease.emit(retry + 1, json!({"kind": "renewed", "source": "holder", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl,
                        "latency_ms": rtt, "mono_ms": mono + 300.0 + rtt, "keepalive_sent_mono_ms": mono + 300.0}));
                    last_good = retry;
                    last_sent_mono = mono + 300.0;
                } else {
                    let rtt = lease.rng.random_range(2..20) as f64;
                    lease.emit(rt, json!({"kind": "renewed", "source": "coordinator", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl}));
                    lease.emit(rt + 1, json!({"kind": "renewed", "source": "holder", "holder_id": holder, "fencing_token": token, "ttl_ms": ttl,
                        "latency_ms": rtt, "mono_ms": mono + rtt, "keepalive_sent_mono_ms": mono}));
                    last_good = rt;
                    last_sent_mono = mono;
                }
                // A regressed grant's writes would be stale: a fenced
                // resource refuses them, so its holder is not shown writing.
                if !regression && lease.rng.random_bool(0.5) {
                    lease.emit(last_good + 50, json!({"kind": "write_accepted", "source": "resource", "holder_id": holder, "fencing_token": token}));
                }
                if k == fault_at && double {
                    // A faulty coordinator grants the lease to another holder
                    // while this grant is valid; the next grant starts soon.
                    end = Some(last_good + 100);
                    break;
                }
            }
            let next = match end {
                Some(e) => e,
                None => {
                    let release = last_good + 200 + lease.jitter(300);
                    lease.emit(release, json!({"kind": "released", "source": "holder", "holder_id": holder, "fencing_token": token}));
                    lease.emit(release + 3, json!({"kind": "released", "source": "coordinator", "holder_id": holder, "fencing_token": token}));
                    release + 3
                }
            };
            t = next + 350 + lease.jitter(300);
            // Tokens step by at least 2, so that `max_token - 1` is never a
            // token already granted (see `token_reuse`).
            token = max_token + 2 + lease.rng.random_range(0..4);
            overlap_next = double;
        }
        sim.events
            .extend(lease.out.into_iter().map(|(ts, v)| (ts, v.to_string())));
    }
    sim.events.sort_by_key(|(ts, _)| *ts);
    sim.truth.sort();
    sim
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_history() {
        let cfg = SimConfig {
            events: 2_000,
            pause: 0.05,
            ..SimConfig::default()
        };
        let (a, b) = (simulate(&cfg), simulate(&cfg));
        assert_eq!(a.events, b.events);
        let other = simulate(&SimConfig { seed: 2, ..cfg });
        assert_ne!(a.events, other.events);
        assert!(
            a.events.windows(2).all(|w| w[0].0 <= w[1].0),
            "event time order"
        );
        assert!(a.events.len() >= 2_000);
    }
}
