//! `leaseline watch etcd` against a real etcd: locks and elections taken
//! by real `etcdctl lock` and `etcdctl elect` processes (their sessions'
//! keepalives renewing them), released by a signal, left to expire by a
//! SIGKILL, revoked with `etcdctl lease revoke`; the events go through a
//! Kafka-protocol broker (tansu) into `leaseline serve --ingest`. The
//! watcher is SIGKILLed while locks change and restarted (it replays
//! etcd's history from its saved revision), and once more after a
//! compaction (it falls back to a scan).
#![allow(clippy::await_holding_lock)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use common::*;

/// One test at a time: each runs etcd, a broker and the server.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// An etcd of the test's own: one member on free loopback client and peer
/// ports, its own data directory.
pub struct Etcd {
    pub endpoint: String,
    _proc: Proc,
}

/// A key as `etcdctl get --write-out=json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub key: String,
    pub create_revision: u64,
    pub lease: i64,
    pub value: String,
}

impl Key {
    /// The lease in hex, as the key's last part and `etcdctl lease` name it.
    pub fn lease_hex(&self) -> String {
        format!("{:x}", self.lease)
    }
}

impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "test"])
            .arg("--data-dir")
            .arg(dir.join("etcd-data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .args(["--log-level", "warn"]);
        let proc = Proc::spawn("etcd", cmd, dir);
        let etcd = Etcd {
            endpoint: client_url,
            _proc: proc,
        };
        assert!(
            wait_until(Duration::from_secs(30), || etcd
                .try_ctl(&["endpoint", "health"])
                .is_some()),
            "etcd did not answer (scripts/test.sh installs etcd-server and etcd-client)"
        );
        etcd
    }

    pub fn ctl(&self) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint));
        cmd
    }

    pub fn try_ctl(&self, args: &[&str]) -> Option<String> {
        let out = self.ctl().args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn run(&self, args: &[&str]) -> String {
        self.try_ctl(args)
            .unwrap_or_else(|| panic!("etcdctl {args:?} failed"))
    }

    /// Every key under `prefix`, and the store's revision.
    pub fn keys(&self, prefix: &str) -> (Vec<Key>, u64) {
        let out = self.run(&["get", "--prefix", prefix, "--write-out=json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let b64 = |s: &serde_json::Value| {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(s.as_str().unwrap_or(""))
                .unwrap();
            String::from_utf8(raw).unwrap()
        };
        let keys = v["kvs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|kv| Key {
                        key: b64(&kv["key"]),
                        create_revision: kv["create_revision"].as_u64().unwrap(),
                        lease: kv["lease"].as_i64().unwrap_or(0),
                        value: b64(&kv["value"]),
                    })
                    .collect()
            })
            .unwrap_or_default();
        (keys, v["header"]["revision"].as_u64().unwrap())
    }

    /// `etcdctl lock --ttl TTL NAME`: waits for the lock until a signal.
    pub fn lock(&self, name: &str, ttl_s: u32, tag: &str, dir: &Path) -> Proc {
        let mut cmd = self.ctl();
        cmd.args(["lock", "--ttl", &ttl_s.to_string(), name]);
        Proc::spawn(tag, cmd, dir)
    }

    /// `etcdctl elect NAME PROPOSAL`: campaigns until a signal.
    pub fn elect(&self, name: &str, proposal: &str, tag: &str, dir: &Path) -> Proc {
        let mut cmd = self.ctl();
        cmd.args(["elect", name, proposal]);
        Proc::spawn(tag, cmd, dir)
    }

    /// Waits until `p` (an `etcdctl lock` or `elect` of `name`) says it
    /// owns `name`, and returns its key as etcd has it.
    pub fn owned(&self, p: &mut Proc, name: &str) -> Key {
        let marker = format!("{name}/");
        let mut key = None;
        let ok = wait_until(Duration::from_secs(30), || {
            assert!(p.running(), "{} exited:\n{}", p.name, p.logs());
            key = p
                .logs()
                .lines()
                .find(|l| l.starts_with(&marker))
                .map(str::to_string);
            key.is_some()
        });
        assert!(ok, "{} never owned {name}:\n{}", p.name, p.logs());
        let key = key.unwrap();
        let (keys, _) = self.keys(&marker);
        let found = keys.into_iter().find(|k| k.key == key);
        let found = found.unwrap_or_else(|| panic!("{key} is not in etcd"));
        let lowest = self.keys(&marker).0.iter().map(|k| k.create_revision).min();
        assert_eq!(lowest, Some(found.create_revision), "{key} is the owner");
        found
    }

    /// The number of keys (contenders) under a lock.
    pub fn contenders(&self, name: &str) -> usize {
        self.keys(&format!("{name}/")).0.len()
    }
}

/// Sends SIGINT or SIGTERM and waits for the exit.
pub fn stop(p: &mut Proc, sig: i32) {
    p.signal(sig);
    p.wait(Duration::from_secs(30));
}

fn watch_etcd(etcd: &Etcd, broker: &Broker, state: &Path, dir: &Path) -> Proc {
    let mut cmd = leaseline();
    cmd.args(["watch", "etcd", "--endpoints", &etcd.endpoint])
        .args(["--prefix", "leases/"])
        .args(["--brokers", &broker.addr, "--topic", "leases"])
        .arg("--state-file")
        .arg(state)
        .args([
            "--checkpoint-interval",
            "100ms",
            "--lease-poll-interval",
            "300ms",
        ])
        .env("LEASELINE_LOG", "info");
    spawn_watch(cmd, dir)
}

fn serve(dir: &Path, broker: &Broker) -> Server {
    let config = dir.join("leaseline.toml");
    std::fs::write(&config, "[flush]\nflush_interval = \"300ms\"\n").unwrap();
    Server::ingesting(
        &dir.join("lake"),
        &broker.addr,
        "leases",
        &["--config", config.to_str().unwrap(), "--no-pg"],
        dir,
    )
}

/// etcd, a broker with the `leases` topic, and `serve --ingest` on it.
async fn services(dir: &Path) -> (Etcd, Broker, Server) {
    let etcd = Etcd::start(dir);
    let broker = Broker::start(dir);
    broker.create_topic("leases", 1).await;
    let server = serve(dir, &broker);
    (etcd, broker, server)
}

fn csv(server: &Server, q: &str) -> String {
    server.sql(q, &["-H", "Accept: text/csv"]).text()
}

/// The events other than renewals, as `kind,lease_id,token,holder` lines
/// in a fixed order.
fn transitions(server: &Server) -> String {
    csv(
        server,
        "SELECT lease_id, fencing_token, kind, holder_id FROM lease_events \
         WHERE kind <> 'renewed' ORDER BY lease_id, fencing_token, kind",
    )
}

/// Waits until the ingested transitions are `want` (a header line, then
/// one line per event).
fn wait_transitions(server: &Server, w: &Proc, want: &str) {
    let mut seen = String::new();
    let ok = wait_until(Duration::from_secs(40), || {
        seen = transitions(server);
        seen == want
    });
    assert!(
        ok,
        "ingested:\n{seen}\nwanted:\n{want}\nwatch log:\n{}",
        w.logs()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn locks_and_elections_are_reported_once_through_kafka_across_restarts() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (etcd, broker, server) = services(d).await;
    let state = d.join("watch-etcd.json");

    // A lock held before the watcher starts is found by its first scan.
    let mut a = etcd.lock("leases/orders", 30, "lock-a", d);
    let ka = etcd.owned(&mut a, "leases/orders");
    let mut w = watch_etcd(&etcd, &broker, &state, d);

    // The next contender waits; the owner's SIGINT unlocks (its lease
    // lives on): released, and the waiter's grant.
    let mut b = etcd.lock("leases/orders", 30, "lock-b", d);
    assert!(wait_until(Duration::from_secs(20), || etcd
        .contenders("leases/orders")
        == 2));
    stop(&mut a, libc::SIGINT);
    let kb = etcd.owned(&mut b, "leases/orders");

    // A holder SIGKILLed: no more keepalives, its 2 s lease runs out.
    let mut c = etcd.lock("leases/jobs", 2, "lock-c", d);
    let kc = etcd.owned(&mut c, "leases/jobs");
    c.kill9();

    // An election: the leader's lease revoked by an operator, the next
    // candidate elected.
    let mut e1 = etcd.elect("leases/leader", "p1", "elect-1", d);
    let k1 = etcd.owned(&mut e1, "leases/leader");
    // The revoke waits for the grant's report: a watcher that first reads
    // a lease already gone cannot tell a revoke from an expiry (a limit
    // in watch/src/etcd.rs), and the report comes after that first read.
    let granted = format!("leader,{},acquired,p1\n", k1.create_revision);
    assert!(
        wait_until(Duration::from_secs(40), || transitions(&server)
            .contains(&granted)),
        "{granted} never ingested:\n{}",
        w.logs()
    );
    let mut e2 = etcd.elect("leases/leader", "p2", "elect-2", d);
    assert!(wait_until(Duration::from_secs(20), || etcd
        .contenders("leases/leader")
        == 2));
    etcd.run(&["lease", "revoke", &k1.lease_hex()]);
    let k2 = etcd.owned(&mut e2, "leases/leader");
    e1.wait(Duration::from_secs(30));

    let line = |k: &Key, kind: &str, holder: &str| {
        let name = k.key.trim_start_matches("leases/");
        let name = &name[..name.rfind('/').unwrap()];
        format!("{name},{},{kind},{holder}\n", k.create_revision)
    };
    let header = "lease_id,fencing_token,kind,holder_id\n";
    let mut want = format!(
        "{header}{}{}{}{}{}{}{}{}",
        line(&kc, "acquired", &kc.lease_hex()),
        line(&kc, "expired", &kc.lease_hex()),
        line(&k1, "acquired", "p1"),
        line(&k1, "revoked", "p1"),
        line(&k2, "acquired", "p2"),
        line(&ka, "acquired", &ka.lease_hex()),
        line(&ka, "released", &ka.lease_hex()),
        line(&kb, "acquired", &kb.lease_hex()),
    );
    wait_transitions(&server, &w, &want);

    // SIGKILL the watcher as a lock changes hands, and change more while
    // it is down: the restart replays etcd's history from the saved
    // revision.
    let mut dd = etcd.lock("leases/orders", 30, "lock-d", d);
    assert!(wait_until(Duration::from_secs(20), || etcd
        .contenders("leases/orders")
        == 2));
    b.signal(libc::SIGINT);
    w.kill9();
    b.wait(Duration::from_secs(30));
    let kd = etcd.owned(&mut dd, "leases/orders");
    stop(&mut e2, libc::SIGINT);
    assert_eq!(etcd.contenders("leases/leader"), 0);
    let mut w = watch_etcd(&etcd, &broker, &state, d);
    assert!(
        w.logs()
            .contains("replaying etcd's history from the saved revision"),
        "{}",
        w.logs()
    );
    // Live again after the restart.
    stop(&mut dd, libc::SIGTERM);
    want = format!(
        "{header}{}{}{}{}{}{}{}{}{}{}{}{}{}",
        line(&kc, "acquired", &kc.lease_hex()),
        line(&kc, "expired", &kc.lease_hex()),
        line(&k1, "acquired", "p1"),
        line(&k1, "revoked", "p1"),
        line(&k2, "acquired", "p2"),
        line(&k2, "released", "p2"),
        line(&ka, "acquired", &ka.lease_hex()),
        line(&ka, "released", &ka.lease_hex()),
        line(&kb, "acquired", &kb.lease_hex()),
        line(&kb, "released", &kb.lease_hex()),
        line(&kd, "acquired", &kd.lease_hex()),
        line(&kd, "released", &kd.lease_hex()),
        "",
    );
    wait_transitions(&server, &w, &want);

    // Down again, a new lock taken, and the history compacted past the
    // saved revision: the restart says so and falls back to a scan.
    w.kill9();
    let mut f = etcd.lock("leases/reports", 30, "lock-f", d);
    let kf = etcd.owned(&mut f, "leases/reports");
    let (_, rev) = etcd.keys("leases/");
    etcd.run(&["compact", &rev.to_string()]);
    let mut w = watch_etcd(&etcd, &broker, &state, d);
    assert!(
        w.logs()
            .contains("cannot replay from the saved revision: resyncing from a scan"),
        "{}",
        w.logs()
    );
    stop(&mut f, libc::SIGINT);
    want.push_str(&line(&kf, "acquired", &kf.lease_hex()));
    want.push_str(&line(&kf, "released", &kf.lease_hex()));
    let mut lines: Vec<&str> = want.lines().skip(1).collect();
    lines.sort_by_key(|l| {
        let p: Vec<&str> = l.split(',').collect();
        (
            p[0].to_string(),
            p[1].parse::<u64>().unwrap(),
            p[2].to_string(),
        )
    });
    let want = format!("{header}{}\n", lines.join("\n"));
    wait_transitions(&server, &w, &want);
    assert!(w.terminate(Duration::from_secs(30)).success());

    // The grants: holders, tokens (create revisions) and ends exactly.
    let grant = |k: &Key, holder: &str, end: &str| {
        let name = k.key.trim_start_matches("leases/");
        let name = name[..name.rfind('/').unwrap()].to_string();
        let row = format!("{name},{},{holder},{end},etcd\n", k.create_revision);
        (name, k.create_revision, row)
    };
    let mut rows = vec![
        grant(&kc, &kc.lease_hex(), "expired"),
        grant(&k1, "p1", "revoked"),
        grant(&k2, "p2", "released"),
        grant(&ka, &ka.lease_hex(), "released"),
        grant(&kb, &kb.lease_hex(), "released"),
        grant(&kd, &kd.lease_hex(), "released"),
        grant(&kf, &kf.lease_hex(), "released"),
    ];
    rows.sort();
    let rows: Vec<String> = rows.into_iter().map(|(_, _, row)| row).collect();
    assert_eq!(
        csv(
            &server,
            "SELECT lease_id, fencing_token, holder_id, end_kind, backend FROM lease_timeline \
             ORDER BY lease_id, fencing_token"
        ),
        format!(
            "lease_id,fencing_token,holder_id,end_kind,backend\n{}",
            rows.concat()
        )
    );
    // Each transition once, under one id; renewals (as many as the lease
    // polls saw) never twice.
    let counts = csv(
        &server,
        "SELECT kind, count(*) AS n, count(DISTINCT event_id) AS ids FROM lease_events \
         WHERE kind <> 'renewed' GROUP BY kind ORDER BY kind",
    );
    assert_eq!(
        counts,
        "kind,n,ids\nacquired,7,7\nexpired,1,1\nreleased,5,5\nrevoked,1,1\n"
    );
    let renewals = csv(
        &server,
        "SELECT count(*) - count(DISTINCT event_id) AS repeated FROM lease_events",
    );
    assert_eq!(renewals, "repeated\n0\n");
    let violations = csv(&server, "SELECT kind, detail FROM lease_violations");
    assert_eq!(
        violations,
        "kind,detail\n",
        "events:\n{}\nwatch log:\n{}",
        csv(
            &server,
            "SELECT ts, lease_id, fencing_token, kind, holder_id, ttl_ms FROM lease_events \
             ORDER BY lease_id, ts"
        ),
        w.logs()
    );
    assert_eq!(
        csv(&server, "SELECT count(*) AS n FROM lease_rejects"),
        "n\n0\n"
    );
}

/// An example program of this package (`cli/examples/`). `cargo test`
/// builds the examples with the tests; `cargo test --test watch_etcd`
/// alone does not, and cargo cannot be run from a test while it holds the
/// build directory, so a missing one is a panic saying what to build.
fn example(name: &str) -> Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_leaseline"))
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p leaseline --example etcd_lock_holder --example fenced_resource",
        bin.display()
    );
    Command::new(bin)
}

/// `fenced_resource` on a free port; returns it and its address.
fn resource(broker: &Broker, fencing: bool, tag: &str, dir: &Path) -> (Proc, String) {
    let mut cmd = example("fenced_resource");
    cmd.args(["--brokers", &broker.addr, "--topic", "leases"]);
    if !fencing {
        cmd.arg("--no-fencing");
    }
    let p = Proc::spawn(tag, cmd, dir);
    let mut addr = String::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let logs = p.logs();
            match logs.lines().find_map(|l| l.strip_prefix("listening on ")) {
                Some(rest) => {
                    addr = rest.split_whitespace().next().unwrap().to_string();
                    true
                }
                None => false,
            }
        }),
        "{tag} did not listen:\n{}",
        p.logs()
    );
    (p, addr)
}

/// `etcd_lock_holder` of lock `lock` as `holder` (TTL 3 s), writing to
/// `resource`.
fn holder(
    etcd: &Etcd,
    broker: &Broker,
    lock: &str,
    holder: &str,
    resource: &str,
    extra: &[&str],
    dir: &Path,
) -> Proc {
    let mut cmd = example("etcd_lock_holder");
    cmd.args(["--endpoints", &etcd.endpoint, "--prefix", "leases/"])
        .args(["--lock", lock, "--holder", holder, "--ttl", "3"])
        .args(["--resource", resource])
        .args(["--brokers", &broker.addr, "--topic", "leases"])
        .args(["--writes", "3", "--write-interval", "200ms"])
        .args(extra);
    Proc::spawn(holder, cmd, dir)
}

fn wait_log(p: &mut Proc, what: &str, secs: u64) -> String {
    let mut line = String::new();
    let ok = wait_until(Duration::from_secs(secs), || {
        if let Some(l) = p.logs().lines().find(|l| l.contains(what)) {
            line = l.to_string();
            return true;
        }
        false
    });
    assert!(ok, "{} never logged {what:?}:\n{}", p.name, p.logs());
    line
}

/// The token a holder's `acquired <lock> token N` line names.
fn token_of(line: &str) -> u64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// One paused holder: `a` takes `lock`, is frozen in its write window past
/// its TTL, `b` takes the lock and writes, `a` resumes and writes with
/// its lost token. Returns both tokens.
fn paused_holder(
    etcd: &Etcd,
    broker: &Broker,
    lock: &str,
    resource: &str,
    fencing: bool,
    dir: &Path,
) -> (u64, u64) {
    let mut flags = vec!["--pause-at-write", "2", "--pause", "1s"];
    if !fencing {
        flags.push("--no-fencing");
    }
    let (a_name, b_name) = (format!("{lock}-a"), format!("{lock}-b"));
    let mut a = holder(etcd, broker, lock, &a_name, resource, &flags, dir);
    let t1 = token_of(&wait_log(&mut a, "acquired ", 30));
    let b_flags: Vec<&str> = if fencing {
        vec![]
    } else {
        vec!["--no-fencing"]
    };
    let mut b = holder(etcd, broker, lock, &b_name, resource, &b_flags, dir);
    wait_log(&mut b, "waiting for ", 30);
    wait_log(&mut a, "in the write window", 30);
    a.signal(libc::SIGSTOP);
    // Frozen past its TTL: etcd expires the lease and the next one owns.
    let t2 = token_of(&wait_log(&mut b, "acquired ", 30));
    wait_log(&mut b, &format!("write 1 token {t2}: OK"), 30);
    a.signal(libc::SIGCONT);
    let answer = if fencing {
        format!("write 2 token {t1}: REJECTED {t2}")
    } else {
        format!("write 2 token {t1}: OK")
    };
    wait_log(&mut a, &answer, 30);
    assert!(a.wait(Duration::from_secs(30)).success(), "{}", a.logs());
    assert!(b.wait(Duration::from_secs(30)).success(), "{}", b.logs());
    (t1, t2)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_holder_s_stale_write_is_refused_and_reported_and_accepted_without_fencing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let etcd = Etcd::start(d);
    let broker = Broker::start(d);
    broker.create_topic("leases", 1).await;
    let config = d.join("leaseline.toml");
    std::fs::write(
        &config,
        r#"
[flush]
flush_interval = "300ms"
[alerts]
lateness = "1s"
partition_idle_timeout = "1s"
evaluation_interval = "1s"
[alerts.rules.forced_expiry]
window = "1m"
[alerts.rules.stale_write_rejected]
window = "1m"
"#,
    )
    .unwrap();
    let server = Server::start(
        &d.join("lake"),
        &[
            "--ingest",
            "--brokers",
            &broker.addr,
            "--topic",
            "leases",
            "--config",
            config.to_str().unwrap(),
            "--no-pg",
        ],
        d,
    );
    let state = d.join("watch-etcd.json");
    let mut w = watch_etcd(&etcd, &broker, &state, d);

    // Fencing on: the resource refuses the resumed holder's write.
    let (_r1, fenced_at) = resource(&broker, true, "resource-fenced", d);
    let (t1, t2) = paused_holder(&etcd, &broker, "ledger", &fenced_at, true, d);
    // Fencing off: the same pause, and the stale write goes through.
    let (_r2, open_at) = resource(&broker, false, "resource-open", d);
    let (t3, t4) = paused_holder(&etcd, &broker, "journal", &open_at, false, d);

    let grants = format!(
        "lease_id,fencing_token,holder_id,end_kind\n\
         journal,{t3},journal-a,expired\njournal,{t4},journal-b,released\n\
         ledger,{t1},ledger-a,expired\nledger,{t2},ledger-b,released\n"
    );
    let mut seen = String::new();
    let ok = wait_until(Duration::from_secs(40), || {
        seen = csv(
            &server,
            "SELECT lease_id, fencing_token, holder_id, end_kind FROM lease_timeline \
             ORDER BY lease_id, fencing_token",
        );
        seen == grants
    });
    assert!(ok, "lease_timeline:\n{seen}\nwatch:\n{}", w.logs());

    // The writes as the resources reported them.
    let writes = format!(
        "lease_id,fencing_token,kind,holder_id,max_token\n\
         journal,{t3},write_accepted,journal-a,\njournal,{t3},write_accepted,journal-a,\n\
         journal,{t4},write_accepted,journal-b,\njournal,{t4},write_accepted,journal-b,\n\
         journal,{t4},write_accepted,journal-b,\n\
         ledger,{t1},stale_write_rejected,ledger-a,{t2}\nledger,{t1},write_accepted,ledger-a,\n\
         ledger,{t2},write_accepted,ledger-b,\nledger,{t2},write_accepted,ledger-b,\n\
         ledger,{t2},write_accepted,ledger-b,\n"
    );
    let ok = wait_until(Duration::from_secs(30), || {
        seen = csv(
            &server,
            "SELECT lease_id, fencing_token, kind, holder_id, max_token FROM lease_events \
             WHERE source = 'resource' ORDER BY lease_id, fencing_token, kind",
        );
        seen == writes
    });
    assert!(ok, "resource events:\n{seen}");

    // Fencing on: the resumed holder fenced late (it was frozen), and
    // nothing unsafe reached the resource. Fencing off: its write was
    // stale, and came after its grant had ended.
    let violations = format!(
        "kind,lease_id,fencing_token\n\
         stale_write_accepted,journal,{t3}\nwrite_after_loss,journal,{t3}\n\
         late_fence,ledger,{t1}\n"
    );
    let ok = wait_until(Duration::from_secs(30), || {
        seen = csv(
            &server,
            "SELECT kind, lease_id, fencing_token FROM lease_violations \
             ORDER BY lease_id, kind",
        );
        seen == violations
    });
    assert!(ok, "lease_violations:\n{seen}");

    // The alerts: both forced expiries, the refused stale write.
    let alerts = "alertname,lease_id\n\
                  LeaseForcedExpiry,journal\nLeaseForcedExpiry,ledger\n\
                  LeaseStaleWriteRejected,ledger\n";
    let ok = wait_until(Duration::from_secs(30), || {
        seen = csv(
            &server,
            "SELECT DISTINCT alertname, lease_id FROM lease_alerts \
             WHERE state = 'firing' AND alertname IN ('LeaseForcedExpiry', 'LeaseStaleWriteRejected') \
             ORDER BY alertname, lease_id",
        );
        seen == alerts
    });
    assert!(ok, "lease_alerts:\n{seen}\nserve:\n{}", server.proc.logs());
    assert!(w.terminate(Duration::from_secs(30)).success());
}

/// A client's release is a delete of its key and, at once, a revoke of its
/// session's lease. The watcher must read the lease before the revoke
/// even while its loop waits on a stalled broker for a checkpoint:
/// read after, the release would look like an operator's revoke.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_while_kafka_stalls_the_watcher_is_still_a_release() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (etcd, broker, server) = services(d).await;
    let mut w = watch_etcd(&etcd, &broker, &d.join("watch-etcd.json"), d);
    wait_log(&mut w, "watching", 30);

    // A session's key, as etcd's `concurrency` package puts it.
    let take = |name: &str| {
        let out = etcd.run(&["lease", "grant", "60"]);
        // etcdctl pads the id to 16 digits; a session's key does not.
        let id = out.split_whitespace().nth(1).unwrap();
        let hex = format!("{:x}", u64::from_str_radix(id, 16).unwrap());
        let key = format!("leases/{name}/{hex}");
        etcd.run(&["put", "--lease", &hex, &key, ""]);
        (key, hex)
    };
    let (orders, orders_lease) = take("orders");
    let revision = |key: &str| {
        let (keys, _) = etcd.keys(key);
        keys[0].create_revision
    };
    let orders_token = revision(&orders);
    let granted = format!("orders,{orders_token},acquired,{orders_lease}\n");
    assert!(
        wait_until(Duration::from_secs(40), || transitions(&server)
            .contains(&granted)),
        "{granted} never ingested:\n{}",
        w.logs()
    );

    // The broker stops answering; a new grant leaves the watcher with
    // events to confirm, and its next checkpoint waits.
    broker.proc.signal(libc::SIGSTOP);
    let (jobs, jobs_lease) = take("jobs");
    let jobs_token = revision(&jobs);
    wait_log(&mut w, "has not confirmed delivery yet", 30);
    etcd.run(&["del", &orders]);
    etcd.run(&["lease", "revoke", &orders_lease]);
    broker.proc.signal(libc::SIGCONT);

    wait_transitions(
        &server,
        &w,
        &format!(
            "lease_id,fencing_token,kind,holder_id\n\
             jobs,{jobs_token},acquired,{jobs_lease}\n\
             orders,{orders_token},acquired,{orders_lease}\n\
             orders,{orders_token},released,{orders_lease}\n"
        ),
    );
}
