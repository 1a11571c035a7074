//! Kafka to durable Parquet, side by side with a consumer that reads and
//! discards, against the same topic in the same run.
//!
//! `scripts/bench-ingest.sh` starts a broker and runs this; see
//! BENCHMARKS.md. Usage:
//! `bench_ingest BROKERS EVENTS ROUNDS LEASELINE_BIN WORKDIR`

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

mod common;

const TOPIC: &str = "bench-leases";

fn event(i: u64) -> String {
    let lease = i % 10_000;
    let kinds = [
        "renewed",
        "renewed",
        "renewed",
        "write_accepted",
        "acquired",
        "released",
    ];
    let kind = kinds[(i % kinds.len() as u64) as usize];
    let ttl = if kind == "acquired" {
        r#","ttl_ms":10000"#
    } else {
        ""
    };
    format!(
        r#"{{"ts":{},"kind":"{kind}","source":"holder","lease_id":"orders/order-{lease}","holder_id":"worker-{}","fencing_token":{},"backend":"etcd","latency_ms":{:.1},"event_id":"e-{i:012}"{ttl},"mono_ms":{}.0}}"#,
        1_789_380_000_000u64 + i,
        i % 97,
        1000 + i / 10_000,
        (i % 50) as f64 / 3.0,
        i * 3,
    )
}

/// A consumer that reads and discards, built by the ingester's own
/// configuration code: the same librdkafka settings
/// (`queued.max.messages.kbytes`, `fetch.wait.max.ms`,
/// `enable.partition.eof`, ...), so the ratio measures the lake, not the
/// client's tuning.
fn discard(brokers: &str, n: u64, round: u32) -> Duration {
    let cfg = leaseline_ingest::KafkaConfig {
        brokers: brokers.to_string(),
        topics: vec![TOPIC.to_string()],
        group_id: format!("discard-{round}"),
        ..Default::default()
    };
    let c: BaseConsumer = leaseline_ingest::kafka::client_config(&cfg)
        .unwrap()
        .create()
        .unwrap();
    c.subscribe(&[TOPIC]).unwrap();
    let start = Instant::now();
    let mut seen = 0u64;
    let mut bytes = 0usize;
    while seen < n {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            use rdkafka::message::Message;
            bytes += m.payload().map_or(0, |p| p.len());
            seen += 1;
        }
    }
    std::hint::black_box(bytes);
    start.elapsed()
}

fn ingest(bin: &str, brokers: &str, n: u64, round: u32, work: &Path) -> (Duration, u64, u64) {
    let lake = work.join(format!("lake-{round}"));
    let _ = std::fs::remove_dir_all(&lake);
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(["ingest", "--lake"])
        .arg(&lake)
        .args([
            "--brokers",
            brokers,
            "--topic",
            TOPIC,
            "--group-id",
            &format!("ingest-{round}"),
            "--no-compaction",
        ])
        .args(["--flush-interval", "500ms"])
        .env("LEASELINE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut hwm = 0;
    loop {
        hwm = hwm.max(common::vm_hwm_kib(child.id()));
        let (rows, _) = common::committed_rows(&lake);
        if rows >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    hwm = hwm.max(common::vm_hwm_kib(child.id()));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let (_, bytes) = common::committed_rows(&lake);
    (took, hwm, bytes)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let brokers = &args[1];
    let n: u64 = args[2].parse().unwrap();
    let rounds: u32 = args[3].parse().unwrap();
    let bin = &args[4];
    let work = Path::new(&args[5]);
    std::fs::create_dir_all(work).unwrap();

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let _ = admin
        .create_topics(
            &[NewTopic::new(TOPIC, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await;

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let mut ndjson_bytes = 0u64;
    let t = Instant::now();
    for i in 0..n {
        let v = event(i);
        ndjson_bytes += v.len() as u64 + 1;
        let key = format!("{}", i % 10_000);
        loop {
            match producer.send(BaseRecord::to(TOPIC).key(&key).payload(&v)) {
                Ok(()) => break,
                Err((_, _)) => producer.poll(Duration::from_millis(10)),
            }
        }
    }
    producer.flush(Duration::from_secs(300)).unwrap();
    eprintln!("produced {n} events in {:.1}s", t.elapsed().as_secs_f64());

    let mut discard_rates = Vec::new();
    let mut ingest_rates = Vec::new();
    let mut ratios = Vec::new();
    let mut hwms = Vec::new();
    let mut parquet_bytes = 0;
    for round in 0..rounds {
        let d = discard(brokers, n, round);
        let (i, hwm, bytes) = ingest(bin, brokers, n, round, work);
        let dr = n as f64 / d.as_secs_f64();
        let ir = n as f64 / i.as_secs_f64();
        eprintln!("round {round}: discard {dr:.0} ev/s, ingest {ir:.0} ev/s, ratio {:.2}, peak RSS {} MiB", ir / dr, hwm / 1024);
        discard_rates.push(dr);
        ingest_rates.push(ir);
        ratios.push(ir / dr);
        hwms.push(hwm as f64);
        parquet_bytes = bytes;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "events: {n}, rounds: {rounds}").unwrap();
    writeln!(
        out,
        "discard consumer: median {:.0} events/s",
        median(discard_rates)
    )
    .unwrap();
    writeln!(
        out,
        "leaseline ingest (to committed Parquet): median {:.0} events/s",
        median(ingest_rates)
    )
    .unwrap();
    writeln!(out, "ratio ingest/discard: median {:.2}", median(ratios)).unwrap();
    writeln!(
        out,
        "ingester peak RSS (VmHWM): median {:.0} MiB",
        median(hwms) / 1024.0
    )
    .unwrap();
    writeln!(
        out,
        "bytes per event: NDJSON {:.1}, Parquet {:.1} ({:.1} %)",
        ndjson_bytes as f64 / n as f64,
        parquet_bytes as f64 / n as f64,
        100.0 * parquet_bytes as f64 / ndjson_bytes as f64
    )
    .unwrap();
}
