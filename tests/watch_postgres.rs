//! `leaseline watch postgres` against a real PostgreSQL that the test
//! starts itself (initdb and postgres on a free loopback port, as the
//! `postgres` user when the test runs as root, which PostgreSQL refuses to
//! run as): leases taken, renewed, released, revoked and taken over by psql
//! clients with the SQL lock clients use, one client SIGKILLed while it
//! holds a lease so that its row lapses; events through Kafka (tansu) into
//! `serve --ingest`; the watcher SIGKILLed right after a change and
//! restarted while leases change.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// PostgreSQL's server binaries: `LEASELINE_PG_BIN`, or Debian's newest
/// `/usr/lib/postgresql/<version>/bin`.
fn pg_bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("LEASELINE_PG_BIN") {
        return Path::new(&dir).join(name);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, dir)) => dir.join(name),
        None => PathBuf::from(name),
    }
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A PostgreSQL server binary, run as the `postgres` user when the test
/// is root. `setpriv` executes it in place, so the process the test holds
/// (and kills) is the server itself.
fn pg_command(name: &str) -> Command {
    if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(pg_bin(name));
        cmd
    } else {
        Command::new(pg_bin(name))
    }
}

/// A PostgreSQL of the test's own: a fresh cluster in the test's
/// directory, TCP on a free loopback port, trust authentication.
struct Postgres {
    port: u16,
    _proc: Proc,
}

impl Postgres {
    fn start(dir: &Path) -> Postgres {
        let data = dir.join("pgdata");
        std::fs::create_dir_all(&data).unwrap();
        if is_root() {
            // The postgres user must reach its data directory through the
            // test's private temporary directory.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let out = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&data)
                .output()
                .expect("chown");
            assert!(
                out.status.success(),
                "chown: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = pg_command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .args(["-E", "UTF8", "--locale=C"])
            .current_dir(&data)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "initdb ({:?}): {e} (scripts/test.sh installs postgresql)",
                    pg_bin("initdb")
                )
            });
        assert!(
            out.status.success(),
            "initdb failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut cmd = pg_command("postgres");
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "fsync=off"])
            .current_dir(&data);
        let proc = Proc::spawn("postgres", cmd, dir);
        let pg = Postgres { port, _proc: proc };
        assert!(
            wait_until(Duration::from_secs(30), || pg
                .try_psql("SELECT 1")
                .as_deref()
                == Some("1")),
            "postgres did not answer"
        );
        pg
    }

    fn psql_command(&self) -> Command {
        let mut cmd = Command::new("psql");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres"])
            .args(["-v", "ON_ERROR_STOP=1", "-qAtX"]);
        cmd
    }

    fn try_psql(&self, sql: &str) -> Option<String> {
        let out = self.psql_command().args(["-c", sql]).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn psql(&self, sql: &str) -> String {
        let out = self
            .psql_command()
            .args(["-c", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// The statement a lock client acquires with: a free or lapsed row is
/// taken with the next token of the sequence; returns the token, or
/// nothing when the lease is held.
fn acquire_sql(name: &str, holder: &str, ttl_ms: u64) -> String {
    format!(
        "INSERT INTO leases AS l (name, holder, token, expires_at) \
         VALUES ('{name}', '{holder}', nextval('lease_tokens'), now() + interval '{ttl_ms} milliseconds') \
         ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, token = EXCLUDED.token, \
         expires_at = EXCLUDED.expires_at \
         WHERE l.expires_at < now() OR l.holder IS NULL \
         RETURNING token"
    )
}

fn acquire(pg: &Postgres, name: &str, holder: &str, ttl_ms: u64) -> u64 {
    pg.psql(&acquire_sql(name, holder, ttl_ms))
        .parse()
        .unwrap_or_else(|_| panic!("{holder} did not acquire {name}"))
}

fn renew(pg: &Postgres, name: &str, holder: &str, token: u64, ttl_ms: u64) {
    let n = pg.psql(&format!(
        "WITH r AS (UPDATE leases SET expires_at = now() + interval '{ttl_ms} milliseconds' \
         WHERE name = '{name}' AND holder = '{holder}' AND token = {token} RETURNING 1) \
         SELECT count(*) FROM r"
    ));
    assert_eq!(n, "1", "{holder} did not renew {name}");
}

fn release(pg: &Postgres, name: &str, holder: &str, token: u64) {
    let n = pg.psql(&format!(
        "WITH r AS (DELETE FROM leases WHERE name = '{name}' AND holder = '{holder}' \
         AND token = {token} RETURNING 1) SELECT count(*) FROM r"
    ));
    assert_eq!(n, "1", "{holder} did not release {name}");
}

/// The live lease of `name`, as the table has it: token and deadline (ms).
fn live(pg: &Postgres, name: &str) -> Option<(u64, i64)> {
    let row = pg.psql(&format!(
        "SELECT token, floor(extract(epoch FROM expires_at) * 1000)::bigint FROM leases \
         WHERE name = '{name}' AND holder IS NOT NULL AND expires_at > clock_timestamp()"
    ));
    let (t, d) = row.split_once('|')?;
    Some((t.parse().unwrap(), d.parse().unwrap()))
}

fn watch(pg: &Postgres, broker: &Broker, state: &Path, dir: &Path) -> Proc {
    let mut cmd = leaseline();
    cmd.args(["watch", "postgres", "--table", "leases", "--install"])
        .env("LEASELINE_WATCH_POSTGRES_URL", pg.url())
        .args(["--brokers", &broker.addr, "--topic", "lease-events"])
        .arg("--state-file")
        .arg(state)
        // Notifications, deadlines and the resync at each start only: a
        // later resync would hide a notification the watcher missed.
        .args(["--resync-interval", "1h", "--checkpoint-interval", "100ms"])
        .env("LEASELINE_LOG", "info");
    spawn_watch(cmd, dir)
}

/// Waits until the watcher has reported (Kafka acknowledged, the state
/// file saved) `name` as the table has it now: its live token and
/// deadline, or no lease. One change at a time: the watcher reads a row
/// when notified, so changes closer together than that read are one
/// change to it (docs/sources.md).
fn reported(pg: &Postgres, state: &Path, w: &Proc, name: &str) {
    let want = live(pg, name);
    let mut seen = None;
    let ok = wait_until(Duration::from_secs(20), || {
        seen = watch_state_locks(state)
            .into_iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, t, d)| (t, d));
        seen == want
    });
    assert!(ok, "{name}: reported {seen:?}, not {want:?}:\n{}", w.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn leases_are_reported_once_across_a_watcher_killed_mid_change() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let state = dir.path().join("watch-state.json");
    let pg = Postgres::start(dir.path());
    pg.psql(
        "CREATE TABLE leases (name text PRIMARY KEY, holder text, token bigint, expires_at timestamptz)",
    );
    pg.psql("CREATE SEQUENCE lease_tokens");
    // `--print-install-sql` prints what `--install` runs.
    let printed = run_ok(leaseline().args([
        "watch",
        "postgres",
        "--table",
        "leases",
        "--print-install-sql",
    ]));
    let printed = String::from_utf8(printed.stdout).unwrap();
    assert!(
        printed.contains("CREATE TRIGGER leaseline_notify"),
        "{printed}"
    );

    let broker = Broker::start(dir.path());
    broker.create_topic("lease-events", 1).await;
    let server = Server::ingesting(
        &lake,
        &broker.addr,
        "lease-events",
        &[
            "--group-id",
            "watch-postgres",
            "--flush-interval",
            "1s",
            "--no-compaction",
        ],
        dir.path(),
    );

    // A lease held before the watcher starts is found by its first resync.
    assert_eq!(acquire(&pg, "orders/2", "w-6", 300_000), 1);
    let mut w = watch(&pg, &broker, &state, dir.path());
    reported(&pg, &state, &w, "orders/2");
    assert!(
        pg.psql("SELECT count(*) FROM pg_trigger WHERE tgname = 'leaseline_notify'") == "1",
        "--install did not install the trigger"
    );

    // Live, through notifications: a grant renewed and released, the next
    // holder.
    assert_eq!(acquire(&pg, "orders/1", "w-1", 30_000), 2);
    reported(&pg, &state, &w, "orders/1");
    renew(&pg, "orders/1", "w-1", 2, 60_000);
    reported(&pg, &state, &w, "orders/1");
    release(&pg, "orders/1", "w-1", 2);
    reported(&pg, &state, &w, "orders/1");
    assert_eq!(acquire(&pg, "orders/1", "w-2", 300_000), 3);
    reported(&pg, &state, &w, "orders/1");

    // A holder that dies holding its lease: its session sleeps after the
    // acquire until SIGKILL; nothing renews the row, nothing writes when
    // it lapses, and the watcher reports it expired by the clock.
    let mut crashing = pg.psql_command();
    crashing
        .args(["-c", &acquire_sql("jobs/7", "w-3", 4_000)])
        .args(["-c", "SELECT pg_sleep(600)"]);
    let mut crashing = Proc::spawn("psql-w-3", crashing, dir.path());
    assert!(wait_until(Duration::from_secs(20), || live(&pg, "jobs/7").is_some()));
    reported(&pg, &state, &w, "jobs/7");
    crashing.kill9();
    assert_eq!(live(&pg, "jobs/7").map(|(t, _)| t), Some(4));

    // An operator deletes a live lease, saying it is a revocation.
    assert_eq!(acquire(&pg, "jobs/5", "w-8", 300_000), 5);
    reported(&pg, &state, &w, "jobs/5");
    pg.psql(
        "BEGIN; SET LOCAL leaseline.revoke = 'on'; DELETE FROM leases WHERE name = 'jobs/5'; COMMIT;",
    );
    reported(&pg, &state, &w, "jobs/5");

    // A forced acquire takes a live lease over: the first grant revoked.
    assert_eq!(acquire(&pg, "orders/3", "w-9", 300_000), 6);
    reported(&pg, &state, &w, "orders/3");
    pg.psql(
        "UPDATE leases SET holder = 'w-10', token = nextval('lease_tokens'), \
         expires_at = now() + interval '300 seconds' WHERE name = 'orders/3'",
    );
    assert_eq!(live(&pg, "orders/3").map(|(t, _)| t), Some(7));
    reported(&pg, &state, &w, "orders/3");

    // jobs/7 lapses.
    assert!(wait_until(Duration::from_secs(20), || watch_state_locks(
        &state
    )
    .iter()
    .all(|(k, _, _)| k != "jobs/7")));
    assert_eq!(acquire(&pg, "jobs/9", "w-7", 8_000), 8);
    reported(&pg, &state, &w, "jobs/9");
    // orders/2 acquired; orders/1 acquired, renewed, released, acquired;
    // jobs/7 acquired, expired; jobs/5 acquired, revoked; orders/3
    // acquired, revoked, acquired; jobs/9 acquired.
    wait_for_events(&server, 13, &w);

    // SIGKILL right after a release, before the watcher has saved it (or
    // maybe even read it), then more changes while it is down: the next
    // grant, a renewal, a new lease, an expiry.
    release(&pg, "orders/1", "w-2", 3);
    w.kill9();
    assert_eq!(acquire(&pg, "orders/1", "w-4", 300_000), 9);
    renew(&pg, "orders/2", "w-6", 1, 600_000);
    assert_eq!(acquire(&pg, "jobs/8", "w-5", 300_000), 10);
    assert!(wait_until(Duration::from_secs(20), || live(&pg, "jobs/9").is_none()));

    let mut w = watch(&pg, &broker, &state, dir.path());
    // orders/1: released, acquired; orders/2 renewed; jobs/8 acquired;
    // jobs/9 expired.
    wait_for_events(&server, 18, &w);
    for name in ["orders/1", "orders/2", "jobs/8", "jobs/9"] {
        reported(&pg, &state, &w, name);
    }
    // Live again after the restart: a release that clears the row
    // (expires_at = now()) instead of deleting it.
    pg.psql(
        "UPDATE leases SET expires_at = now() WHERE name = 'orders/1' AND holder = 'w-4' AND token = 9",
    );
    reported(&pg, &state, &w, "orders/1");
    wait_for_events(&server, 19, &w);
    assert!(w.terminate(Duration::from_secs(30)).success());
    assert_second_run_sent(&w, 5);

    // Through Kafka into the served lake, and committed when serve stops.
    let timeline = "lease_id,fencing_token,holder_id,end_kind,renewals,backend\n\
                    jobs/5,5,w-8,revoked,0,postgres\n\
                    jobs/7,4,w-3,expired,0,postgres\n\
                    jobs/8,10,w-5,open,0,postgres\n\
                    jobs/9,8,w-7,expired,0,postgres\n\
                    orders/1,2,w-1,released,1,postgres\n\
                    orders/1,3,w-2,released,0,postgres\n\
                    orders/1,9,w-4,released,0,postgres\n\
                    orders/2,1,w-6,open,1,postgres\n\
                    orders/3,6,w-9,revoked,0,postgres\n\
                    orders/3,7,w-10,open,0,postgres\n";
    assert_served_then_stored(
        server,
        &lake,
        WATCH_TIMELINE_SQL,
        timeline,
        "kind,n,ids\nacquired,10,10\nexpired,2,2\nreleased,3,3\nrenewed,2,2\nrevoked,2,2\n",
    );
    assert_eq!(
        sql(
            &lake,
            "SELECT lease_id, fencing_token, reason FROM lease_events WHERE kind = 'revoked' ORDER BY lease_id",
            "csv"
        ),
        "lease_id,fencing_token,reason\njobs/5,5,operator\norders/3,6,takeover\n"
    );
    assert_eq!(count(&lake, "lease_violations"), 0);
    assert_eq!(count(&lake, "lease_rejects"), 0);
}
