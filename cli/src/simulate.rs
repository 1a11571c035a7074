//! `leaseline simulate`: lease traffic to NDJSON or a Kafka topic.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use leaseline_sim::{simulate, SimConfig, Simulation};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::info;

/// Flags of `leaseline simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// The same seed gives the same events.
    #[arg(long, default_value_t = 1, env = "LEASELINE_SIM_SEED")]
    pub seed: u64,
    /// Number of leases.
    #[arg(long, default_value_t = 100, env = "LEASELINE_SIM_LEASES")]
    pub leases: usize,
    /// Holders taking turns on each lease.
    #[arg(long, default_value_t = 3, env = "LEASELINE_SIM_HOLDERS")]
    pub holders_per_lease: usize,
    /// About how many events to generate.
    #[arg(long, default_value_t = 10_000, env = "LEASELINE_SIM_EVENTS")]
    pub events: usize,
    /// The leases' TTL.
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration, env = "LEASELINE_SIM_TTL")]
    pub ttl: Duration,
    /// Event time of the first event: RFC 3339, or `now`.
    #[arg(long, default_value = "now", env = "LEASELINE_SIM_START")]
    pub start: String,
    /// Rate of keepalive blips that recover (per keepalive).
    #[arg(long, default_value_t = 0.002, env = "LEASELINE_SIM_BLIP")]
    pub blip: f64,
    /// Rate of holder crashes (per grant): forced expiries.
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_CRASH")]
    pub crash: f64,
    /// Rate of stop-the-world pauses longer than the TTL (per grant).
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_PAUSE")]
    pub pause: f64,
    /// The resource does not check tokens: a paused holder's write lands.
    #[arg(long, env = "LEASELINE_SIM_UNCHECKED_STORAGE")]
    pub unchecked_storage: bool,
    /// Rate of grants a faulty coordinator makes while a grant is valid.
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_DOUBLE_GRANT")]
    pub double_grant: f64,
    /// Rate of grants a faulty coordinator makes with a lower token.
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_TOKEN_REUSE")]
    pub token_reuse: f64,
    /// Rate of clients that fence past their safe deadline.
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_LATE_FENCE")]
    pub late_fence: f64,
    /// Rate of network partitions between a holder and the coordinator.
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_PARTITION")]
    pub partition: f64,
    /// Each holder's clock is off by up to this much, either way (e.g.
    /// `200ms`; within the audit's clock-skew tolerance: no violation).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, env = "LEASELINE_SIM_CLOCK_SKEW")]
    pub clock_skew: Duration,
    /// Send at most this many events per second (0: as fast as possible,
    /// unless `--realtime`).
    #[arg(long, default_value_t = 0.0, env = "LEASELINE_SIM_RATE")]
    pub rate: f64,
    /// Write NDJSON here (`-`: standard output) unless `--brokers` is given.
    #[arg(long, default_value = "-", env = "LEASELINE_SIM_OUTPUT")]
    pub output: String,
    /// Produce to Kafka instead (with `--topic`).
    #[arg(long, env = "LEASELINE_SIM_BROKERS")]
    pub brokers: Option<String>,
    /// The topic to produce to.
    #[arg(long, default_value = "lease-events", env = "LEASELINE_SIM_TOPIC")]
    pub topic: String,
    /// Write the injected violations here, one JSON object per line.
    #[arg(long, env = "LEASELINE_SIM_TRUTH")]
    pub truth: Option<PathBuf>,
    /// Send each event when the wall clock reaches its time, instead of as
    /// fast as possible.
    #[arg(long, env = "LEASELINE_SIM_REALTIME")]
    pub realtime: bool,
}

impl SimArgs {
    pub fn config(&self) -> anyhow::Result<SimConfig> {
        let start_ms = if self.start == "now" {
            chrono::Utc::now().timestamp_millis()
        } else {
            chrono::DateTime::parse_from_rfc3339(&self.start)
                .with_context(|| format!("--start {:?} is not RFC 3339 or `now`", self.start))?
                .timestamp_millis()
        };
        for (name, rate) in [
            ("blip", self.blip),
            ("crash", self.crash),
            ("pause", self.pause),
            ("double-grant", self.double_grant),
            ("token-reuse", self.token_reuse),
            ("late-fence", self.late_fence),
            ("partition", self.partition),
        ] {
            anyhow::ensure!(
                (0.0..=1.0).contains(&rate),
                "--{name} is a rate in [0, 1], not {rate}"
            );
        }
        Ok(SimConfig {
            seed: self.seed,
            leases: self.leases.max(1),
            holders_per_lease: self.holders_per_lease.max(1),
            events: self.events,
            start_ms,
            ttl_ms: i64::try_from(self.ttl.as_millis())?.max(1_500),
            blip: self.blip,
            crash: self.crash,
            pause: self.pause,
            unchecked_storage: self.unchecked_storage,
            double_grant: self.double_grant,
            token_reuse: self.token_reuse,
            late_fence: self.late_fence,
            partition: self.partition,
            clock_skew_ms: i64::try_from(self.clock_skew.as_millis())?,
        })
    }
}

/// Paces output to `rate` events per second (no pacing at 0).
struct Pace {
    rate: f64,
    started: std::time::Instant,
    sent: u64,
}

impl Pace {
    async fn next(&mut self) {
        if self.rate > 0.0 {
            let due = Duration::from_secs_f64(self.sent as f64 / self.rate);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        self.sent += 1;
    }
}

/// Waits until the wall clock reaches `ts_ms`.
pub async fn until(ts_ms: i64) {
    let now = chrono::Utc::now().timestamp_millis();
    if ts_ms > now {
        tokio::time::sleep(Duration::from_millis((ts_ms - now) as u64)).await;
    }
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let sim: Simulation = simulate(&args.config()?);
    if let Some(path) = &args.truth {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for t in &sim.truth {
            serde_json::to_writer(&mut f, t)?;
            f.write_all(b"\n")?;
        }
        f.flush()?;
    }
    match &args.brokers {
        Some(brokers) => {
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("linger.ms", "5")
                .set("message.timeout.ms", "60000")
                .create()
                .context("creating the Kafka producer")?;
            let mut inflight = Vec::new();
            let mut pace = Pace {
                rate: args.rate,
                started: std::time::Instant::now(),
                sent: 0,
            };
            for (ts, line) in &sim.events {
                if args.realtime {
                    until(*ts).await;
                }
                pace.next().await;
                let key = serde_json::from_str::<serde_json::Value>(line)?["lease_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let p = producer.clone();
                let (topic, line) = (args.topic.clone(), line.clone());
                inflight.push(tokio::spawn(async move {
                    p.send(
                        FutureRecord::to(&topic).key(&key).payload(&line),
                        Duration::from_secs(60),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| e)
                }));
                if inflight.len() >= 5_000 {
                    for h in inflight.drain(..) {
                        h.await?.context("producing to Kafka")?;
                    }
                }
            }
            for h in inflight {
                h.await?.context("producing to Kafka")?;
            }
            info!(events = sim.events.len(), topic = %args.topic, "produced");
        }
        None => {
            let mut out: Box<dyn Write> = if args.output == "-" {
                Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(&args.output)
                        .with_context(|| format!("creating {}", args.output))?,
                ))
            };
            let mut pace = Pace {
                rate: args.rate,
                started: std::time::Instant::now(),
                sent: 0,
            };
            for (ts, line) in &sim.events {
                if args.realtime {
                    out.flush()?;
                    until(*ts).await;
                }
                pace.next().await;
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
    }
    eprintln!(
        "simulated {} events: {} injected violations, {} forced expiries, {} stale writes rejected",
        sim.events.len(),
        sim.truth.len(),
        sim.expiries,
        sim.stale_rejections
    );
    Ok(())
}
