//! Time from producing an event to Kafka until Alertmanager lists the alert
//! it raises, over many alerts; driven by `scripts/bench-alert-latency.sh`.
//!
//! Usage: bench_alert_latency BROKER ALERTMANAGER_URL LEASELINE_BIN WORK_DIR ALERTS
//!
//! Each sample is one forced expiry on its own lease: the clock starts just
//! before the event is handed to the producer and stops when
//! `GET /api/v2/alerts` first lists the alert for that lease (polled every
//! 5 ms).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 6,
        "usage: BROKER AM_URL LEASELINE_BIN WORK_DIR ALERTS"
    );
    let (broker, am, bin, work) = (&args[1], &args[2], &args[3], std::path::Path::new(&args[4]));
    let n: usize = args[5].parse()?;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()?;
    admin
        .create_topics(
            &[NewTopic::new("bench", 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;

    let cfg = work.join("bench.toml");
    std::fs::write(
        &cfg,
        format!(
            "[alerts]\nlateness = \"1s\"\n[alerts.rules.forced_expiry]\nwindow = \"10m\"\n\
             [[alerts.receivers]]\ntype = \"alertmanager\"\nname = \"am\"\nurl = \"{am}\"\n"
        ),
    )?;
    let mut serve = Command::new(bin)
        .args([
            "serve",
            "--no-pg",
            "--http-listen",
            "127.0.0.1:0",
            "--ingest",
            "--topic",
            "bench",
        ])
        .args(["--brokers", broker, "--lake"])
        .arg(work.join("lake"))
        .arg("--config")
        .arg(&cfg)
        .env("LEASELINE_LOG", "warn,leaseline::serve=info")
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(serve.stderr.take().expect("piped")).lines();
    loop {
        let line = lines
            .next()
            .ok_or_else(|| anyhow::anyhow!("serve exited"))??;
        if line.contains("HTTP API listening") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("linger.ms", "0")
        .create()?;
    let http = reqwest::Client::new();
    // Warm up: the consumer joins its group and is assigned the partition.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let lease = format!("bench/{i}");
        let t = now_ms();
        let acquired = serde_json::json!({"ts": t - 1000, "kind": "acquired", "source": "coordinator",
            "lease_id": lease, "holder_id": "w", "fencing_token": 1, "ttl_ms": 1000});
        let expired = serde_json::json!({"ts": t, "kind": "expired", "source": "coordinator",
            "lease_id": lease, "holder_id": "w", "fencing_token": 1});
        let start = Instant::now();
        for ev in [acquired, expired] {
            let payload = ev.to_string();
            producer
                .send(
                    FutureRecord::to("bench").key(&lease).payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
        }
        let filter = format!("lease_id=\"{lease}\"");
        loop {
            let listed: serde_json::Value = http
                .get(format!("{am}/api/v2/alerts"))
                .query(&[("filter", filter.as_str())])
                .send()
                .await?
                .json()
                .await?;
            if listed.as_array().is_some_and(|a| !a.is_empty()) {
                break;
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(30),
                "alert {i} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        samples.push(start.elapsed());
    }
    let _ = serve.kill();
    samples.sort();
    let q =
        |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "alerts={} p50_ms={:.1} p99_ms={:.1} max_ms={:.1} min_ms={:.1}",
        samples.len(),
        q(0.50).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3
    );
    Ok(())
}
