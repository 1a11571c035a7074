//! `leaseline watch redis` against a real redis-server: locks taken,
//! renewed, released and left to expire by redis-cli, as lock clients do
//! (`INCR <key>:token`, then `SET <key> <holder> NX PX <ttl>`), reported
//! into a lake; the watcher SIGKILLed and restarted while locks change,
//! its connections to Redis killed under it; and the same through Kafka
//! into `serve --ingest`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A redis-server of the test's own, on a free loopback port, no
/// persistence.
struct Redis {
    port: u16,
    _proc: Proc,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let port = free_port();
        let data = dir.join("redis");
        std::fs::create_dir_all(&data).unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&data);
        let proc = Proc::spawn("redis-server", cmd, dir);
        let r = Redis { port, _proc: proc };
        assert!(
            wait_until(Duration::from_secs(20), || r.try_cli(&["PING"]).as_deref()
                == Some("PONG")),
            "redis-server did not answer (scripts/test.sh installs it)"
        );
        r
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    /// A lock client taking `name`: a new token, then the lock.
    fn acquire(&self, name: &str, holder: &str, ttl_ms: u64) -> u64 {
        let key = format!("locks:{name}");
        let token = self
            .cli(&["INCR", &format!("{key}:token")])
            .parse()
            .unwrap();
        let ttl = ttl_ms.to_string();
        assert_eq!(self.cli(&["SET", &key, holder, "NX", "PX", &ttl]), "OK");
        token
    }

    fn renew(&self, name: &str, ttl_ms: u64) {
        let ttl = ttl_ms.to_string();
        assert_eq!(self.cli(&["PEXPIRE", &format!("locks:{name}"), &ttl]), "1");
    }

    fn release(&self, name: &str) {
        assert_eq!(self.cli(&["DEL", &format!("locks:{name}")]), "1");
    }

    fn exists(&self, name: &str) -> bool {
        self.cli(&["EXISTS", &format!("locks:{name}")]) == "1"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

/// Where a watcher's events go.
enum To<'a> {
    Lake(&'a Path),
    /// A broker's address and topic.
    Kafka(&'a str, &'a str),
}

fn watch(redis: &Redis, lake: &Path, state: &Path, dir: &Path) -> Proc {
    watch_to(redis, To::Lake(lake), state, dir)
}

fn watch_to(redis: &Redis, to: To<'_>, state: &Path, dir: &Path) -> Proc {
    let mut cmd = leaseline();
    cmd.args([
        "watch",
        "redis",
        "--url",
        &redis.url(),
        "--prefix",
        "locks:",
    ]);
    match to {
        To::Lake(lake) => cmd.arg("--lake").arg(lake),
        To::Kafka(brokers, topic) => cmd.args(["--brokers", brokers, "--topic", topic]),
    };
    cmd.arg("--state-file")
        .arg(state)
        // Only notifications and the resync at each start: a later resync
        // would hide a notification the watcher missed.
        .args(["--resync-interval", "1h", "--checkpoint-interval", "100ms"])
        .env("LEASELINE_LOG", "info");
    spawn_watch(cmd, dir)
}

fn wait_for_events(lake: &Path, n: usize, w: &Proc) {
    let mut seen = 0;
    let ok = wait_until(Duration::from_secs(30), || {
        seen = committed_events(lake).unwrap_or(0);
        seen >= n
    });
    assert!(
        ok,
        "{seen} events in the lake, waited for {n}:\n{}",
        w.logs()
    );
    assert_eq!(seen, n, "more events than transitions:\n{}", w.logs());
}

/// Waits until the watcher has reported (the sink committed, the state
/// file saved) `lease_id` with `token` and the deadline Redis has now, or
/// none with `token` 0. One change at a time: a watcher reads a lock when
/// notified, so changes closer together than that read are one change to
/// it (docs/sources.md).
fn reported(redis: &Redis, state: &Path, w: &Proc, lease_id: &str, token: u64) {
    let key = format!("locks:{lease_id}");
    let want = match token {
        0 => None,
        t => Some((t, redis.cli(&["PEXPIRETIME", &key]).parse::<i64>().unwrap())),
    };
    let mut seen = None;
    let ok = wait_until(Duration::from_secs(20), || {
        seen = watch_state_locks(state)
            .into_iter()
            .find(|(k, _, _)| k == lease_id)
            .map(|(_, t, d)| (t, d));
        seen == want
    });
    assert!(
        ok,
        "{lease_id}: reported {seen:?}, not {want:?}:\n{}",
        w.logs()
    );
}

fn timeline(lake: &Path) -> String {
    sql(lake, WATCH_TIMELINE_SQL, "csv")
}

#[test]
fn locks_are_reported_once_across_restarts_and_lost_connections() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let state: PathBuf = dir.path().join("watch-state.json");
    let redis = Redis::start(dir.path());

    // A lock held before the watcher starts is found by its first resync,
    // and so is a key under the prefix that is no lock (a hash's changes
    // are not even notified).
    assert_eq!(redis.acquire("orders/2", "w-6", 60_000), 1);
    redis.cli(&["HSET", "locks:weird", "f", "v"]);
    let mut w = watch(&redis, &lake, &state, dir.path());

    reported(&redis, &state, &w, "orders/2", 1);

    // Live, through notifications: a grant renewed and released, the
    // next holder, a holder that stops renewing.
    assert_eq!(redis.acquire("orders/1", "w-1", 30_000), 1);
    reported(&redis, &state, &w, "orders/1", 1);
    redis.renew("orders/1", 60_000);
    reported(&redis, &state, &w, "orders/1", 1);
    redis.release("orders/1");
    reported(&redis, &state, &w, "orders/1", 0);
    assert_eq!(redis.acquire("orders/1", "w-2", 60_000), 2);
    reported(&redis, &state, &w, "orders/1", 2);
    assert_eq!(redis.acquire("jobs/7", "w-3", 3_000), 1);
    reported(&redis, &state, &w, "jobs/7", 1);
    reported(&redis, &state, &w, "jobs/7", 0);
    // orders/2 acquired; orders/1: acquired, renewed, released, acquired;
    // jobs/7: acquired, expired.
    wait_for_events(&lake, 7, &w);
    assert!(
        w.logs()
            .contains("not a lock the watcher can read; ignored until it is"),
        "{}",
        w.logs()
    );

    // Its connections killed: it reconnects, and a lock still held is no
    // new grant.
    let killed: u64 = redis
        .cli(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .parse()
        .unwrap();
    assert_eq!(killed, 1);
    assert!(
        wait_until(Duration::from_secs(30), || w
            .logs()
            .matches(" watching")
            .count()
            == 2),
        "no reconnect:\n{}",
        w.logs()
    );
    assert!(w.logs().contains("lost the lock service; reconnecting"));
    assert_eq!(redis.acquire("jobs/9", "w-7", 5_000), 1);
    reported(&redis, &state, &w, "jobs/9", 1);
    wait_for_events(&lake, 8, &w);

    // SIGKILL, then change things while it is down: a release and the
    // next grant, a renewal, a new lock, an expiry.
    w.kill9();
    redis.release("orders/1");
    assert_eq!(redis.acquire("orders/1", "w-4", 60_000), 3);
    redis.renew("orders/2", 90_000);
    assert_eq!(redis.acquire("jobs/8", "w-5", 60_000), 1);
    assert!(wait_until(Duration::from_secs(20), || !redis.exists("jobs/9")));

    let mut w = watch(&redis, &lake, &state, dir.path());
    // orders/1: released, acquired; orders/2 renewed; jobs/8 acquired;
    // jobs/9 expired.
    wait_for_events(&lake, 13, &w);
    // Live again after the restart.
    redis.release("orders/1");
    wait_for_events(&lake, 14, &w);
    assert!(w.terminate(Duration::from_secs(30)).success());
    assert_eq!(last_run_events(&w.logs()), 6, "{}", w.logs());

    assert_eq!(
        timeline(&lake),
        "lease_id,fencing_token,holder_id,end_kind,renewals,backend\n\
         jobs/7,1,w-3,expired,0,redis\n\
         jobs/8,1,w-5,open,0,redis\n\
         jobs/9,1,w-7,expired,0,redis\n\
         orders/1,1,w-1,released,1,redis\n\
         orders/1,2,w-2,released,0,redis\n\
         orders/1,3,w-4,released,0,redis\n\
         orders/2,1,w-6,open,1,redis\n"
    );
    assert_eq!(
        sql(
            &lake,
            "SELECT kind, count(*) AS n, count(DISTINCT event_id) AS ids FROM lease_events GROUP BY kind ORDER BY kind",
            "csv"
        ),
        "kind,n,ids\nacquired,7,7\nexpired,2,2\nreleased,3,3\nrenewed,2,2\n"
    );
    assert_eq!(count(&lake, "lease_violations"), 0);
    assert_eq!(count(&lake, "lease_rejects"), 0);
}

/// The deployment the sources are meant for: the watcher produces to
/// Kafka and `serve --ingest` consumes, while the watcher is SIGKILLed and
/// restarted between changes.
#[tokio::test(flavor = "multi_thread")]
async fn through_kafka_into_serve_ingest_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let state: PathBuf = dir.path().join("watch-state.json");
    let redis = Redis::start(dir.path());
    let broker = Broker::start(dir.path());
    broker.create_topic("leases", 2).await;
    let server = Server::ingesting(&lake, &broker.addr, "leases", &["--no-pg"], dir.path());
    let kafka = || To::Kafka(&broker.addr, "leases");
    let mut w = watch_to(&redis, kafka(), &state, dir.path());

    // A grant renewed and released, the next holder, and a client that
    // dies holding a lock: nobody renews it, so it expires.
    assert_eq!(redis.acquire("orders/1", "w-1", 30_000), 1);
    reported(&redis, &state, &w, "orders/1", 1);
    redis.renew("orders/1", 60_000);
    reported(&redis, &state, &w, "orders/1", 1);
    redis.release("orders/1");
    reported(&redis, &state, &w, "orders/1", 0);
    assert_eq!(redis.acquire("orders/1", "w-2", 60_000), 2);
    reported(&redis, &state, &w, "orders/1", 2);
    assert_eq!(redis.acquire("jobs/7", "w-3", 2_000), 1);
    reported(&redis, &state, &w, "jobs/7", 1);
    reported(&redis, &state, &w, "jobs/7", 0);
    wait_for_events(&lake, 6, &w);

    // Killed; meanwhile the lock changes hands.
    w.kill9();
    redis.release("orders/1");
    assert_eq!(redis.acquire("orders/1", "w-4", 60_000), 3);
    let mut w = watch_to(&redis, kafka(), &state, dir.path());
    reported(&redis, &state, &w, "orders/1", 3);
    redis.release("orders/1");
    reported(&redis, &state, &w, "orders/1", 0);
    // released, acquired (while down), released (live).
    wait_for_events(&lake, 9, &w);
    assert!(w.terminate(Duration::from_secs(30)).success());

    let answer = |q: &str| {
        let r = server.sql(q, &["-H", "Accept: text/csv"]);
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
    };
    assert_eq!(
        answer(WATCH_TIMELINE_SQL),
        "lease_id,fencing_token,holder_id,end_kind,renewals,backend\n\
         jobs/7,1,w-3,expired,0,redis\n\
         orders/1,1,w-1,released,1,redis\n\
         orders/1,2,w-2,released,0,redis\n\
         orders/1,3,w-4,released,0,redis\n"
    );
    assert_eq!(
        answer(
            "SELECT kind, count(*) AS n, count(DISTINCT event_id) AS ids FROM lease_events \
             GROUP BY kind ORDER BY kind"
        ),
        "kind,n,ids\nacquired,4,4\nexpired,1,1\nreleased,3,3\nrenewed,1,1\n"
    );
    assert_eq!(
        answer("SELECT count(*) AS n FROM lease_violations"),
        "n\n0\n"
    );
}
