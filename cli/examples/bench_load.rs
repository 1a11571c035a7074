//! Fills a topic for the load test (`scripts/bench-load.sh`, BENCHMARKS.md):
//! the simulator's NDJSON, replayed COPIES times at full rate.
//!
//! A run at full ingest rate needs more events than one simulation can
//! hold in memory, so the file is replayed. Each copy after the first is a
//! fleet of its own that comes later: its lease ids, holder ids and event
//! ids get a `~K` suffix (no token regresses, no id repeats, so the copies
//! add no violation and no duplicate), and its times are shifted past the
//! previous copy's, so the stream stays in event-time order for the alert
//! engine as a live fleet's would.
//!
//! Usage: `bench_load BROKERS TOPIC NDJSON COPIES [COMPRESSION]` (the
//! producer's `compression.type`, default `none`). Prints one JSON object:
//! events produced, the first and last event times, seconds taken.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;

fn lines(path: &str) -> impl Iterator<Item = String> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    BufReader::with_capacity(1 << 20, f)
        .lines()
        .map(|l| l.unwrap())
        .filter(|l| !l.trim().is_empty())
}

/// The event times the file spans, in ms.
fn span(path: &str) -> (i64, i64) {
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for l in lines(path) {
        let v: Value = serde_json::from_str(&l).unwrap();
        let ts = v["ts"].as_i64().expect("ts in epoch milliseconds");
        lo = lo.min(ts);
        hi = hi.max(ts);
    }
    (lo, hi)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(
        (5..=6).contains(&args.len()),
        "usage: bench_load BROKERS TOPIC NDJSON COPIES [COMPRESSION]"
    );
    let (brokers, topic, path) = (&args[1], &args[2], &args[3]);
    let copies: i64 = args[4].parse().unwrap();
    let compression = args.get(5).map_or("none", String::as_str);

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let _ = admin
        .create_topics(
            &[NewTopic::new(topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await;

    let (first, last) = span(path);
    // A second between copies, so no two copies share a millisecond.
    let shift = last - first + 1_000;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", compression)
        .create()
        .unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    for k in 0..copies {
        for line in lines(path) {
            let mut v: Value = serde_json::from_str(&line).unwrap();
            if k > 0 {
                for field in ["lease_id", "holder_id", "event_id"] {
                    if let Some(Value::String(s)) = v.get_mut(field) {
                        s.push_str(&format!("~{k}"));
                    }
                }
                let ts = v["ts"].as_i64().unwrap();
                v["ts"] = Value::from(ts + k * shift);
            }
            let key = v["lease_id"].as_str().unwrap_or_default().to_string();
            let payload = if k > 0 { v.to_string() } else { line };
            loop {
                match producer.send(BaseRecord::to(topic).key(&key).payload(&payload)) {
                    Ok(()) => break,
                    Err(_) => producer.poll(Duration::from_millis(10)),
                }
            }
            n += 1;
        }
        eprintln!(
            "copy {}/{copies}: {n} events in {:.1} s",
            k + 1,
            t.elapsed().as_secs_f64()
        );
    }
    producer.flush(Duration::from_secs(600)).unwrap();
    println!(
        "{}",
        serde_json::json!({
            "events": n,
            "copies": copies,
            "first_ts_ms": first,
            "last_ts_ms": last + (copies - 1) * shift,
            "copy_span_ms": shift,
            "compression": compression,
            "seconds": t.elapsed().as_secs_f64(),
        })
    );
}
