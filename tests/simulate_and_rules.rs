//! The simulator's ground truth against the audit, alerts recorded from
//! imported history, the shipped Prometheus rules under promtool, and
//! OpenTelemetry export to an OTLP receiver.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;

fn simulate(dir: &Path, name: &str, args: &[&str]) -> (std::path::PathBuf, BTreeSet<String>) {
    let events = dir.join(format!("{name}.ndjson"));
    let truth = dir.join(format!("{name}.truth.ndjson"));
    run_ok(
        leaseline()
            .args(["simulate", "--start", "2026-09-14T10:00:00Z", "--output"])
            .arg(&events)
            .arg("--truth")
            .arg(&truth)
            .args(args),
    );
    let truth = std::fs::read_to_string(&truth)
        .unwrap()
        .lines()
        .map(|l| violation_key(&serde_json::from_str(l).unwrap()))
        .collect();
    (events, truth)
}

fn check(events: &Path) -> (i32, BTreeSet<String>) {
    let out = leaseline()
        .args(["check", "--format", "ndjson"])
        .arg(events)
        .output()
        .unwrap();
    let found = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // The violations, not the summary line.
        .filter(|v| v["lease_id"].is_string() && v["kind"].is_string())
        .map(|v| violation_key(&v))
        .collect();
    (out.status.code().unwrap(), found)
}

#[test]
fn the_audit_finds_exactly_the_violations_each_fault_injects() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("crash", &["--crash", "0.05"][..]),
        ("pause", &["--pause", "0.05"][..]),
        ("unchecked", &["--pause", "0.05", "--unchecked-storage"][..]),
        ("double", &["--double-grant", "0.05"][..]),
        ("reuse", &["--token-reuse", "0.1"][..]),
        ("late", &["--late-fence", "0.05"][..]),
        ("blips", &["--blip", "0.05"][..]),
        ("partition", &["--partition", "0.05"][..]),
        ("skew", &["--clock-skew", "200ms"][..]),
    ] {
        let mut all = vec!["--events", "20000", "--leases", "40"];
        all.extend_from_slice(args);
        let (events, truth) = simulate(dir.path(), name, &all);
        let (code, found) = check(&events);
        assert_eq!(found, truth, "{name}: the audit against the ground truth");
        assert_eq!(code, if truth.is_empty() { 0 } else { 1 }, "{name}");
        if ["unchecked", "double", "reuse", "late"].contains(&name) {
            assert!(!truth.is_empty(), "{name} injected violations");
        }
    }
}

#[test]
fn a_fault_free_simulation_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (events, truth) = simulate(
        dir.path(),
        "clean",
        &["--events", "200000", "--leases", "500"],
    );
    assert!(truth.is_empty());
    let (code, found) = check(&events);
    assert_eq!((code, found.len()), (0, 0), "{found:?}");
}

#[test]
fn import_records_the_alerts_history_would_have_raised_without_notifying() {
    let dir = tempfile::tempdir().unwrap();
    let (events, _) = simulate(
        dir.path(),
        "paused",
        &[
            "--events",
            "5000",
            "--leases",
            "20",
            "--pause",
            "0.1",
            "--double-grant",
            "0.05",
        ],
    );
    let lake = dir.path().join("lake");
    let stdout = import_with(&lake, &[&events], &[]);
    assert!(stdout.contains("alerts would have fired"), "{stdout}");
    assert!(stdout.contains("nobody notified"), "{stdout}");
    let sql = |q: &str| {
        let out = run_ok(
            leaseline()
                .args(["sql", "--lake"])
                .arg(&lake)
                .args([q, "--format", "csv"]),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let names = sql(
        "SELECT DISTINCT alertname FROM lease_alerts WHERE state = 'firing' AND NOT notified ORDER BY alertname",
    );
    for name in [
        "LeaseForcedExpiry",
        "LeaseSafetyViolation",
        "LeaseStaleWriteRejected",
    ] {
        assert!(names.contains(name), "{names}");
    }
    // Each forced expiry alert is about an expired grant in the timeline.
    let orphans = sql(
        "SELECT count(*) AS n FROM lease_alerts a WHERE a.alertname = 'LeaseForcedExpiry' \
         AND NOT EXISTS (SELECT 1 FROM lease_timeline t WHERE t.lease_id = a.lease_id AND t.end_kind = 'expired')",
    );
    assert_eq!(orphans.lines().nth(1), Some("0"), "{orphans}");

    // `check` of the same file replays the rules too, and records them in
    // the lake it is given.
    let checked = dir.path().join("checked");
    let out = leaseline()
        .args(["check", "--lake"])
        .arg(&checked)
        .arg(&events)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "violations: {stderr}");
    assert!(
        stderr.contains("alerts that would have fired (recorded in lease_alerts; nobody notified)"),
        "{stderr}"
    );
    assert!(stderr.contains("LeaseForcedExpiry"), "{stderr}");
    let out = leaseline()
        .args(["sql", "--lake"])
        .arg(&checked)
        .args([
            "SELECT count(*) AS n FROM lease_alerts WHERE alertname = 'LeaseSafetyViolation'",
            "--format",
            "csv",
        ])
        .output()
        .unwrap();
    let n: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(n > 0);

    // `check` of a lake replays its rules and lists what would fire.
    let out = leaseline()
        .args(["check", "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("alerts that would have fired (nobody notified"),
        "{stderr}"
    );
}

#[test]
fn shipped_prometheus_rules_pass_promtool_check_and_unit_tests() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../alerts/prometheus");
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    for args in [
        vec!["check", "rules", "leaseline-rules.yml"],
        vec!["test", "rules", "leaseline-rules.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(&args)
            .current_dir(&rules)
            .output()
            .unwrap_or_else(|e| panic!("running {promtool} (scripts/test.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert the built-in engine raises has a Prometheus rule.
    let text = std::fs::read_to_string(rules.join("leaseline-rules.yml")).unwrap();
    for name in [
        "LeaseAcquisitionLatencyHigh",
        "LeaseRenewalFailuresHigh",
        "LeaseForcedExpiry",
        "LeaseStaleWriteRejected",
        "LeaseTokenChurn",
        "LeaseSafetyViolation",
    ] {
        assert!(text.contains(&format!("alert: {name}")), "{name}");
    }
}

#[test]
fn otlp_export_reaches_a_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = HttpSink::start();
    let (events, _) = simulate(dir.path(), "otlp", &["--events", "2000", "--leases", "10"]);
    let lake = dir.path().join("lake");

    // Traces: the import's flush spans, sent when the command exits.
    run_ok(
        leaseline()
            .args(["import", "--lake"])
            .arg(&lake)
            .arg(&events)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
    );
    let traces: Vec<Received> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/traces")
        .collect();
    assert!(!traces.is_empty(), "no traces: {:?}", receiver.requests());
    assert_eq!(traces[0].method, "POST");
    assert_eq!(traces[0].content_type, "application/x-protobuf");
    assert!(
        traces.iter().any(|t| contains(&t.body, b"lake.flush")),
        "the flush span is in the export"
    );

    // Metrics: `serve` exports its counters every `metrics_interval`.
    let cfg = dir.path().join("otel.toml");
    std::fs::write(
        &cfg,
        format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval = \"1s\"\n",
            receiver.url
        ),
    )
    .unwrap();
    let server = Server::start(
        &lake,
        &["--no-pg", "--config", cfg.to_str().unwrap()],
        dir.path(),
    );
    assert!(
        wait_until(std::time::Duration::from_secs(20), || receiver
            .requests()
            .iter()
            .any(
                |r| r.path == "/v1/metrics" && contains(&r.body, b"lease.renewals")
            )),
        "no metrics export: {:?}\n{}",
        receiver
            .requests()
            .iter()
            .map(|r| &r.path)
            .collect::<Vec<_>>(),
        server.proc.logs()
    );
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn demo_serves_sql_within_30s_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let (mut demo, http, _) = start_demo(dir.path(), &["--leases", "20", "--events", "20000"]);
    let mut events = 0;
    let served = wait_until(std::time::Duration::from_secs(30), || {
        let r = curl(&[
            "-X",
            "POST",
            "--data-binary",
            "SELECT count(*) AS n FROM lease_events",
            "-H",
            "Accept: application/json",
            &format!("http://{http}/api/v1/sql"),
        ]);
        events = if r.status == 200 {
            r.json()[0]["n"].as_u64().unwrap_or(0)
        } else {
            0
        };
        events > 0
    });
    assert!(served, "no simulated events served:\n{}", demo.logs());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "SQL served {:?} after start",
        started.elapsed()
    );
    let logs = demo.logs();
    assert!(
        logs.contains("psql \"host=127.0.0.1"),
        "the banner says how to connect:\n{logs}"
    );
    assert!(logs.contains("lease_violations"), "{logs}");
    demo.signal(libc::SIGINT);
    let status = demo.wait(std::time::Duration::from_secs(30));
    assert!(
        status.success(),
        "exit after SIGINT: {status:?}\n{}",
        demo.logs()
    );
    assert!(
        demo.logs().contains("everything flushed"),
        "{}",
        demo.logs()
    );
}

#[test]
fn every_incident_query_in_the_docs_runs() {
    let dir = tempfile::tempdir().unwrap();
    // Recent history (the queries look at the last hour) with faults.
    let events = dir.path().join("incident.ndjson");
    run_ok(
        leaseline()
            .args([
                "simulate", "--events", "8000", "--leases", "12", "--pause", "0.1",
            ])
            .args(["--double-grant", "0.05", "--crash", "0.05", "--output"])
            .arg(&events),
    );
    let lake = dir.path().join("lake");
    import_with(&lake, &[&events], &[]);

    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/incident-queries.md"),
    )
    .unwrap();
    let queries: Vec<&str> = doc
        .split("```sql")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().trim())
        .collect();
    assert!(queries.len() >= 10, "{}", queries.len());
    let mut with_rows = 0;
    for q in &queries {
        let out = leaseline()
            .args(["sql", "--lake"])
            .arg(&lake)
            .args([*q, "--format", "csv"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "query failed:\n{q}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if String::from_utf8_lossy(&out.stdout).lines().count() > 1 {
            with_rows += 1;
        }
    }
    // All but the rejects and trace queries have something to show here.
    assert!(
        with_rows >= queries.len() - 2,
        "{with_rows} of {} returned rows",
        queries.len()
    );
}

/// The paused holder of the contract: worker-1 stalls past its lease, it
/// expires, worker-2 takes over with token 34 and writes, and worker-1's
/// late write with token 33 is rejected.
const PAUSED_HOLDER: &str = r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"backend":"etcd","event_id":"c-0001"}
{"ts":"2026-09-14T10:00:03.300Z","kind":"renewed","source":"holder","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"latency_ms":4.2,"mono_ms":3300.0,"keepalive_sent_mono_ms":3295.8}
{"ts":"2026-09-14T10:00:13.300Z","kind":"expired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33}
{"ts":"2026-09-14T10:00:13.500Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:14.000Z","kind":"write_accepted","source":"resource","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34}
{"ts":"2026-09-14T10:00:18.000Z","kind":"stale_write_rejected","source":"resource","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"max_token":34}
"#;

#[test]
fn the_paused_holder_timeline_picture_shows_both_grants_the_expiry_and_the_rejected_write() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("paused.ndjson");
    std::fs::write(&events, PAUSED_HOLDER).unwrap();
    let lake = dir.path().join("lake");
    import_with(&lake, &[&events], &[]);
    let svg_path = dir.path().join("timeline.svg");
    run_ok(
        leaseline()
            .args(["timeline", "--lake"])
            .arg(&lake)
            .args(["orders/order-123", "--svg"])
            .arg(&svg_path),
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    for needle in [
        "worker-1 · token 33",
        "worker-2 · token 34",
        "expired at 10:00:13.300",
        // The marker's words, not the legend's "expired" swatch.
        "fill=\"#c0392b\">expired</text>",
        "stale_write_rejected at 10:00:18.000 by worker-1, token 33",
        "fill=\"#c0392b\">stale write rejected</text>",
        "write_accepted at 10:00:14.000 by worker-2, token 34",
    ] {
        assert!(svg.contains(needle), "the picture lacks {needle:?}:\n{svg}");
    }
    // The grant bars: worker-1's ended expired (red), worker-2's is open.
    assert!(
        svg.contains("grant 33 to worker-1: 10:00:00.000 → 10:00:13.300 (expired)"),
        "{svg}"
    );
    assert!(svg.contains("fill=\"#d64541\""), "{svg}");
    // Well-formed XML, as a browser needs it.
    let check = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
        ])
        .arg(&svg_path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    // The HTTP API draws the same picture.
    let server = Server::start(&lake, &["--no-pg"], dir.path());
    let reply = server.get("/api/v1/leases/orders%2Forder-123/timeline.svg");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply.content_type.starts_with("image/svg+xml"),
        "{}",
        reply.content_type
    );
    assert_eq!(reply.text(), svg);
}

/// Expands Grafana's macros and variables in a panel's SQL the way its
/// PostgreSQL data source does for a time range and a chosen lease.
fn expand_sql(sql: &str, from: &str, to: &str, lease: &str) -> String {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(i) = rest.find("$__timeFilter(") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "$__timeFilter(".len()..];
        let end = after.find(')').unwrap();
        let col = &after[..end];
        out.push_str(&format!("{col} BETWEEN '{from}' AND '{to}'"));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out.replace("${lease}", lease).replace("$lease", lease)
}

/// `leaseline demo` on free ports: the process, the HTTP address and the
/// PostgreSQL port, once both listen.
fn start_demo(dir: &Path, args: &[&str]) -> (Proc, String, u16) {
    let mut cmd = leaseline();
    cmd.args(["demo", "--lake"])
        .arg(dir.join("demo-lake"))
        .args(["--http-listen", "127.0.0.1:0", "--pg-listen", "127.0.0.1:0"])
        .args(args)
        .env("LEASELINE_LOG", "info");
    let demo = Proc::spawn("demo", cmd, dir);
    let find = |marker: &str| -> Option<String> {
        let logs = demo.logs();
        let i = logs.find(marker)?;
        Some(
            logs[i + marker.len()..]
                .chars()
                .take_while(|c| !c.is_whitespace())
                .collect(),
        )
    };
    let (http_marker, pg_marker) = ("HTTP API listening on http://", "PostgreSQL listening on ");
    assert!(
        wait_until(std::time::Duration::from_secs(30), || find(pg_marker)
            .is_some()
            && find(http_marker).is_some()),
        "{}",
        demo.logs()
    );
    let http = find(http_marker).unwrap();
    let pg = find(pg_marker)
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (demo, http, pg)
}

/// psql to the demo's PostgreSQL port, with `args` and one command.
fn psql(port: u16, args: &[&str], sql: &str) -> std::process::Output {
    Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "leaseline",
            "-d",
            "leaseline",
        ])
        .args(["-X", "-v", "ON_ERROR_STOP=1"])
        .args(args)
        .args(["-c", sql])
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql (scripts/test.sh installs postgresql-client)")
}

fn psql_columns(port: u16, sql: &str) -> (Vec<String>, usize) {
    let out = psql(port, &["-A", "-F", "\t", "-P", "footer=off"], sql);
    assert!(
        out.status.success(),
        "psql failed on\n{sql}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header = lines
        .next()
        .unwrap_or_default()
        .split('\t')
        .map(str::to_string)
        .collect();
    (header, lines.count())
}

#[test]
fn every_dashboard_panel_query_runs_against_a_live_serve_fed_by_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, http, pg) = start_demo(
        dir.path(),
        &[
            "--leases", "60", "--events", "50000", "--pause", "0.1", "--crash", "0.05",
        ],
    );
    assert!(
        wait_until(std::time::Duration::from_secs(60), || {
            let (_, rows) = psql_columns(pg, "SELECT lease_id FROM lease_events LIMIT 2000");
            rows >= 2000
        }),
        "the simulator fed too little:\n{}",
        demo.logs()
    );
    let prometheus = Prometheus::start(dir.path(), &http);
    std::thread::sleep(std::time::Duration::from_secs(4));

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let rfc = |s: i64| {
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{s}"), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (from, to) = (rfc(now - 3600), rfc(now + 3600));
    let dashboards = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut panels_checked = 0;
    for name in [
        "fleet-overview",
        "lease-ownership",
        "incident-drilldown",
        "leaseline-health",
    ] {
        let text = std::fs::read_to_string(dashboards.join(format!("{name}.json"))).unwrap();
        let d: serde_json::Value = serde_json::from_str(&text).unwrap();
        // What Grafana requires of a dashboard model.
        for key in [
            "uid",
            "title",
            "schemaVersion",
            "panels",
            "time",
            "templating",
        ] {
            assert!(!d[key].is_null(), "{name} lacks {key}");
        }
        // The lease variable, resolved as Grafana would: its query's first value.
        let mut lease = String::new();
        for v in d["templating"]["list"].as_array().unwrap() {
            let q = v["query"].as_str().unwrap();
            let out = psql(pg, &["-A", "-t"], q);
            assert!(
                out.status.success(),
                "{q}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            lease = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            assert!(!lease.is_empty(), "variable {} has values", v["name"]);
        }
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            let ptype = p["type"].as_str().unwrap();
            assert!(p["gridPos"]["w"].as_u64().unwrap() > 0, "{title}");
            let ds = p["datasource"]["uid"].as_str().unwrap();
            for t in p["targets"].as_array().unwrap() {
                panels_checked += 1;
                match ds {
                    "leaseline-sql" => {
                        let sql = expand_sql(t["rawSql"].as_str().unwrap(), &from, &to, &lease);
                        let (cols, _rows) = psql_columns(pg, &sql);
                        match ptype {
                            "timeseries" | "state-timeline" => {
                                assert_eq!(cols[0], "time", "{name}/{title}: {cols:?}");
                                assert!(cols.len() >= 2, "{name}/{title}: {cols:?}");
                            }
                            "table" => assert!(!cols.is_empty(), "{name}/{title}"),
                            other => panic!("{name}/{title}: unexpected panel type {other}"),
                        }
                    }
                    "leaseline-prom" => {
                        let expr = t["expr"]
                            .as_str()
                            .unwrap()
                            .replace("$__rate_interval", "1m");
                        let reply = curl(&[
                            "-G",
                            "--data-urlencode",
                            &format!("query={expr}"),
                            &format!("{}/api/v1/query", prometheus.url),
                        ]);
                        assert_eq!(reply.status, 200, "{name}/{title}: {}", reply.text());
                        assert_eq!(reply.json()["status"], "success", "{name}/{title}");
                        assert_eq!(
                            reply.json()["data"]["resultType"],
                            "vector",
                            "{name}/{title}"
                        );
                    }
                    other => panic!("{name}/{title}: unknown data source {other}"),
                }
            }
        }
    }
    assert!(panels_checked >= 20, "{panels_checked}");
    // The fleet dashboard's grants panel has data from the simulator.
    let (_, rows) = psql_columns(
        pg,
        &expand_sql(
            "SELECT date_bin(INTERVAL '1 minute', acquired_at) AS time, count(*) AS grants FROM lease_timeline WHERE $__timeFilter(acquired_at) GROUP BY 1",
            &from,
            &to,
            "",
        ),
    );
    assert!(rows >= 1);
}
