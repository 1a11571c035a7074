//! Shared harness of the end-to-end tests: a real Kafka-protocol broker
//! (tansu), the real `leaseline` binary, and generated datasets.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// How long one test binary may run (`LEASELINE_TEST_BINARY_LIMIT_SECS`,
/// default 15 minutes; the slowest takes under 5 on two cores).
const BINARY_LIMIT: Duration = Duration::from_secs(15 * 60);

/// The processes the tests of this binary have started and not yet
/// reaped: pid, name and log.
static LIVE: Mutex<Vec<(u32, String, PathBuf)>> = Mutex::new(Vec::new());

/// Puts a process a test started on [`LIVE`], for the watchdog (armed
/// here if it was not) to show its log and kill it (a [`Proc`] is put
/// there by itself).
pub fn track(pid: u32, name: &str, log: &Path) {
    arm_watchdog();
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((pid, name.to_string(), log.to_path_buf()));
}

/// Takes a reaped process off [`LIVE`]: its pid may be reused.
pub fn reaped(pid: u32) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(p, _, _)| *p != pid);
}

/// Arms, once per test binary, a watchdog for a test that hangs: a call
/// with no deadline of its own (a client library's request, a child's
/// output) would otherwise hold the whole run until CI gives up, printing
/// nothing. Past the limit it writes what every live process logged to
/// the real standard error (the test harness captures only what `print!`
/// and `eprint!` write),
/// kills them and aborts, so the run fails here with the evidence.
pub fn arm_watchdog() {
    static ARMED: OnceLock<()> = OnceLock::new();
    ARMED.get_or_init(|| {
        let limit = std::env::var("LEASELINE_TEST_BINARY_LIMIT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(BINARY_LIMIT);
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            use std::io::Write;
            let live = LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(
                err,
                "\n===== this test binary ran past {limit:?}: a test hangs; \
                 {} processes it started are alive =====",
                live.len()
            );
            for (pid, name, log) in &live {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                let _ = writeln!(err, "----- {name} (pid {pid}), last lines of its log -----");
                for l in tail.iter().rev() {
                    let _ = writeln!(err, "{l}");
                }
                unsafe {
                    libc::kill(*pid as i32, libc::SIGKILL);
                }
            }
            let _ = err.flush();
            std::process::abort();
        });
    });
}

pub fn free_port() -> u16 {
    arm_watchdog();
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process whose output goes to a log file; killed on drop, and
/// its log printed if the test is failing.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        cmd.stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        track(child.id(), name, &log);
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// True while the process has not exited.
    pub fn running(&mut self) -> bool {
        let exited = self.child.try_wait().unwrap().is_some();
        if exited {
            reaped(self.child.id());
        }
        !exited
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }

    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                reaped(self.child.id());
                return s;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} did not exit within {timeout:?}:\n{}",
                    self.name,
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        reaped(self.child.id());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        reaped(self.child.id());
        if std::thread::panicking() {
            eprintln!("----- log of {} -----\n{}", self.name, self.logs());
        }
    }
}

/// A tansu broker with in-memory storage on a free loopback port.
pub struct Broker {
    pub addr: String,
    pub proc: Proc,
}

impl Broker {
    pub fn start(dir: &Path) -> Broker {
        let tansu = std::env::var("TANSU").unwrap_or_else(|_| "tansu".into());
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let mut cmd = Command::new(&tansu);
        cmd.args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "memory://tansu/",
        ])
        .env("RUST_LOG", "warn");
        let proc = Proc::spawn("tansu", cmd, dir);
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {addr} (is it installed? scripts/test.sh installs it):\n{}",
                proc.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Broker { addr, proc }
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.addr)
            .create()
            .unwrap();
        let res = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics");
        for r in res {
            r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
        }
    }

    pub fn producer(&self) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.addr)
            // One message per record batch. tansu 0.6 answers a fetch
            // that starts inside a batch with the batches after it only
            // (tansu-storage dynostore.rs `fetch`: `offsets.split_off(&offset)`
            // on batch base offsets), so resuming mid-batch would skip the
            // rest of that batch, or stall on the partition's last batch.
            // Kafka returns the batch holding the offset; leaseline resumes
            // at arbitrary offsets, so the tests must not depend on the bug.
            .set("linger.ms", "0")
            .set("batch.num.messages", "1")
            .set("message.timeout.ms", "60000")
            .create()
            .unwrap()
    }
}

/// `leaseline ingest` of one topic into `lake` as consumer group `group`,
/// without background compaction; callers add their own flags.
pub fn ingest_command(broker: &Broker, lake: &Path, topic: &str, group: &str) -> Command {
    let mut cmd = leaseline();
    cmd.args(["ingest", "--lake"])
        .arg(lake)
        .args([
            "--brokers",
            &broker.addr,
            "--topic",
            topic,
            "--group-id",
            group,
        ])
        .arg("--no-compaction");
    cmd
}

/// Where a produced message landed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Landed {
    pub partition: i32,
    pub offset: i64,
}

/// Produces messages (key, value) and returns where each landed, in order.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    msgs: &[(String, Vec<u8>)],
) -> Vec<Landed> {
    use futures_like::join_all_chunked;
    let landed = join_all_chunked(msgs, 2000, |(key, value)| {
        let producer = producer.clone();
        let topic = topic.to_string();
        let key = key.clone();
        let value = value.clone();
        async move {
            let rec = FutureRecord::to(&topic).key(&key).payload(&value);
            let (partition, offset) = producer
                .send(rec, Duration::from_secs(30))
                .await
                .map(|d| (d.partition, d.offset))
                .map_err(|(e, _)| e)
                .expect("produce");
            Landed { partition, offset }
        }
    })
    .await;
    producer.flush(Duration::from_secs(30)).unwrap();
    landed
}

mod futures_like {
    use std::future::Future;

    /// Runs futures in chunks so at most `chunk` are in flight.
    pub async fn join_all_chunked<T, F, Fut, R>(items: &[T], chunk: usize, f: F) -> Vec<R>
    where
        F: Fn(&T) -> Fut,
        Fut: Future<Output = R> + Send + 'static,
        R: Send + 'static,
    {
        let mut out = Vec::with_capacity(items.len());
        for c in items.chunks(chunk) {
            let handles: Vec<_> = c.iter().map(|i| tokio::spawn(f(i))).collect();
            for h in handles {
                out.push(h.await.unwrap());
            }
        }
        out
    }
}

/// A generated mix of valid events, duplicates and malformed messages.
pub struct Dataset {
    /// (key, value) in production order.
    pub messages: Vec<(String, Vec<u8>)>,
    /// For each message: Some(reason) if malformed.
    pub expected_reason: Vec<Option<String>>,
    /// Canonical text of each unique valid event, by event_id.
    pub unique: BTreeMap<String, String>,
}

/// The malformed messages of every reject reason, with the reason.
pub fn malformed_samples() -> Vec<(Vec<u8>, &'static str)> {
    let ok =
        r#""ts":"2026-09-14T10:00:00Z","source":"coordinator","lease_id":"l/1","holder_id":"h""#;
    vec![
        (b"\xff\xfe not utf8".to_vec(), "invalid_utf8"),
        (b"{\"ts\": ".to_vec(), "invalid_json"),
        (b"".to_vec(), "invalid_json"),
        (b"[1,2,3]".to_vec(), "not_an_object"),
        (
            br#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","holder_id":"h","fencing_token":1,"ttl_ms":5}"#.to_vec(),
            "missing_field:lease_id",
        ),
        (format!(r#"{{{ok},"kind":"acquired","ttl_ms":5}}"#).into_bytes(), "missing_field:fencing_token"),
        (format!(r#"{{{ok},"kind":"acquired","fencing_token":"7","ttl_ms":5}}"#).into_bytes(), "wrong_type:fencing_token"),
        (format!(r#"{{{ok},"kind":"acquired","fencing_token":-7,"ttl_ms":5}}"#).into_bytes(), "out_of_range:fencing_token"),
        (format!(r#"{{{ok},"kind":"acquired","fencing_token":7,"ttl_ms":0}}"#).into_bytes(), "out_of_range:ttl_ms"),
        (format!(r#"{{{ok},"kind":"teleported"}}"#).into_bytes(), "unknown_kind"),
        (
            br#"{"ts":"2026-09-14T10:00:00Z","kind":"released","source":"oracle","lease_id":"l","holder_id":"h","fencing_token":1}"#.to_vec(),
            "unknown_source",
        ),
        (
            br#"{"ts":"14/09/2026","kind":"released","source":"holder","lease_id":"l","holder_id":"h","fencing_token":1}"#.to_vec(),
            "bad_timestamp",
        ),
        (format!(r#"{{{ok},"kind":"released","fencing_token":1,"trace_id":"ABC"}}"#).into_bytes(), "bad_format:trace_id"),
    ]
}

const KINDS: [&str; 6] = [
    "acquired",
    "renewed",
    "released",
    "write_accepted",
    "renew_failed",
    "expired",
];

impl Dataset {
    /// `n` messages in all: about 90 % valid unique events, 5 % re-sent
    /// duplicates, 5 % malformed messages cycling through every reason.
    pub fn generate(n: usize, seed: u64) -> Dataset {
        let mut rng = StdRng::seed_from_u64(seed);
        let bad = malformed_samples();
        let mut messages: Vec<(String, Vec<u8>)> = Vec::with_capacity(n);
        let mut expected_reason = Vec::with_capacity(n);
        let mut unique = BTreeMap::new();
        let mut sent: Vec<usize> = Vec::new();
        let mut bad_i = 0;
        for i in 0..n {
            let roll: f64 = rng.random();
            if roll < 0.05 && !sent.is_empty() {
                let j = sent[rng.random_range(0..sent.len())];
                let (k, v) = messages[j].clone();
                messages.push((k, v));
                expected_reason.push(None);
            } else if roll < 0.10 {
                let (raw, reason) = &bad[bad_i % bad.len()];
                bad_i += 1;
                messages.push((format!("bad-{i}"), raw.clone()));
                expected_reason.push(Some(reason.to_string()));
            } else {
                let lease = format!("orders/order-{}", rng.random_range(0..500));
                let kind = KINDS[rng.random_range(0..KINDS.len())];
                let token: u64 = rng.random_range(1..1_000_000);
                let ts_ms: i64 = 1_789_380_000_000 + (i as i64) * 7;
                let id = format!("ev-{seed}-{i}");
                let mut v = serde_json::json!({
                    "ts": ts_ms,
                    "kind": kind,
                    "source": "coordinator",
                    "lease_id": lease,
                    "holder_id": format!("worker-{}", rng.random_range(0..50)),
                    "fencing_token": token,
                    "backend": "etcd",
                    "event_id": id,
                });
                if kind == "acquired" {
                    v["ttl_ms"] = serde_json::json!(10_000);
                }
                let canon = canonical(&id, ts_ms * 1000, kind, &lease, token);
                unique.insert(id, canon);
                messages.push((lease, serde_json::to_vec(&v).unwrap()));
                expected_reason.push(None);
                sent.push(messages.len() - 1);
            }
        }
        Dataset {
            messages,
            expected_reason,
            unique,
        }
    }

    pub fn checksum(&self) -> u64 {
        checksum(self.unique.values().cloned().collect())
    }

    pub fn malformed(&self) -> usize {
        self.expected_reason.iter().filter(|r| r.is_some()).count()
    }
}

pub fn canonical(id: &str, ts_us: i64, kind: &str, lease: &str, token: u64) -> String {
    format!("{id}|{ts_us}|{kind}|{lease}|{token}")
}

pub fn checksum(mut rows: Vec<String>) -> u64 {
    rows.sort();
    xxhash_rust::xxh3::xxh3_64(rows.join("\n").as_bytes())
}

/// The `leaseline` binary under test.
pub fn leaseline() -> Command {
    arm_watchdog();
    Command::new(env!("CARGO_BIN_EXE_leaseline"))
}

/// Runs a command to the end and returns its output, panicking with the
/// command line and its stderr unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `leaseline sql` and returns stdout, panicking with stderr on failure.
pub fn sql(lake: &Path, query: &str, format: &str) -> String {
    let out = run_ok(
        leaseline()
            .args(["sql", "--lake"])
            .arg(lake)
            .args(["--format", format, query]),
    );
    String::from_utf8(out.stdout).unwrap()
}

/// [`sql`] with the audit's tables computed from every event of
/// `lease_events` rather than from the stored audit rows: the reference
/// the stored rows are checked against.
pub fn sql_auditing_all(lake: &Path, query: &str, format: &str) -> String {
    let out = run_ok(
        leaseline()
            .env("LEASELINE_AUDIT_READ_STORED", "false")
            .args(["sql", "--lake"])
            .arg(lake)
            .args(["--format", format, query]),
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Whether `leaseline sql` answers the audit's tables of `lake` from its
/// stored audit rows (as its debug log says) rather than by auditing
/// every event.
pub fn sql_reads_stored_rows(lake: &Path) -> bool {
    let out = run_ok(
        leaseline()
            .env("LEASELINE_LOG", "leaseline_query=debug")
            .env("NO_COLOR", "1")
            .args(["sql", "--lake"])
            .arg(lake)
            .args(["--format", "csv", "SELECT count(*) FROM lease_timeline"]),
    );
    String::from_utf8_lossy(&out.stderr)
        .contains("the audit's tables are the stored audit rows and the events after them")
}

/// Runs `scripts/lake_readers.py` on `table` of the lake (a directory or
/// an `s3://` URL, with `env` for the engines' credentials): what the
/// Python `deltalake` package, polars, DuckDB's delta extension and
/// `leaseline sql` each read.
fn lake_readers(lake: &str, table: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/lake_readers.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--leaseline", env!("CARGO_BIN_EXE_leaseline")])
        .args([lake, table])
        .envs(env.iter().copied())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "another engine could not read {table} (scripts/test.sh installs deltalake, polars, duckdb-ext-delta):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Reads `table` of the lake with every reader of [`lake_readers`],
/// asserts that all four see the same rows, and returns how many.
pub fn readers_agree(lake: &str, table: &str, env: &[(&str, &str)]) -> u64 {
    let v = lake_readers(lake, table, env);
    let theirs = &v["leaseline"];
    for reader in ["deltalake", "polars", "duckdb"] {
        assert_eq!(
            &v[reader], theirs,
            "{reader} and leaseline disagree on {table}: {v}"
        );
    }
    theirs["rows"].as_u64().unwrap()
}

/// Reads a stored audit table (`lease_timeline`, `lease_violations`) of
/// the lake directory `lake` with the Python `deltalake` package, polars
/// and DuckDB's delta extension, asserts that the three see the same rows
/// and that each of them is a row `leaseline sql` answers for that table,
/// none stored twice; returns the leases that have stored rows.
pub fn stored_rows_are_answered_once(lake: &Path, table: &str) -> Vec<String> {
    // leaseline's answer is the audit of every event, not the stored rows
    // themselves (which would make the check hold by construction).
    let v = lake_readers(
        lake.to_str().unwrap(),
        table,
        &[("LEASELINE_AUDIT_READ_STORED", "false")],
    );
    for reader in ["polars", "duckdb"] {
        assert_eq!(
            v[reader], v["deltalake"],
            "{reader} and deltalake disagree on {table}: {v}"
        );
    }
    assert_eq!(
        v["within"], true,
        "{table} stores a row leaseline does not answer, or one twice: {v}"
    );
    v["stored_leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// The most cuts at which `lease_context` holds one lease's context rows,
/// as the `deltalake` package reads it (polars and DuckDB agreeing on the
/// rows).
pub fn context_cuts_per_lease(lake: &Path) -> u64 {
    let v = lake_readers(lake.to_str().unwrap(), "lease_context", &[]);
    for reader in ["polars", "duckdb"] {
        assert_eq!(v[reader], v["deltalake"], "{reader} on lease_context: {v}");
    }
    v["cuts_per_lease"].as_u64().unwrap()
}

/// `SELECT count(*)` of a table, as a number.
pub fn count(lake: &Path, table: &str) -> usize {
    let out = sql(lake, &format!("SELECT count(*) AS n FROM {table}"), "csv");
    out.lines().nth(1).unwrap_or("0").trim().parse().unwrap()
}

/// The events the lake has committed, or None before its first flush.
pub fn committed_events(lake: &Path) -> Option<usize> {
    let out = leaseline()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(lake)
        .arg("SELECT count(*) AS n FROM lease_events")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|n| n.trim().parse::<usize>().ok())
}

/// Canonical rows of `lease_events`, for the checksum.
pub fn lake_events(lake: &Path) -> Vec<String> {
    let out = sql(
        lake,
        "SELECT event_id, CAST(ts AS BIGINT) AS ts_us, kind, lease_id, fencing_token FROM lease_events",
        "csv",
    );
    out.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            canonical(
                f[0],
                f[1].parse().unwrap(),
                f[2],
                f[3],
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

/// (partition, offset, reason) of every row of `lease_rejects` from `topic`.
pub fn lake_rejects(lake: &Path, topic: &str) -> Vec<(i32, i64, String)> {
    let out = sql(
        lake,
        &format!(
            "SELECT kafka_partition, kafka_offset, reason FROM lease_rejects WHERE kafka_topic = '{topic}'"
        ),
        "csv",
    );
    let mut v: Vec<(i32, i64, String)> = out
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.splitn(3, ',').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Polls until `f` returns true or the timeout passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

pub fn read_to_string(mut r: impl Read) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}

/// The quick-start sample (78 events, clean, 4 malformed lines).
pub fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../samples/lease-events.ndjson")
}

/// A payment lease handed over badly: grant 8 starts while grant 7 is
/// still held, the old holder's write lands after the new holder's, and a
/// later grant goes backwards to token 5.
pub const UNSAFE: &str = r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"pay/acct-9","holder_id":"b-1","fencing_token":7,"ttl_ms":10000,"event_id":"u1"}
{"ts":"2026-09-14T10:00:06.000Z","kind":"acquired","source":"coordinator","lease_id":"pay/acct-9","holder_id":"b-2","fencing_token":8,"ttl_ms":10000,"event_id":"u2"}
{"ts":"2026-09-14T10:00:07.000Z","kind":"write_accepted","source":"resource","lease_id":"pay/acct-9","holder_id":"b-2","fencing_token":8,"event_id":"u3"}
{"ts":"2026-09-14T10:00:08.000Z","kind":"write_accepted","source":"resource","lease_id":"pay/acct-9","holder_id":"b-1","fencing_token":7,"event_id":"u4"}
{"ts":"2026-09-14T10:00:09.000Z","kind":"released","source":"holder","lease_id":"pay/acct-9","holder_id":"b-1","fencing_token":7,"event_id":"u5"}
{"ts":"2026-09-14T10:00:20.000Z","kind":"acquired","source":"coordinator","lease_id":"pay/acct-9","holder_id":"b-3","fencing_token":5,"ttl_ms":10000,"event_id":"u6"}
"#;

pub fn write_unsafe(dir: &Path) -> PathBuf {
    let p = dir.join("unsafe.ndjson");
    std::fs::write(&p, UNSAFE).unwrap();
    p
}

/// Imports NDJSON files into the lake with `leaseline import`.
pub fn import_files(lake: &Path, files: &[PathBuf]) {
    import_with(lake, files, &[]);
}

/// `leaseline import` with extra flags; returns its stdout (the summary).
pub fn import_with(lake: &Path, files: &[impl AsRef<std::ffi::OsStr>], extra: &[&str]) -> String {
    let out = run_ok(
        leaseline()
            .args(["import", "--lake"])
            .arg(lake)
            .args(extra)
            .args(files),
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `leaseline serve` on a free port, killed on drop.
pub struct Server {
    pub proc: Proc,
    /// `http://127.0.0.1:PORT` (`https://` with TLS)
    pub http: String,
    /// The PostgreSQL protocol's port.
    pub pg_port: u16,
    /// Given to every curl of [`Server::get`] and [`Server::sql`] (e.g.
    /// `--cacert`).
    pub curl_args: Vec<String>,
}

impl Server {
    /// Starts `leaseline serve --lake LAKE --http-listen 127.0.0.1:0 ARGS`
    /// and waits until `/health` answers.
    pub fn start(lake: &Path, args: &[&str], dir: &Path) -> Server {
        Server::start_expecting(lake, args, dir, 200)
    }

    /// [`Server::start`] with `--ingest` from `topic` of the broker at
    /// `brokers`, and `args` after.
    pub fn ingesting(lake: &Path, brokers: &str, topic: &str, args: &[&str], dir: &Path) -> Server {
        let mut all = vec!["--ingest", "--brokers", brokers, "--topic", topic];
        all.extend_from_slice(args);
        Server::start(lake, &all, dir)
    }

    /// Like [`Server::start`], waiting until `/health` answers `health`
    /// (503 for a lake that is damaged).
    pub fn start_expecting(lake: &Path, args: &[&str], dir: &Path, health: u16) -> Server {
        Server::start_with(lake, args, dir, health, &[])
    }

    /// Like [`Server::start_expecting`], with curl arguments for every
    /// request (`--cacert` for a server with TLS).
    pub fn start_with(
        lake: &Path,
        args: &[&str],
        dir: &Path,
        health: u16,
        curl_args: &[&str],
    ) -> Server {
        let mut cmd = leaseline();
        cmd.args(["serve", "--lake"])
            .arg(lake)
            .args(["--http-listen", "127.0.0.1:0", "--pg-listen", "127.0.0.1:0"])
            .args(args)
            .env("LEASELINE_LOG", "info");
        // One log per server: a second server in the same directory must
        // not find the first one's address.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let proc = Proc::spawn(&format!("serve-{n}"), cmd, dir);
        let marker = "HTTP API listening on ";
        let deadline = Instant::now() + Duration::from_secs(60);
        let http = loop {
            let logs = proc.logs();
            if let Some(i) = logs.find(marker) {
                let rest = &logs[i + marker.len()..];
                break rest.chars().take_while(|c| !c.is_whitespace()).collect();
            }
            assert!(Instant::now() < deadline, "serve did not start:\n{logs}");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut server = Server {
            proc,
            http,
            pg_port: 0,
            curl_args: curl_args.iter().map(|a| a.to_string()).collect(),
        };
        assert!(
            wait_until(Duration::from_secs(30), || server.get("/health").status
                == health),
            "health never answered {health}"
        );
        // The PostgreSQL listener is bound before the HTTP API serves.
        let pg_marker = "PostgreSQL listening on ";
        let logs = server.proc.logs();
        if let Some(i) = logs.find(pg_marker) {
            let rest = &logs[i + pg_marker.len()..];
            let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
            server.pg_port = addr.rsplit(':').next().unwrap().parse().unwrap();
        }
        server
    }

    fn curl(&self, args: &[&str]) -> HttpReply {
        let mut all: Vec<&str> = self.curl_args.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        curl(&all)
    }

    pub fn get(&self, path: &str) -> HttpReply {
        self.curl(&[&format!("{}{path}", self.http)])
    }

    pub fn get_as(&self, path: &str, accept: &str) -> HttpReply {
        self.curl(&[
            "-H",
            &format!("Accept: {accept}"),
            &format!("{}{path}", self.http),
        ])
    }

    /// POSTs `body` to `/api/v1/sql` with extra curl arguments.
    pub fn sql(&self, body: &str, args: &[&str]) -> HttpReply {
        let url = format!("{}/api/v1/sql", self.http);
        let mut all = vec!["-X", "POST", "--data-binary", body];
        all.extend_from_slice(args);
        all.push(&url);
        self.curl(&all)
    }
}

/// An HTTP reply, as curl saw it.
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Runs curl; the status and content type come from `--write-out`.
pub fn curl(args: &[&str]) -> HttpReply {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "60",
            "-o",
            "-",
            "-w",
            "\n%{http_code} %{content_type}",
        ])
        .args(args)
        .output()
        .expect("curl");
    let mut body = out.stdout;
    let pos = body.iter().rposition(|b| *b == b'\n').unwrap_or(0);
    let trailer = String::from_utf8_lossy(&body[pos + 1..]).into_owned();
    body.truncate(pos);
    let mut parts = trailer.splitn(2, ' ');
    let status = parts.next().unwrap_or("0").parse().unwrap_or(0);
    let content_type = parts.next().unwrap_or("").to_string();
    HttpReply {
        status,
        content_type,
        body,
    }
}

/// Waits until `url` answers 200, or panics with the process's log.
fn wait_ready(url: &str, proc: &Proc, what: &str) {
    assert!(
        wait_until(Duration::from_secs(60), || curl(&[url]).status == 200),
        "{what} did not become ready at {url} (scripts/test.sh installs it):\n{}",
        proc.logs()
    );
}

/// Debian's Prometheus Alertmanager on a loopback port, killed on drop.
pub struct Alertmanager {
    pub url: String,
    pub port: u16,
    pub proc: Option<Proc>,
    dir: PathBuf,
    /// `--web.config.file`, when it serves HTTPS with basic auth.
    web_config: Option<PathBuf>,
    /// What curl needs to reach it (the CA, the credentials).
    curl_args: Vec<String>,
}

impl Alertmanager {
    /// A free port for an Alertmanager started later with [`Alertmanager::start_on`].
    pub fn start(dir: &Path) -> Alertmanager {
        let mut am = Alertmanager::stopped(dir, free_port());
        am.run();
        am
    }

    /// An Alertmanager that is not running yet: its URL is known.
    pub fn stopped(dir: &Path, port: u16) -> Alertmanager {
        Alertmanager {
            url: format!("http://127.0.0.1:{port}"),
            port,
            proc: None,
            dir: dir.to_path_buf(),
            web_config: None,
            curl_args: Vec::new(),
        }
    }

    /// An Alertmanager serving HTTPS with a certificate of `pki` and
    /// requiring basic auth as `user` with `password` (stored as a bcrypt
    /// hash, as Alertmanager's web configuration wants it).
    pub fn start_secured(dir: &Path, pki: &Pki, user: &str, password: &str) -> Alertmanager {
        let port = free_port();
        let (cert, key) = pki.issue("alertmanager");
        let hash = bcrypt_hash(password);
        let web = dir.join("alertmanager-web.yml");
        std::fs::write(
            &web,
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {user}: '{hash}'\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let mut am = Alertmanager::stopped(dir, port);
        am.url = format!("https://127.0.0.1:{port}");
        am.web_config = Some(web);
        am.curl_args = vec![
            "--cacert".into(),
            pki.ca.display().to_string(),
            "-u".into(),
            format!("{user}:{password}"),
        ];
        am.run();
        am
    }

    fn curl(&self, path: &str) -> HttpReply {
        let url = format!("{}{path}", self.url);
        let mut args: Vec<&str> = self.curl_args.iter().map(String::as_str).collect();
        args.push(&url);
        curl(&args)
    }

    pub fn run(&mut self) {
        let config = self.dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            "route:\n  receiver: devnull\n  group_wait: 1s\nreceivers:\n  - name: devnull\n",
        )
        .unwrap();
        let bin =
            std::env::var("ALERTMANAGER").unwrap_or_else(|_| "prometheus-alertmanager".into());
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.path={}",
                self.dir.join("am-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--cluster.listen-address=");
        if let Some(web) = &self.web_config {
            cmd.arg(format!("--web.config.file={}", web.display()));
        }
        let proc = Proc::spawn("alertmanager", cmd, &self.dir);
        assert!(
            wait_until(Duration::from_secs(60), || self.curl("/-/ready").status
                == 200),
            "Alertmanager did not become ready at {} (scripts/test.sh installs it):\n{}",
            self.url,
            proc.logs()
        );
        self.proc = Some(proc);
    }

    /// The alerts Alertmanager lists as active (resolved ones drop out).
    pub fn alerts(&self) -> Vec<serde_json::Value> {
        let reply = self.curl("/api/v2/alerts");
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json().as_array().cloned().unwrap_or_default()
    }

    /// The active alerts named `name`.
    pub fn named(&self, name: &str) -> Vec<serde_json::Value> {
        self.alerts()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .collect()
    }
}

/// Debian's Prometheus scraping one target every second, killed on drop.
pub struct Prometheus {
    pub url: String,
    pub proc: Proc,
}

impl Prometheus {
    pub fn start(dir: &Path, target: &str) -> Prometheus {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: leaseline\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let bin = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prom-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let proc = Proc::spawn("prometheus", cmd, dir);
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(&format!("{url}/-/ready"), &proc, "Prometheus");
        Prometheus { url, proc }
    }

    /// An instant query's result vector.
    pub fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let reply = curl(&[
            "-G",
            "--data-urlencode",
            &format!("query={q}"),
            &format!("{}/api/v1/query", self.url),
        ]);
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// One request an [`HttpSink`] received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// A minimal HTTP server that answers 200 to everything and keeps what it
/// got: the receiving end of webhooks and OTLP exports.
pub struct HttpSink {
    pub url: String,
    pub received: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
}

impl HttpSink {
    pub fn start() -> HttpSink {
        use std::io::{BufRead, BufReader, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    // Requests on one connection, until the client closes it.
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut parts = line.split_whitespace();
                        let method = parts.next().unwrap_or_default().to_string();
                        let path = parts.next().unwrap_or_default().to_string();
                        let (mut len, mut content_type) = (0usize, String::new());
                        loop {
                            let mut h = String::new();
                            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = h.split_once(':') {
                                match k.trim().to_ascii_lowercase().as_str() {
                                    "content-length" => len = v.trim().parse().unwrap_or(0),
                                    "content-type" => content_type = v.trim().to_string(),
                                    _ => {}
                                }
                            }
                        }
                        let mut body = vec![0; len];
                        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
                            return;
                        }
                        sink.lock().unwrap().push(Received {
                            method,
                            path,
                            content_type,
                            body,
                        });
                        let _ = stream.write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n",
                        );
                    }
                });
            }
        });
        HttpSink { url, received }
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// How many events `leaseline simulate` says it produced (its last line on
/// stderr: "simulated N events: ...").
pub fn simulated_count(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("simulated "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("simulate said: {stderr}"))
}

/// A violation (of the ground truth, `check`, or `lease_violations`) as
/// `kind lease_id fencing_token`, for comparing sets.
pub fn violation_key(v: &serde_json::Value) -> String {
    format!(
        "{} {} {}",
        v["kind"].as_str().expect("kind"),
        v["lease_id"].as_str().expect("lease_id"),
        v["fencing_token"]
    )
}

/// Panics unless `xml` parses as XML 1.0 (Python's parser, as strict as a
/// browser's about what a document may hold).
pub fn assert_well_formed(xml: &str) {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parseString(sys.stdin.buffer.read())",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(xml.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "not well-formed XML: {}\n{xml}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Alertmanager's form of a password: a bcrypt hash, made with Python's
/// bcrypt (scripts/test.sh installs it). Cost 4, the least: the test
/// needs a valid hash, not a slow one.
pub fn bcrypt_hash(password: &str) -> String {
    let out = run_ok(Command::new("python3").args([
        "-c",
        "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
        password,
    ]));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A private CA made with the openssl CLI, and the certificates it signs.
pub struct Pki {
    dir: PathBuf,
    /// The CA's certificate (PEM): what a client trusts.
    pub ca: PathBuf,
    ca_key: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        let dir = dir.join(format!("pki-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, ca_key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        run_ok(Command::new("openssl").args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=leaseline test CA {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            ca_key.to_str().unwrap(),
            "-out",
            ca.to_str().unwrap(),
        ]));
        Pki { dir, ca, ca_key }
    }

    /// A certificate named `name` for 127.0.0.1 and localhost, for a
    /// server or a client: (certificate, key), both PEM.
    pub fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        let cert = self.dir.join(format!("{name}.pem"));
        let key = self.dir.join(format!("{name}-key.pem"));
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        run_ok(Command::new("openssl").args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
        ]));
        run_ok(Command::new("openssl").args([
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            csr.to_str().unwrap(),
            "-CA",
            self.ca.to_str().unwrap(),
            "-CAkey",
            self.ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-extfile",
            ext.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ]));
        (cert, key)
    }
}

/// What an [`HttpsSink`] recorded of one request.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct HttpsRequest {
    pub path: String,
    pub authorization: Option<String>,
    /// The common name of the client certificate.
    pub client: Option<String>,
    pub body: String,
}

/// An HTTPS server (Python's http.server and ssl) that requires a client
/// certificate of its CA, answers 200 to `Authorization: Bearer <token>`
/// and 401 to anything else, and records every request.
pub struct HttpsSink {
    pub url: String,
    pub proc: Proc,
    log: PathBuf,
}

const HTTPS_SINK: &str = r#"
import http.server, json, ssl, sys
port, cert, key, ca, token, log = sys.argv[1:7]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        subject = dict(x[0] for x in self.connection.getpeercert().get("subject", ()))
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "authorization": self.headers.get("Authorization"),
                                "client": subject.get("commonName"), "body": body.decode()}) + "\n")
        self.send_response(200 if self.headers.get("Authorization") == "Bearer " + token else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(ca)
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("listening", flush=True)
server.serve_forever()
"#;

impl HttpsSink {
    pub fn start(dir: &Path, pki: &Pki, token: &str) -> HttpsSink {
        let port = free_port();
        let (cert, key) = pki.issue("webhook");
        let script = dir.join("https_sink.py");
        std::fs::write(&script, HTTPS_SINK).unwrap();
        let log = dir.join("https_sink.requests");
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg(port.to_string())
            .args([&cert, &key, &pki.ca])
            .arg(token)
            .arg(&log);
        let proc = Proc::spawn("https-sink", cmd, dir);
        assert!(
            wait_until(Duration::from_secs(30), || proc
                .logs()
                .contains("listening")),
            "the HTTPS sink did not start:\n{}",
            proc.logs()
        );
        HttpsSink {
            url: format!("https://127.0.0.1:{port}"),
            proc,
            log,
        }
    }

    pub fn requests(&self) -> Vec<HttpsRequest> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The value of one series on a `/metrics` page, e.g.
/// `leaseline_alert_delivery_failures_total{receiver="am"}`; 0 when absent.
pub fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// moto's S3 server on a free loopback port (from PyPI, installed by
/// `scripts/test.sh`), with one bucket; killed on drop.
pub struct S3Server {
    pub proc: Proc,
    pub endpoint: String,
    pub bucket: String,
}

impl S3Server {
    pub fn start(log_dir: &Path, bucket: &str) -> S3Server {
        let port = free_port();
        let mut cmd = Command::new("python3");
        cmd.args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        let proc = Proc::spawn("moto", cmd, log_dir);
        let endpoint = format!("http://127.0.0.1:{port}");
        let s3 = S3Server {
            proc,
            endpoint,
            bucket: bucket.to_string(),
        };
        let script = format!(
            "import boto3\nboto3.client('s3', endpoint_url='{}', aws_access_key_id='test', aws_secret_access_key='test', region_name='us-east-1').create_bucket(Bucket='{bucket}')",
            s3.endpoint
        );
        let made = wait_until(Duration::from_secs(60), || {
            Command::new("python3")
                .args(["-c", &script])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        assert!(made, "moto's S3 server did not start:\n{}", s3.proc.logs());
        s3
    }

    /// The environment under which leaseline and the other readers reach
    /// this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// Puts [`S3Server::env`] into this process's environment, for every
    /// command the test starts.
    pub fn export_env(&self) {
        for (k, v) in self.env() {
            std::env::set_var(k, v);
        }
    }

    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }
}

/// Starts `leaseline watch ...` (`cmd`) and waits until it logs that it
/// is watching (its first resync done) once more than before.
pub fn spawn_watch(cmd: Command, dir: &Path) -> Proc {
    let mut p = Proc::spawn("watch", cmd, dir);
    let runs = p.logs().matches(" watching").count();
    assert!(
        wait_until(Duration::from_secs(60), || {
            assert!(p.running(), "watch exited:\n{}", p.logs());
            p.logs().matches(" watching").count() > runs
        }),
        "watch did not start:\n{}",
        p.logs()
    );
    p
}

/// The locks a watcher's state file says were reported: name, token and
/// deadline; none before its first save.
pub fn watch_state_locks(state: &Path) -> Vec<(String, u64, i64)> {
    let Ok(bytes) = std::fs::read(state) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["locks"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, h)| {
            (
                k.clone(),
                h["token"].as_u64().unwrap(),
                h["deadline_ms"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The watch tests' view of the grants, in a fixed order.
pub const WATCH_TIMELINE_SQL: &str =
    "SELECT lease_id, fencing_token, holder_id, end_kind, renewals, backend \
     FROM lease_timeline ORDER BY lease_id, fencing_token";

/// A restarted watcher's run (`w`) sent the `transitions` made while it
/// ran, and perhaps one more: a release the killed run may not have sent.
#[track_caller]
pub fn assert_second_run_sent(w: &Proc, transitions: u64) {
    let sent = last_run_events(&w.logs());
    assert!(
        (transitions..=transitions + 1).contains(&sent),
        "the second run sent {sent} events: the {transitions} transitions of its time, and the release the first run may not have sent:\n{}",
        w.logs()
    );
}

/// The `events=` of the last `watch stopped` line: what that run sent.
pub fn last_run_events(log: &str) -> u64 {
    let line = log
        .lines()
        .rfind(|l| l.contains("watch stopped"))
        .expect("a watch stopped line");
    let at = line.find("events=").unwrap() + "events=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `count(*)` of `lease_events` as `serve` answers it; 0 before it answers.
pub fn served_events(server: &Server) -> usize {
    let out = server
        .sql(
            "SELECT count(*) AS n FROM lease_events",
            &["-H", "Accept: text/csv"],
        )
        .text();
    out.lines()
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `serve` holds `n` events, then asserts it holds no more:
/// a watcher (`w`, whose logs a failure shows) sent each transition once.
pub fn wait_for_events(server: &Server, n: usize, w: &Proc) {
    let mut seen = 0;
    let ok = wait_until(Duration::from_secs(30), || {
        seen = served_events(server);
        seen >= n
    });
    assert!(ok, "{seen} events served, waited for {n}:\n{}", w.logs());
    assert_eq!(seen, n, "more events than transitions:\n{}", w.logs());
}

/// The end of a watcher's run through `serve --ingest`: `serve` answers
/// `timeline_sql` with `timeline`, then stops cleanly, and `leaseline sql`
/// on the lake answers the same; `lease_events` holds `kinds` (the CSV of
/// kind, rows and distinct ids: every event once).
pub fn assert_served_then_stored(
    mut server: Server,
    lake: &Path,
    timeline_sql: &str,
    timeline: &str,
    kinds: &str,
) {
    assert_eq!(
        server.sql(timeline_sql, &["-H", "Accept: text/csv"]).text(),
        timeline
    );
    assert!(server.proc.terminate(Duration::from_secs(30)).success());
    assert_eq!(sql(lake, timeline_sql, "csv"), timeline);
    assert_eq!(
        sql(
            lake,
            "SELECT kind, count(*) AS n, count(DISTINCT event_id) AS ids FROM lease_events GROUP BY kind ORDER BY kind",
            "csv"
        ),
        kinds
    );
}
