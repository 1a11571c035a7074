//! Catching up a backlog with alerts on, against ingest with alerting off,
//! on the same topic in the same run; driven by `scripts/bench-catchup.sh`.
//!
//! Usage: `bench_catchup BROKER LEASELINE_BIN WORK_DIR HISTORY ROUNDS [WINDOWS]`
//!
//! HISTORY is an NDJSON file (a simulated history with every fault on). It
//! is produced to a 3-partition topic keyed by `lease_id`, then each round
//! runs, one after the other, each from the topic's start with a consumer
//! group and a lake of its own:
//! - **off**: `leaseline ingest`, timed until the lake has committed every
//!   event;
//! - **on**: `leaseline serve --ingest` with a webhook receiver, timed until
//!   the lake has committed every event and the receiver has had every
//!   alert `check FILE` reports for the history as firing; its peak RSS
//!   (`VmHWM`) is read then. With WINDOWS (`10m,0s`, say), one "on" run
//!   per `audit.event_window` given, one after the other.
//!
//! After each "on" round the process is stopped and the firing alerts the
//! receiver got are compared with `check FILE`'s, by (alertname, lease_id,
//! holder_id, kind): a missing or a false one fails the run.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

mod common;

const TOPIC: &str = "catchup";

/// The alerts a history proves by its events alone.
const EVENT_ALERTS: [&str; 3] = [
    "LeaseForcedExpiry",
    "LeaseStaleWriteRejected",
    "LeaseSafetyViolation",
];

fn key(labels: &serde_json::Value) -> String {
    let s = |k: &str| labels[k].as_str().unwrap_or("").to_string();
    format!(
        "{} {} {} {}",
        s("alertname"),
        s("lease_id"),
        s("holder_id"),
        s("kind")
    )
}

fn committed(lake: &Path) -> u64 {
    common::committed_rows(lake).0
}

/// A webhook receiver: every alert sent as firing, by key.
#[derive(Clone, Default)]
struct Receiver {
    firing: Arc<Mutex<BTreeSet<String>>>,
}

impl Receiver {
    /// Serves on a free loopback port; returns its URL.
    fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let me = self.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let me = me.clone();
                std::thread::spawn(move || me.serve(conn));
            }
        });
        url
    }

    fn serve(&self, conn: std::net::TcpStream) {
        let mut out = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        loop {
            let mut len = 0usize;
            let mut line = String::new();
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                let mut firing = self.firing.lock().unwrap();
                for a in v["alerts"].as_array().into_iter().flatten() {
                    let name = a["labels"]["alertname"].as_str().unwrap_or("");
                    if EVENT_ALERTS.contains(&name) && a["status"] == "firing" {
                        firing.insert(key(&a["labels"]));
                    }
                }
            }
            if out
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
        }
    }

    fn firing(&self) -> BTreeSet<String> {
        self.firing.lock().unwrap().clone()
    }
}

fn stop(mut child: Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

fn run(bin: &str, args: &[&str], lake: &Path, cfg: &Path) -> Child {
    Command::new(bin)
        .args(args)
        .arg("--lake")
        .arg(lake)
        .arg("--config")
        .arg(cfg)
        // Each alert is logged at warn: thousands of lines.
        .env("LEASELINE_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 6 || args.len() == 7,
        "usage: bench_catchup BROKER LEASELINE_BIN WORK_DIR HISTORY ROUNDS [WINDOWS]"
    );
    let (broker, bin, work, history) =
        (&args[1], &args[2], Path::new(&args[3]), Path::new(&args[4]));
    let rounds: u32 = args[5].parse()?;
    // `None`: the default window.
    let windows: Vec<Option<&str>> = match args.get(6) {
        Some(w) => w.split(',').map(Some).collect(),
        None => vec![None],
    };

    let receiver = Receiver::default();
    let url = receiver.start();
    // The shipped rules and lateness. Partitions count as idle after 1 s
    // instead of 10 s: the alerts of the history's last lateness window
    // wait for that once the backlog is read, a constant a larger backlog
    // would hide.
    let on_cfgs: Vec<std::path::PathBuf> = windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let path = work.join(format!("on-{i}.toml"));
            let audit = w.map_or(String::new(), |w| {
                format!("[audit]\nevent_window = \"{w}\"\n")
            });
            std::fs::write(
                &path,
                format!(
                    "{audit}[alerts]\npartition_idle_timeout = \"1s\"\n\
                     [[alerts.receivers]]\ntype = \"webhook\"\nname = \"hook\"\nurl = \"{url}\"\n"
                ),
            )
            .map(|()| path)
        })
        .collect::<std::io::Result<_>>()?;
    let off_cfg = work.join("off.toml");
    std::fs::write(&off_cfg, "")?;

    // What `check FILE` says the history's alerts are.
    let checked = work.join("checked");
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&off_cfg)
        .arg("--lake")
        .arg(&checked)
        .arg(history)
        .output()?;
    anyhow::ensure!(
        out.status.code() == Some(1),
        "check FILE should find violations: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = Command::new(bin)
        .args(["sql", "--format", "ndjson", "--lake"])
        .arg(&checked)
        .arg(
            "SELECT alertname, lease_id, holder_id, kind FROM lease_alerts WHERE state = 'firing' \
             AND alertname IN ('LeaseForcedExpiry', 'LeaseStaleWriteRejected', 'LeaseSafetyViolation')",
        )
        .output()?;
    anyhow::ensure!(rows.status.success(), "sql on the checked lake failed");
    let expected: BTreeSet<String> = String::from_utf8(rows.stdout)?
        .lines()
        .map(|l| key(&serde_json::from_str(l).unwrap()))
        .collect();

    let lines: Vec<String> = std::fs::read_to_string(history)?
        .lines()
        .map(str::to_string)
        .collect();
    let n = lines.len() as u64;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()?;
    admin
        .create_topics(
            &[NewTopic::new(TOPIC, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let t = Instant::now();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l)?;
        let lease = v["lease_id"].as_str().unwrap_or("").to_string();
        loop {
            match producer.send(BaseRecord::to(TOPIC).key(&lease).payload(l)) {
                Ok(()) => break,
                Err(_) => producer.poll(Duration::from_millis(10)),
            }
        }
    }
    producer.flush(Duration::from_secs(300))?;
    eprintln!(
        "history: {n} events, {} alerts expected; produced in {:.1}s",
        expected.len(),
        t.elapsed().as_secs_f64()
    );

    let mut offs = Vec::new();
    // Per window: times, on/off ratios, peak RSS in MiB.
    let mut ons: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); windows.len()];
    for round in 0..rounds {
        let lake = work.join(format!("off-{round}"));
        let start = Instant::now();
        let child = run(
            bin,
            &[
                "ingest",
                "--brokers",
                broker,
                "--topic",
                TOPIC,
                "--group-id",
                &format!("off-{round}"),
                "--no-compaction",
            ],
            &lake,
            &off_cfg,
        );
        while committed(&lake) < n {
            std::thread::sleep(Duration::from_millis(20));
        }
        let off = start.elapsed().as_secs_f64();
        stop(child);
        offs.push(off);
        for (i, on_cfg) in on_cfgs.iter().enumerate() {
            receiver.firing.lock().unwrap().clear();
            let lake = work.join(format!("on-{round}-{i}"));
            let start = Instant::now();
            let child = run(
                bin,
                &[
                    "serve",
                    "--no-pg",
                    "--http-listen",
                    "127.0.0.1:0",
                    "--ingest",
                    "--brokers",
                    broker,
                    "--topic",
                    TOPIC,
                    "--group-id",
                    &format!("on-{round}-{i}"),
                    "--no-compaction",
                ],
                &lake,
                on_cfg,
            );
            let deadline = Instant::now() + Duration::from_secs(3600);
            while committed(&lake) < n || !receiver.firing().is_superset(&expected) {
                if Instant::now() >= deadline {
                    stop(child);
                    anyhow::bail!("round {round}: alerts never came");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let on = start.elapsed().as_secs_f64();
            let peak = common::vm_hwm_kib(child.id()) as f64 / 1024.0;
            stop(child);
            let got = receiver.firing();
            let false_pages: Vec<&String> = got.difference(&expected).collect();
            anyhow::ensure!(
                false_pages.is_empty(),
                "round {round}: alerts check FILE does not report: {false_pages:?}"
            );
            let window = windows[i].unwrap_or("default");
            eprintln!(
            "round {round}: alerting off {off:.1}s, on (audit window {window}) {on:.1}s, ratio {:.2}, peak RSS {peak:.0} MiB; {} alerts, none missing, none false",
            on / off,
            got.len()
        );
            ons[i].0.push(on);
            ons[i].1.push(on / off);
            ons[i].2.push(peak);
        }
    }
    println!("events: {n}, alerts: {}, rounds: {rounds}", expected.len());
    println!(
        "ingest, alerting off: median {:.1}s ({:.0} events/s)",
        median(offs.clone()),
        n as f64 / median(offs)
    );
    for (w, (times, ratios, peaks)) in windows.iter().zip(ons) {
        let window = w.unwrap_or("default");
        println!(
            "serve --ingest, alerting on, audit window {window}, until every alert is sent: \
             median {:.1}s ({:.0} events/s), ratio on/off {:.2}, peak RSS {:.0} MiB",
            median(times.clone()),
            n as f64 / median(times),
            median(ratios),
            median(peaks)
        );
    }
    Ok(())
}
