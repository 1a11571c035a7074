//! One request must not take the server down, and a damaged lake or a
//! hostile event must not change an answer: each test sends what an
//! attacker or a careless user would, says what must happen, and checks
//! that the server still answers `/health` and has not exited.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn lake_with_history(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    import_files(&lake, &[sample(), write_unsafe(dir)]);
    lake
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `SELECT 1+1+...+1`: `terms` terms, nested `terms` levels deep.
fn deep_sum(terms: usize) -> String {
    format!("SELECT {} AS n", vec!["1"; terms].join("+"))
}

fn psql(port: u16, sql: &str) -> std::process::Output {
    std::process::Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={port} user=leaseline dbname=leaseline sslmode=disable"
        ))
        .args([
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
            "-c",
            sql,
        ])
        .output()
        .expect("psql")
}

/// Posts `sql` to the HTTP SQL endpoint at `base` from another thread.
fn sql_in_background(base: &str, sql: &'static str) -> std::thread::JoinHandle<HttpReply> {
    let url = format!("{base}/api/v1/sql");
    std::thread::spawn(move || curl(&["-X", "POST", "--data-binary", sql, &url]))
}

/// `/health` answers 200, and how long it took.
fn health(server: &Server) -> Duration {
    let started = Instant::now();
    let reply = server.get("/health");
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{}", reply.text());
    took
}

#[test]
fn deep_expressions_are_refused_on_every_surface_and_the_server_lives() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(&lake, &[], dir.path());

    // Within the bound the answer is exact.
    let ok = server.sql(&deep_sum(900), &[]);
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()[0]["n"], 900);

    let deep = deep_sum(2000);
    let reply = server.sql(&deep, &[]);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(reply.json()["error"], "bad_request");
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("statement too complex"),
        "{}",
        reply.text()
    );
    let ors: Vec<String> = (0..3000).map(|i| format!("lease_id = 'l/{i}'")).collect();
    let or_chain = format!(
        "SELECT count(*) FROM lease_events WHERE {}",
        ors.join(" OR ")
    );
    assert_eq!(server.sql(&or_chain, &[]).status, 400);

    let out = psql(server.pg_port, &deep);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("54001"), "{err}");
    assert!(err.contains("statement too complex"), "{err}");

    let out = leaseline()
        .args(["sql", "--lake"])
        .arg(&lake)
        .arg(&deep)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("error: statement too complex"),
        "{}",
        text(&out.stderr)
    );

    health(&server);
    assert!(server.proc.running(), "{}", server.proc.logs());
    assert!(server.proc.terminate(Duration::from_secs(30)).success());
}

#[test]
fn runaway_queries_time_out_while_health_and_signals_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(&lake, &["--query-timeout", "3s"], dir.path());
    // A trillion rows of string work, streamed: hours of CPU in almost no
    // memory, so only the timeout can stop it.
    let runaway =
        "SELECT sum(length(CAST(value AS VARCHAR))) AS n FROM generate_series(1, 1000000000000)";
    let url = server.http.clone();
    // Two at once: as many as the machine has cores.
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let reply = curl(&[
                    "-X",
                    "POST",
                    "--data-binary",
                    runaway,
                    &format!("{url}/api/v1/sql"),
                ]);
                (reply, started.elapsed())
            })
        })
        .collect();
    // While they run, /health answers at once, every time.
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        slowest = slowest.max(health(&server));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(slowest < Duration::from_secs(1), "health took {slowest:?}");
    for c in clients {
        let (reply, took) = c.join().unwrap();
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert!(
            reply.text().contains("timed out after 3s"),
            "{}",
            reply.text()
        );
        assert!(took < Duration::from_secs(20), "the timeout took {took:?}");
    }
    // The aborted work is gone: a small query is answered at once.
    let small = server.sql("SELECT count(*) AS n FROM lease_events", &[]);
    assert_eq!(small.json()[0]["n"], 84);
    // And a runaway in flight does not hold up SIGTERM: the health checks
    // run while it is being worked on.
    let pending = sql_in_background(&url, runaway);
    for _ in 0..5 {
        health(&server);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server.proc.running(), "{}", server.proc.logs());
    let status = server.proc.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}\n{}", server.proc.logs());
    let _ = pending.join();
}

#[test]
fn a_missing_data_file_fails_queries_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    assert_eq!(count(&lake, "lease_events"), 84);
    let victim = std::fs::read_dir(lake.join("lease_events"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    std::fs::remove_file(&victim).unwrap();

    let out = leaseline()
        .args(["sql", "--lake"])
        .arg(&lake)
        .arg("SELECT count(*) FROM lease_events")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: the lake is damaged: lease_events version 1 names 1 data file that storage does not have: lease_events/"),
        "{err}"
    );
    assert!(
        err.contains(victim.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );

    let server = Server::start_expecting(&lake, &[], dir.path(), 503);
    let h = server.get("/health");
    assert_eq!(h.status, 503, "{}", h.text());
    assert_eq!(h.json()["status"], "damaged");
    let named = h.json()["missing_files"][0].as_str().unwrap().to_string();
    assert!(victim.ends_with(&named), "{named} vs {victim:?}");
    let q = server.sql("SELECT count(*) AS n FROM lease_events", &[]);
    assert_eq!(q.status, 500, "{}", q.text());
    assert!(q.text().contains("the lake is damaged"), "{}", q.text());
}

#[test]
fn importing_a_file_again_keeps_each_reject_once() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    assert_eq!(count(&lake, "lease_rejects"), 4);
    // Again, by another path to the same file.
    let copy_dir = dir.path().join("via");
    std::os::unix::fs::symlink(sample().parent().unwrap(), &copy_dir).unwrap();
    let summary = import_with(&lake, &[copy_dir.join("lease-events.ndjson")], &[]);
    assert!(
        summary.starts_with("imported 83 lines: 0 events, 83 duplicates, 0 rejects"),
        "{summary}"
    );
    assert_eq!(count(&lake, "lease_rejects"), 4);
    assert_eq!(count(&lake, "lease_events"), 78);
}

#[test]
fn a_ttl_past_what_a_timestamp_holds_is_a_reject_and_breaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let bad = dir.path().join("bad.ndjson");
    std::fs::write(
        &bad,
        r#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"x/1","holder_id":"h","fencing_token":1,"ttl_ms":9223372036854775807}
{"ts":"2026-09-14T10:00:01Z","kind":"acquired","source":"coordinator","lease_id":"x/2","holder_id":"h","fencing_token":1,"ttl_ms":1000}
"#,
    )
    .unwrap();
    import_files(&lake, &[bad]);
    let rejects = sql(&lake, "SELECT reason, message FROM lease_rejects", "csv");
    assert_eq!(
        rejects,
        "reason,message\nout_of_range:ttl_ms,ttl_ms 9223372036854775807 is too large: at most 3155760000000 ms (100 years)\n"
    );
    let grants = sql(
        &lake,
        "SELECT lease_id, fencing_token, end_kind FROM lease_timeline ORDER BY lease_id",
        "csv",
    );
    assert_eq!(grants, "lease_id,fencing_token,end_kind\nx/2,1,open\n");
}

#[test]
fn an_empty_postgres_password_is_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let out = leaseline()
        .args(["serve", "--lake"])
        .arg(&lake)
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--pg-listen",
            "0.0.0.0:0",
            "--pg-password",
            "",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().find(|l| l.starts_with("error:")).unwrap_or(""),
        "error: the PostgreSQL password is empty: set a real one (serve.pg_password or LEASELINE_PG_PASSWORD), or none at all on a loopback address"
    );
}

/// `printf %s TOKEN | sha256sum`, as the docs tell an operator to do.
fn sha256_hex(token: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("printf %s '{token}' | sha256sum"))
        .output()
        .unwrap();
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_http_api_takes_bearer_tokens_by_scope_and_checks_host_and_origin() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nname = \"grafana\"\nsha256 = \"{}\"\nscopes = [\"query\"]\n\n\
             [[tokens]]\nname = \"prometheus\"\nsha256 = \"{}\"\nscopes = [\"metrics\"]\n",
            sha256_hex("q-token"),
            sha256_hex("m-token")
        ),
    )
    .unwrap();
    let tokens_arg = tokens.to_str().unwrap();
    let metrics_at = format!("127.0.0.1:{}", free_port());
    let server = Server::start(
        &lake,
        &[
            "--http-tokens-file",
            tokens_arg,
            "--metrics-listen",
            &metrics_at,
        ],
        dir.path(),
    );
    let q = "SELECT count(*) AS n FROM lease_events";
    let bearer = |t: &str| format!("Authorization: Bearer {t}");

    let none = server.sql(q, &[]);
    assert_eq!(none.status, 401, "{}", none.text());
    assert_eq!(none.json()["error"], "unauthenticated");
    let wrong = server.sql(q, &["-H", &bearer("nope")]);
    assert_eq!(wrong.status, 401);
    let ok = server.sql(q, &["-H", &bearer("q-token")]);
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()[0]["n"], 84);

    // /metrics is on its own listener, with its own scope.
    let metrics = format!("http://{metrics_at}/metrics");
    let denied = curl(&["-H", &bearer("q-token"), &metrics]);
    assert_eq!(denied.status, 403, "{}", denied.text());
    assert_eq!(
        denied.json()["message"],
        "token \"grafana\" lacks the metrics scope"
    );
    let scraped = curl(&["-H", &bearer("m-token"), &metrics]);
    assert_eq!(scraped.status, 200);
    assert!(scraped.text().contains("# EOF"), "{}", scraped.text());
    let on_api = curl(&[
        "-H",
        &bearer("m-token"),
        &format!("{}/metrics", server.http),
    ]);
    assert_eq!(on_api.status, 404);
    // The health check stays open.
    assert_eq!(server.get("/health").status, 200);

    // DNS rebinding and cross-site requests name another host.
    let rebound = server.sql(q, &["-H", &bearer("q-token"), "-H", "Host: evil.example"]);
    assert_eq!(rebound.status, 403, "{}", rebound.text());
    assert_eq!(rebound.json()["error"], "foreign_host");
    let cross = server.sql(
        q,
        &[
            "-H",
            &bearer("q-token"),
            "-H",
            "Origin: https://evil.example",
        ],
    );
    assert_eq!(cross.status, 403);
    // A token never shows in the log.
    assert!(!server.proc.logs().contains("q-token"));
}

#[test]
fn a_network_address_without_credentials_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let out = leaseline()
        .args(["serve", "--no-pg", "--http-listen", "0.0.0.0:0", "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().next().unwrap_or(""),
        "error: refusing to serve HTTP on 0.0.0.0:0 without tokens: set serve.http_tokens or serve.http_tokens_file (or --http-tokens-file), or listen on a loopback address"
    );
}

#[test]
fn queries_past_the_concurrency_cap_wait_then_are_refused_as_busy() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(
        &lake,
        &[
            "--query-max-concurrent",
            "1",
            "--query-queue-timeout",
            "500ms",
            "--query-timeout",
            "4s",
        ],
        dir.path(),
    );
    let runaway =
        "SELECT sum(length(CAST(value AS VARCHAR))) AS n FROM generate_series(1, 1000000000000)";
    let first = sql_in_background(&server.http, runaway);
    // Until the runaway holds the only place, a small query gets it.
    let q = "SELECT count(*) AS n FROM lease_events";
    assert!(
        wait_until(Duration::from_secs(10), || server.sql(q, &[]).status == 503),
        "the runaway never filled the only place:\n{}",
        server.proc.logs()
    );
    let busy = server.sql(q, &[]);
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert_eq!(
        busy.json()["message"],
        "too many queries: 1 are running and none finished within 500ms (query.max_concurrent, query.queue_timeout)"
    );
    let out = psql(server.pg_port, q);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("53300"), "{}", text(&out.stderr));
    health(&server);
    let timed_out = first.join().unwrap();
    assert_eq!(timed_out.status, 503, "{}", timed_out.text());
    assert!(
        timed_out.text().contains("timed out"),
        "{}",
        timed_out.text()
    );
    // Its place is free again.
    let after = server.sql(q, &[]);
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(after.json()[0]["n"], 84);
}

#[test]
fn postgres_connections_past_the_cap_are_refused_and_http_lives() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &["--pg-max-connections", "2"], dir.path());
    let addr = format!("127.0.0.1:{}", server.pg_port);
    // Two sockets that connect and say nothing hold both places.
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let q = "SELECT count(*) FROM lease_events";
    assert!(
        wait_until(Duration::from_secs(10), || {
            let out = psql(server.pg_port, q);
            !out.status.success() && text(&out.stderr).contains("too many clients")
        }),
        "a third connection was not refused:\n{}",
        server.proc.logs()
    );
    let out = psql(server.pg_port, q);
    assert!(
        text(&out.stderr).contains("sorry, too many clients already"),
        "{}",
        text(&out.stderr)
    );
    health(&server);
    assert_eq!(server.sql("SELECT 1 AS one", &[]).status, 200);
    // Closing them frees the places.
    drop(held);
    assert!(
        wait_until(Duration::from_secs(10), || psql(server.pg_port, q)
            .status
            .success()),
        "{}",
        server.proc.logs()
    );
}

/// CPU time the process has used so far (user and system).
fn cpu_time(server: &Server) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.proc.child.id())).unwrap();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

#[test]
fn a_join_that_makes_rows_faster_than_it_reads_stops_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(&lake, &["--query-timeout", "2s"], dir.path());
    // Each batch read from `b` makes 8192 x 3 M rows: hours of work on
    // very little input. Two at once, as many as the machine has cores.
    let runaway = "SELECT count(*) AS n FROM generate_series(1, 3000000) a \
                   CROSS JOIN generate_series(1, 3000000) b";
    let clients: Vec<_> = (0..2)
        .map(|_| sql_in_background(&server.http, runaway))
        .collect();
    for c in clients {
        let reply = c.join().unwrap();
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert!(
            reply.text().contains("timed out after 2s"),
            "{}",
            reply.text()
        );
    }
    // The work stops with the answer: within seconds the server is idle
    // again (under 10 % of a core over half a second), where a join that
    // never yields would keep both query threads busy for hours.
    let idle = wait_until(Duration::from_secs(10), || {
        let before = cpu_time(&server);
        std::thread::sleep(Duration::from_millis(500));
        cpu_time(&server) - before < Duration::from_millis(50)
    });
    assert!(
        idle,
        "the joins went on after their timeout\n{}",
        server.proc.logs()
    );
    // The query threads yield the cores to the rest of the process
    // (`query.sched_idle`, default true, and `query.nice`, default 10):
    // each is idle-class at nice 10, the serving runtime's threads are of
    // the normal class at the process's own nice value.
    let pid = server.proc.child.id();
    let mut niced = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        let Some((_, fields)) = stat.rsplit_once(')') else {
            continue;
        };
        // Fields 19 (nice) and 41 (policy) of stat, the 17th and 39th
        // after the command name.
        let fields: Vec<&str> = fields.split_whitespace().collect();
        let nice: i32 = fields[16].parse().unwrap();
        let policy: i32 = fields[38].parse().unwrap();
        if name.trim() == "leaseline-query" {
            assert_eq!((nice, policy), (10, libc::SCHED_IDLE), "{}", task.display());
            niced += 1;
        } else if name.trim() == "tokio-rt-worker" {
            assert_eq!((nice, policy), (0, libc::SCHED_OTHER), "{}", task.display());
        }
    }
    assert!(niced >= 1, "no query thread found");
    let started = Instant::now();
    let small = server.sql("SELECT count(*) AS n FROM lease_events", &[]);
    assert_eq!(small.json()[0]["n"], 84);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(server.proc.running(), "{}", server.proc.logs());
}

/// The most memory the process has held so far (its peak resident set).
fn peak_rss(server: &Server) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", server.proc.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

#[test]
fn functions_that_build_huge_values_are_held_to_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(
        &lake,
        &[
            "--query-max-memory-bytes",
            "256MiB",
            "--query-memory-pool-bytes",
            "384MiB",
        ],
        dir.path(),
    );
    // Each would build gigabytes in one value or one list: refused before
    // it is built, as over the query's memory limit.
    for probe in [
        "SELECT repeat('x', 1000000000) AS s",
        "SELECT length(lpad('x', 1000000000)) AS n",
        "SELECT count(*) AS n FROM unnest(range(1, 1000000000))",
        "SELECT count(*) AS n FROM unnest(generate_series(1, 1000000000))",
        "SELECT cardinality(array_repeat(1, 1000000000)) AS n",
        // Row by row: each value is small, the batch's are not.
        "SELECT sum(length(repeat('x', 100000000 + value))) AS n FROM generate_series(1, 20)",
    ] {
        let reply = server.sql(probe, &[]);
        assert_eq!(reply.status, 503, "{probe}: {}", reply.text());
        let body = reply.json();
        assert_eq!(body["error"], "resource_exhausted", "{probe}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("query.max_memory_bytes"),
            "{probe}: {body}"
        );
        health(&server);
    }
    // The same over PostgreSQL.
    let out = psql(server.pg_port, "SELECT repeat('x', 1000000000) AS s");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("query.max_memory_bytes"),
        "{}",
        text(&out.stderr)
    );
    // What fits is answered, exactly.
    let ok = server.sql(
        "SELECT length(repeat('ab', 1000)) AS a, \
         (SELECT count(*) FROM unnest(range(1, 100001))) AS b",
        &[],
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()[0]["a"], 2000);
    assert_eq!(ok.json()[0]["b"], 100000);
    // Nothing was built: the process never came near the gigabytes asked.
    let peak = peak_rss(&server);
    assert!(peak < 512 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(server.proc.running(), "{}", server.proc.logs());
}

/// curl's response headers and body, for a request with extra arguments.
fn curl_with_headers(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "60", "-D", "-"])
        .args(args)
        .output()
        .expect("curl");
    let all = text(&out.stdout);
    let (head, body) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
    (head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn results_stream_and_a_row_limit_keeps_the_first_rows() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    let url = format!("{}/api/v1/sql", server.http);
    let ordered = "SELECT event_id FROM lease_events ORDER BY event_id";
    let all: Vec<String> = server
        .sql(ordered, &[])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(all.len(), 84);

    // Sent as computed: chunked, with no length known in advance.
    for accept in [
        "application/json",
        "text/csv",
        "application/x-ndjson",
        "application/vnd.apache.arrow.stream",
    ] {
        let (head, _) = curl_with_headers(&[
            "-X",
            "POST",
            "-H",
            &format!("Accept: {accept}"),
            "--data-binary",
            ordered,
            &url,
        ]);
        assert!(
            head.contains("transfer-encoding: chunked"),
            "{accept}: {head}"
        );
        assert!(!head.contains("content-length"), "{accept}: {head}");
    }

    // max_rows as a parameter, or in a JSON body: the first rows.
    let reply = curl(&[
        "-X",
        "POST",
        "--data-binary",
        ordered,
        &format!("{url}?max_rows=5"),
    ]);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let got: Vec<String> = reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, all[..5]);
    let body = serde_json::json!({ "query": ordered, "max_rows": 3 }).to_string();
    let reply = curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-H",
        "Accept: application/x-ndjson",
        "--data-binary",
        &body,
        &url,
    ]);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let lines: Vec<String> = reply
        .text()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(lines, all[..3]);
    // A bad limit is the client's error.
    let bad = curl(&[
        "-X",
        "POST",
        "--data-binary",
        ordered,
        &format!("{url}?max_rows=many"),
    ]);
    assert_eq!(bad.status, 400, "{}", bad.text());
    // Errors before the first row keep their status.
    assert_eq!(server.sql("SELECT nope FROM lease_events", &[]).status, 400);

    // The CLI prints as it reads, with the same limit.
    let out = run_ok(leaseline().args([
        "sql",
        "--lake",
        lake.to_str().unwrap(),
        "--format",
        "csv",
        "--max-rows",
        "2",
        ordered,
    ]));
    let csv = text(&out.stdout);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows, vec!["event_id", all[0].as_str(), all[1].as_str()]);
}

#[test]
fn slow_readers_of_large_results_hold_little_memory_and_free_their_places() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(
        &lake,
        &["--query-max-concurrent", "4", "--query-queue-timeout", "1s"],
        dir.path(),
    );
    let url = format!("{}/api/v1/sql", server.http);
    // About 2 GB of JSON each: buffered whole, four would take gigabytes.
    let big = "SELECT value, repeat('x', 100) AS pad FROM generate_series(1, 20000000)";
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                std::process::Command::new("curl")
                    .args([
                        "-sS",
                        "-o",
                        "/dev/null",
                        "--limit-rate",
                        "200K",
                        "--max-time",
                        "4",
                        "-X",
                        "POST",
                        "--data-binary",
                        big,
                        &url,
                    ])
                    .status()
                    .unwrap()
            })
        })
        .collect();
    // While they read, the four places are taken and /health answers.
    for _ in 0..5 {
        health(&server);
        std::thread::sleep(Duration::from_millis(200));
    }
    for r in readers {
        // curl gave up at its --max-time (exit 28), mid-body.
        assert_eq!(r.join().unwrap().code(), Some(28));
    }
    // Readers gone, their queries stop and give their places back.
    assert!(
        wait_until(Duration::from_secs(10), || server
            .sql("SELECT count(*) AS n FROM lease_events", &[])
            .status
            == 200),
        "places were not given back:\n{}",
        server.proc.logs()
    );
    let peak = peak_rss(&server);
    assert!(peak < 512 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(server.proc.running(), "{}", server.proc.logs());
}

#[test]
fn an_empty_password_of_any_postgres_user_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let empty_file = dir.path().join("empty.pw");
    std::fs::write(&empty_file, "\n").unwrap();
    // PostgreSQL's verifier of the empty password, made apart from leaseline.
    let script = r#"
import base64, hashlib, hmac
salt, i = b"0123456789abcdef", 4096
salted = hashlib.pbkdf2_hmac("sha256", b"", salt, i)
stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
server = hmac.new(salted, b"Server Key", "sha256").digest()
b = lambda x: base64.b64encode(x).decode()
print(f"SCRAM-SHA-256${i}:{b(salt)}${b(stored)}:{b(server)}")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    let empty_verifier = text(&out.stdout).trim().to_string();
    for (user, expected) in [
        (
            format!("name = \"sre\"\npassword_file = {:?}", empty_file.to_str().unwrap()),
            "error: serve.pg_users: the password of user \"sre\" is empty: set a real one (its scram verifier or password_file)",
        ),
        (
            format!("name = \"grafana\"\nscram = \"{empty_verifier}\""),
            "error: serve.pg_users: the password of user \"grafana\" is empty: set a real one (its scram verifier or password_file)",
        ),
        (
            "name = \"nobody\"".to_string(),
            "error: serve.pg_users: user \"nobody\" needs one of scram (a verifier: `leaseline pg-verifier` prints one) or password_file",
        ),
    ] {
        let users = dir.path().join("users.toml");
        std::fs::write(&users, format!("[[users]]\n{user}\n")).unwrap();
        let out = leaseline()
            .args(["serve", "--lake"])
            .arg(&lake)
            .args(["--http-listen", "127.0.0.1:0", "--pg-listen", "127.0.0.1:0"])
            .arg("--pg-users-file")
            .arg(&users)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{user}");
        assert_eq!(
            text(&out.stderr).lines().find(|l| l.starts_with("error:")).unwrap_or(""),
            expected
        );
    }
    // pg-verifier refuses to make one.
    let mut child = leaseline()
        .arg("pg-verifier")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: the password is empty: give a real one on standard input"
    );
}

/// One raw HTTP/1.1 request on a new connection; the whole answer, and
/// how long it took.
fn raw_get(base: &str, path: &str) -> (String, Duration) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    (text(&answer), started.elapsed())
}

#[test]
fn http_connections_past_the_cap_get_one_answer_and_health_stays_quick() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let metrics_at = format!("127.0.0.1:{}", free_port());
    let server = Server::start(
        &lake,
        &[
            "--http-max-connections",
            "2",
            "--http-header-timeout",
            "60s",
            "--metrics-listen",
            &metrics_at,
        ],
        dir.path(),
    );
    let addr = server.http.trim_start_matches("http://").to_string();
    // Connections that say nothing hold both places (one more each time
    // round: the health check's connection may not be closed yet).
    let mut held: Vec<std::net::TcpStream> = Vec::new();
    let q = "SELECT count(*) AS n FROM lease_events";
    assert!(
        wait_until(Duration::from_secs(10), || {
            held.push(std::net::TcpStream::connect(&addr).unwrap());
            server.sql(q, &[]).status == 503
        }),
        "a third connection was served:\n{}",
        server.proc.logs()
    );
    let refused = server.sql(q, &[]);
    assert_eq!(
        refused.json(),
        serde_json::json!({
            "error": "resource_exhausted",
            "message": "too many open HTTP connections (serve.http_max_connections); retry later",
        })
    );
    // /health is still answered, at once, on connections over the cap.
    let mut fastest = Duration::MAX;
    for _ in 0..5 {
        let (answer, took) = raw_get(&server.http, "/health");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("\"status\":\"ok\""), "{answer}");
        assert!(took < Duration::from_secs(1), "health took {took:?}");
        fastest = fastest.min(took);
    }
    assert!(
        fastest < Duration::from_millis(100),
        "health took {fastest:?}"
    );
    assert!(server.proc.logs().contains("HTTP connection over the cap"));
    // The metrics listener and PostgreSQL have places of their own.
    let scraped = curl(&[&format!("http://{metrics_at}/metrics")]);
    assert_eq!(scraped.status, 200, "{}", scraped.text());
    let out = psql(server.pg_port, q);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Closing them frees the places.
    drop(held);
    assert!(
        wait_until(Duration::from_secs(10), || server.sql(q, &[]).status == 200),
        "{}",
        server.proc.logs()
    );
}

#[test]
fn silent_slow_and_idle_http_connections_are_closed_at_their_deadlines() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(
        &lake,
        &["--http-header-timeout", "1s", "--http-idle-timeout", "3s"],
        dir.path(),
    );
    let addr = server.http.trim_start_matches("http://").to_string();
    // How long until the server closes `s` (reads return end of file).
    let closed_after = |mut s: std::net::TcpStream, started: Instant| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)
            .expect("the server never closed the connection");
        (started.elapsed(), rest)
    };
    // Silent from the start: the header deadline.
    let started = Instant::now();
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    let (took, _) = closed_after(silent, started);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // Half a request head, then nothing (slowloris): the same deadline.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    let started = Instant::now();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let (took, rest) = closed_after(slow, started);
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(!text(&rest).contains("200 OK"), "{}", text(&rest));
    // A kept-alive connection after its answer: the idle deadline, longer.
    let mut kept = std::net::TcpStream::connect(&addr).unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = kept.read(&mut buf).unwrap();
    assert!(
        text(&buf[..n]).starts_with("HTTP/1.1 200 OK"),
        "{}",
        text(&buf[..n])
    );
    let (took, _) = closed_after(kept, Instant::now());
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(6),
        "{took:?}"
    );
    health(&server);
}

#[test]
fn running_out_of_file_descriptors_backs_off_and_every_surface_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(&lake, &["--http-header-timeout", "60s"], dir.path());
    let pid = server.proc.child.id();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    // A few descriptors to spare, then none.
    let limit = open + 8;
    let out = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .output()
        .expect("prlimit");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let addr = server.http.trim_start_matches("http://").to_string();
    let flood: Vec<std::net::TcpStream> = (0..32)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    assert!(
        wait_until(Duration::from_secs(10), || server
            .proc
            .logs()
            .contains("HTTP accept failed")),
        "{}",
        server.proc.logs()
    );
    assert!(server.proc.running(), "{}", server.proc.logs());
    // The flood leaves: everything answers again, on every surface.
    drop(flood);
    assert!(
        wait_until(Duration::from_secs(20), || server.get("/health").status
            == 200),
        "{}",
        server.proc.logs()
    );
    assert!(
        wait_until(Duration::from_secs(20), || psql(server.pg_port, "SELECT 1")
            .status
            .success()),
        "{}",
        server.proc.logs()
    );
    assert_eq!(server.sql("SELECT 1 AS one", &[]).status, 200);
    assert!(server.proc.terminate(Duration::from_secs(30)).success());
}
