//! Decode-to-Arrow throughput of the strict decoder, in events per second
//! on one core.
//!
//! The input is a fixed, realistic mix of ~250-byte events (grants,
//! keepalives, resource writes, failures, ends; with event ids, backends,
//! latencies, monotonic clocks, trace context and a few attrs), decoded one
//! by one and appended to an `EventBatchBuilder`, the batch finished at the
//! end as ingest does. `serde_json::Value parse` parses the same lines into
//! a `serde_json::Value` as a baseline: what a plain JSON parse costs,
//! without validation or columns.
//!
//! First, per CPU-second of the bench thread: the three variants take turns
//! in short slices (`LEASELINE_BENCH_CPU_SECS`, default 0.2 s) for
//! `LEASELINE_BENCH_ROUNDS` rounds (default 25), so that all of them see the
//! same spells of a noisy host, and the medians and median ratios to the
//! baseline are printed. `LEASELINE_BENCH_ONLY=<part of a name>` runs one
//! variant alone (for profiling); `LEASELINE_BENCH_CPU_ONLY=1` skips the
//! criterion groups that follow; `LEASELINE_BENCH_PASSES=<n>` runs a fixed
//! n passes of decode to Arrow alone, for callgrind and cachegrind.
//!
//! Run: `cargo bench -p leaseline-schema --bench decode`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leaseline_schema::{decode, EventBatchBuilder, Origin};

/// Events per iteration: about one ingest batch.
const EVENTS: usize = 8192;

/// A small deterministic generator (xorshift), so every run sees the same lines.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn hex(&mut self, digits: usize) -> String {
        let mut s = String::with_capacity(digits);
        while s.len() < digits {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(digits);
        s
    }
}

/// The event mix: what a fleet of lock clients, an etcd/Redis adapter and a
/// fenced store send, roughly in the proportions they send it (keepalives
/// and writes dominate).
fn lines() -> Vec<String> {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let backends = [
        "etcd",
        "redis",
        "postgres",
        "zookeeper",
        "kubernetes",
        "consul",
    ];
    let mut out = Vec::with_capacity(EVENTS);
    let t0_ms: u64 = 1_789_380_000_000;
    for i in 0..EVENTS as u64 {
        let ms = t0_ms + i * 7 + r.below(5);
        let ts = format!(
            "2026-09-14T{:02}:{:02}:{:02}.{:03}Z",
            10 + (ms / 3_600_000) % 10,
            (ms / 60_000) % 60,
            (ms / 1000) % 60,
            ms % 1000
        );
        let lease = format!("orders/order-{}", 100_000 + r.below(5_000));
        let holder = format!("worker-{}-{}", r.below(64), r.hex(6));
        let token = 1_000_000 + r.below(1_000_000);
        let backend = backends[r.below(backends.len() as u64) as usize];
        let event_id = format!("{}-{}", r.hex(8), i);
        let trace = if r.below(2) == 0 {
            format!(r#","trace_id":"{}","span_id":"{}""#, r.hex(32), r.hex(16))
        } else {
            String::new()
        };
        let mono = 1_000_000.0 + (i as f64) * 7.25;
        let line = match r.below(20) {
            0..=1 => format!(
                r#"{{"ts":"{ts}","kind":"acquired","source":"coordinator","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"ttl_ms":10000,"backend":"{backend}","event_id":"{event_id}","latency_ms":{:.1}{trace}}}"#,
                r.below(2000) as f64 / 10.0
            ),
            2..=8 => format!(
                r#"{{"ts":"{ts}","kind":"renewed","source":"holder","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"ttl_ms":10000,"backend":"{backend}","event_id":"{event_id}","latency_ms":{:.1},"mono_ms":{mono:.1},"keepalive_sent_mono_ms":{:.1}}}"#,
                r.below(400) as f64 / 10.0,
                mono - 4.2
            ),
            9..=14 => format!(
                r#"{{"ts":{ms},"kind":"write_accepted","source":"resource","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"event_id":"{event_id}","backend":"{backend}"{trace},"attrs":{{"region":"eu-west-1","table":"orders"}}}}"#
            ),
            15 => format!(
                r#"{{"ts":"{ts}","kind":"renew_failed","source":"holder","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"reason":"timeout","latency_ms":{:.1},"mono_ms":{mono:.1},"backend":"{backend}","event_id":"{event_id}"}}"#,
                500.0 + r.below(100) as f64
            ),
            16 => format!(
                r#"{{"ts":"{ts}","kind":"released","source":"holder","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"backend":"{backend}","event_id":"{event_id}","mono_ms":{mono:.1},"pod":"api-{}"}}"#,
                r.below(100)
            ),
            17 => format!(
                r#"{{"ts":"{ts}","kind":"expired","source":"coordinator","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"ttl_ms":10000,"backend":"{backend}","event_id":"{event_id}"}}"#
            ),
            18 => format!(
                r#"{{"ts":"{ts}","kind":"fenced","source":"holder","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"deadline_mono_ms":{:.1},"mono_ms":{mono:.1},"backend":"{backend}","event_id":"{event_id}"}}"#,
                mono - 10.0
            ),
            _ => format!(
                r#"{{"ts":"{ts}","kind":"stale_write_rejected","source":"resource","lease_id":"{lease}","holder_id":"{holder}","fencing_token":{token},"max_token":{},"backend":"{backend}","event_id":"{event_id}"{trace}}}"#,
                token + 1
            ),
        };
        out.push(line);
    }
    out
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat), or `None`
/// elsewhere. On a shared machine wall time counts the time other processes
/// hold the core; CPU time gives the per-core rate regardless.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Events per CPU-second of one pass function run for about `secs` of wall
/// time, or `None` where CPU time cannot be read.
fn per_cpu_second(events: usize, secs: f64, f: &mut dyn FnMut()) -> Option<f64> {
    f(); // warm up
    let (cpu0, wall0) = (thread_cpu_ns()?, std::time::Instant::now());
    let mut passes = 0u64;
    while wall0.elapsed().as_secs_f64() < secs {
        f();
        passes += 1;
    }
    let cpu = (thread_cpu_ns()? - cpu0) as f64 / 1e9;
    Some((passes * events as u64) as f64 / cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the variants in turn, `rounds` times over, and prints each one's
/// median events per CPU-second and its median ratio to the last variant
/// (the baseline). Interleaving puts every variant through the same spells
/// of a noisy host, so the ratios hold better than the absolute figures.
fn interleaved(events: usize, rounds: usize, secs: f64, variants: &mut [(&str, &mut dyn FnMut())]) {
    let mut rates = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        for (i, (name, f)) in variants.iter_mut().enumerate() {
            // For profiling one variant alone: LEASELINE_BENCH_ONLY=<part of its name>.
            if std::env::var("LEASELINE_BENCH_ONLY").is_ok_and(|only| !name.contains(&only)) {
                continue;
            }
            let Some(r) = per_cpu_second(events, secs, *f) else {
                return;
            };
            eprintln!(
                "cpu-time round {}: {name}: {r:.0} events per CPU-second",
                round + 1
            );
            rates[i].push(r);
        }
    }
    let Some(base) = rates.last().filter(|b| !b.is_empty()).cloned() else {
        return;
    };
    for ((name, _), r) in variants.iter().zip(&rates) {
        let ratios: Vec<f64> = r.iter().zip(&base).map(|(a, b)| a / b).collect();
        eprintln!(
            "cpu-time median over {rounds} rounds: {name}: {:.0} events per CPU-second, {:.2}x the baseline (min {:.0}, max {:.0})",
            median(r.clone()),
            median(ratios),
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        );
    }
}

fn bench(c: &mut Criterion) {
    let lines = lines();
    let bytes: usize = lines.iter().map(String::len).sum();
    eprintln!(
        "decode bench: {} events, {} bytes, {:.0} bytes/event on average",
        lines.len(),
        bytes,
        bytes as f64 / lines.len() as f64
    );
    // Every line of the mix is a valid event.
    for l in &lines {
        if let Err(e) = decode(l.as_bytes()) {
            panic!("bench line refused: {e}\n{l}");
        }
    }
    let origin = Origin::Kafka {
        topic: "lease-events",
        partition: 0,
        offset: 0,
    };

    {
        let env = |name: &str, default: f64| {
            std::env::var(name)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default)
        };
        let secs = env("LEASELINE_BENCH_CPU_SECS", 0.2);
        let rounds = env("LEASELINE_BENCH_ROUNDS", 25.0) as usize;
        let mut builder = EventBatchBuilder::new();
        let mut to_arrow = || {
            for l in &lines {
                let e = decode(black_box(l.as_bytes())).unwrap();
                builder.append(&e, &origin, 0);
            }
            black_box(builder.finish());
        };
        // For callgrind and cachegrind, whose counts need a fixed amount of
        // work: LEASELINE_BENCH_PASSES=<n> runs n passes of decode to Arrow
        // and nothing else.
        if let Some(passes) = std::env::var("LEASELINE_BENCH_PASSES")
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
        {
            for _ in 0..passes {
                to_arrow();
            }
            return;
        }
        let mut decode_only = || {
            for l in &lines {
                black_box(decode(black_box(l.as_bytes())).unwrap());
            }
        };
        let mut value_parse = || {
            for l in &lines {
                let v: serde_json::Value = serde_json::from_slice(black_box(l.as_bytes())).unwrap();
                black_box(v);
            }
        };
        interleaved(
            lines.len(),
            rounds,
            secs,
            &mut [
                ("decode + EventBatchBuilder", &mut to_arrow),
                ("decode only", &mut decode_only),
                ("serde_json::Value parse (baseline)", &mut value_parse),
            ],
        );
        if std::env::var_os("LEASELINE_BENCH_CPU_ONLY").is_some() {
            return;
        }
    }

    let mut g = c.benchmark_group("Decode to Arrow");
    g.throughput(Throughput::Elements(lines.len() as u64));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("decode + EventBatchBuilder (mixed ~250 B events)", |b| {
        let mut builder = EventBatchBuilder::new();
        b.iter(|| {
            for l in &lines {
                let e = decode(black_box(l.as_bytes())).unwrap();
                builder.append(&e, &origin, 0);
            }
            black_box(builder.finish())
        })
    });
    g.bench_function("decode only (mixed ~250 B events)", |b| {
        b.iter(|| {
            for l in &lines {
                black_box(decode(black_box(l.as_bytes())).unwrap());
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("serde_json::Value parse");
    g.throughput(Throughput::Elements(lines.len() as u64));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("serde_json::from_slice::<Value> (same lines)", |b| {
        b.iter(|| {
            for l in &lines {
                let v: serde_json::Value = serde_json::from_slice(black_box(l.as_bytes())).unwrap();
                black_box(v);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
