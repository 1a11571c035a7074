//! Ingest against a real Kafka-protocol broker: exactly once, nothing lost,
//! through crashes and rebalances.

// Each test holds SERIAL for its whole run, awaits included, on purpose: the
// tests run on separate threads with separate runtimes, and the lock only
// keeps them from running at the same time.
#![allow(clippy::await_holding_lock)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

const MESSAGES: usize = 100_000;

/// The tests each run a broker, ingesters and 100,000 messages; on a
/// 2-core machine they are faster one after another than interleaved.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn ingest_cmd(broker: &Broker, lake: &Path, topic: &str, group: &str) -> Command {
    let mut cmd = ingest_command(broker, lake, topic, group);
    cmd.args(["--flush-max-rows", "7000", "--flush-interval", "500ms"])
        // A restarted or stopped member must hand its partitions on fast.
        .args([
            "--kafka-property",
            "session.timeout.ms=6000",
            "--kafka-property",
            "heartbeat.interval.ms=500",
        ])
        .env("LEASELINE_LOG", "info,leaseline_ingest=debug");
    cmd
}

/// Checks that the lake holds exactly the dataset: every unique valid
/// event once (count and content checksum) and every malformed message
/// with its reason, partition and offset.
fn assert_exact(lake: &Path, topic: &str, data: &Dataset, landed: &[Landed]) {
    let events = lake_events(lake);
    assert_eq!(events.len(), data.unique.len(), "lease_events row count");
    assert_eq!(
        checksum(events),
        data.checksum(),
        "lease_events content checksum"
    );

    let mut expected: Vec<(i32, i64, String)> = data
        .expected_reason
        .iter()
        .zip(landed)
        .filter_map(|(r, l)| r.clone().map(|r| (l.partition, l.offset, r)))
        .collect();
    expected.sort();
    let got = lake_rejects(lake, topic);
    assert_eq!(got.len(), expected.len(), "lease_rejects row count");
    assert_eq!(got, expected, "lease_rejects reasons and origins");
}

fn caught_up(lake: &Path, data: &Dataset) -> bool {
    // Until the first commit there is no lake to read (reading one is an
    // error, not an empty answer).
    let n = |table: &str| -> Option<usize> {
        let out = leaseline()
            .args(["sql", "--lake"])
            .arg(lake)
            .args([
                "--format",
                "csv",
                &format!("SELECT count(*) AS n FROM {table}"),
            ])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then_some(())?;
        text.lines().nth(1)?.trim().parse().ok()
    };
    n("lease_events").is_some_and(|c| c >= data.unique.len())
        && n("lease_rejects").is_some_and(|c| c >= data.malformed())
}

async fn setup(topic: &str, seed: u64) -> (tempfile::TempDir, Broker, Dataset, Vec<Landed>) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic(topic, 3).await;
    let data = Dataset::generate(MESSAGES, seed);
    let landed = produce(&broker.producer(), topic, &data.messages).await;
    let partitions: std::collections::BTreeSet<i32> = landed.iter().map(|l| l.partition).collect();
    assert_eq!(partitions.len(), 3, "messages spread over 3 partitions");
    (dir, broker, data, landed)
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_with_rejects_and_duplicates() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (dir, broker, data, landed) = setup("leases", 1).await;
    let lake = dir.path().join("lake");
    let mut ingest = Proc::spawn(
        "ingest",
        ingest_cmd(&broker, &lake, "leases", "g1"),
        dir.path(),
    );
    assert!(
        wait_until(Duration::from_secs(180), || caught_up(&lake, &data)),
        "ingest did not catch up:\n{}",
        ingest.logs()
    );
    // A clean stop: exit 0, and nothing more is written after.
    let status = ingest.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "ingest exit status {status:?}:\n{}",
        ingest.logs()
    );
    assert_exact(&lake, "leases", &data, &landed);

    // Restarting on a caught-up lake adds nothing.
    let mut again = Proc::spawn(
        "ingest-again",
        ingest_cmd(&broker, &lake, "leases", "g1"),
        dir.path(),
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(again.terminate(Duration::from_secs(30)).success());
    assert_exact(&lake, "leases", &data, &landed);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (dir, broker, data, landed) = setup("leases", 2).await;
    let lake = dir.path().join("lake");
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut kills = 0;
    for round in 0..6 {
        let mut p = Proc::spawn(
            &format!("ingest-{round}"),
            // A fresh group each time: the broker may keep a SIGKILLed
            // member's partitions until its session expires, and where to
            // resume comes from the lake anyway, which is what this tests.
            ingest_cmd(&broker, &lake, "leases", &format!("crashy-{round}")),
            dir.path(),
        );
        // Let it get somewhere, then kill it without warning.
        let ms = rng.random_range(300..1500);
        std::thread::sleep(Duration::from_millis(ms));
        if caught_up(&lake, &data) {
            p.kill9();
            kills += 1;
            break;
        }
        p.kill9();
        kills += 1;
    }
    assert!(
        kills >= 5 || caught_up(&lake, &data),
        "killed {kills} times"
    );
    let mut last = Proc::spawn(
        "ingest-final",
        ingest_cmd(&broker, &lake, "leases", "crashy-final"),
        dir.path(),
    );
    assert!(
        wait_until(Duration::from_secs(180), || caught_up(&lake, &data)),
        "ingest did not catch up after crashes:\n{}",
        last.logs()
    );
    assert!(last.terminate(Duration::from_secs(30)).success());
    assert_exact(&lake, "leases", &data, &landed);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_ingesters_split_partitions_and_take_over() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (dir, broker, data, landed) = setup("leases", 3).await;
    let lake = dir.path().join("lake");
    let mut a = Proc::spawn(
        "ingest-a",
        ingest_cmd(&broker, &lake, "leases", "pair"),
        dir.path(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let mut b = Proc::spawn(
        "ingest-b",
        ingest_cmd(&broker, &lake, "leases", "pair"),
        dir.path(),
    );
    // Both members must own partitions at some point.
    assert!(
        wait_until(Duration::from_secs(60), || {
            b.logs().contains("assigned partitions=[(")
        }),
        "b never got partitions:\n{}",
        b.logs()
    );
    // Stop a mid-way; b takes over its partitions.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        a.terminate(Duration::from_secs(30)).success(),
        "{}",
        a.logs()
    );
    assert!(
        wait_until(Duration::from_secs(180), || caught_up(&lake, &data)),
        "b did not take over: {} of {} events, {} of {} rejects in the lake; by partition:\n{}\n{}",
        count(&lake, "lease_events"),
        data.unique.len(),
        count(&lake, "lease_rejects"),
        data.malformed(),
        sql(&lake, "SELECT kafka_partition, count(*), min(kafka_offset), max(kafka_offset) FROM (SELECT kafka_partition, kafka_offset FROM lease_events UNION ALL SELECT kafka_partition, kafka_offset FROM lease_rejects) GROUP BY 1 ORDER BY 1", "table"),
        b.logs()
    );
    assert!(b.terminate(Duration::from_secs(30)).success());
    assert_exact(&lake, "leases", &data, &landed);
}

/// `leaseline serve --ingest`: an event produced to the broker is visible to
/// SQL within a second, long before the flush that makes it durable; after
/// the flush it is there once, not twice.
#[tokio::test(flavor = "multi_thread")]
async fn served_sql_sees_a_consumed_event_before_its_flush() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("fresh", 3).await;
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    let server = Server::start(
        &lake,
        &[
            "--ingest",
            "--brokers",
            &broker.addr,
            "--topic",
            "fresh",
            "--group-id",
            "fresh",
            // Nothing is flushed by size or time during the test, nor
            // when the input goes quiet.
            "--flush-interval",
            "1h",
            "--flush-idle",
            "1h",
            "--no-compaction",
        ],
        dir.path(),
    );
    assert!(
        wait_until(Duration::from_secs(60), || server
            .proc
            .logs()
            .contains("assigned partitions=[(")),
        "never assigned:\n{}",
        server.proc.logs()
    );
    let holder = |lease: &str| {
        server
            .sql(
                &format!(
                    "SELECT holder_id, fencing_token FROM lease_holders WHERE lease_id = '{lease}'"
                ),
                &["-H", "Accept: text/csv"],
            )
            .text()
    };
    let events = |lease: &str| {
        server
            .sql(
                &format!("SELECT count(*) AS n FROM lease_events WHERE lease_id = '{lease}'"),
                &["-H", "Accept: text/csv"],
            )
            .text()
    };
    let event = br#"{"ts":"2026-09-14T12:00:00Z","kind":"acquired","source":"coordinator","lease_id":"fresh/1","holder_id":"f-1","fencing_token":9,"ttl_ms":30000,"event_id":"fresh-1"}"#;
    produce(
        &broker.producer(),
        "fresh",
        &[("fresh/1".to_string(), event.to_vec())],
    )
    .await;
    let produced = std::time::Instant::now();
    // Polled finely: the latency is what is measured.
    let deadline = produced + Duration::from_secs(10);
    while !holder("fresh/1").contains("f-1,9") {
        assert!(
            std::time::Instant::now() < deadline,
            "the event never became visible:\n{}",
            server.proc.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let latency = produced.elapsed();
    // Still only buffered: a separate reader of the lake does not see it.
    assert_eq!(
        count(&lake, "lease_events"),
        78,
        "the lake itself has not changed yet"
    );
    assert!(
        latency < Duration::from_secs(1),
        "visible after {latency:?}, more than a second"
    );
    assert_eq!(events("fresh/1"), "n\n1\n");

    // SIGTERM flushes it; the lake then holds it once.
    let mut server = server;
    assert!(
        server.proc.terminate(Duration::from_secs(30)).success(),
        "{}",
        server.proc.logs()
    );
    assert_eq!(count(&lake, "lease_events"), 79);
}

/// A secret librdkafka property read from a file
/// (`--kafka-property-file sasl.password=PATH`) reaches the consumer and no
/// log line or error. The broker (tansu 0.6) cannot check it: it offers no
/// SASL a test can use nor TLS (docs/security.md says what is tested), so
/// the property is set beside PLAINTEXT, where librdkafka holds it unused;
/// that the consumer's configuration carries the file's password is the
/// unit test `a_property_file_sets_the_property_to_its_first_line`.
#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_password_from_a_file_reaches_no_log_line_or_error() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 3).await;
    let data = Dataset::generate(5_000, 9);
    let landed = produce(&broker.producer(), "leases", &data.messages).await;

    let password = "kafka-pw-9d41c7";
    let file = dir.path().join("kafka-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let lake = dir.path().join("lake");
    let mut cmd = ingest_cmd(&broker, &lake, "leases", "secret");
    cmd.env(
        "LEASELINE_KAFKA_PROPERTY_FILES",
        format!("sasl.password={}", file.display()),
    )
    .env("LEASELINE_LOG", "debug");
    let mut ingest = Proc::spawn("ingest-secret", cmd, dir.path());
    assert!(
        wait_until(Duration::from_secs(120), || caught_up(&lake, &data)),
        "ingest did not catch up:\n{}",
        ingest.logs()
    );
    assert!(ingest.terminate(Duration::from_secs(30)).success());
    assert_exact(&lake, "leases", &data, &landed);
    let logs = ingest.logs();
    assert!(logs.contains("consuming"), "{logs}");
    assert!(!logs.contains(password), "the password in the log:\n{logs}");

    // A missing file stops ingest at start, naming the file.
    let out = ingest_cmd(&broker, &lake, "leases", "secret")
        .args([
            "--kafka-property-file",
            "sasl.password=/nonexistent/kafka-pw",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("reading kafka property sasl.password from /nonexistent/kafka-pw"),
        "{stderr}"
    );

    // librdkafka refuses a misspelt key with its value; not this one.
    let out = ingest_cmd(&broker, &lake, "leases", "secret")
        .args(["--kafka-property-file"])
        .arg(format!("sasl.pasword={}", file.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("sasl.pasword"), "{stderr}");
    assert!(
        !stderr.contains(password),
        "the password in the error:\n{stderr}"
    );
}

/// The crash and takeover tests on a lake in S3 (moto's server): five
/// SIGKILLs at random moments (each run in a fresh group: where to resume
/// comes from the lake), then two ingesters in one group, one stopped while
/// the other takes its partitions over. The end state is exact.
#[tokio::test(flavor = "multi_thread")]
async fn on_s3_sigkills_and_a_group_of_two_lose_and_duplicate_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (dir, broker, data, landed) = setup("leases", 4).await;
    let s3 = S3Server::start(dir.path(), "leaseline");
    s3.export_env();
    let url = s3.url("lake");
    let lake = Path::new(&url);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..5 {
        let mut p = Proc::spawn(
            &format!("ingest-crashy-{round}"),
            ingest_cmd(&broker, lake, "leases", &format!("s3-crashy-{round}")),
            dir.path(),
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..3000)));
        p.kill9();
    }
    let mut a = Proc::spawn(
        "ingest-a",
        ingest_cmd(&broker, lake, "leases", "s3-pair"),
        dir.path(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let mut b = Proc::spawn(
        "ingest-b",
        ingest_cmd(&broker, lake, "leases", "s3-pair"),
        dir.path(),
    );
    assert!(
        wait_until(Duration::from_secs(60), || b
            .logs()
            .contains("assigned partitions=[(")),
        "b never got partitions:\n{}",
        b.logs()
    );
    assert!(
        a.terminate(Duration::from_secs(30)).success(),
        "{}",
        a.logs()
    );
    assert!(
        wait_until(Duration::from_secs(300), || caught_up(lake, &data)),
        "ingest on S3 did not catch up:\n{}",
        b.logs()
    );
    assert!(b.terminate(Duration::from_secs(30)).success());
    assert_exact(lake, "leases", &data, &landed);
}

/// A holder that emits through `leaseline-emit`: its messages are keyed by
/// lease (so each lease stays on one partition), pass the decoder, and
/// become the grants it reported, each event once.
#[tokio::test(flavor = "multi_thread")]
async fn events_from_the_emit_crate_land_once_keyed_by_lease() {
    use leaseline_emit::{mono_ms, Emitter, KafkaSink, Kind, Source};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;

    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("emitted", 3).await;

    let mut cfg = rdkafka::ClientConfig::new();
    // One message per batch: see `Broker::producer` on tansu's fetch.
    cfg.set("bootstrap.servers", &broker.addr)
        .set("linger.ms", "0")
        .set("batch.num.messages", "1");
    let sink = KafkaSink::new(cfg, "emitted", 10_000).unwrap();
    let holder = Emitter::new(Source::Holder, sink)
        .holder_id("worker-1")
        .backend("etcd");
    const LEASES: u64 = 12;
    for l in 0..LEASES {
        let lease = format!("emit/{l}");
        let sent = mono_ms();
        holder
            .event(Kind::Acquired, &lease)
            .fencing_token(100 + l)
            .ttl_ms(30_000)
            .keepalive_sent_mono_ms(sent)
            .send()
            .unwrap();
        for _ in 0..3 {
            let sent = mono_ms();
            holder
                .event(Kind::Renewed, &lease)
                .fencing_token(100 + l)
                .ttl_ms(30_000)
                .keepalive_sent_mono_ms(sent)
                .latency_ms(1.5)
                .send()
                .unwrap();
        }
        holder
            .event(Kind::Released, &lease)
            .fencing_token(100 + l)
            .send()
            .unwrap();
    }
    holder.flush(Duration::from_secs(30)).unwrap();
    let total = LEASES * 5;
    assert_eq!((holder.sent(), holder.dropped()), (total, 0));

    // Keyed by lease_id: every message's key is its lease, and one lease's
    // messages share a partition.
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .set("group.id", "emit-check")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&["emitted"]).unwrap();
    let mut partition_of = std::collections::HashMap::new();
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen < total && std::time::Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let ev = leaseline_schema::decode(m.payload().unwrap()).unwrap();
        assert_eq!(m.key().unwrap(), ev.lease_id.as_bytes());
        let p = *partition_of
            .entry(ev.lease_id.to_string())
            .or_insert(m.partition());
        assert_eq!(p, m.partition(), "lease {} on two partitions", ev.lease_id);
        seen += 1;
    }
    assert_eq!(seen, total, "messages read back from the topic");

    let lake = dir.path().join("lake");
    let mut ingest = Proc::spawn(
        "ingest",
        ingest_cmd(&broker, &lake, "emitted", "g-emit"),
        dir.path(),
    );
    let rows = |q: &str| -> Option<String> {
        let out = leaseline()
            .args(["sql", "--lake"])
            .arg(&lake)
            .args(["--format", "csv", q])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let caught_up = || {
        rows("SELECT count(*) AS n FROM lease_events")
            .is_some_and(|t| t.lines().nth(1) == Some(&total.to_string()))
    };
    assert!(
        wait_until(Duration::from_secs(120), caught_up),
        "ingest did not take the emitted events:\n{}",
        ingest.logs()
    );
    assert!(ingest.terminate(Duration::from_secs(30)).success());
    assert_eq!(
        sql(
            &lake,
            "SELECT count(DISTINCT event_id) AS n FROM lease_events",
            "csv"
        ),
        format!("n\n{total}\n")
    );
    let mut want: Vec<String> = (0..LEASES)
        .map(|l| format!("emit/{l},{},worker-1,etcd,released,3", 100 + l))
        .collect();
    want.sort();
    let mut got: Vec<String> = sql(
        &lake,
        "SELECT lease_id, fencing_token, holder_id, backend, end_kind, renewals FROM lease_timeline",
        "csv",
    )
    .lines()
    .skip(1)
    .map(str::to_string)
    .collect();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(
        sql(&lake, "SELECT count(*) AS n FROM lease_violations", "csv"),
        "n\n0\n"
    );
}

/// Reading a backlog, no partition is read further ahead in event time
/// than `kafka.max_drift` of the slowest one still being read: the alert
/// engine's watermark is that slowest partition's, and everything of the
/// others past it is held in memory. Partition 0 holds an event a second,
/// partition 1 one every 50 ms, as many of each: however librdkafka serves
/// them, one runs minutes ahead of the other unless paused. The same
/// backlog read with `0s` (no alignment) shows that it does.
#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_is_read_in_step_by_event_time() {
    use rdkafka::producer::FutureRecord;

    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("skewed", 2).await;
    const N: i64 = 3000;
    const BASE_MS: i64 = 1_789_380_000_000;
    let step_ms = [1000, 50];
    let producer = broker.producer();
    for (p, step) in step_ms.iter().enumerate() {
        for i in 0..N {
            let lease = format!("skew/{p}-{}", i % 20);
            let ev = serde_json::json!({
                "ts": BASE_MS + i * step,
                "kind": "renewed",
                "source": "holder",
                "lease_id": lease,
                "holder_id": "worker-1",
                "fencing_token": 7,
                "event_id": format!("skew-{p}-{i}"),
            });
            let value = serde_json::to_vec(&ev).unwrap();
            let rec = FutureRecord::to("skewed")
                .partition(p as i32)
                .key(&lease)
                .payload(&value);
            producer
                .send(rec, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| e)
                .expect("produce");
        }
    }

    // The most one partition was read ahead of the other (in ms) while the
    // other still had events to read; a partition not read yet counts as
    // being at the first event.
    let spread = |lake: &Path| -> i64 {
        let out = sql(
            lake,
            "SELECT kafka_partition AS p, CAST(ts AS BIGINT) / 1000 AS ms \
             FROM lease_events ORDER BY ingested_at, kafka_partition, kafka_offset",
            "csv",
        );
        let end = step_ms.map(|step| BASE_MS + (N - 1) * step);
        let mut newest = [BASE_MS, BASE_MS];
        let mut most = i64::MIN;
        let mut rows = 0;
        for line in out.lines().skip(1) {
            let (p, ms) = line.split_once(',').unwrap();
            let (p, ms): (usize, i64) = (p.parse().unwrap(), ms.parse().unwrap());
            newest[p] = newest[p].max(ms);
            rows += 1;
            for (a, b) in [(0, 1), (1, 0)] {
                if newest[b] < end[b] {
                    most = most.max(newest[a] - newest[b]);
                }
            }
        }
        assert_eq!(rows, 2 * N, "every event landed once");
        most
    };

    let mut spreads = Vec::new();
    for drift in ["10s", "0s"] {
        let lake = dir.path().join(format!("lake-{drift}"));
        let mut ingest = Proc::spawn(
            &format!("ingest-{drift}"),
            {
                let mut cmd = ingest_cmd(&broker, &lake, "skewed", &format!("g-{drift}"));
                cmd.args(["--kafka-max-drift", drift]);
                cmd
            },
            dir.path(),
        );
        assert!(
            wait_until(Duration::from_secs(120), || {
                committed_events(&lake) == Some(2 * N as usize)
            }),
            "ingest did not read the backlog:\n{}",
            ingest.logs()
        );
        assert!(ingest.terminate(Duration::from_secs(30)).success());
        spreads.push(spread(&lake));
    }
    // The event that goes past the drift (at most a second) is read
    // before the pause.
    assert!(
        spreads[0] <= 11_000,
        "a partition was read {} ms ahead with a 10 s drift",
        spreads[0]
    );
    assert!(
        spreads[1] > 60_000,
        "without alignment a partition was read only {} ms ahead: the test no longer shows what alignment changes",
        spreads[1]
    );
}
