//! Audit throughput per core: ~1M synthetic events across 10k leases, pushed
//! in stream order with mild disorder and 1 % retried duplicates, then the
//! timeline and the violations computed.
//!
//! Measured in the CPU time of the whole process, so the figure is per core
//! and does not move with whatever else the machine is running. That
//! includes the worker threads a big refresh spreads leases over
//! (`Auditor::refresh`), which the bench thread's own CPU clock would miss.
//! The `wall` group gives wall-clock time for comparison.

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use leaseline_audit::Auditor;
use leaseline_schema::{Kind, LeaseEvent, Source};

const LEASES: usize = 10_000;
const GRANTS_PER_LEASE: usize = 10;
const HOLDERS: usize = 500;
const T0: i64 = 1_789_380_000_000_000;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn event(
    ts: i64,
    kind: Kind,
    source: Source,
    lease: &str,
    holder: &str,
    token: u64,
) -> LeaseEvent<'static> {
    LeaseEvent {
        ts_us: ts,
        kind,
        source,
        lease_id: Cow::Owned(lease.to_string()),
        holder_id: Some(Cow::Owned(holder.to_string())),
        fencing_token: Some(token),
        ttl_ms: None,
        event_id: None,
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
}

/// Per grant: coordinator and holder `acquired`, three holder keepalives
/// (one in six preceded by a `renew_failed`), two accepted writes, holder
/// and coordinator `released`: about 10 events, 100 per lease.
fn synthetic() -> Vec<LeaseEvent<'static>> {
    let mut rng = Lcg(42);
    let mut out = Vec::with_capacity(LEASES * GRANTS_PER_LEASE * 11);
    for l in 0..LEASES {
        let lease = format!("orders/order-{l:06}");
        // Leases start staggered over a minute; grants follow each other.
        let mut t = T0 + rng.below(60_000_000) as i64;
        let mut token = 1000 + rng.below(1000);
        for _ in 0..GRANTS_PER_LEASE {
            let holder = format!("worker-{}", rng.below(HOLDERS as u64));
            let ttl = 3000;
            let mut mono = rng.below(1_000_000) as f64;
            let mut e = event(
                t,
                Kind::Acquired,
                Source::Coordinator,
                &lease,
                &holder,
                token,
            );
            e.ttl_ms = Some(ttl);
            e.backend = Some(Cow::Borrowed("etcd"));
            e.latency_ms = Some(12.0);
            out.push(e);
            let mut e = event(
                t + 2_000,
                Kind::Acquired,
                Source::Holder,
                &lease,
                &holder,
                token,
            );
            e.ttl_ms = Some(ttl);
            e.keepalive_sent_mono_ms = Some(mono);
            e.mono_ms = Some(mono + 2.0);
            out.push(e);
            for _ in 0..3 {
                t += 1_000_000;
                mono += 1000.0;
                if rng.below(6) == 0 {
                    let mut e = event(
                        t - 400_000,
                        Kind::RenewFailed,
                        Source::Holder,
                        &lease,
                        &holder,
                        token,
                    );
                    e.reason = Some(Cow::Borrowed("timeout"));
                    out.push(e);
                }
                let mut e = event(t, Kind::Renewed, Source::Holder, &lease, &holder, token);
                e.keepalive_sent_mono_ms = Some(mono);
                e.mono_ms = Some(mono + 3.0);
                e.latency_ms = Some(3.0);
                out.push(e);
            }
            for _ in 0..2 {
                let w = t - rng.below(900_000) as i64;
                out.push(event(
                    w,
                    Kind::WriteAccepted,
                    Source::Resource,
                    &lease,
                    &holder,
                    token,
                ));
            }
            t += 500_000;
            out.push(event(
                t,
                Kind::Released,
                Source::Holder,
                &lease,
                &holder,
                token,
            ));
            out.push(event(
                t + 1_000,
                Kind::Released,
                Source::Coordinator,
                &lease,
                &holder,
                token,
            ));
            t += 100_000 + rng.below(400_000) as i64;
            token += 1 + rng.below(3);
        }
        if l % 100 == 0 {
            // A paused holder's write, accepted after the lease moved on.
            out.push(event(
                t,
                Kind::WriteAccepted,
                Source::Resource,
                &lease,
                "worker-0",
                999,
            ));
        }
    }
    for (i, e) in out.iter_mut().enumerate() {
        e.event_id = Some(Cow::Owned(format!("ev-{i:08}")));
    }
    // Stream order, with up to 50 ms of reordering between emitters.
    let mut keyed: Vec<(i64, LeaseEvent<'static>)> = out
        .into_iter()
        .map(|e| (e.ts_us + rng.below(50_000) as i64, e))
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    let out: Vec<LeaseEvent<'static>> = keyed.into_iter().map(|(_, e)| e).collect();
    // 1 % retried: a copy arrives a little later.
    let n = out.len();
    let mut retries: Vec<(usize, usize)> = (0..n / 100)
        .map(|_| {
            let i = rng.below(n as u64) as usize;
            (i + 1 + rng.below(1000) as usize, i)
        })
        .collect();
    retries.sort_unstable();
    let mut with_retries = Vec::with_capacity(n + retries.len());
    let mut r = retries.iter().peekable();
    for (pos, e) in out.iter().enumerate() {
        while let Some(&(_, i)) = r.next_if(|(at, _)| *at <= pos) {
            with_retries.push(out[i].clone());
        }
        with_retries.push(e.clone());
    }
    with_retries.extend(r.map(|&(_, i)| out[i].clone()));
    // Copy the strings in stream order: a consumer decodes a batch from one
    // buffer, so the input is read sequentially, not scattered in memory.
    with_retries
        .iter()
        .map(|e| LeaseEvent {
            lease_id: Cow::Owned(e.lease_id.to_string()),
            holder_id: e.holder_id.as_ref().map(|h| Cow::Owned(h.to_string())),
            event_id: e.event_id.as_ref().map(|h| Cow::Owned(h.to_string())),
            ..e.clone()
        })
        .collect()
}

/// The CPU time of every thread of this process, in nanoseconds.
struct ProcessCpuTime;

fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static WALL: WallTime = WallTime;

impl Measurement for ProcessCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        process_cpu_ns()
    }

    fn end(&self, start: u64) -> u64 {
        process_cpu_ns() - start
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, like wall time.
        WALL.formatter()
    }
}

fn audit_all(events: &[LeaseEvent<'static>]) -> (usize, usize) {
    let mut auditor = Auditor::default();
    for e in events {
        auditor.push(e);
    }
    let timeline = auditor.timeline();
    let violations = auditor.violations();
    (timeline.len(), violations.len())
}

fn audit_all_batched(events: &[LeaseEvent<'static>]) -> (usize, usize) {
    let mut auditor = Auditor::default();
    auditor.push_all(events);
    let timeline = auditor.timeline();
    let violations = auditor.violations();
    (timeline.len(), violations.len())
}

fn configure<M: Measurement>(group: &mut BenchmarkGroup<'_, M>, events: usize) {
    group.throughput(Throughput::Elements(events as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
}

fn bench_cpu(c: &mut Criterion<ProcessCpuTime>) {
    let events = synthetic();
    let (grants, violations) = audit_all(&events);
    println!(
        "{} events ({} leases, {grants} grants, {violations} violations)",
        events.len(),
        LEASES
    );
    let mut group = c.benchmark_group("audit");
    configure(&mut group, events.len());
    group.bench_function("push+timeline+violations", |b| {
        b.iter(|| black_box(audit_all(&events)))
    });
    group.bench_function("push_all+timeline+violations", |b| {
        b.iter(|| black_box(audit_all_batched(&events)))
    });
    group.finish();
}

fn bench_wall(c: &mut Criterion) {
    let events = synthetic();
    let mut group = c.benchmark_group("audit-wall");
    configure(&mut group, events.len());
    group.bench_function("push+timeline+violations", |b| {
        b.iter(|| black_box(audit_all(&events)))
    });
    group.finish();
}

/// Leases in the auditor of `audit-new-lease`: as many as a live audit
/// of a large fleet holds.
const MANY_LEASES: usize = 300_000;

/// A lease id that sorts anywhere among the others, as new leases do.
fn random_lease(rng: &mut Lcg) -> String {
    format!("lease-{:08x}{:08x}", rng.next(), rng.next())
}

/// The tables read again after one new lease among many: what a live
/// audit does for a query after each commit while the fleet grows. Each
/// read orders the leases by id, the new one included.
fn bench_new_lease(c: &mut Criterion) {
    let mut rng = Lcg(7);
    let mut auditor = Auditor::default();
    let acquired = |i: usize, lease: &str| {
        event(
            T0 + i as i64,
            Kind::Acquired,
            Source::Coordinator,
            lease,
            "h",
            1,
        )
    };
    for i in 0..MANY_LEASES {
        auditor.push(&acquired(i, &random_lease(&mut rng)));
    }
    assert_eq!(auditor.lease_ids().len(), MANY_LEASES);
    let mut i = MANY_LEASES;
    let mut group = c.benchmark_group("audit-new-lease");
    group.sample_size(20);
    group.bench_function("one new lease among 300k, then violations", |b| {
        b.iter(|| {
            i += 1;
            auditor.push(&acquired(i, &random_lease(&mut rng)));
            black_box(auditor.violations().len())
        })
    });
    group.finish();
}

criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ProcessCpuTime);
    targets = bench_cpu
}
criterion_group!(wall, bench_wall, bench_new_lease);
criterion_main!(cpu, wall);
