//! `leaseline watch zookeeper` against a real ZooKeeper that the test
//! starts itself (Debian's zookeeper jar, standalone, on a free loopback
//! port with its own data directory and configuration): locks taken with
//! ephemeral sequential nodes by clients of the zookeeper-client crate
//! and by zkCli (ZooKeeper's own shell), released, a waiter taking over, a
//! zkCli SIGKILLed while it owns a lock so that its session expires; events
//! through Kafka (tansu) into `serve --ingest`; the watcher SIGKILLed right
//! after a release and restarted while locks change.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::*;
use zookeeper_client as zk;

/// ZooKeeper's classpath: `LEASELINE_ZOOKEEPER_CLASSPATH`, or Debian's.
fn classpath() -> String {
    std::env::var("LEASELINE_ZOOKEEPER_CLASSPATH")
        .unwrap_or_else(|_| "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar".into())
}

/// A standalone ZooKeeper of the test's own. A short tick lets sessions
/// time out within seconds; `dump` is allowed, for the watcher to tell an
/// expiry from a release.
struct ZooKeeper {
    addr: String,
    _proc: Proc,
}

impl ZooKeeper {
    fn start(dir: &Path) -> ZooKeeper {
        let data = dir.join("zookeeper");
        std::fs::create_dir_all(&data).unwrap();
        let port = free_port();
        let cfg = dir.join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=dump,ruok\n",
                data.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new("java");
        cmd.args(["-cp", &classpath()])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg);
        let proc = Proc::spawn("zookeeper", cmd, dir);
        let addr = format!("127.0.0.1:{port}");
        let z = ZooKeeper { addr, _proc: proc };
        assert!(
            wait_until(Duration::from_secs(60), || z.four("ruok") == "imok"),
            "zookeeper did not answer (scripts/test.sh installs it)"
        );
        z
    }

    /// A four-letter word's answer; empty if none comes within 5 s (a
    /// server still starting may take the connection and not answer).
    fn four(&self, word: &str) -> String {
        use std::io::Read;
        let Ok(addr) = self.addr.parse() else {
            return String::new();
        };
        let limit = Duration::from_secs(5);
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, limit) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(limit));
        let _ = s.set_write_timeout(Some(limit));
        let _ = s.write_all(word.as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    async fn client(&self) -> zk::Client {
        within(
            "connecting",
            zk::Client::connector()
                .with_session_timeout(Duration::from_secs(10))
                .connect(&self.addr),
        )
        .await
        .unwrap()
    }
}

/// A zkCli session kept open through its standard input: a lock client
/// written in Java, which the test can SIGKILL.
struct ZkCli {
    child: Child,
    stdin: ChildStdin,
}

impl ZkCli {
    fn start(zk: &ZooKeeper, dir: &Path, name: &str) -> ZkCli {
        let log_path = dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = Command::new("java")
            .args(["-cp", &classpath()])
            .arg("org.apache.zookeeper.ZooKeeperMain")
            .args(["-server", &zk.addr, "-timeout", "2000"])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("java");
        track(child.id(), name, &log_path);
        let stdin = child.stdin.take().unwrap();
        ZkCli { child, stdin }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        reaped(self.child.id());
    }
}

impl Drop for ZkCli {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A ZooKeeper request, given 30 s: the client library waits for an
/// answer as long as its session lives, and a test must fail, not hang.
async fn within<T>(what: &str, request: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), request)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer from ZooKeeper within 30 s"))
}

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

async fn mkdir(c: &zk::Client, path: &str) {
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match within(path, c.create(path, b"", &opts)).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => panic!("creating {path}: {e}"),
    }
}

/// A contender's node under `lock`: its path and czxid.
async fn contend(c: &zk::Client, lock: &str, holder: &str) -> (String, u64) {
    let (stat, seq) = within(
        lock,
        c.create(
            &format!("/locks/{lock}/lock-"),
            holder.as_bytes(),
            &ephemeral_sequential(),
        ),
    )
    .await
    .unwrap();
    (format!("/locks/{lock}/lock-{seq}"), stat.czxid as u64)
}

/// The czxid of the owner (lowest sequence) of `lock`, or none.
async fn owner(c: &zk::Client, lock: &str) -> Option<u64> {
    let path = format!("/locks/{lock}");
    let mut children = within(&path, c.list_children(&path)).await.ok()?;
    children.retain(|n| n.contains("lock-"));
    children.sort_by_key(|n| n[n.len() - 10..].to_string());
    let first = children.first()?;
    let (_, stat) = within(&path, c.get_data(&format!("{path}/{first}")))
        .await
        .ok()?;
    Some(stat.czxid as u64)
}

fn watch(zk: &ZooKeeper, broker: &Broker, state: &Path, dir: &Path) -> Proc {
    let mut cmd = leaseline();
    cmd.args(["watch", "zookeeper", "--root", "/locks"])
        .env("LEASELINE_WATCH_ZOOKEEPER_CONNECT", &zk.addr)
        .args(["--brokers", &broker.addr, "--topic", "lease-events"])
        .arg("--state-file")
        .arg(state)
        // Notifications and the resync at each start only: a later resync
        // would hide a notification the watcher missed.
        .args(["--resync-interval", "1h", "--checkpoint-interval", "100ms"])
        .env("LEASELINE_LOG", "info");
    spawn_watch(cmd, dir)
}

/// Waits until the watcher has reported (Kafka acknowledged, the state
/// file saved) `lock` owned by the node of czxid `token`, or by none.
fn reported(state: &Path, w: &Proc, lock: &str, token: Option<u64>) {
    reported_or(state, w, lock, token, String::new);
}

/// [`reported`], adding `context()` to the failure's message.
fn reported_or(
    state: &Path,
    w: &Proc,
    lock: &str,
    token: Option<u64>,
    context: impl FnOnce() -> String,
) {
    let mut seen = None;
    let ok = wait_until(Duration::from_secs(30), || {
        seen = watch_state_locks(state)
            .into_iter()
            .find(|(k, _, _)| k == lock)
            .map(|(_, t, _)| t);
        seen == token
    });
    if !ok {
        panic!(
            "{lock}: reported {seen:?}, not {token:?}:\n{}\n{}",
            context(),
            w.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn locks_are_reported_once_across_a_watcher_killed_mid_change() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let state = dir.path().join("watch-state.json");
    let zk = ZooKeeper::start(dir.path());
    let admin = zk.client().await;
    for path in [
        "/locks",
        "/locks/orders-1",
        "/locks/orders-2",
        "/locks/jobs-7",
    ] {
        mkdir(&admin, path).await;
    }

    let broker = Broker::start(dir.path());
    broker.create_topic("lease-events", 1).await;
    let server = Server::ingesting(
        &lake,
        &broker.addr,
        "lease-events",
        &[
            "--group-id",
            "watch-zookeeper",
            "--flush-interval",
            "1s",
            "--no-compaction",
        ],
        dir.path(),
    );

    // A lock owned before the watcher starts is found by its first resync.
    let a = zk.client().await;
    let (a_node, a_token) = contend(&a, "orders-1", "w-1").await;
    let mut w = watch(&zk, &broker, &state, dir.path());
    reported(&state, &w, "orders-1", Some(a_token));

    // A waiter queues behind it: nothing changes hands. The owner deletes
    // its node: released, and the waiter owns the lock.
    let b = zk.client().await;
    let (b_node, b_token) = contend(&b, "orders-1", "w-2").await;
    assert!(b_token > a_token);
    within(&a_node, a.delete(&a_node, None)).await.unwrap();
    reported(&state, &w, "orders-1", Some(b_token));

    // A zkCli owns jobs-7 with a 2 s session, a waiter behind it; the
    // zkCli is SIGKILLed, its session expires, the server deletes its
    // node: expired, and the waiter owns the lock.
    let mut cli = ZkCli::start(&zk, dir.path(), "zkcli-w-3");
    cli.send("create -e -s /locks/jobs-7/lock- w-3");
    let mut crash_token = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while crash_token.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "zkCli did not create its node"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        crash_token = owner(&admin, "jobs-7").await;
    }
    let crash_token = crash_token.unwrap();
    reported(&state, &w, "jobs-7", Some(crash_token));
    let c = zk.client().await;
    let (c_node, c_token) = contend(&c, "jobs-7", "w-4").await;
    cli.kill9();
    // Whether the server expired the session and deleted its node, should
    // the watcher not report the waiter.
    reported_or(&state, &w, "jobs-7", Some(c_token), || {
        format!(
            "the server's sessions and ephemeral nodes:\n{}",
            zk.four("dump")
        )
    });
    // orders-1: acquired, released, acquired; jobs-7: acquired, expired,
    // acquired.
    wait_for_events(&server, 6, &w);

    // SIGKILL right after a release, then a new lock while it is down.
    within(&b_node, b.delete(&b_node, None)).await.unwrap();
    w.kill9();
    let d = zk.client().await;
    let (d_node, d_token) = contend(&d, "orders-2", "w-5").await;

    let mut w = watch(&zk, &broker, &state, dir.path());
    // orders-1 released, orders-2 acquired.
    reported(&state, &w, "orders-1", None);
    reported(&state, &w, "orders-2", Some(d_token));
    wait_for_events(&server, 8, &w);
    // Live again after the restart.
    within(&c_node, c.delete(&c_node, None)).await.unwrap();
    reported(&state, &w, "jobs-7", None);
    wait_for_events(&server, 9, &w);
    // Curator's revocation: another client asks the owner to let go by
    // writing `__REVOKE__` into its node, and the owner deletes it.
    within(&d_node, admin.set_data(&d_node, b"__REVOKE__", None))
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || w
            .logs()
            .contains("revocation requested")),
        "the watcher did not see the request:\n{}",
        w.logs()
    );
    within(&d_node, d.delete(&d_node, None)).await.unwrap();
    reported(&state, &w, "orders-2", None);
    wait_for_events(&server, 10, &w);
    assert!(w.terminate(Duration::from_secs(30)).success());
    assert_second_run_sent(&w, 3);
    let timeline = format!(
        "lease_id,fencing_token,holder_id,end_kind,renewals,backend\n\
         jobs-7,{crash_token},w-3,expired,0,zookeeper\n\
         jobs-7,{c_token},w-4,released,0,zookeeper\n\
         orders-1,{a_token},w-1,released,0,zookeeper\n\
         orders-1,{b_token},w-2,released,0,zookeeper\n\
         orders-2,{d_token},w-5,revoked,0,zookeeper\n"
    );
    assert_served_then_stored(
        server,
        &lake,
        WATCH_TIMELINE_SQL,
        &timeline,
        "kind,n,ids\nacquired,5,5\nexpired,1,1\nreleased,3,3\nrevoked,1,1\n",
    );
    assert_eq!(
        sql(
            &lake,
            "SELECT lease_id, holder_id, reason FROM lease_events WHERE kind = 'revoked'",
            "csv"
        ),
        "lease_id,holder_id,reason\norders-2,w-5,revocation requested\n"
    );
    assert_eq!(count(&lake, "lease_violations"), 0);
    assert_eq!(count(&lake, "lease_rejects"), 0);
}
