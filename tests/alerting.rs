//! Alerts end to end: events produced to a real broker, `leaseline serve
//! --ingest` evaluating them as they are consumed, a real Alertmanager
//! receiving them, and a real Prometheus scraping `/metrics`.
#![allow(clippy::await_holding_lock)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

// Each test runs a broker, Alertmanager and the server: one at a time on
// two cores. The guard is held across awaits on purpose (see
// kafka_ingest.rs).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Rule windows short enough for a test; the rest are the defaults.
fn config(dir: &Path, receivers: &[&str]) -> std::path::PathBuf {
    let mut text = String::from(
        r#"
[alerts]
lateness = "1s"
partition_idle_timeout = "1s"
evaluation_interval = "1s"
resend_interval = "2s"
[alerts.rules.forced_expiry]
window = "4s"
[alerts.rules.stale_write_rejected]
window = "4s"
[alerts.rules.safety_violation]
resolve_after = "6s"
[alerts.rules.token_churn]
window = "3s"
baseline_window = "30s"
"#,
    );
    for (i, url) in receivers.iter().enumerate() {
        text.push_str(&format!(
            "[[alerts.receivers]]\ntype = \"alertmanager\"\nname = \"am-{i}\"\nurl = \"{url}\"\n"
        ));
    }
    let path = dir.join("leaseline.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn event(v: Value) -> (String, Vec<u8>) {
    (
        v["lease_id"].as_str().unwrap().to_string(),
        v.to_string().into_bytes(),
    )
}

fn acquired(ts: i64, lease: &str, holder: &str, token: u64) -> (String, Vec<u8>) {
    event(
        json!({"ts": ts, "kind": "acquired", "source": "coordinator", "lease_id": lease,
        "holder_id": holder, "fencing_token": token, "ttl_ms": 10_000, "backend": "etcd"}),
    )
}

fn released(ts: i64, lease: &str, holder: &str, token: u64) -> (String, Vec<u8>) {
    event(
        json!({"ts": ts, "kind": "released", "source": "coordinator", "lease_id": lease,
        "holder_id": holder, "fencing_token": token, "backend": "etcd"}),
    )
}

/// A lease `filler` granted and released once a minute for `minutes`
/// minutes after `t0`: event time that moves on.
fn filler(t0: i64, minutes: u64) -> Vec<(String, Vec<u8>)> {
    (1..=minutes)
        .flat_map(|k| {
            let at = t0 + k as i64 * 60_000;
            [
                acquired(at, "filler", "f", k),
                released(at + 1_000, "filler", "f", k),
            ]
        })
        .collect()
}

fn serve_with_ingest(dir: &Path, broker: &Broker, config: &Path) -> Server {
    serve_in_group(dir, broker, config, "leaseline")
}

/// [`serve_with_ingest`] in the consumer group `group`.
fn serve_in_group(dir: &Path, broker: &Broker, config: &Path, group: &str) -> Server {
    let lake = dir.join("lake");
    let config = config.to_str().unwrap();
    Server::start(
        &lake,
        &[
            "--ingest",
            "--brokers",
            &broker.addr,
            "--topic",
            "leases",
            "--group-id",
            group,
            "--config",
            config,
            "--no-pg",
            // A member SIGKILLed or stopped must hand its partitions on
            // fast: the group is rebalanced only once the dead member's
            // session has run out (45 s by default).
            "--kafka-property",
            "session.timeout.ms=6000",
            "--kafka-property",
            "heartbeat.interval.ms=500",
        ],
        dir,
    )
}

/// Produces one forced expiry of `lease` held by `holder` with `token`,
/// ending now.
async fn produce_forced_expiry(broker: &Broker, lease: &str, holder: &str, token: u64) {
    let t = now_ms();
    produce(
        &broker.producer(),
        "leases",
        &[
            acquired(t - 2_000, lease, holder, token),
            event(json!({"ts": t, "kind": "expired", "source": "coordinator",
                "lease_id": lease, "holder_id": holder, "fencing_token": token, "backend": "etcd"})),
        ],
    )
    .await;
}

fn label<'a>(a: &'a Value, name: &str) -> &'a str {
    a["labels"][name].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn each_alert_reaches_alertmanager_with_its_labels_and_resolves() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 1).await;
    let am = Alertmanager::start(dir.path());
    let server = serve_with_ingest(dir.path(), &broker, &config(dir.path(), &[&am.url]));
    let producer = broker.producer();

    // Some history first: token churn needs one window of baseline.
    let t = now_ms();
    produce(&producer, "leases", &[acquired(t, "calm/1", "c-1", 1)]).await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;

    let t = now_ms();
    let mut msgs = vec![
        // A forced expiry.
        acquired(t - 2_000, "orders/expiry", "w-1", 10),
        event(json!({"ts": t, "kind": "expired", "source": "coordinator",
            "lease_id": "orders/expiry", "holder_id": "w-1", "fencing_token": 10, "backend": "etcd"})),
        // A stale write the resource refused.
        acquired(t - 1_000, "orders/stale", "w-2", 34),
        event(
            json!({"ts": t, "kind": "stale_write_rejected", "source": "resource",
            "lease_id": "orders/stale", "holder_id": "w-1", "fencing_token": 33, "max_token": 34}),
        ),
        // Two grants at once: overlapping ownership.
        acquired(t - 1_000, "orders/split", "w-a", 7),
        acquired(t, "orders/split", "w-b", 8),
    ];
    // A burst of handoffs on one lease.
    for i in 0..30u64 {
        msgs.push(acquired(
            t + i as i64 * 20,
            "jobs/hot",
            &format!("h-{i}"),
            100 + i,
        ));
        msgs.push(released(
            t + i as i64 * 20 + 10,
            "jobs/hot",
            &format!("h-{i}"),
            100 + i,
        ));
    }
    produce(&producer, "leases", &msgs).await;

    let wanted = [
        ("LeaseForcedExpiry", "orders/expiry", "w-1", "warning"),
        ("LeaseStaleWriteRejected", "orders/stale", "w-1", "warning"),
        ("LeaseSafetyViolation", "orders/split", "w-b", "critical"),
        ("LeaseTokenChurn", "jobs/hot", "", "warning"),
    ];
    let mut seen = Vec::new();
    let arrived = wait_until(Duration::from_secs(30), || {
        seen = am.alerts();
        wanted.iter().all(|(name, lease, _, _)| {
            seen.iter()
                .any(|a| label(a, "alertname") == *name && label(a, "lease_id") == *lease)
        })
    });
    assert!(
        arrived,
        "alerts in Alertmanager: {seen:#?}\n{}",
        server.proc.logs()
    );
    for (name, lease, holder, severity) in wanted {
        let a = seen
            .iter()
            .find(|a| label(a, "alertname") == name && label(a, "lease_id") == lease)
            .unwrap();
        assert_eq!(label(a, "holder_id"), holder, "{a:#}");
        assert_eq!(label(a, "severity"), severity, "{a:#}");
        if name != "LeaseStaleWriteRejected" {
            assert_eq!(label(a, "backend"), "etcd", "{a:#}");
        }
        let description = a["annotations"]["description"].as_str().unwrap();
        assert!(!description.is_empty());
        let link = a["annotations"]["timeline"].as_str().unwrap();
        assert!(link.contains("/api/v1/leases/"), "{link}");
    }
    let violation = seen
        .iter()
        .find(|a| label(a, "alertname") == "LeaseSafetyViolation")
        .unwrap();
    assert_eq!(label(violation, "kind"), "overlapping_ownership");
    assert!(
        violation["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("grant 8"),
        "{violation:#}"
    );

    // Nothing more happens: every alert resolves and leaves the list.
    let cleared = wait_until(Duration::from_secs(40), || {
        seen = am.alerts();
        seen.iter().all(|a| {
            label(a, "alertname") != "LeaseForcedExpiry"
                && label(a, "alertname") != "LeaseStaleWriteRejected"
                && label(a, "alertname") != "LeaseSafetyViolation"
                && label(a, "alertname") != "LeaseTokenChurn"
        })
    });
    assert!(cleared, "still active: {seen:#?}\n{}", server.proc.logs());

    // The history table holds each one's firing and resolved rows.
    let rows = wait_until(Duration::from_secs(20), || {
        let r = server.sql(
            "SELECT alertname, state FROM lease_alerts WHERE state = 'resolved'",
            &["-H", "Accept: application/json"],
        );
        let text = r.text();
        wanted.iter().all(|(name, ..)| text.contains(name))
    });
    let all = server.sql(
        "SELECT alertname, lease_id, state, starts_at, ends_at FROM lease_alerts ORDER BY recorded_at",
        &["-H", "Accept: application/json"],
    );
    assert!(rows, "lease_alerts: {}", all.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alert_raised_while_alertmanager_is_down_arrives_when_it_is_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 1).await;
    let mut am = Alertmanager::stopped(dir.path(), free_port());
    let cfg = config(dir.path(), &[&am.url]);
    // A second receiver, a JSON webhook, that is up all along.
    let webhook = HttpSink::start();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[[alerts.receivers]]\ntype = \"webhook\"\nname = \"hook\"\nurl = \"{}/hook\"\n",
        webhook.url
    ));
    std::fs::write(&cfg, text).unwrap();
    // Long enough to still be firing when Alertmanager comes back.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("window = \"4s\"", "window = \"10m\"");
    std::fs::write(&cfg, text).unwrap();
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    produce_forced_expiry(&broker, "orders/outage", "w-9", 3).await;
    assert!(
        wait_until(Duration::from_secs(20), || server
            .proc
            .logs()
            .contains("alert delivery failed")),
        "the alert fired and its delivery failed:\n{}",
        server.proc.logs()
    );
    am.run();
    let mut seen = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            seen = am.named("LeaseForcedExpiry");
            !seen.is_empty()
        }),
        "the alert never arrived:\n{}",
        server.proc.logs()
    );
    assert_eq!(label(&seen[0], "lease_id"), "orders/outage");
    assert_eq!(label(&seen[0], "holder_id"), "w-9");

    // The webhook got it at once, in Alertmanager's webhook format.
    let hooks = webhook.requests();
    let hook = hooks
        .iter()
        .find(|r| r.path == "/hook")
        .unwrap_or_else(|| panic!("webhook requests: {hooks:?}"));
    assert_eq!(hook.method, "POST");
    let body: Value = serde_json::from_slice(&hook.body).unwrap();
    assert_eq!(body["version"], "4");
    assert_eq!(body["status"], "firing");
    let alert = &body["alerts"][0];
    assert_eq!(alert["labels"]["alertname"], "LeaseForcedExpiry");
    assert_eq!(alert["labels"]["lease_id"], "orders/outage");
    assert_eq!(alert["status"], "firing");
}

#[tokio::test(flavor = "multi_thread")]
async fn healthy_traffic_raises_no_alert_and_prometheus_scrapes_the_counters() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 1).await;
    let am = Alertmanager::start(dir.path());
    // The default rules and windows, delivering to Alertmanager.
    let cfg = dir.path().join("leaseline.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[alerts.receivers]]\ntype = \"alertmanager\"\nname = \"am\"\nurl = \"{}\"\n",
            am.url
        ),
    )
    .unwrap();
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    let target = server.http.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(dir.path(), &target);

    // 100,000 events of normal handoffs and keepalive blips that recover.
    let out = run_ok(leaseline().args([
        "simulate",
        "--seed",
        "7",
        "--leases",
        "100",
        "--events",
        "100000",
        "--blip",
        "0.005",
        "--brokers",
        &broker.addr,
        "--topic",
        "leases",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let produced = simulated_count(&stderr);
    assert!(produced >= 100_000, "{stderr}");

    let counted = wait_until(Duration::from_secs(240), || {
        let r = server.sql(
            "SELECT count(*) AS n FROM lease_events",
            &["-H", "Accept: application/json"],
        );
        r.status == 200 && r.json()[0]["n"].as_u64() == Some(produced)
    });
    assert!(counted, "not all events consumed:\n{}", server.proc.logs());
    // Give the engine and the delivery a moment past the last event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        am.alerts().is_empty(),
        "healthy traffic raised alerts: {:#?}",
        am.alerts()
    );
    assert!(
        !server.proc.logs().contains("ALERT FIRING"),
        "{}",
        server.proc.logs()
    );

    // /metrics has every series the shipped Prometheus rules use, and a
    // real Prometheus has scraped the counters.
    let metrics = server.get("/metrics").text();
    for name in [
        "lease_acquisition_latency_ms_bucket",
        "lease_acquisition_latency_p99_ms",
        "lease_renewals_total",
        "lease_renewal_failures_total",
        "lease_renewal_failure_rate",
        "fencing_token_increments_total",
        "fencing_token_increment_rate",
        "leaseline_ingest_events_total",
        "leaseline_ingest_rejects_total",
        "leaseline_ingest_flush_seconds_total",
        "leaseline_ingest_files_written_total",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    let rules = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../alerts/prometheus/leaseline-rules.yml"),
    )
    .unwrap();
    for name in [
        "lease_expiry_forced_total",
        "stale_write_rejected_total",
        "lease_violations_total",
    ] {
        assert!(rules.contains(name), "the rules use {name}");
    }
    let mut result = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            result = prometheus.query("sum(leaseline_ingest_events_total)");
            result.first().and_then(|r| r["value"][1].as_str()) == Some(&produced.to_string())
        }),
        "Prometheus query: {result:?}\n{}",
        prometheus.proc.logs()
    );
    let renewals = prometheus.query("sum(lease_renewals_total)");
    let n: f64 = renewals[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(n > 10_000.0, "{renewals:?}");
    let by_backend = prometheus.query("lease_renewals_total");
    assert_eq!(
        by_backend.len(),
        6,
        "one series per backend: {by_backend:?}"
    );
}

/// The violations `serve` reports, as `kind lease token` lines, once it
/// answers for the snapshot the query read (`Leaseline-Audit-Version`
/// equals `Leaseline-Lake-Version`).
/// While the alert engine is still taking the last commits, serve answers
/// for the newest commit the engine holds whole, and says so: exact for
/// that commit, but the simulator's producer sends each event from a task
/// of its own, so a partition may hold a grant's start before the end of
/// the grant before it, and an earlier commit may show them overlapping.
fn served_violations(server: &Server) -> std::collections::BTreeSet<String> {
    let headers = tempfile::NamedTempFile::new().unwrap();
    let path = headers.path().to_str().unwrap();
    let (mut found, mut seen) = (Default::default(), String::new());
    let current = wait_until(Duration::from_secs(120), || {
        let r = server.sql(
            "SELECT kind, lease_id, fencing_token FROM lease_violations",
            &["-H", "Accept: application/json", "-D", path],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        found = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(violation_key)
            .collect();
        seen = std::fs::read_to_string(path).unwrap().to_ascii_lowercase();
        let version = |name: &str| {
            seen.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let lake = version("leaseline-lake-version:");
        lake.is_some() && lake == version("leaseline-audit-version:")
    });
    assert!(
        current,
        "the audit never answered for the snapshot read:\n{seen}"
    );
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_finds_exactly_the_violations_the_simulator_injected_through_kafka() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let faults: [(&str, &[&str]); 10] = [
        ("clean", &["--events", "1000000", "--leases", "1000"]),
        ("crash", &["--crash", "0.05"]),
        ("pause", &["--pause", "0.05"]),
        ("unchecked", &["--pause", "0.05", "--unchecked-storage"]),
        ("double", &["--double-grant", "0.05"]),
        ("reuse", &["--token-reuse", "0.1"]),
        ("late", &["--late-fence", "0.05"]),
        ("blips", &["--blip", "0.05"]),
        ("partition", &["--partition", "0.05"]),
        ("skew", &["--clock-skew", "200ms"]),
    ];
    // The clean history (about six minutes of event time) settles and
    // stores its rows many times over with a 30 s window.
    let window = dir.path().join("window.toml");
    std::fs::write(&window, "[audit]\nevent_window = \"30s\"\n").unwrap();
    for (name, args) in faults {
        let topic = format!("sim-{name}");
        broker.create_topic(&topic, 3).await;
        let truth_file = dir.path().join(format!("{name}.truth"));
        let mut sim = leaseline();
        sim.args([
            "simulate",
            "--start",
            "2026-09-14T10:00:00Z",
            "--brokers",
            &broker.addr,
        ])
        .args(["--topic", &topic, "--truth"])
        .arg(&truth_file);
        if name != "clean" {
            sim.args(["--events", "20000", "--leases", "40"]);
        }
        let out = sim.args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{name}: {stderr}");
        let produced = simulated_count(&stderr);
        let truth: std::collections::BTreeSet<String> = std::fs::read_to_string(&truth_file)
            .unwrap()
            .lines()
            .map(|l| violation_key(&serde_json::from_str(l).unwrap()))
            .collect();

        let lake = dir.path().join(format!("lake-{name}"));
        let mut args = vec![
            "--ingest",
            "--brokers",
            &broker.addr,
            "--topic",
            &topic,
            "--group-id",
            &topic,
            "--no-pg",
        ];
        if name == "clean" {
            args.extend(["--config", window.to_str().unwrap()]);
        }
        let mut server = Server::start(&lake, &args, dir.path());
        let consumed = wait_until(Duration::from_secs(600), || {
            let r = server.sql(
                "SELECT count(*) AS n FROM lease_events",
                &["-H", "Accept: application/json"],
            );
            r.status == 200 && r.json()[0]["n"].as_u64() == Some(produced)
        });
        assert!(
            consumed,
            "{name}: not all {produced} events consumed:\n{}",
            server.proc.logs()
        );
        // SQL on lease_events already counts rows buffered for the next
        // commit; the audit's tables hold only committed ones (docs/
        // audit-and-sql.md), so they are read once every event is.
        assert!(
            wait_until(Duration::from_secs(60), || committed_events(&lake)
                == Some(produced as usize)),
            "{name}: not all {produced} events committed:\n{}",
            server.proc.logs()
        );
        let found = served_violations(&server);
        if found != truth {
            // Which reader answered, and what the lake itself says, tell
            // a wrong read from a wrong lake.
            let q = "SELECT kind, lease_id, fencing_token FROM lease_violations";
            let metrics = server.get("/metrics").text();
            let reads: Vec<&str> = metrics
                .lines()
                .filter(|l| l.starts_with("leaseline_query_audit_reads_total"))
                .collect();
            panic!(
                "{name}: lease_violations served {found:?}, injected {truth:?}\n\
                 audit reads: {reads:?}\nserved again: {:?}\n\
                 the lake audited whole: {}\nfrom its stored rows: {}\n{}",
                served_violations(&server),
                sql_auditing_all(&lake, q, "ndjson"),
                sql(&lake, q, "ndjson"),
                server.proc.logs()
            );
        }
        if name == "clean" {
            assert!(produced >= 1_000_000 && found.is_empty());
            // Each settle stored every lease's context again, at its new
            // cut; the table keeps few cuts of a lease, not one per settle.
            let stores = server
                .proc
                .logs()
                .matches("stored the audit's settled rows")
                .count();
            // Stopped first: serve goes on settling as its idle
            // partitions move the watermark, and the readers below must
            // all read the same version.
            assert!(server.proc.terminate(Duration::from_secs(60)).success());
            let cuts = context_cuts_per_lease(&lake);
            assert!(
                stores > 4 && cuts <= 4,
                "{stores} stores; a lease's context at up to {cuts} cuts"
            );
            // Read with the rewritten context, the stored rows answer as
            // an audit of every event does.
            assert!(sql_reads_stored_rows(&lake));
            for q in [
                "SELECT lease_id, fencing_token, holder_id, acquired_at, ended_at, end_kind, \
                 renewals, valid_until FROM lease_timeline ORDER BY lease_id, fencing_token",
                "SELECT lease_id, holder_id, fencing_token, valid FROM lease_holders \
                 ORDER BY lease_id",
            ] {
                assert_eq!(
                    sql(&lake, q, "csv"),
                    sql_auditing_all(&lake, q, "csv"),
                    "{q}"
                );
            }
        } else if ["unchecked", "double", "reuse", "late"].contains(&name) {
            assert!(!truth.is_empty(), "{name} injected violations");
        }
    }
}

/// (alertname, lease_id, holder_id, kind) of an alert's labels.
fn alert_key(labels: &Value) -> String {
    let l = |n: &str| labels[n].as_str().unwrap_or("").to_string();
    format!(
        "{}|{}|{}|{}",
        l("alertname"),
        l("lease_id"),
        l("holder_id"),
        l("kind")
    )
}

/// The alerts a history proves by its events alone, which a live run must
/// raise whatever the order and speed it reads them in.
const EVENT_ALERTS: [&str; 3] = [
    "LeaseForcedExpiry",
    "LeaseStaleWriteRejected",
    "LeaseSafetyViolation",
];

/// How a burst lays a history's messages over six partitions.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Keyed by lease, as the contract asks: one lease, one partition.
    Keyed,
    /// No key, round robin: one lease's events over all six partitions,
    /// read in any interleaving.
    RoundRobin,
    /// Keyed, but one partition's messages are produced only once the
    /// others have been read, every partition has idled and the wall clock
    /// has moved the watermark past the whole history.
    OnePartitionLate,
}

/// The partition of a lease when keyed (the same one every time).
fn lease_partition(line: &str) -> i32 {
    let v: Value = serde_json::from_str(line).unwrap();
    let lease = v["lease_id"].as_str().unwrap();
    (lease.bytes().map(u32::from).sum::<u32>() % 6) as i32
}

/// A simulated history with every fault switch on: its file and lines.
fn faulty_history(dir: &Path) -> (std::path::PathBuf, Vec<String>) {
    let history = dir.join("history.ndjson");
    let out = leaseline()
        .args([
            "simulate",
            "--start",
            "2026-09-14T10:00:00Z",
            "--events",
            "8000",
            "--leases",
            "16",
            "--crash",
            "0.05",
            "--pause",
            "0.05",
            "--double-grant",
            "0.05",
            "--late-fence",
            "0.05",
            "--output",
        ])
        .arg(&history)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = std::fs::read_to_string(&history)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (history, lines)
}

/// A config with `alerts` settings and one webhook receiver.
fn webhook_config(dir: &Path, name: &str, alerts: &str, webhook: &HttpSink) -> std::path::PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!(
            "[alerts]\n{alerts}\n\
             [[alerts.receivers]]\ntype = \"webhook\"\nname = \"hook\"\nurl = \"{}/hook\"\n",
            webhook.url
        ),
    )
    .unwrap();
    cfg
}

/// `lease_alerts`' firing rows of the alerts a history proves by its events
/// alone, as (key, starts_at), sorted.
fn firing_rows(lake: &Path) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = sql(
        lake,
        "SELECT alertname, lease_id, holder_id, kind, starts_at FROM lease_alerts \
         WHERE state = 'firing' AND alertname IN \
         ('LeaseForcedExpiry', 'LeaseStaleWriteRejected', 'LeaseSafetyViolation')",
        "ndjson",
    )
    .lines()
    .map(|l| {
        let v: Value = serde_json::from_str(l).unwrap();
        (alert_key(&v), v["starts_at"].as_str().unwrap().to_string())
    })
    .collect();
    rows.sort();
    rows
}

/// What `check FILE` records for `history`: its firing rows, as
/// [`firing_rows`] gives them. Each of the event alerts is among them.
fn checked_firing(dir: &Path, cfg: &Path, history: &Path) -> Vec<(String, String)> {
    let checked = dir.join("checked");
    let out = leaseline()
        .args(["check", "--config"])
        .arg(cfg)
        .arg("--lake")
        .arg(&checked)
        .arg(history)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = firing_rows(&checked);
    for name in EVENT_ALERTS {
        assert!(
            rows.iter().any(|(k, _)| k.starts_with(name)),
            "the history holds a {name}: {rows:?}"
        );
    }
    rows
}

/// The event alerts a webhook was sent as firing, and as resolved, by key.
fn webhook_alerts(
    webhook: &HttpSink,
) -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
) {
    let mut firing = std::collections::BTreeSet::new();
    let mut resolved = std::collections::BTreeSet::new();
    for r in webhook.requests() {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        for a in body["alerts"].as_array().unwrap() {
            let name = a["labels"]["alertname"].as_str().unwrap_or("");
            if !EVENT_ALERTS.contains(&name) {
                continue;
            }
            match a["status"].as_str() {
                Some("firing") => firing.insert(alert_key(&a["labels"])),
                _ => resolved.insert(alert_key(&a["labels"])),
            };
        }
    }
    (firing, resolved)
}

/// The alert keys of `lease_alerts` rows as [`firing_rows`] gives them.
fn keys(rows: &[(String, String)]) -> std::collections::BTreeSet<String> {
    rows.iter().map(|(k, _)| k.clone()).collect()
}

/// Each line with the partition its lease is keyed to.
fn keyed(lines: &[String]) -> Vec<(i32, String)> {
    lines
        .iter()
        .map(|l| (lease_partition(l), l.clone()))
        .collect()
}

/// Produces each line to its partition, one message at a time.
async fn produce_to(producer: &rdkafka::producer::FutureProducer, msgs: &[(i32, String)]) {
    for (p, line) in msgs {
        let rec = rdkafka::producer::FutureRecord::<(), [u8]>::to("leases")
            .partition(*p)
            .payload(line.as_bytes());
        producer
            .send(rec, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

/// Waits until every alert in `expected` went out as firing and every
/// alert sent as firing was resolved (once the input is read and every
/// partition idles, the engine has seen it all); then nothing false may
/// have been sent.
fn assert_settled(
    webhook: &HttpSink,
    expected: &std::collections::BTreeSet<String>,
    server: &Server,
) {
    let settled = wait_until(Duration::from_secs(90), || {
        let (firing, resolved) = webhook_alerts(webhook);
        firing.is_superset(expected) && firing.is_subset(&resolved)
    });
    let (firing, resolved) = webhook_alerts(webhook);
    let missing: Vec<_> = expected.difference(&firing).collect();
    let false_pages: Vec<_> = firing.difference(expected).collect();
    assert!(
        settled,
        "alerts never settled: {} of {} sent as firing; missing {missing:?}; false {false_pages:?}; not resolved {:?}\n{}",
        firing.len(),
        expected.len(),
        firing.difference(&resolved).collect::<Vec<_>>(),
        server.proc.logs()
    );
    assert!(false_pages.is_empty(), "false: {false_pages:?}");
}

/// The audit's tables as `serve --ingest` answers them over HTTP are those
/// `leaseline sql` computes by auditing the lake itself, row for row. Returns
/// the process's `leaseline_query_audit_reads_total` counts: (answered by
/// the alert engine's auditor, by auditing the lake).
fn served_audit_is_the_lakes(server: &Server, lake: &Path) -> (u64, u64) {
    let queries = [
        "SELECT lease_id, fencing_token, holder_id, acquired_at, ended_at, end_kind, renewals, \
         renew_failures, writes_accepted, stale_writes_rejected, valid_until FROM lease_timeline \
         ORDER BY lease_id, fencing_token",
        "SELECT kind, lease_id, fencing_token, holder_id, at, other_fencing_token, detail \
         FROM lease_violations ORDER BY kind, lease_id, fencing_token, at, other_fencing_token",
        "SELECT lease_id, holder_id, fencing_token, valid, ended_at FROM lease_holders ORDER BY lease_id",
    ];
    let rows = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    for q in queries {
        let served = server.sql(q, &["-H", "Accept: application/x-ndjson"]);
        assert_eq!(served.status, 200, "{q}: {}", served.text());
        let served = rows(&served.text());
        let audited = rows(&sql_auditing_all(lake, q, "ndjson"));
        assert!(!audited.is_empty(), "{q}: the history has rows");
        assert_eq!(served, audited, "{q}");
        // Another process reading the lake, from its stored audit rows
        // when there are any.
        assert_eq!(rows(&sql(lake, q, "ndjson")), audited, "leaseline sql: {q}");
    }
    let metrics = server.get("/metrics").text();
    let count = |from: &str| -> u64 {
        let prefix = format!("leaseline_query_audit_reads_total{{from=\"{from}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}in\n{metrics}"))
            .parse()
            .unwrap()
    };
    (count("alert_engine"), count("lake"))
}

/// A history with every fault, produced in one burst laid out as `layout`
/// says. The alerts sent as firing are exactly those `check FILE` finds;
/// none is missing and none is false.
async fn a_burst_alerts_exactly_what_check_finds(layout: Layout) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (history, lines) = faulty_history(dir.path());
    let webhook = HttpSink::start();
    let cfg = webhook_config(
        dir.path(),
        "leaseline.toml",
        "lateness = \"5s\"\npartition_idle_timeout = \"2s\"",
        &webhook,
    );
    let expected = keys(&checked_firing(dir.path(), &cfg, &history));

    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 6).await;
    let producer = broker.producer();
    let partition = |i: usize, line: &str| match layout {
        Layout::RoundRobin => (i % 6) as i32,
        Layout::Keyed | Layout::OnePartitionLate => lease_partition(line),
    };
    let late = |p: i32| layout == Layout::OnePartitionLate && p == 5;
    let msgs_where = |keep: &dyn Fn(i32) -> bool| -> Vec<(i32, String)> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| (partition(i, l), l.clone()))
            .filter(|(p, _)| keep(*p))
            .collect()
    };
    produce_to(&producer, &msgs_where(&|p| !late(p))).await;
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    if layout == Layout::OnePartitionLate {
        let later = msgs_where(&late);
        assert!(!later.is_empty(), "partition 5 holds leases");
        // Read, idle, and the wall clock past the history: an alert of the
        // early partitions has been resolved.
        assert!(
            wait_until(Duration::from_secs(90), || {
                !webhook_alerts(&webhook).1.is_empty()
            }),
            "the early partitions never settled:\n{}",
            server.proc.logs()
        );
        produce_to(&producer, &later).await;
    }

    assert_settled(&webhook, &expected, &server);
    // Unkeyed, every lease came from several partitions and was counted
    // once; keyed, none.
    let metrics = server.get("/metrics").text();
    let several = metrics
        .lines()
        .find(|l| l.starts_with("leaseline_leases_on_several_partitions_total"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let leases = if layout == Layout::RoundRobin { 16 } else { 0 };
    assert!(several.ends_with(&format!(" {leases}")), "{several}");
    // One process reads every partition: its alert engine's auditor holds
    // the whole lake, and SQL's derived tables come from it, the same as
    // an audit of the lake's files.
    let (from_engine, from_lake) = served_audit_is_the_lakes(&server, &dir.path().join("lake"));
    assert_eq!(
        (from_engine, from_lake),
        (3, 0),
        "each query once, from the engine"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_keyed_by_lease_alerts_exactly_what_check_finds() {
    a_burst_alerts_exactly_what_check_finds(Layout::Keyed).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unkeyed_burst_over_six_partitions_alerts_exactly_what_check_finds() {
    a_burst_alerts_exactly_what_check_finds(Layout::RoundRobin).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_produced_after_the_others_settled_alerts_exactly_what_check_finds() {
    a_burst_alerts_exactly_what_check_finds(Layout::OnePartitionLate).await;
}

/// `serve --ingest` SIGKILLed three times while alerts wait for the
/// watermark, each time after the lake committed another third of a faulty
/// history: the restarted process rebuilds what it had from the lake. Every
/// alert `check FILE` finds reaches the webhook as firing, nothing false
/// does, and `lease_alerts` holds exactly `check`'s firing rows: one per
/// alert, none lost with a killed process and none written twice.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_while_alerts_are_pending_loses_none_and_records_each_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (history, lines) = faulty_history(dir.path());
    let webhook = HttpSink::start();
    // A minute of lateness and an idle timeout no run reaches: the alerts of
    // each third's last minute are pending when the process is killed.
    let pending = webhook_config(
        dir.path(),
        "pending.toml",
        "lateness = \"60s\"\npartition_idle_timeout = \"1h\"",
        &webhook,
    );
    let settling = webhook_config(
        dir.path(),
        "settling.toml",
        "lateness = \"60s\"\npartition_idle_timeout = \"2s\"",
        &webhook,
    );
    let expected_rows = checked_firing(dir.path(), &settling, &history);
    let expected = keys(&expected_rows);

    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 6).await;
    let producer = broker.producer();
    let lake = dir.path().join("lake");
    let msgs = keyed(&lines);
    let mut produced = 0;
    for (n, third) in msgs.chunks(msgs.len().div_ceil(3)).enumerate() {
        produce_to(&producer, third).await;
        produced += third.len();
        // A fresh group each time: tansu keeps a SIGKILLed member's
        // partitions (a restart in the same group was once given none for
        // 90 s, even with a 6 s session), and where ingest resumes and what
        // the engine rebuilds come from the lake, which is what this tests.
        let mut server = serve_in_group(dir.path(), &broker, &pending, &format!("crashy-{n}"));
        let committed = || committed_events(&lake);
        assert!(
            wait_until(Duration::from_secs(90), || committed() == Some(produced)),
            "the lake never held {produced} events:\n{}",
            server.proc.logs()
        );
        // Killed whatever the engine and the history writer are doing.
        server.proc.kill9();
    }
    // Something was still pending at the last kill: an alert of the
    // history's last minute that nobody had been sent.
    let (firing, _) = webhook_alerts(&webhook);
    assert!(
        !firing.is_superset(&expected),
        "nothing was pending when the process was killed"
    );

    // The last start settles: every partition idles and the wall clock
    // moves the watermark past the history.
    let mut server = serve_in_group(dir.path(), &broker, &settling, "crashy-last");
    assert_settled(&webhook, &expected, &server);
    assert!(server.proc.terminate(Duration::from_secs(30)).success());
    let recorded = firing_rows(&lake);
    let doubled: Vec<_> = recorded
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| &w[0])
        .collect();
    assert!(doubled.is_empty(), "recorded twice: {doubled:?}");
    assert_eq!(
        recorded, expected_rows,
        "lease_alerts' firing rows are check's, one each"
    );
}

/// Two `serve --ingest` in one consumer group split a faulty history's six
/// partitions; one is stopped while the second half is being read, and the
/// other takes its partitions over. Each alert reaches the webhooks as
/// firing from one process only, every alert `check FILE` finds arrives,
/// and `lease_alerts` holds exactly `check`'s firing rows.
#[tokio::test(flavor = "multi_thread")]
async fn two_ingesters_in_a_group_alert_each_lease_once_across_a_takeover() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (history, lines) = faulty_history(dir.path());
    // While the history is read no partition idles: the wall clock, far
    // past the history's time, must not move the watermark between the
    // halves. The last start settles with a short idle timeout.
    let reading = "lateness = \"5s\"\npartition_idle_timeout = \"1h\"";
    let settling = "lateness = \"5s\"\npartition_idle_timeout = \"2s\"";
    let (hook_a, hook_b) = (HttpSink::start(), HttpSink::start());
    let cfg_a = webhook_config(dir.path(), "a.toml", reading, &hook_a);
    let cfg_b = webhook_config(dir.path(), "b.toml", reading, &hook_b);
    let cfg_last = webhook_config(dir.path(), "last.toml", settling, &hook_a);
    let expected_rows = checked_firing(dir.path(), &cfg_last, &history);
    let expected = keys(&expected_rows);

    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 6).await;
    let producer = broker.producer();
    let lake = dir.path().join("lake");
    let msgs = keyed(&lines);
    let (first, second) = msgs.split_at(msgs.len() / 2);
    let mut a = serve_with_ingest(dir.path(), &broker, &cfg_a);
    let mut b = serve_with_ingest(dir.path(), &broker, &cfg_b);
    // Split: each one's latest assignment is its own half of the six
    // partitions. Both may join one generation, or the first may hold all
    // six until the second joins.
    let latest = |s: &Server| -> Option<std::collections::BTreeSet<u32>> {
        let logs = s.proc.logs();
        let line = logs
            .lines()
            .rev()
            .find(|l| l.contains("assigned partitions="))?;
        let list = line.split("assigned partitions=").nth(1)?;
        Some(
            list.split("(\"leases\", ")
                .skip(1)
                .filter_map(|p| p.split(')').next()?.trim().parse().ok())
                .collect(),
        )
    };
    assert!(
        wait_until(Duration::from_secs(60), || {
            match (latest(&a), latest(&b)) {
                (Some(pa), Some(pb)) => {
                    !pa.is_empty()
                        && !pb.is_empty()
                        && pa.is_disjoint(&pb)
                        && pa.union(&pb).copied().eq(0..6)
                }
                _ => false,
            }
        }),
        "the group never split:\n{}\n{}",
        a.proc.logs(),
        b.proc.logs()
    );
    let committed = || committed_events(&lake);
    produce_to(&producer, first).await;
    assert!(
        wait_until(Duration::from_secs(90), || committed() == Some(first.len())),
        "the first half never landed:\n{}\n{}",
        a.proc.logs(),
        b.proc.logs()
    );
    // Each ingester's engine holds only its partitions' events: SQL still
    // answers for the whole lake, by auditing it.
    for s in [&a, &b] {
        let (_, from_lake) = served_audit_is_the_lakes(s, &lake);
        assert_eq!(from_lake, 3, "{}", s.proc.logs());
    }
    // One ingester stops while the second half is being read; the other
    // takes its partitions over.
    produce_to(&producer, second).await;
    assert!(
        b.proc.terminate(Duration::from_secs(60)).success(),
        "{}",
        b.proc.logs()
    );
    assert!(
        wait_until(Duration::from_secs(90), || committed() == Some(msgs.len())),
        "the second half never landed:\n{}",
        a.proc.logs()
    );
    assert!(
        a.proc.terminate(Duration::from_secs(60)).success(),
        "{}",
        a.proc.logs()
    );
    let mut last = serve_with_ingest(dir.path(), &broker, &cfg_last);

    // Settled: every alert went out as firing and was resolved, from one
    // process or the other.
    let both = || {
        let (fa, ra) = webhook_alerts(&hook_a);
        let (fb, rb) = webhook_alerts(&hook_b);
        (&fa | &fb, &ra | &rb)
    };
    let settled = wait_until(Duration::from_secs(90), || {
        let (firing, resolved) = both();
        firing.is_superset(&expected) && firing.is_subset(&resolved)
    });
    let (firing, _) = both();
    assert!(
        settled,
        "missing {:?}, false {:?}\n{}",
        expected.difference(&firing).collect::<Vec<_>>(),
        firing.difference(&expected).collect::<Vec<_>>(),
        last.proc.logs()
    );
    assert_eq!(firing, expected, "nothing false");
    // One alert is a key and a start: a lease's forced expiries of one
    // holder are several alerts. Each went out as firing from one
    // ingester only, and both ingesters alerted.
    let instances = |hook: &HttpSink| -> std::collections::BTreeSet<String> {
        hook.requests()
            .iter()
            .flat_map(|r| {
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                body["alerts"].as_array().unwrap().clone()
            })
            .filter(|a| {
                a["status"] == "firing"
                    && EVENT_ALERTS.contains(&a["labels"]["alertname"].as_str().unwrap_or(""))
            })
            .map(|a| format!("{}@{}", alert_key(&a["labels"]), a["startsAt"]))
            .collect()
    };
    let (from_a, from_b) = (instances(&hook_a), instances(&hook_b));
    assert!(!from_b.is_empty(), "the stopped ingester alerted nothing");
    let twice: Vec<_> = from_a.intersection(&from_b).collect();
    assert!(twice.is_empty(), "sent as firing by both: {twice:?}");
    assert!(last.proc.terminate(Duration::from_secs(60)).success());
    assert_eq!(
        firing_rows(&lake),
        expected_rows,
        "lease_alerts' firing rows are check's, one each"
    );
}

/// One history three ways: `simulate --realtime` into Kafka as `serve
/// --ingest` reads it, the same history produced in one burst, and
/// `import --notify` of its file. Each sends the webhook the same alerts as
/// firing: those `check FILE` finds.
#[tokio::test(flavor = "multi_thread")]
async fn realtime_burst_and_import_send_the_same_alerts() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // About a minute of a small fleet with faults at high rates, so that
    // the real-time run is short and still holds every kind of alert.
    let sim: &[&str] = &[
        "--seed",
        "7",
        "--events",
        "600",
        "--leases",
        "4",
        "--crash",
        "0.2",
        "--pause",
        "0.2",
        "--double-grant",
        "0.2",
    ];
    let history = dir.path().join("history.ndjson");
    run_ok(
        leaseline()
            .arg("simulate")
            .args(sim)
            .args(["--start", "2026-09-14T10:00:00Z", "--output"])
            .arg(&history),
    );
    let lines: Vec<String> = std::fs::read_to_string(&history)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // Short resolve windows: the real-time run's alerts resolve by the
    // wall clock, which is how the test knows the engine has seen it all.
    let settings = "lateness = \"5s\"\npartition_idle_timeout = \"2s\"\n\
        [alerts.rules.forced_expiry]\nwindow = \"4s\"\n\
        [alerts.rules.stale_write_rejected]\nwindow = \"4s\"\n\
        [alerts.rules.safety_violation]\nresolve_after = \"6s\"";
    let hooks: Vec<HttpSink> = (0..3).map(|_| HttpSink::start()).collect();
    let cfgs: Vec<std::path::PathBuf> = ["realtime", "burst", "import"]
        .iter()
        .zip(&hooks)
        .map(|(name, hook)| webhook_config(dir.path(), &format!("{name}.toml"), settings, hook))
        .collect();
    let expected = keys(&checked_firing(dir.path(), &cfgs[2], &history));

    // Real time and burst side by side, each with its broker and server.
    let (rt_dir, burst_dir) = (dir.path().join("realtime"), dir.path().join("burst"));
    std::fs::create_dir_all(&rt_dir).unwrap();
    std::fs::create_dir_all(&burst_dir).unwrap();
    let rt_broker = Broker::start(&rt_dir);
    rt_broker.create_topic("leases", 6).await;
    let burst_broker = Broker::start(&burst_dir);
    burst_broker.create_topic("leases", 6).await;
    let rt_server = serve_with_ingest(&rt_dir, &rt_broker, &cfgs[0]);
    let mut realtime = Proc::spawn(
        "simulate-realtime",
        {
            let mut cmd = leaseline();
            cmd.arg("simulate")
                .args(sim)
                .args(["--start", "now", "--realtime", "--brokers"])
                .arg(&rt_broker.addr)
                .args(["--topic", "leases"]);
            cmd
        },
        &rt_dir,
    );
    let msgs: Vec<(i32, String)> = lines
        .iter()
        .map(|l| (lease_partition(l), l.clone()))
        .collect();
    produce_to(&burst_broker.producer(), &msgs).await;
    let burst_server = serve_with_ingest(&burst_dir, &burst_broker, &cfgs[1]);
    assert_settled(&hooks[1], &expected, &burst_server);

    let import_lake = dir.path().join("imported");
    let out = leaseline()
        .args(["import", "--notify", "--config"])
        .arg(&cfgs[2])
        .arg("--lake")
        .arg(&import_lake)
        .arg(&history)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(webhook_alerts(&hooks[2]).0, expected, "import --notify");

    let status = realtime.wait(Duration::from_secs(300));
    assert!(status.success(), "{}", realtime.logs());
    assert_settled(&hooks[0], &expected, &rt_server);
}

#[tokio::test(flavor = "multi_thread")]
async fn alertmanager_behind_tls_and_basic_auth_gets_alerts_with_static_labels() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 1).await;
    let pki = Pki::new(dir.path(), "private");
    let password = "am-pass-7f3c9e";
    let am = Alertmanager::start_secured(dir.path(), &pki, "leaseline", password);
    let right = dir.path().join("am-password");
    std::fs::write(&right, format!("{password}\n")).unwrap();
    let wrong = dir.path().join("am-wrong-password");
    let wrong_password = "not-the-pass-41d8";
    std::fs::write(&wrong, wrong_password).unwrap();
    // A CA that did not sign Alertmanager's certificate.
    let other = Pki::new(dir.path(), "other");

    // Three receivers at the one Alertmanager: right, with a wrong
    // password, and trusting the wrong CA. The first must not be held up
    // by the other two.
    let cfg = config(dir.path(), &[]);
    let mut text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("window = \"4s\"", "window = \"10m\"");
    for (name, password_file, ca) in [
        ("am", &right, &pki.ca),
        ("am-wrong-password", &wrong, &pki.ca),
        ("am-untrusted", &right, &other.ca),
    ] {
        text.push_str(&format!(
            r#"
[[alerts.receivers]]
type = "alertmanager"
name = "{name}"
url = "{url}"
labels = {{ cluster = "eu-1", env = "test" }}
basic_auth = {{ username = "leaseline", password_file = "{password_file}" }}
tls = {{ ca_file = "{ca}" }}
"#,
            url = am.url,
            password_file = password_file.display(),
            ca = ca.display(),
        ));
    }
    std::fs::write(&cfg, text).unwrap();
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    produce_forced_expiry(&broker, "orders/private", "w-5", 4).await;

    let mut seen = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            seen = am.named("LeaseForcedExpiry");
            !seen.is_empty()
        }),
        "the alert never reached Alertmanager:\n{}",
        server.proc.logs()
    );
    let alert = &seen[0];
    assert_eq!(label(alert, "lease_id"), "orders/private");
    assert_eq!(label(alert, "cluster"), "eu-1", "{alert:#}");
    assert_eq!(label(alert, "env"), "test", "{alert:#}");

    // The two broken receivers fail, are counted and say why; the server
    // goes on.
    let failures = "leaseline_alert_delivery_failures_total";
    let mut page = String::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            page = server.get("/metrics").text();
            metric(
                &page,
                &format!("{failures}{{receiver=\"am-wrong-password\"}}"),
            ) >= 1.0
                && metric(&page, &format!("{failures}{{receiver=\"am-untrusted\"}}")) >= 1.0
        }),
        "{page}"
    );
    assert!(
        metric(&page, "leaseline_alert_deliveries_total{receiver=\"am\"}") >= 1.0,
        "{page}"
    );
    assert_eq!(
        metric(&page, &format!("{failures}{{receiver=\"am\"}}")),
        0.0,
        "{page}"
    );
    let logs = server.proc.logs();
    let line = |receiver: &str| {
        logs.lines()
            .find(|l| l.contains(&format!("receiver={receiver} ")))
            .unwrap_or_else(|| panic!("no log line of {receiver}:\n{logs}"))
            .to_string()
    };
    let refused = line("am-wrong-password");
    assert!(
        refused.contains("alert delivery refused") && refused.contains("401"),
        "{refused}"
    );
    assert!(refused.contains("basic_auth"), "{refused}");
    let untrusted = line("am-untrusted");
    assert!(
        untrusted.contains("alert delivery failed")
            && untrusted.contains("invalid peer certificate"),
        "{untrusted}"
    );
    assert_eq!(server.get("/health").status, 200);
    for secret in [password, wrong_password] {
        assert!(!logs.contains(secret), "a password in the log:\n{logs}");
        assert!(!page.contains(secret), "a password on /metrics");
    }
}

#[test]
fn a_webhook_over_mutual_tls_gets_the_bearer_token_and_the_labels() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "private");
    let token = "hook-token-5b2e81";
    let sink = HttpsSink::start(dir.path(), &pki, token);
    let token_file = dir.path().join("hook-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let (cert, key) = pki.issue("leaseline-client");
    let cfg = dir.path().join("leaseline.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[[alerts.receivers]]
type = "webhook"
name = "bridge"
url = "{url}/hook"
labels = {{ cluster = "eu-1", env = "test" }}
bearer_token_file = "{token_file}"
[alerts.receivers.tls]
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
"#,
            url = sink.url,
            token_file = token_file.display(),
            ca = pki.ca.display(),
            cert = cert.display(),
            key = key.display(),
        ),
    )
    .unwrap();
    // Replaying a forced expiry that happened just now: its alert is still
    // firing when the replay ends, and --notify sends it.
    let t = now_ms();
    let events = dir.path().join("events.ndjson");
    let lines: Vec<String> = [
        acquired(t - 2_000, "pay/acct-1", "b-1", 7),
        event(json!({"ts": t, "kind": "expired", "source": "coordinator",
            "lease_id": "pay/acct-1", "holder_id": "b-1", "fencing_token": 7, "backend": "etcd"})),
    ]
    .into_iter()
    .map(|(_, v)| String::from_utf8(v).unwrap())
    .collect();
    std::fs::write(&events, lines.join("\n") + "\n").unwrap();
    let out = leaseline()
        .args(["check", "--notify", "--config"])
        .arg(&cfg)
        .arg(&events)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(stderr.contains("LeaseForcedExpiry"), "{stderr}");
    assert!(
        !stderr.contains(token),
        "the token in the output:\n{stderr}"
    );

    let requests = sink.requests();
    let hook = requests
        .iter()
        .find(|r| r.path == "/hook")
        .unwrap_or_else(|| panic!("requests: {requests:?}\n{stderr}"));
    assert_eq!(
        hook.authorization.as_deref(),
        Some(&*format!("Bearer {token}"))
    );
    assert_eq!(hook.client.as_deref(), Some("leaseline-client"));
    let body: Value = serde_json::from_str(&hook.body).unwrap();
    let alert = &body["alerts"][0];
    assert_eq!(alert["labels"]["alertname"], "LeaseForcedExpiry");
    assert_eq!(alert["labels"]["lease_id"], "pay/acct-1");
    assert_eq!(alert["labels"]["cluster"], "eu-1");
    assert_eq!(alert["labels"]["env"], "test");
}

/// `serve --ingest` keeps ten minutes of event time behind its watermark
/// as the audit's events (`audit.event_window`, the default). Two events
/// arrive forty minutes late, after the grants they concern were settled:
/// one makes an overlap (its alert fires), one is the release that proves
/// an overlap was none (the alert that overlap raised resolves). Each
/// lease is audited again from the lake once, and the audit tables the
/// process answers from its engine are those of an audit of the whole
/// lake. The settled rows are stored in the lake, once each, across a
/// SIGKILL and restart.
#[tokio::test(flavor = "multi_thread")]
async fn events_later_than_the_audit_window_are_audited_again_alerted_and_stored() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 1).await;
    let cfg = config(dir.path(), &[]);
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    let producer = broker.producer();
    let t0 = now_ms() - 3_600_000;
    let mut history = vec![
        // made-1: token 1 [0 s, 5 s), token 5 from 20 s; token 2 will
        // arrive late, acquired at 3 s: an overlap.
        acquired(t0, "made-1", "a", 1),
        released(t0 + 5_000, "made-1", "a", 1),
        acquired(t0 + 20_000, "made-1", "c", 5),
        released(t0 + 25_000, "made-1", "c", 5),
        // unmade-1: token 2 acquired at 6 s while token 1 (10 s TTL) still
        // holds: an overlap, until token 1's release at 4 s arrives late.
        acquired(t0, "unmade-1", "a", 1),
        acquired(t0 + 6_000, "unmade-1", "b", 2),
        released(t0 + 9_000, "unmade-1", "b", 2),
        acquired(t0 + 30_000, "unmade-1", "c", 5),
        released(t0 + 35_000, "unmade-1", "c", 5),
    ];
    // Forty minutes of another lease move event time on.
    history.extend(filler(t0, 40));
    produce(&producer, "leases", &history).await;

    // The overlap of unmade-1 alerts; then the audit settles past both
    // leases' grants (a cutoff a minute after they began is past them).
    let past = chrono::DateTime::from_timestamp_millis(t0 + 60_000)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let settled_past = |log: &str| {
        log.lines()
            .filter(|l| l.contains("settled the audit"))
            .filter_map(|l| l.split("before=").nth(1))
            .any(|b| {
                b.split_whitespace()
                    .next()
                    .is_some_and(|b| b > past.as_str())
            })
    };
    let firing = |log: &str, lease: &str| {
        log.lines()
            .filter(|l| l.contains("ALERT FIRING") && l.contains("LeaseSafetyViolation"))
            .any(|l| l.contains(&format!("lease_id={lease},")))
    };
    assert!(
        wait_until(Duration::from_secs(60), || {
            let log = server.proc.logs();
            firing(&log, "unmade-1") && settled_past(&log)
        }),
        "{}",
        server.proc.logs()
    );
    assert!(!firing(&server.proc.logs(), "made-1"));

    produce(
        &producer,
        "leases",
        &[
            acquired(t0 + 3_000, "made-1", "b", 2),
            released(t0 + 4_000, "unmade-1", "a", 1),
        ],
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(60), || {
            let log = server.proc.logs();
            firing(&log, "made-1")
                && log.lines().any(|l| {
                    l.contains("alert resolved")
                        && l.contains("LeaseSafetyViolation")
                        && l.contains("lease_id=unmade-1,")
                })
        }),
        "{}",
        server.proc.logs()
    );
    let log = server.proc.logs();
    for lease in ["made-1", "unmade-1"] {
        let reaudits = log
            .lines()
            .filter(|l| l.contains("audited again from the lake"))
            .filter(|l| l.contains(&format!("lease_id={lease} ")))
            .count();
        assert_eq!(reaudits, 1, "{lease}:\n{log}");
    }
    let lake = dir.path().join("lake");
    assert_eq!(
        server
            .sql(
                "SELECT lease_id, kind, fencing_token, other_fencing_token FROM lease_violations",
                &["-H", "Accept: text/csv"]
            )
            .text(),
        "lease_id,kind,fencing_token,other_fencing_token\nmade-1,overlapping_ownership,2,1\n"
    );
    let (engine, _) = served_audit_is_the_lakes(&server, &lake);
    assert!(engine >= 3, "the engine answered the audit's tables");

    // The settled rows are in the lake's stored tables, which other
    // engines read. The late events voided the stored rows of made-1 and
    // unmade-1 (the files holding them were rewritten without them), and
    // once the watermark moved on they were settled and stored again:
    // every grant but each lease's newest (which stays in memory), and
    // made-1's overlap.
    let restored = |log: &str| {
        log.split_once("voided=2").is_some_and(|(_, after)| {
            after
                .lines()
                .any(|l| l.contains("stored the audit's settled rows") && !l.contains("grants=0"))
        })
    };
    assert!(
        wait_until(Duration::from_secs(60), || restored(&server.proc.logs())),
        "{}",
        server.proc.logs()
    );
    let all = ["filler", "made-1", "unmade-1"];
    assert_eq!(stored_rows_are_answered_once(&lake, "lease_timeline"), all);
    assert_eq!(
        stored_rows_are_answered_once(&lake, "lease_violations"),
        ["made-1"]
    );
    served_audit_is_the_lakes(&server, &lake);
    // Once every late event is accounted for by the stored rows, another
    // process's SQL answers from them (and agrees with the whole audit,
    // above).
    assert!(sql_reads_stored_rows(&lake));

    // A restart replays the history up to where the stored rows answer
    // for, takes each lease's stored rows as settled, and settles on: no
    // row is stored twice, and what the process answers is still the
    // lake's audit.
    let mut server = server;
    server.proc.kill9();
    let server = serve_in_group(dir.path(), &broker, &cfg, "restarted");
    let resumed_then_settled = |log: &str| {
        log.split_once("as settled topic=leases partition=0 leases=3")
            .is_some_and(|(_, after)| after.contains("settled the audit"))
    };
    assert!(
        wait_until(Duration::from_secs(60), || resumed_then_settled(
            &server.proc.logs()
        )),
        "{}",
        server.proc.logs()
    );
    assert_eq!(stored_rows_are_answered_once(&lake, "lease_timeline"), all);
    assert_eq!(
        stored_rows_are_answered_once(&lake, "lease_violations"),
        ["made-1"]
    );
    let (engine, _) = served_audit_is_the_lakes(&server, &lake);
    assert!(
        engine >= 3,
        "the restarted engine answered the audit's tables"
    );
    assert!(sql_reads_stored_rows(&lake));
}

/// What a lease's later grants are judged against reaches back across its
/// stored rows: the highest token before the cut (a later lower token is
/// a regression) and the highest token a resource accepted before it (a
/// later lower one is a stale write). Another process answers the audit's
/// tables from the stored rows and that context, and agrees with an audit
/// of every event; an event before a lease's cut that the stored rows do
/// not account for (imported from a file) makes it audit every event
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn another_process_answers_from_the_stored_rows_and_their_context() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 2).await;
    let cfg = config(dir.path(), &[]);
    let server = serve_with_ingest(dir.path(), &broker, &cfg);
    let producer = broker.producer();
    let t0 = now_ms() - 3 * 3_600_000;
    let later = t0 + 40 * 60_000;
    let write = |ts: i64, lease: &str, token: u64| {
        event(
            json!({"ts": ts, "kind": "write_accepted", "source": "resource",
            "lease_id": lease, "holder_id": "db", "fencing_token": token}),
        )
    };
    let mut history = vec![
        acquired(t0, "regress-1", "a", 10),
        released(t0 + 1_000, "regress-1", "a", 10),
        acquired(later, "regress-1", "b", 3),
        released(later + 1_000, "regress-1", "b", 3),
        acquired(t0, "write-1", "a", 7),
        write(t0 + 500, "write-1", 7),
        released(t0 + 1_000, "write-1", "a", 7),
        acquired(later, "write-1", "b", 8),
        write(later + 500, "write-1", 5),
        released(later + 1_000, "write-1", "b", 8),
    ];
    // An hour of another lease moves event time past the settle cutoff.
    history.extend(filler(t0, 60));
    produce(&producer, "leases", &history).await;

    let lake = dir.path().join("lake");
    // The audit settles past the later grants' starts, then stores.
    let past = chrono::DateTime::from_timestamp_millis(later + 60_000)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let stored_past = |log: &str| {
        log.lines()
            .skip_while(|l| {
                !l.contains("settled the audit")
                    || l.split("before=")
                        .nth(1)
                        .and_then(|b| b.split_whitespace().next())
                        .is_none_or(|b| b <= past.as_str())
            })
            .any(|l| l.contains("stored the audit's settled rows"))
    };
    assert!(
        wait_until(Duration::from_secs(60), || stored_past(&server.proc.logs())),
        "{}",
        server.proc.logs()
    );
    assert_eq!(
        stored_rows_are_answered_once(&lake, "lease_timeline"),
        ["filler", "regress-1", "write-1"]
    );
    assert!(sql_reads_stored_rows(&lake));
    let q = "SELECT lease_id, kind, fencing_token, other_fencing_token FROM lease_violations \
             ORDER BY lease_id, kind, fencing_token";
    let expected = "lease_id,kind,fencing_token,other_fencing_token\n\
                    regress-1,token_regression,3,10\n\
                    write-1,stale_write_accepted,5,7\n";
    assert_eq!(sql_auditing_all(&lake, q, "csv"), expected);
    assert_eq!(sql(&lake, q, "csv"), expected);
    // Each of those violations is judged against the context: none is
    // stored (each is at or after its lease's cut).
    assert_eq!(
        stored_rows_are_answered_once(&lake, "lease_violations"),
        Vec::<String>::new()
    );
    served_audit_is_the_lakes(&server, &lake);

    // A late event from a file: its lease's stored rows do not account
    // for it, so the reader audits every event, and the overlap it makes
    // is answered.
    let mut server = server;
    server.proc.kill9();
    let late = dir.path().join("late.jsonl");
    std::fs::write(
        &late,
        format!(
            "{}\n",
            json!({"ts": t0 + 500, "kind": "acquired", "source": "coordinator",
                "lease_id": "regress-1", "holder_id": "c", "fencing_token": 11,
                "ttl_ms": 10_000, "backend": "etcd"})
        ),
    )
    .unwrap();
    import_files(&lake, &[late]);
    assert!(!sql_reads_stored_rows(&lake));
    let with_late = sql_auditing_all(&lake, q, "csv");
    assert!(
        with_late.contains("regress-1,overlapping_ownership,11,10\n"),
        "{with_late}"
    );
    assert_eq!(sql(&lake, q, "csv"), with_late);
}
