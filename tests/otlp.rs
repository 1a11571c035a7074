//! OpenTelemetry log records in: the Python SDK's OTLP/HTTP exporter
//! against `serve --otlp-logs`, and Kafka messages in the Collector's
//! `otlp_proto` and `otlp_json` encodings against `ingest --encoding`, and
//! leaseline-emit's own OTLP sink.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/otel/lease_logs.py")
}

fn python(args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "lease_logs.py {args:?} failed (scripts/test.sh installs the OpenTelemetry SDK):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// `count(*)` of a table, or none while the lake has no commit yet.
fn try_count(lake: &Path, table: &str) -> Option<usize> {
    let out = leaseline()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(lake)
        .arg(format!("SELECT count(*) FROM {table}"))
        .output()
        .unwrap();
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Rows of a query as CSV lines, header dropped, sorted.
fn rows(lake: &Path, query: &str) -> Vec<String> {
    let mut v: Vec<String> = sql(lake, query, "csv")
        .lines()
        .skip(1)
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn sdk_log_records_land_once_across_a_retried_export() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let server = Server::start(&lake, &["--otlp-logs", "--no-pg"], dir.path());
    let report = python(&["send", &format!("{}/v1/logs", server.http), "orders/o-1"]);

    // The batch reached leaseline twice, and the SDK's export succeeded.
    assert_eq!(
        report["attempts"],
        serde_json::json!([200, 200]),
        "{report}"
    );
    assert_eq!(
        report["results"],
        serde_json::json!(["SUCCESS"]),
        "{report}"
    );

    let trace = report["trace_id"].as_str().unwrap();
    let span = report["span_id"].as_str().unwrap();
    assert_eq!(
        rows(
            &lake,
            "SELECT kind, source, lease_id, holder_id, fencing_token, ttl_ms, backend, trace_id, \
             span_id, attrs LIKE '%\"service.name\":\"billing\"%' FROM lease_events"
        ),
        vec![
            format!("acquired,holder,orders/o-1,pod-1,7,10000,etcd,{trace},{span},true"),
            format!("released,holder,orders/o-1,pod-1,7,,etcd,{trace},{span},true"),
            format!("renewed,holder,orders/o-1,pod-1,7,10000,etcd,{trace},{span},true"),
        ]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT count(DISTINCT event_id), min(event_id LIKE 'otlp-%') FROM lease_events"
        ),
        vec!["3,true"]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT lease_id, fencing_token, holder_id, end_kind, renewals FROM lease_timeline"
        ),
        vec!["orders/o-1,7,pod-1,released,1"]
    );
    // The record without a lease id, once, where it came from.
    assert_eq!(
        rows(
            &lake,
            "SELECT reason, file_path LIKE 'otlp-http/%', file_line, \
             CAST(raw AS VARCHAR) LIKE '%\"fencing_token\":7%' FROM lease_rejects"
        ),
        vec!["missing_field:lease_id,true,4,true"]
    );
    let metrics = server.get("/metrics").text();
    assert!(
        metrics.contains("leaseline_ingest_rejects_total 1"),
        "{metrics}"
    );
}

#[test]
fn the_emit_crates_otlp_sink_lands_a_holders_events_once() {
    use leaseline_emit::{Emitter, Kind, OtlpConfig, OtlpSink, Sink, Source};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let server = Server::start(&lake, &["--otlp-logs", "--no-pg"], dir.path());
    let sink = Arc::new(
        OtlpSink::with_config(OtlpConfig {
            service_name: Some("billing".into()),
            ..OtlpConfig::new(&server.http)
        })
        .unwrap(),
    );
    let holder = Emitter::new(Source::Holder, sink.clone())
        .holder_id("pod-9")
        .backend("etcd");
    let resource = Emitter::new(Source::Resource, sink.clone());
    let sent = leaseline_emit::mono_ms();
    holder
        .event(Kind::Acquired, "orders/o-9")
        .fencing_token(11)
        .ttl_ms(10_000)
        .keepalive_sent_mono_ms(sent)
        .send()
        .unwrap();
    for _ in 0..2 {
        holder
            .event(Kind::Renewed, "orders/o-9")
            .fencing_token(11)
            .ttl_ms(10_000)
            .keepalive_sent_mono_ms(leaseline_emit::mono_ms())
            .send()
            .unwrap();
    }
    resource
        .event(Kind::WriteAccepted, "orders/o-9")
        .holder_id("pod-9")
        .fencing_token(11)
        .send()
        .unwrap();
    holder
        .event(Kind::Released, "orders/o-9")
        .fencing_token(11)
        .send()
        .unwrap();
    sink.flush(Duration::from_secs(60)).unwrap();
    assert_eq!((sink.delivered(), sink.refused()), (5, 0));

    // The emitter's own ids, not ids derived from the records.
    assert_eq!(
        rows(
            &lake,
            "SELECT count(*), count(DISTINCT event_id), max(event_id LIKE 'otlp-%'), \
             min(attrs LIKE '%\"service.name\":\"billing\"%') FROM lease_events"
        ),
        vec!["5,5,false,true"]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT kind, source, holder_id, fencing_token, mono_ms IS NOT NULL FROM lease_events"
        ),
        vec![
            "acquired,holder,pod-9,11,true",
            "released,holder,pod-9,11,true",
            "renewed,holder,pod-9,11,true",
            "renewed,holder,pod-9,11,true",
            "write_accepted,resource,pod-9,11,false",
        ]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT holder_id, fencing_token, end_kind, renewals, writes_accepted FROM lease_timeline"
        ),
        vec!["pod-9,11,released,2,1"]
    );
    assert_eq!(try_count(&lake, "lease_rejects"), Some(0));
}

#[test]
fn what_is_not_otlp_is_refused_with_a_reason_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let server = Server::start(&lake, &["--otlp-logs", "--no-pg"], dir.path());
    let url = format!("{}/v1/logs", server.http);
    let post = |ct: &str, body: &str| {
        curl(&[
            "-X",
            "POST",
            "-H",
            &format!("Content-Type: {ct}"),
            "--data-binary",
            body,
            &url,
        ])
    };

    let r = post("application/x-protobuf", "this is not protobuf");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.content_type, "application/x-protobuf");
    let r = post("application/json", r#"{"resourceLogs": 5}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["code"], 3, "{}", r.text());
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid_otlp: "),
        "{}",
        r.text()
    );
    // Sent again, as a client that did not hear the answer would: kept once.
    let r = post("application/json", r#"{"resourceLogs": 5}"#);
    assert_eq!(r.status, 400);
    let r = post("text/plain", "hello");
    assert_eq!(r.status, 415, "{}", r.text());

    // One good record and one with a string TTL: a partial success.
    let body = r#"{"resourceLogs":[{"resource":{"attributes":[
        {"key":"lease.source","value":{"stringValue":"coordinator"}}]},
      "scopeLogs":[{"logRecords":[
        {"timeUnixNano":"1757844000000000000","attributes":[
          {"key":"lease.kind","value":{"stringValue":"acquired"}},
          {"key":"lease.id","value":{"stringValue":"jobs/1"}},
          {"key":"lease.holder_id","value":{"stringValue":"w-1"}},
          {"key":"lease.fencing_token","value":{"intValue":"3"}},
          {"key":"lease.ttl_ms","value":{"intValue":"5000"}}]},
        {"timeUnixNano":"1757844001000000000","attributes":[
          {"key":"lease.kind","value":{"stringValue":"renewed"}},
          {"key":"lease.id","value":{"stringValue":"jobs/1"}},
          {"key":"lease.holder_id","value":{"stringValue":"w-1"}},
          {"key":"lease.fencing_token","value":{"intValue":"3"}},
          {"key":"lease.ttl_ms","value":{"stringValue":"5s"}}]}]}]}]}"#;
    let r = post("application/json", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let partial = &r.json()["partialSuccess"];
    assert_eq!(
        partial["rejectedLogRecords"].to_string().trim_matches('"'),
        "1",
        "{}",
        r.text()
    );
    assert!(
        partial["errorMessage"]
            .as_str()
            .unwrap()
            .contains("record 2: wrong_type:ttl_ms"),
        "{}",
        r.text()
    );

    assert_eq!(
        rows(&lake, "SELECT reason, file_line FROM lease_rejects"),
        vec!["invalid_otlp,0", "invalid_otlp,0", "wrong_type:ttl_ms,2",]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT lease_id, fencing_token, holder_id, ttl_ms FROM lease_timeline"
        ),
        vec!["jobs/1,3,w-1,5000"]
    );
}

fn ingest_cmd(broker: &Broker, lake: &Path, topic: &str, group: &str, encoding: &str) -> Command {
    let mut cmd = ingest_command(broker, lake, topic, group);
    cmd.args(["--encoding", encoding, "--flush-interval", "200ms"])
        .env("LEASELINE_LOG", "info");
    cmd
}

/// Runs an ingester until `done` holds, then stops it cleanly.
fn ingest_until(name: &str, cmd: Command, dir: &Path, done: impl FnMut() -> bool) {
    let mut p = Proc::spawn(name, cmd, dir);
    assert!(
        wait_until(Duration::from_secs(120), done),
        "{name} did not get there:\n{}",
        p.logs()
    );
    assert!(
        p.terminate(Duration::from_secs(30)).success(),
        "{}",
        p.logs()
    );
}

/// OTLP/JSON as the Collector's Kafka exporter writes it (`otlp_json`):
/// camelCase names, hex ids, 64-bit integers as strings.
const COLLECTOR_JSON: &str = r#"{"resourceLogs":[{"resource":{"attributes":[
  {"key":"service.name","value":{"stringValue":"lock-service"}},
  {"key":"lease.source","value":{"stringValue":"coordinator"}},
  {"key":"lease.backend","value":{"stringValue":"zookeeper"}}]},
 "scopeLogs":[{"scope":{"name":"locks"},"logRecords":[
  {"timeUnixNano":"1757844000000000000","observedTimeUnixNano":"1757844000000100000",
   "traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
   "attributes":[{"key":"lease.kind","value":{"stringValue":"acquired"}},
    {"key":"lease.id","value":{"stringValue":"jobs/batch-9"}},
    {"key":"lease.holder_id","value":{"stringValue":"w-2"}},
    {"key":"lease.fencing_token","value":{"intValue":"40"}},
    {"key":"lease.ttl_ms","value":{"intValue":"3000"}}]},
  {"timeUnixNano":"1757844003000000000","observedTimeUnixNano":"1757844003000100000",
   "attributes":[{"key":"lease.kind","value":{"stringValue":"expired"}},
    {"key":"lease.id","value":{"stringValue":"jobs/batch-9"}},
    {"key":"lease.holder_id","value":{"stringValue":"w-2"}},
    {"key":"lease.fencing_token","value":{"intValue":"40"}}]}]}]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_encodings_on_kafka_land_once_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let broker = Broker::start(dir.path());
    broker.create_topic("otlp-proto", 1).await;
    broker.create_topic("otlp-json", 1).await;
    let pb = dir.path().join("export.pb");
    let ids = python(&["encode", pb.to_str().unwrap(), "orders/o-2"]);
    let producer = broker.producer();
    let proto_landed = produce(
        &producer,
        "otlp-proto",
        &[
            ("orders/o-2".into(), std::fs::read(&pb).unwrap()),
            ("x".into(), b"{\"kind\":\"acquired\"}".to_vec()),
        ],
    )
    .await;
    produce(
        &producer,
        "otlp-json",
        &[("jobs/batch-9".into(), COLLECTOR_JSON.as_bytes().to_vec())],
    )
    .await;

    let caught_up = || {
        try_count(&lake, "lease_events") == Some(3) && try_count(&lake, "lease_rejects") == Some(2)
    };
    ingest_until(
        "ingest-proto",
        ingest_cmd(&broker, &lake, "otlp-proto", "g1", "otlp_proto"),
        dir.path(),
        caught_up,
    );
    let caught_up = || try_count(&lake, "lease_events") == Some(5);
    ingest_until(
        "ingest-json",
        ingest_cmd(&broker, &lake, "otlp-json", "g2", "otlp_json"),
        dir.path(),
        caught_up,
    );
    let trace = ids["trace_id"].as_str().unwrap();
    assert_eq!(
        rows(
            &lake,
            "SELECT kind, source, lease_id, holder_id, fencing_token, backend, trace_id, \
             kafka_topic, kafka_offset, file_line FROM lease_events"
        ),
        vec![
            format!("acquired,coordinator,jobs/batch-9,w-2,40,zookeeper,5b8efff798038103d269b633813fc60c,otlp-json,0,1"),
            format!("acquired,holder,orders/o-2,pod-1,7,etcd,{trace},otlp-proto,{},1", proto_landed[0].offset),
            format!("expired,coordinator,jobs/batch-9,w-2,40,zookeeper,,otlp-json,0,2"),
            format!("released,holder,orders/o-2,pod-1,7,etcd,{trace},otlp-proto,{},3", proto_landed[0].offset),
            format!("renewed,holder,orders/o-2,pod-1,7,etcd,{trace},otlp-proto,{},2", proto_landed[0].offset),
        ]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT reason, kafka_topic, kafka_offset, file_line FROM lease_rejects"
        ),
        vec![
            format!("invalid_otlp,otlp-proto,{},", proto_landed[1].offset),
            format!(
                "missing_field:lease_id,otlp-proto,{},4",
                proto_landed[0].offset
            ),
        ]
    );
    assert_eq!(
        rows(
            &lake,
            "SELECT lease_id, fencing_token, holder_id, end_kind FROM lease_timeline"
        ),
        vec!["jobs/batch-9,40,w-2,expired", "orders/o-2,7,pod-1,released"]
    );
}
