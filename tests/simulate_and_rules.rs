//! The simulator's ground truth against the audit, alerts recorded from
//! imported history, the shipped Prometheus rules under promtool, and
//! OpenTelemetry export to an OTLP receiver.

mod common;

use std::collections::{BTreeMap, BTreeSet};
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

/// Expands a panel's or a variable's SQL the way Grafana does for a time
/// range and variable values: variables first (in the browser), where
/// `${name:sqlstring}` doubles single quotes and wraps the value in single
/// quotes and a bare `${name}` or `$name` is the raw value, then the
/// PostgreSQL data source's macros (on the server), with the range as
/// RFC 3339 in UTC. An unknown macro or format fails the test, as it would
/// fail the panel.
fn expand_sql(sql: &str, from: &str, to: &str, vars: &[(&str, &str)]) -> String {
    let value = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let ident_len = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut out = String::new();
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("unclosed ${");
            let (name, format) = match braced[..end].split_once(':') {
                Some((n, f)) => (n, Some(f)),
                None => (&braced[..end], None),
            };
            let v = value(name).unwrap_or_else(|| panic!("no value for variable {name}"));
            match format {
                None => out.push_str(v),
                Some("sqlstring") => out.push_str(&format!("'{}'", v.replace('\'', "''"))),
                Some(other) => panic!("format {other} of ${{{name}}} is not expanded here"),
            }
            rest = &braced[end + 1..];
        } else {
            let n = ident_len(after);
            match value(&after[..n]) {
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[i..i + 1 + n]),
            }
            rest = &after[n..];
        }
    }
    out.push_str(rest);

    let sql = out;
    let mut out = String::new();
    let mut rest = sql.as_str();
    while let Some(i) = rest.find("$__") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let open = after.find('(').expect("a macro takes parentheses");
        let close = open + after[open..].find(')').unwrap();
        let arg = after[open + 1..close].trim();
        out.push_str(&match &after[..open] {
            "__timeFilter" => format!("{arg} BETWEEN '{from}' AND '{to}'"),
            "__timeFrom" => format!("'{from}'"),
            "__timeTo" => format!("'{to}'"),
            other => panic!("macro ${other} is not expanded here"),
        });
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
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

/// A query's column names and rows, through psql.
fn psql_table(port: u16, sql: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let out = psql(port, &["-A", "-F", "\t", "-P", "footer=off"], sql);
    assert!(
        out.status.success(),
        "psql failed on\n{sql}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let split = |l: &str| l.split('\t').map(str::to_string).collect::<Vec<_>>();
    let header = lines.next().map(split).unwrap_or_default();
    (header, lines.map(split).collect())
}

fn psql_columns(port: u16, sql: &str) -> (Vec<String>, usize) {
    let (header, rows) = psql_table(port, sql);
    (header, rows.len())
}

fn dashboards() -> Vec<(String, serde_json::Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let d = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            found.push((name, d));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [
            "fleet-overview",
            "incident-drilldown",
            "lease-ownership",
            "leaseline-health"
        ]
    );
    found
}

/// Microseconds since the epoch of an RFC 3339 time or of a timestamp as
/// psql prints it.
fn micros(t: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t)
        .or_else(|_| chrono::DateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .unwrap_or_else(|e| panic!("{t:?}: {e}"))
        .timestamp_micros()
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// Values of a dashboard's template variables, resolved as Grafana does:
/// a textbox is its default, a query variable its query's first value (the
/// query expanded with the variables before it); data source variables
/// only pick the data source.
fn resolve_variables(
    d: &serde_json::Value,
    pg: u16,
    from: &str,
    to: &str,
) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for v in d["templating"]["list"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "datasource" => {}
            "textbox" => vars.push((name, v["query"].as_str().unwrap().to_string())),
            "query" => {
                let refs: Vec<(&str, &str)> =
                    vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                let q = expand_sql(v["query"].as_str().unwrap(), from, to, &refs);
                let (_, rows) = psql_table(pg, &q);
                let first = rows.first().map(|r| r[0].clone()).unwrap_or_default();
                assert!(!first.is_empty(), "variable {name} has values: {q}");
                vars.push((name, first));
            }
            other => panic!("variable {name}: unexpected type {other}"),
        }
    }
    vars
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
    assert!(
        wait_until(std::time::Duration::from_secs(30), || !prometheus
            .query("leaseline_ingest_events_total")
            .is_empty()),
        "Prometheus never scraped leaseline:\n{}",
        prometheus.proc.logs()
    );

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let hour = 3_600_000_000;
    let (from, to) = (rfc3339(now - hour), rfc3339(now + hour));
    let mut panels_checked = 0;
    for (name, d) in dashboards() {
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
        let vars = resolve_variables(&d, pg, &from, &to);
        let vars: Vec<(&str, &str)> = vars.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            let ptype = p["type"].as_str().unwrap();
            assert!(p["gridPos"]["w"].as_u64().unwrap() > 0, "{title}");
            for t in p["targets"].as_array().unwrap() {
                panels_checked += 1;
                match t["datasource"]["type"].as_str().unwrap() {
                    "grafana-postgresql-datasource" => {
                        let sql = expand_sql(t["rawSql"].as_str().unwrap(), &from, &to, &vars);
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
                    "prometheus" => {
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
            &[],
        ),
    );
    assert!(rows >= 1);
}

/// A faulty coordinator's double grant of `shards/00030`: token 383 goes to
/// worker-b at 10:00:08 while worker-a holds 382 (released at 10:00:12),
/// and 385 to worker-d at 10:00:31 while worker-c holds 384. Token 381 ended
/// before the dashboards' range (10:00:10 to 10:00:36); 382 and 383 were
/// acquired before it and still valid at its start; worker-q's one-hour
/// grant of `tenant/o'hara` spans it. `shards/00099` has events only before
/// the range, `shards/00100` one exactly at its end, `shards/00101` one
/// just after.
const DOUBLE_GRANT: &str = r#"{"ts":"2026-09-14T09:58:00.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00099","holder_id":"worker-y","fencing_token":1,"ttl_ms":1000}
{"ts":"2026-09-14T09:58:01.000Z","kind":"expired","source":"coordinator","lease_id":"shards/00099","holder_id":"worker-y","fencing_token":1}
{"ts":"2026-09-14T09:59:00.000Z","kind":"acquired","source":"coordinator","lease_id":"tenant/o'hara","holder_id":"worker-q","fencing_token":7,"ttl_ms":3600000}
{"ts":"2026-09-14T09:59:50.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-z","fencing_token":381,"ttl_ms":5000}
{"ts":"2026-09-14T09:59:54.000Z","kind":"released","source":"holder","lease_id":"shards/00030","holder_id":"worker-z","fencing_token":381}
{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-a","fencing_token":382,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:05.000Z","kind":"renewed","source":"holder","lease_id":"shards/00030","holder_id":"worker-a","fencing_token":382,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:08.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-b","fencing_token":383,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:12.000Z","kind":"released","source":"holder","lease_id":"shards/00030","holder_id":"worker-a","fencing_token":382}
{"ts":"2026-09-14T10:00:14.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/o'brien's","holder_id":"worker-1","fencing_token":1,"ttl_ms":2000}
{"ts":"2026-09-14T10:00:16.000Z","kind":"expired","source":"coordinator","lease_id":"orders/o'brien's","holder_id":"worker-1","fencing_token":1}
{"ts":"2026-09-14T10:00:18.000Z","kind":"expired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-b","fencing_token":383}
{"ts":"2026-09-14T10:00:20.000Z","kind":"write_accepted","source":"resource","lease_id":"tenant/o'hara","holder_id":"worker-q","fencing_token":7}
{"ts":"2026-09-14T10:00:25.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-c","fencing_token":384,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:30.000Z","kind":"renewed","source":"holder","lease_id":"shards/00030","holder_id":"worker-c","fencing_token":384,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:31.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00030","holder_id":"worker-d","fencing_token":385,"ttl_ms":10000}
{"ts":"2026-09-14T10:00:33.500Z","kind":"released","source":"holder","lease_id":"shards/00030","holder_id":"worker-d","fencing_token":385}
{"ts":"2026-09-14T10:00:36.000Z","kind":"acquired","source":"coordinator","lease_id":"shards/00100","holder_id":"worker-x","fencing_token":1,"ttl_ms":1000}
{"ts":"2026-09-14T10:00:36.001Z","kind":"acquired","source":"coordinator","lease_id":"shards/00101","holder_id":"worker-x","fencing_token":1,"ttl_ms":1000}
"#;

const RANGE: (&str, &str) = ("2026-09-14T10:00:10Z", "2026-09-14T10:00:36Z");

/// `leaseline serve` over a lake holding [`DOUBLE_GRANT`].
fn double_grant_server(dir: &Path) -> Server {
    let events = dir.join("double-grant.ndjson");
    std::fs::write(&events, DOUBLE_GRANT).unwrap();
    let lake = dir.join("lake");
    import_with(&lake, &[&events], &[]);
    let server = Server::start(&lake, &[], dir);
    assert_ne!(server.pg_port, 0, "{}", server.proc.logs());
    server
}

/// Every lease of [`DOUBLE_GRANT`], once each.
fn double_grant_leases() -> BTreeSet<String> {
    double_grant_events().into_iter().map(|(l, _)| l).collect()
}

/// Every lease of [`DOUBLE_GRANT`] and its event times, from the file.
fn double_grant_events() -> Vec<(String, i64)> {
    DOUBLE_GRANT
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["lease_id"].as_str().unwrap().to_string(),
                micros(v["ts"].as_str().unwrap()),
            )
        })
        .collect()
}

/// A panel state as the set of (token, holder) it names.
fn named_grants(state: &str) -> BTreeSet<(u64, String)> {
    if state == "(nobody)" {
        return BTreeSet::new();
    }
    state
        .split(" + ")
        .map(|g| {
            let (holder, token) = g
                .rsplit_once(" · token ")
                .unwrap_or_else(|| panic!("{state:?}"));
            (token.parse().unwrap(), holder.to_string())
        })
        .collect()
}

#[test]
fn every_state_timeline_shows_the_grants_the_audit_finds_valid_at_each_instant() {
    let dir = tempfile::tempdir().unwrap();
    let server = double_grant_server(dir.path());
    let pg = server.pg_port;
    let (from, to) = RANGE;
    let (t0, t1) = (micros(from), micros(to));
    let leases = double_grant_leases();

    let mut panels = 0;
    for (name, d) in dashboards() {
        for p in d["panels"].as_array().unwrap() {
            if p["type"] != "state-timeline" {
                continue;
            }
            panels += 1;
            let title = p["title"].as_str().unwrap();
            let sql = p["targets"][0]["rawSql"].as_str().unwrap();
            for lease in &leases {
                let vars = [("lease_search", ""), ("lease", lease.as_str())];
                let (cols, rows) = psql_table(pg, &expand_sql(sql, from, to, &vars));
                assert_eq!(cols, ["time", "holder", "grants"], "{name}/{title}");
                let shown: Vec<(i64, String, usize)> = rows
                    .iter()
                    .map(|r| (micros(&r[0]), r[1].clone(), r[2].parse().unwrap()))
                    .collect();
                let at = format!("{name}/{title}, {lease}");
                assert!(
                    shown.windows(2).all(|w| w[0].0 < w[1].0),
                    "{at}: one row per instant, in time order: {shown:?}"
                );
                // A state timeline draws nothing before its first row.
                assert_eq!(shown.first().map(|r| r.0), Some(t0), "{at}: {shown:?}");
                assert!(shown.iter().all(|r| r.0 <= t1), "{at}: {shown:?}");

                // The audit's own answer.
                let (_, grants) = psql_table(
                    pg,
                    &format!(
                        "SELECT fencing_token, holder_id, acquired_at, valid_until FROM lease_timeline WHERE lease_id = '{}'",
                        lease.replace('\'', "''")
                    ),
                );
                assert!(!grants.is_empty(), "{lease}");
                let grants: Vec<(u64, String, i64, Option<i64>)> = grants
                    .iter()
                    .map(|g| {
                        let until = (!g[3].is_empty()).then(|| micros(&g[3]));
                        (g[0].parse().unwrap(), g[1].clone(), micros(&g[2]), until)
                    })
                    .collect();
                // Every 100 ms, and either side of every change of the audit.
                let mut instants: BTreeSet<i64> = (t0..=t1).step_by(100_000).collect();
                for (_, _, acquired, until) in &grants {
                    for t in [Some(*acquired), *until].into_iter().flatten() {
                        instants.extend(
                            [t - 1, t, t + 1]
                                .into_iter()
                                .filter(|i| (t0..=t1).contains(i)),
                        );
                    }
                }
                for s in instants {
                    let (_, state, count) = shown.iter().rev().find(|r| r.0 <= s).unwrap();
                    let valid: BTreeSet<(u64, String)> = grants
                        .iter()
                        .filter(|(_, _, acquired, until)| {
                            *acquired <= s && until.is_none_or(|u| s < u)
                        })
                        .map(|(token, holder, _, _)| (*token, holder.clone()))
                        .collect();
                    assert_eq!(named_grants(state), valid, "{at} at {}", rfc3339(s));
                    assert_eq!(*count, valid.len(), "{at} at {}", rfc3339(s));
                }
            }

            // The exact answer for the double grant, by hand.
            let vars = [("lease_search", ""), ("lease", "shards/00030")];
            let (_, rows) = psql_table(pg, &expand_sql(sql, from, to, &vars));
            let rows: Vec<(String, &str, &str)> = rows
                .iter()
                .map(|r| (rfc3339(micros(&r[0])), r[1].as_str(), r[2].as_str()))
                .collect();
            let rows: Vec<(&str, &str, &str)> =
                rows.iter().map(|(t, h, n)| (t.as_str(), *h, *n)).collect();
            assert_eq!(
                rows,
                [
                    (
                        "2026-09-14T10:00:10Z",
                        "worker-a · token 382 + worker-b · token 383",
                        "2"
                    ),
                    ("2026-09-14T10:00:12Z", "worker-b · token 383", "1"),
                    ("2026-09-14T10:00:18Z", "(nobody)", "0"),
                    ("2026-09-14T10:00:25Z", "worker-c · token 384", "1"),
                    (
                        "2026-09-14T10:00:31Z",
                        "worker-c · token 384 + worker-d · token 385",
                        "2"
                    ),
                    ("2026-09-14T10:00:33.500Z", "worker-c · token 384", "1"),
                ],
                "{name}/{title}"
            );
            let vars = [("lease_search", ""), ("lease", "tenant/o'hara")];
            let (_, rows) = psql_table(pg, &expand_sql(sql, from, to, &vars));
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert_eq!(rows[0][1], "worker-q · token 7", "{name}/{title}");
        }
    }
    assert_eq!(
        panels, 2,
        "the ownership and incident dashboards' timelines"
    );
}

#[test]
fn the_grants_tables_list_every_grant_that_overlaps_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let server = double_grant_server(dir.path());
    let pg = server.pg_port;
    let (from, to) = RANGE;
    let (t0, t1) = (micros(from), micros(to));
    let leases = double_grant_leases();
    let mut tables = 0;
    for (name, d) in dashboards() {
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            if p["type"] != "table" || !title.starts_with("Grants") {
                continue;
            }
            tables += 1;
            let sql = p["targets"][0]["rawSql"].as_str().unwrap();
            for lease in &leases {
                let vars = [("lease_search", ""), ("lease", lease.as_str())];
                let (cols, rows) = psql_table(pg, &expand_sql(sql, from, to, &vars));
                let token = cols.iter().position(|c| c == "fencing_token").unwrap();
                let listed: Vec<u64> = rows.iter().map(|r| r[token].parse().unwrap()).collect();
                let (_, grants) = psql_table(
                    pg,
                    &format!(
                        "SELECT fencing_token, acquired_at, valid_until FROM lease_timeline WHERE lease_id = '{}' ORDER BY acquired_at",
                        lease.replace('\'', "''")
                    ),
                );
                let overlapping: Vec<u64> = grants
                    .iter()
                    .filter(|g| micros(&g[1]) <= t1 && (g[2].is_empty() || micros(&g[2]) >= t0))
                    .map(|g| g[0].parse().unwrap())
                    .collect();
                assert_eq!(listed, overlapping, "{name}/{title}, {lease}");
            }
            // 382 and 383 were acquired before the range and held into it;
            // 381 ended before it.
            let vars = [("lease_search", ""), ("lease", "shards/00030")];
            let (cols, rows) = psql_table(pg, &expand_sql(sql, from, to, &vars));
            let token = cols.iter().position(|c| c == "fencing_token").unwrap();
            let listed: Vec<&str> = rows.iter().map(|r| r[token].as_str()).collect();
            assert_eq!(listed, ["382", "383", "384", "385"], "{name}/{title}");
        }
    }
    assert_eq!(
        tables, 2,
        "the ownership and incident dashboards list grants"
    );
}

#[test]
fn the_lease_picker_offers_exactly_the_leases_with_events_in_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let server = double_grant_server(dir.path());
    let (from, to) = RANGE;
    let (t0, t1) = (micros(from), micros(to));
    let events = double_grant_events();
    let mut pickers = 0;
    for (name, d) in dashboards() {
        for v in d["templating"]["list"].as_array().unwrap() {
            if v["name"] != "lease" {
                continue;
            }
            pickers += 1;
            assert_eq!(v["type"], "query", "{name}");
            assert_eq!(
                v["refresh"], 2,
                "{name}: refreshed when the time range changes"
            );
            let query = v["query"].as_str().unwrap();
            for search in ["", "o'", "0003", "no such lease"] {
                let vars = [("lease_search", search)];
                let (_, rows) = psql_table(server.pg_port, &expand_sql(query, from, to, &vars));
                let offered: Vec<String> = rows.into_iter().map(|r| r[0].clone()).collect();
                let expected: Vec<String> = events
                    .iter()
                    .filter(|(lease, ts)| (t0..=t1).contains(ts) && lease.contains(search))
                    .map(|(lease, _)| lease.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                assert_eq!(offered, expected, "{name}, search {search:?}");
            }
            let vars = [("lease_search", "")];
            let (_, rows) = psql_table(server.pg_port, &expand_sql(query, from, to, &vars));
            assert_eq!(
                rows.concat(),
                [
                    "orders/o'brien's",
                    "shards/00030",
                    "shards/00100",
                    "tenant/o'hara"
                ],
                "{name}"
            );
        }
    }
    assert_eq!(
        pickers, 2,
        "the ownership and incident dashboards pick a lease"
    );
}

/// `(type, uid)` of every data source in the provisioning file.
fn provisioned_data_sources() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../dashboards/provisioning/datasources/leaseline.yaml"),
    )
    .unwrap();
    let mut found = BTreeSet::new();
    for item in text.split("\n  - ").skip(1) {
        let field = |key: &str| {
            item.lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
                .unwrap_or_else(|| panic!("no {key} in {item}"))
                .to_string()
        };
        found.insert((field("type"), field("uid")));
    }
    assert_eq!(found.len(), 2, "{text}");
    found
}

/// Every `"datasource": {...}` reference in a JSON value, with its path.
fn datasource_refs(
    v: &serde_json::Value,
    path: String,
    out: &mut Vec<(String, serde_json::Value)>,
) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                let here = format!("{path}/{k}");
                if k == "datasource" && child.is_object() {
                    out.push((here.clone(), child.clone()));
                }
                datasource_refs(child, here, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasource_refs(child, format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Grafana's import: every `${NAME}` of an input, in any string, becomes the
/// uid chosen for it.
fn import_substitute(
    v: &serde_json::Value,
    chosen: &BTreeMap<String, String>,
) -> serde_json::Value {
    match v {
        serde_json::Value::String(s) => {
            let mut s = s.clone();
            for (name, uid) in chosen {
                s = s.replace(&format!("${{{name}}}"), uid);
            }
            serde_json::Value::String(s)
        }
        serde_json::Value::Array(items) => {
            items.iter().map(|i| import_substitute(i, chosen)).collect()
        }
        serde_json::Value::Object(map) => map
            .iter()
            .filter(|(k, _)| *k != "__inputs")
            .map(|(k, child)| (k.clone(), import_substitute(child, chosen)))
            .collect(),
        other => other.clone(),
    }
}

#[test]
fn every_dashboard_asks_for_its_data_sources_on_import_and_finds_the_provisioned_ones() {
    let provisioned = provisioned_data_sources();
    for (name, d) in dashboards() {
        // The inputs Grafana's import asks for.
        let inputs: BTreeMap<String, String> = d["__inputs"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no __inputs"))
            .iter()
            .map(|i| {
                assert_eq!(i["type"], "datasource", "{name}: {i}");
                let input = i["name"].as_str().unwrap().to_string();
                (input, i["pluginId"].as_str().unwrap().to_string())
            })
            .collect();
        // The data source variables that stand for the same names when the
        // dashboard is provisioned, where no input is asked for.
        let variables: BTreeMap<String, (String, String)> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["type"] == "datasource")
            .map(|v| {
                let plugin = v["query"].as_str().unwrap().to_string();
                let current = v["current"]["value"].as_str().unwrap().to_string();
                (v["name"].as_str().unwrap().to_string(), (plugin, current))
            })
            .collect();

        let mut refs = Vec::new();
        datasource_refs(&d, String::new(), &mut refs);
        assert!(!refs.is_empty(), "{name}");
        let mut used = BTreeSet::new();
        for (path, r) in &refs {
            let plugin = r["type"].as_str().unwrap();
            let uid = r["uid"].as_str().unwrap();
            let input = uid
                .strip_prefix("${")
                .and_then(|u| u.strip_suffix('}'))
                .unwrap_or_else(|| panic!("{name}{path}: hard-coded data source uid {uid}"));
            assert_eq!(
                inputs.get(input).map(String::as_str),
                Some(plugin),
                "{name}{path}: {uid} is an input for {plugin}"
            );
            let (var_plugin, current) = variables
                .get(input)
                .unwrap_or_else(|| panic!("{name}{path}: no data source variable {input}"));
            assert_eq!(var_plugin, plugin, "{name}: variable {input}");
            assert!(
                provisioned.contains(&(plugin.to_string(), current.clone())),
                "{name}: variable {input} defaults to {current}, not a provisioned {plugin} uid: {provisioned:?}"
            );
            used.insert(input.to_string());
        }
        assert_eq!(
            used,
            inputs.keys().cloned().collect(),
            "{name}: every input is used"
        );
        // Data source variables come first: the lease picker's query needs
        // its data source resolved.
        let list = d["templating"]["list"].as_array().unwrap();
        assert!(
            list.iter()
                .take(variables.len())
                .all(|v| v["type"] == "datasource"),
            "{name}"
        );
        // No uid outside the data source variables' defaults.
        let mut rest = d.clone();
        rest["templating"]["list"] = list
            .iter()
            .filter(|v| v["type"] != "datasource")
            .cloned()
            .collect();
        let text = rest.to_string();
        for (_, uid) in &provisioned {
            assert!(!text.contains(uid.as_str()), "{name} hard-codes {uid}");
        }

        // What Grafana checks before importing.
        let requires = d["__requires"].as_array().unwrap();
        let required = |kind: &str, id: &str| {
            requires
                .iter()
                .find(|r| r["type"] == kind && r["id"] == id)
                .cloned()
        };
        let grafana = required("grafana", "grafana").unwrap_or_else(|| panic!("{name}"));
        assert_eq!(grafana["version"], "10.2.3", "{name}");
        for plugin in inputs.values() {
            assert!(required("datasource", plugin).is_some(), "{name}: {plugin}");
        }
        for p in d["panels"].as_array().unwrap() {
            let panel = p["type"].as_str().unwrap();
            assert!(required("panel", panel).is_some(), "{name}: {panel}");
        }

        // Imported: every reference is the data source picked for its input.
        let chosen: BTreeMap<String, String> = inputs
            .keys()
            .map(|i| (i.clone(), format!("picked-for-{i}")))
            .collect();
        let imported = import_substitute(&d, &chosen);
        assert!(imported.get("__inputs").is_none());
        assert!(!imported.to_string().contains("${DS_"), "{name}");
        let mut refs = Vec::new();
        datasource_refs(&imported, String::new(), &mut refs);
        for (path, r) in refs {
            assert!(
                r["uid"].as_str().unwrap().starts_with("picked-for-DS_"),
                "{name}{path}: {r}"
            );
        }
    }
}

/// The end of a file closes the lateness window: a violation in the last
/// seconds of a history alerts like any other (the history's last event is
/// itself a violation here, a token that went backwards).
#[test]
fn check_of_a_file_alerts_the_violations_at_its_very_end() {
    let dir = tempfile::tempdir().unwrap();
    let events = write_unsafe(dir.path());
    let lake = dir.path().join("checked");
    let out = leaseline()
        .args(["check", "--format", "ndjson", "--lake"])
        .arg(&lake)
        .arg(&events)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let kinds: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["lease_id"].is_string() && v["kind"].is_string())
        .map(|v| v["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains("token_regression"), "{kinds:?}");
    let alerted = csv_rows(
        &lake,
        "SELECT DISTINCT kind FROM lease_alerts \
         WHERE alertname = 'LeaseSafetyViolation' AND state = 'firing'",
    );
    assert_eq!(alerted, kinds);
}

/// Ctrl-C of the demo closes the lateness window: a violation that was
/// still waiting out the lateness (30 s by default) when the demo stopped
/// fires and is recorded, so every violation the lake holds has its alert.
#[test]
fn a_violation_pending_when_the_demo_is_stopped_still_alerts() {
    let dir = tempfile::tempdir().unwrap();
    let (mut demo, http, _) = start_demo(
        dir.path(),
        &[
            "--leases",
            "6",
            "--events",
            "20000",
            "--double-grant",
            "0.3",
        ],
    );
    let violations = || {
        let r = curl(&[
            "-X",
            "POST",
            "--data-binary",
            "SELECT count(*) AS n FROM lease_violations",
            "-H",
            "Accept: application/json",
            &format!("http://{http}/api/v1/sql"),
        ]);
        if r.status == 200 {
            r.json()[0]["n"].as_u64().unwrap_or(0)
        } else {
            0
        }
    };
    assert!(
        wait_until(std::time::Duration::from_secs(60), || violations() > 0),
        "no violation in a minute:\n{}",
        demo.logs()
    );
    // The demo started moments ago: nothing is past the 30 s lateness yet.
    assert!(
        !demo
            .logs()
            .lines()
            .any(|l| l.contains("ALERT FIRING") && l.contains("alertname=LeaseSafetyViolation")),
        "a safety alert fired before the lateness passed:\n{}",
        demo.logs()
    );
    demo.signal(libc::SIGINT);
    let status = demo.wait(std::time::Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", demo.logs());

    let lake = dir.path().join("demo-lake");
    let found = csv_rows(
        &lake,
        "SELECT DISTINCT lease_id, kind FROM lease_violations",
    );
    let alerted = csv_rows(
        &lake,
        "SELECT DISTINCT lease_id, kind FROM lease_alerts \
         WHERE alertname = 'LeaseSafetyViolation' AND state = 'firing'",
    );
    assert!(!found.is_empty());
    assert_eq!(alerted, found, "{}", demo.logs());
}

/// The rows of a query over the lake, as CSV lines without the header.
fn csv_rows(lake: &Path, query: &str) -> BTreeSet<String> {
    sql(lake, query, "csv")
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// One contract event as an NDJSON line, `ms` after 2026-09-14T10:00:00Z.
fn line(ms: i64, kind: &str, lease: &str, holder: &str, token: u64, id: &str) -> String {
    let ts = chrono::DateTime::from_timestamp_millis(1_789_380_000_000 + ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let ttl = if kind == "acquired" {
        ",\"ttl_ms\":10000"
    } else {
        ""
    };
    format!(
        "{{\"ts\":\"{ts}\",\"kind\":\"{kind}\",\"source\":\"coordinator\",\"lease_id\":\"{lease}\",\
         \"holder_id\":\"{holder}\",\"fencing_token\":{token}{ttl},\"event_id\":\"{id}\"}}\n"
    )
}

/// `import`'s alert replay keeps ten minutes of event time in memory. Two
/// events arrive forty minutes late, after the grants they concern were
/// let go of: one makes an overlap (its alert fires), one is the release
/// that proves an overlap was none (no alert). The answer is the one of a
/// replay that keeps every event.
#[test]
fn import_alerts_on_events_later_than_what_its_audit_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let mut ndjson = String::new();
    // made-1: token 1 [0 s, 5 s), token 5 from 20 s; token 2 will arrive
    // late, acquired at 3 s: an overlap.
    ndjson += &line(0, "acquired", "made-1", "a", 1, "m1");
    ndjson += &line(5_000, "released", "made-1", "a", 1, "m1r");
    ndjson += &line(20_000, "acquired", "made-1", "c", 5, "m5");
    ndjson += &line(25_000, "released", "made-1", "c", 5, "m5r");
    // unmade-1: token 2 acquired at 6 s while token 1 (10 s TTL) still
    // holds: an overlap, until token 1's release at 4 s arrives late.
    ndjson += &line(0, "acquired", "unmade-1", "a", 1, "u1");
    ndjson += &line(6_000, "acquired", "unmade-1", "b", 2, "u2");
    ndjson += &line(9_000, "released", "unmade-1", "b", 2, "u2r");
    ndjson += &line(30_000, "acquired", "unmade-1", "c", 5, "u5");
    ndjson += &line(35_000, "released", "unmade-1", "c", 5, "u5r");
    // Forty minutes of another lease move event time on.
    for k in 1..=40u64 {
        let at = k as i64 * 60_000;
        ndjson += &line(at, "acquired", "filler", "f", k, &format!("f{k}"));
        ndjson += &line(at + 1_000, "released", "filler", "f", k, &format!("f{k}r"));
    }
    ndjson += &line(3_000, "acquired", "made-1", "b", 2, "m2");
    ndjson += &line(4_000, "released", "unmade-1", "a", 1, "u1r");
    let events = dir.path().join("late.ndjson");
    std::fs::write(&events, ndjson).unwrap();

    let replay = |lake: &str, window: &str| {
        let config = dir.path().join(format!("{lake}.toml"));
        std::fs::write(
            &config,
            format!("[alerts]\nreplay_audit_window = \"{window}\"\n"),
        )
        .unwrap();
        let out = run_ok(
            leaseline()
                .args(["import", "--lake"])
                .arg(dir.path().join(lake))
                .arg("--config")
                .arg(&config)
                .arg(&events)
                // A commit every few events: the late ones come after the
                // audit has let go of what they concern.
                .env("LEASELINE_FLUSH_MAX_ROWS", "5")
                .env("LEASELINE_LOG", "info"),
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (settling, log) = replay("settling", "10m");
    let (whole, _) = replay("whole", "0s");
    assert_eq!(
        log.matches("audited again from the lake").count(),
        2,
        "both late events found their lease settled:\n{log}"
    );
    let safety: Vec<&str> = settling
        .lines()
        .filter(|l| l.contains("LeaseSafetyViolation"))
        .collect();
    assert_eq!(safety.len(), 1, "{settling}");
    assert!(safety[0].contains("lease_id=made-1"), "{settling}");
    let alerts = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("  "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(alerts(&settling), alerts(&whole));
    assert_eq!(
        sql(
            &dir.path().join("settling"),
            "SELECT lease_id, kind, fencing_token, other_fencing_token FROM lease_violations",
            "csv"
        ),
        "lease_id,kind,fencing_token,other_fencing_token\nmade-1,overlapping_ownership,2,1\n"
    );
}

/// The token churn query of docs/incident-queries.md counts grants and
/// distinct holders in two groupings; it must answer what `count(*)` and
/// `count(DISTINCT holder_id)` do.
#[test]
fn the_token_churn_query_counts_what_count_distinct_does() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("churn.ndjson");
    run_ok(
        leaseline()
            .args([
                "simulate", "--events", "6000", "--leases", "8", "--crash", "0.05",
            ])
            .args(["--double-grant", "0.05", "--output"])
            .arg(&events),
    );
    let lake = dir.path().join("lake");
    import_with(&lake, &[&events], &[]);
    let two_groupings = sql(
        &lake,
        "SELECT lease_id, backend, sum(grants) AS grants, count(*) AS holders
         FROM (SELECT lease_id, backend, holder_id, count(*) AS grants
               FROM lease_timeline GROUP BY lease_id, backend, holder_id) per_holder
         GROUP BY lease_id, backend ORDER BY lease_id, backend",
        "csv",
    );
    let distinct = sql(
        &lake,
        "SELECT lease_id, backend, count(*) AS grants, count(DISTINCT holder_id) AS holders
         FROM lease_timeline GROUP BY lease_id, backend ORDER BY lease_id, backend",
        "csv",
    );
    assert_eq!(two_groupings, distinct);
    assert!(distinct.lines().count() > 4, "a row per lease:\n{distinct}");
    assert!(
        distinct.lines().skip(1).any(|l| !l.ends_with(",1")),
        "some lease had more than one holder:\n{distinct}"
    );
}
