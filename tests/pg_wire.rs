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

/// `leaseline pg-verifier` with the password on standard input.
fn verifier_of(password: &str) -> String {
    use std::io::Write;
    let mut child = leaseline()
        .arg("pg-verifier")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// PostgreSQL's verifier format computed apart from leaseline (Python's
/// hashlib), as `pg_authid` holds it.
fn python_verifier(password: &str) -> String {
    let script = r#"
import base64, hashlib, hmac, sys
password, salt, i = sys.argv[1].encode(), b"0123456789abcdef", 4096
salted = hashlib.pbkdf2_hmac("sha256", password, salt, i)
client_key = hmac.new(salted, b"Client Key", "sha256").digest()
stored = hashlib.sha256(client_key).digest()
server = hmac.new(salted, b"Server Key", "sha256").digest()
b = lambda x: base64.b64encode(x).decode()
print(f"SCRAM-SHA-256${i}:{b(salt)}${b(stored)}:{b(server)}")
"#;
    let out = Command::new("python3")
        .args(["-c", script, password])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn several_users_log_in_by_verifier_or_password_and_failures_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let bob = verifier_of("bob's secret");
    assert!(bob.starts_with("SCRAM-SHA-256$4096:"), "{bob}");
    assert!(!bob.contains("bob's secret"));
    let alice_file = dir.path().join("alice.pw");
    std::fs::write(&alice_file, "alice-pw\n").unwrap();
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        format!(
            "[[users]]\nname = \"alice\"\npassword_file = {:?}\n\n\
             [[users]]\nname = \"bob\"\nscram = \"{bob}\"\n\n\
             [[users]]\nname = \"carol\"\nscram = \"{}\"\n",
            alice_file.to_str().unwrap(),
            python_verifier("carol-pw")
        ),
    )
    .unwrap();
    let server = Server::start(
        &lake,
        &[
            "--pg-users-file",
            users.to_str().unwrap(),
            // The single user of --pg-user/--pg-password is one more.
            "--pg-user",
            "dave",
            "--pg-password",
            "dave-pw",
        ],
        dir.path(),
    );
    let q = ["SELECT count(*) FROM lease_holders"];
    for (user, password) in [
        ("alice", "alice-pw"),
        ("bob", "bob's secret"),
        ("carol", "carol-pw"),
        ("dave", "dave-pw"),
    ] {
        assert_eq!(
            ok(&psql(server.pg_port, user, Some(password), &q)).trim(),
            "6"
        );
    }

    // A wrong password for bob, alice's password for bob, an unknown user.
    for (user, password) in [("bob", "guess-123"), ("bob", "alice-pw"), ("mallory", "x")] {
        let out = psql(server.pg_port, user, Some(password), &q);
        assert!(!out.status.success(), "{user} got in");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "password authentication failed for user \"{user}\""
            )),
            "{err}"
        );
    }
    let logged = |needle: &str| {
        wait_until(std::time::Duration::from_secs(10), || {
            server.proc.logs().lines().any(|l| {
                l.contains("WARN")
                    && l.contains("postgres authentication failed")
                    && l.contains("peer=127.0.0.1:")
                    && l.contains(needle)
            })
        })
    };
    assert!(
        logged("user=\"bob\" why=\"wrong password\""),
        "{}",
        server.proc.logs()
    );
    assert!(
        logged("user=\"mallory\" why=\"no such user\""),
        "{}",
        server.proc.logs()
    );
    let logs = server.proc.logs();
    for secret in [
        "guess-123",
        "alice-pw",
        "dave-pw",
        "carol-pw",
        "bob's secret",
    ] {
        assert!(!logs.contains(secret), "{secret} in the log");
    }

    // \du lists them.
    let roles = ok(&psql(server.pg_port, "alice", Some("alice-pw"), &["\\du"]));
    let names: Vec<&str> = roles
        .lines()
        .map(|l| l.split('|').next().unwrap())
        .collect();
    assert_eq!(names, ["alice", "bob", "carol", "dave"], "{roles}");
}

#[test]
fn psql_describes_functions_and_tables_in_detail() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    // leaseline defines no functions of its own: \df lists none, as
    // PostgreSQL without user functions; the built-in ones are found by name.
    let functions = ok(&psql(server.pg_port, "leaseline", None, &["\\df"]));
    assert_eq!(functions, "");
    let length = ok(&psql(server.pg_port, "leaseline", None, &["\\df length"]));
    assert!(
        length
            .lines()
            .any(|l| l == "pg_catalog|length|integer|text|func"),
        "{length}"
    );
    let detail = ok(&psql(
        server.pg_port,
        "leaseline",
        None,
        &["\\d+ lease_events"],
    ));
    let rows: Vec<&str> = detail.lines().collect();
    assert_eq!(
        rows.first().copied(),
        Some("ts|timestamp with time zone||not null||plain|||"),
        "{detail}"
    );
    assert!(
        rows.contains(&"lease_id|text||not null||extended|||"),
        "{detail}"
    );
    assert!(
        rows.contains(&"fencing_token|numeric||||main|||"),
        "{detail}"
    );
    assert_eq!(rows.len(), 24, "{detail}");
    // Without users, \du lists none; the query still runs.
    assert_eq!(ok(&psql(server.pg_port, "leaseline", None, &["\\du"])), "");
}

/// A psycopg session: runs `runaway` on one connection and, when a line
/// arrives on standard input, cancels it with `conn.cancel()` (a
/// CancelRequest on a new connection); then runs a small query on the same
/// connection. Prints the cancelled query's SQLSTATE and the small
/// query's answer.
const CANCEL_SCRIPT: &str = r#"
import sys, threading, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
def cancel_on_request():
    sys.stdin.readline()
    conn.cancel()
threading.Thread(target=cancel_on_request, daemon=True).start()
try:
    conn.execute(sys.argv[2]).fetchall()
    print("finished")
except psycopg.Error as e:
    print(e.sqlstate, e.diag.message_primary)
print(conn.execute("SELECT count(*) FROM lease_events").fetchone()[0])
"#;

#[test]
fn a_cancel_request_stops_the_running_query_and_frees_its_place() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    // One place, so that a small HTTP query tells whether the runaway
    // holds it.
    let server = Server::start(
        &lake,
        &[
            "--query-max-concurrent",
            "1",
            "--query-queue-timeout",
            "200ms",
            "--query-timeout",
            "120s",
        ],
        dir.path(),
    );
    let runaway =
        "SELECT count(*) FROM lease_events a CROSS JOIN generate_series(1, 1000000000000) b";
    let small = "SELECT count(*) AS n FROM lease_events";
    let holds_the_place = || {
        wait_until(std::time::Duration::from_secs(30), || {
            server.sql(small, &[]).status == 503
        })
    };

    let mut python = Command::new("python3")
        .args([
            "-c",
            CANCEL_SCRIPT,
            &format!(
                "host=127.0.0.1 port={} user=leaseline dbname=leaseline sslmode=disable",
                server.pg_port
            ),
            runaway,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with psycopg (scripts/test.sh installs it)");
    assert!(holds_the_place(), "{}", server.proc.logs());
    let asked = std::time::Instant::now();
    writeln!(python.stdin.as_mut().unwrap(), "cancel").unwrap();
    let mut lines = std::io::BufReader::new(python.stdout.take().unwrap()).lines();
    let cancelled = lines.next().unwrap().unwrap();
    let took = asked.elapsed();
    assert_eq!(cancelled, "57014 canceling statement due to user request");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    // The place is free at once, and the connection answers.
    let after = server.sql(small, &[]);
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(lines.next().unwrap().unwrap(), "84");
    let status = python.wait().unwrap();
    assert!(
        status.success(),
        "{}",
        common::read_to_string(python.stderr.take().unwrap())
    );

    // psql's Ctrl-C sends the same request.
    let mut cmd = Command::new("psql");
    cmd.arg(format!(
        "host=127.0.0.1 port={} user=leaseline dbname=leaseline sslmode=disable",
        server.pg_port
    ))
    .args(["-X", "-A", "-t", "-c", runaway])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let psql = cmd.spawn().unwrap();
    assert!(holds_the_place(), "{}", server.proc.logs());
    unsafe {
        libc::kill(psql.id() as i32, libc::SIGINT);
    }
    let out = psql.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("canceling statement due to user request"),
        "{err}"
    );
    assert_eq!(server.sql(small, &[]).status, 200);
}

/// A PostgreSQL connection spoken by hand, to see exactly what the server
/// sends and when it closes.
struct RawConnection(std::net::TcpStream);

impl RawConnection {
    /// Connects as `leaseline` (no password) and reads up to ReadyForQuery.
    fn open(port: u16) -> RawConnection {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let mut body = 196608u32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0leaseline\0database\0leaseline\0\0");
        let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        msg.extend(body);
        s.write_all(&msg).unwrap();
        let mut c = RawConnection(s);
        while c.read().unwrap().0 != b'Z' {}
        c
    }

    fn query(&mut self, sql: &str) {
        use std::io::Write;
        let mut msg = vec![b'Q'];
        msg.extend(((sql.len() + 5) as u32).to_be_bytes());
        msg.extend(sql.as_bytes());
        msg.push(0);
        self.0.write_all(&msg).unwrap();
    }

    /// The next message's type and body; None when the server closed.
    fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        use std::io::Read;
        let mut head = [0u8; 5];
        if self.0.read_exact(&mut head).is_err() {
            return None;
        }
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        self.0.read_exact(&mut body).unwrap();
        Some((head[0], body))
    }

    /// The fields of the next ErrorResponse, by their one-letter codes.
    fn next_error(&mut self) -> std::collections::BTreeMap<char, String> {
        loop {
            let (kind, body) = self.read().expect("the server closed before an error");
            if kind == b'E' {
                return body
                    .split(|b| *b == 0)
                    .filter(|f| !f.is_empty())
                    .map(|f| (f[0] as char, String::from_utf8_lossy(&f[1..]).into_owned()))
                    .collect();
            }
        }
    }
}

#[test]
fn an_idle_connection_is_closed_with_57p05_and_a_running_query_is_not_idle() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &["--pg-idle-timeout", "1s"], dir.path());
    let mut c = RawConnection::open(server.pg_port);
    // A statement that runs past the idle timeout ends by its own limit.
    c.query("SET statement_timeout = '2500ms'");
    while c.read().unwrap().0 != b'Z' {}
    c.query("SELECT sum(length(CAST(value AS VARCHAR))) FROM generate_series(1, 1000000000000)");
    let timed_out = c.next_error();
    assert_eq!(timed_out[&'C'], "57014", "{timed_out:?}");
    assert_eq!(c.read().unwrap().0, b'Z');
    // Then nothing is sent: the server says why it closes, and closes.
    let idle_since = std::time::Instant::now();
    let closed = c.next_error();
    let idle = idle_since.elapsed();
    assert_eq!(closed[&'S'], "FATAL");
    assert_eq!(closed[&'C'], "57P05");
    assert_eq!(
        closed[&'M'],
        "terminating connection due to idle-session timeout (serve.pg_idle_timeout)"
    );
    assert!(idle >= std::time::Duration::from_millis(900), "{idle:?}");
    assert!(c.read().is_none(), "the connection stays open");
    assert!(server
        .proc
        .logs()
        .contains("postgres connection closed: idle for 1s"));
}
