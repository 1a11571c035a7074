//! The PostgreSQL wire protocol of `leaseline serve`, with the real `psql`:
//! the catalog commands psql and Grafana use, queries over every table,
//! refused writes, and password authentication.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

fn lake_with_history(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    let unsafe_file = write_unsafe(dir);
    import_files(&lake, &[sample(), unsafe_file]);
    lake
}

/// Runs psql with `-c` commands, unaligned and tuples only.
fn psql(port: u16, user: &str, password: Option<&str>, commands: &[&str]) -> Output {
    let mut cmd = Command::new("psql");
    cmd.arg(format!(
        "host=127.0.0.1 port={port} user={user} dbname=leaseline sslmode=disable connect_timeout=10"
    ))
    .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
    .env_remove("PGPASSWORD")
    .env("PGCONNECT_TIMEOUT", "10");
    if let Some(p) = password {
        cmd.env("PGPASSWORD", p);
    } else {
        // Never prompt: fail instead.
        cmd.arg("-w");
    }
    for c in commands {
        cmd.args(["-c", c]);
    }
    cmd.output()
        .expect("psql (scripts/test.sh installs postgresql-client)")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "psql failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn psql_lists_describes_and_queries_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    assert_ne!(server.pg_port, 0, "{}", server.proc.logs());

    let tables = ok(&psql(server.pg_port, "leaseline", None, &["\\dt"]));
    for t in [
        "lease_events",
        "lease_rejects",
        "lease_timeline",
        "lease_violations",
        "lease_holders",
    ] {
        assert!(tables.contains(t), "\\dt lacks {t}:\n{tables}");
    }

    // Column types come back as PostgreSQL type names.
    let described = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["\\d lease_timeline"],
    ));
    for needle in [
        "lease_id|text",
        "acquired_at|timestamp",
        "renewals|bigint",
        "max_renew_gap_ms|double precision",
    ] {
        assert!(described.contains(needle), "{needle} not in:\n{described}");
    }

    let holders = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["SELECT holder_id, fencing_token FROM lease_holders WHERE lease_id = 'orders/order-123'"],
    ));
    assert_eq!(holders.trim(), "worker-2|34");

    let violations = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["SELECT kind FROM lease_violations ORDER BY kind"],
    ));
    assert_eq!(
        violations.lines().collect::<Vec<_>>(),
        [
            "overlapping_ownership",
            "stale_write_accepted",
            "token_regression",
            "write_after_loss"
        ]
    );

    // What Grafana's table picker asks.
    let picker = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name"],
    ));
    assert!(picker.contains("lease_holders"), "{picker}");

    // New data is seen by the next query on the same server.
    let more = dir.path().join("more.ndjson");
    std::fs::write(
        &more,
        r#"{"ts":"2026-09-14T11:00:00Z","kind":"acquired","source":"coordinator","lease_id":"new/lease","holder_id":"n-1","fencing_token":1,"ttl_ms":5000,"event_id":"n1"}"#,
    )
    .unwrap();
    import_files(&lake, &[more]);
    let fresh = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["SELECT holder_id FROM lease_holders WHERE lease_id = 'new/lease'"],
    ));
    assert_eq!(fresh.trim(), "n-1");
}

#[test]
fn writes_are_refused_over_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    for statement in [
        "INSERT INTO lease_events SELECT * FROM lease_events",
        "DROP TABLE lease_events",
        "CREATE TABLE x AS SELECT 1",
        "COPY lease_events TO '/tmp/leaseline-leak.csv'",
        "SET datafusion.execution.batch_size = 1",
    ] {
        let out = psql(server.pg_port, "leaseline", None, &[statement]);
        assert!(!out.status.success(), "{statement} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("ERROR"), "{statement}: {err}");
    }
    let n = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["SELECT count(*) FROM lease_events"],
    ));
    assert_eq!(n.trim(), "84");
}

#[test]
fn password_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(
        &lake,
        &["--pg-user", "sre", "--pg-password", "s3cret"],
        dir.path(),
    );
    let q = ["SELECT count(*) FROM lease_holders"];
    assert!(!psql(server.pg_port, "sre", None, &q).status.success());
    assert!(!psql(server.pg_port, "sre", Some("wrong"), &q)
        .status
        .success());
    assert!(!psql(server.pg_port, "other", Some("s3cret"), &q)
        .status
        .success());
    let n = ok(&psql(server.pg_port, "sre", Some("s3cret"), &q));
    // orders/order-123, jobs/batch-0 to 3 and pay/acct-9.
    assert_eq!(n.trim(), "6");
}

#[test]
fn a_shorter_statement_timeout_of_the_connection_applies() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &["--query-timeout", "60s"], dir.path());
    let runaway =
        "SELECT sum(length(CAST(value AS VARCHAR))) FROM generate_series(1, 1000000000000)";
    let started = std::time::Instant::now();
    let out = psql(
        server.pg_port,
        "leaseline",
        None,
        &["SET statement_timeout = '700ms'", runaway],
    );
    let took = started.elapsed();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("query timed out after 700ms"), "{err}");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    // 0 means no statement limit, as in PostgreSQL: query.timeout holds.
    let n = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &[
            "SET statement_timeout = 0",
            "SELECT count(*) FROM lease_events",
        ],
    ));
    assert_eq!(n.trim(), "SET\n84");
}

#[test]
fn the_password_can_come_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let file = dir.path().join("pg-password");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let server = Server::start(
        &lake,
        &[
            "--pg-user",
            "sre",
            "--pg-password-file",
            file.to_str().unwrap(),
        ],
        dir.path(),
    );
    let q = ["SELECT count(*) FROM lease_holders"];
    assert!(!psql(server.pg_port, "sre", Some("wrong"), &q)
        .status
        .success());
    assert_eq!(
        ok(&psql(server.pg_port, "sre", Some("from-a-file"), &q)).trim(),
        "6"
    );
    assert!(!server.proc.logs().contains("from-a-file"));
}

#[test]
fn no_password_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let out = leaseline()
        .args(["serve", "--lake"])
        .arg(&lake)
        .args(["--http-listen", "127.0.0.1:0", "--pg-listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a password"), "{err}");
}
