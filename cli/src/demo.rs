//! `leaseline demo`: everything in one process, no Kafka, no other
//! service. The simulator is a source of the same ingest loop that Kafka
//! feeds, in real time, into a local lake; `serve` answers SQL over HTTP and
//! the PostgreSQL protocol, and alerts print on the console (and go to an
//! Alertmanager if one is configured).

use std::time::Duration;

use leaseline_ingest::pipeline::{self, Polled, Source, Step};
use leaseline_ingest::{FlushPolicy, IngestHooks, InputPartition, Notice};
use leaseline_lake::Lake;
use leaseline_schema::Origin;
use leaseline_sim::SimConfig;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Flags of `leaseline demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Leases in the simulated fleet.
    #[arg(long, default_value_t = 50, env = "LEASELINE_DEMO_LEASES")]
    pub leases: usize,
    /// Events to simulate (at the fleet's natural pace, in real time).
    #[arg(long, default_value_t = 500_000, env = "LEASELINE_DEMO_EVENTS")]
    pub events: usize,
    /// The simulator's seed.
    #[arg(long, default_value_t = 1, env = "LEASELINE_DEMO_SEED")]
    pub seed: u64,
    /// Rate of holder crashes (per grant): forced expiries.
    #[arg(long, default_value_t = 0.01, env = "LEASELINE_DEMO_CRASH")]
    pub crash: f64,
    /// Rate of stop-the-world pauses longer than the TTL (per grant): the
    /// paused holder's late write is rejected by its stale token.
    #[arg(long, default_value_t = 0.02, env = "LEASELINE_DEMO_PAUSE")]
    pub pause: f64,
    /// Rate of grants a faulty coordinator makes while a grant is still
    /// valid (per grant): `overlapping_ownership` violations.
    #[arg(long, default_value_t = 0.005, env = "LEASELINE_DEMO_DOUBLE_GRANT")]
    pub double_grant: f64,
}

impl DemoArgs {
    pub fn config(&self) -> SimConfig {
        SimConfig {
            seed: self.seed,
            leases: self.leases.max(1),
            events: self.events,
            start_ms: chrono::Utc::now().timestamp_millis(),
            crash: self.crash.clamp(0.0, 1.0),
            pause: self.pause.clamp(0.0, 1.0),
            double_grant: self.double_grant.clamp(0.0, 1.0),
            ..SimConfig::default()
        }
    }
}

/// Feeds simulated events to the ingest loop as the wall clock reaches
/// their time, until `stop` is cancelled; then flushes the rest.
pub async fn feed(
    lake: Lake,
    policy: FlushPolicy,
    sim: SimConfig,
    stop: CancellationToken,
    hooks: IngestHooks,
) -> anyhow::Result<()> {
    let events = leaseline_sim::simulate(&sim).events;
    info!(
        events = events.len(),
        leases = sim.leases,
        "simulator running"
    );
    let w = pipeline::open_writer(lake, hooks).await?;
    // The simulator is one input partition, read as its events fall due.
    pipeline::lock(&w).signal(Notice::Assigned(InputPartition::FILE));
    let source = Simulator { events, next: 0 };
    let stats = pipeline::run(source, w, policy, stop).await?;
    info!(
        events = stats.events,
        "simulator stopped; everything flushed"
    );
    Ok(())
}

/// The simulator's events as a source: each is read when the wall clock
/// reaches its time.
struct Simulator {
    events: Vec<(i64, String)>,
    next: usize,
}

impl Source for Simulator {
    fn poll(&mut self, timeout: Duration, take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step {
        let now = chrono::Utc::now().timestamp_millis();
        let due = self.events[self.next..].partition_point(|(at, _)| *at <= now);
        let end = self.next + due;
        while self.next < end {
            let line = &self.events[self.next].1;
            self.next += 1;
            let more = take(Polled::Message(
                line.as_bytes(),
                Origin::File {
                    path: "simulator",
                    line: self.next as u64,
                },
            ));
            if !more {
                // A flush is due; the rest is handed on the next poll.
                return Step::More;
            }
        }
        // Every event due has been read: nothing of the input is waiting.
        let _ = take(Polled::CaughtUp(InputPartition::FILE));
        // Until the next event falls due, or the loop's own timeout.
        let wait = match self.events.get(self.next) {
            Some((at, _)) => Duration::from_millis((at - now).max(1) as u64).min(timeout),
            None => timeout,
        };
        std::thread::sleep(wait);
        Step::More
    }
}

/// Marks a directory as the demo's own, so that the next run may replace
/// it. A directory without it is never deleted.
const DEMO_MARKER: &str = ".leaseline-demo";

/// The demo's lake, empty. Each run starts afresh: the simulator reissues
/// the same leases and tokens from the start, so on top of an earlier
/// run's history its grants would overlap and regress against the old
/// ones, and the audit would report violations that never happened. The
/// previous run's lake is kept until the next run starts, for querying.
pub fn fresh_lake(dir: &str) -> anyhow::Result<Lake> {
    use anyhow::Context;
    anyhow::ensure!(
        !dir.contains("://") || dir.starts_with("file://"),
        "the demo's lake is a local directory, not {dir}"
    );
    let path = std::path::Path::new(dir.strip_prefix("file://").unwrap_or(dir));
    let occupied = std::fs::read_dir(path)
        .map(|mut it| it.next().is_some())
        .unwrap_or(false);
    if occupied {
        anyhow::ensure!(
            path.join(DEMO_MARKER).exists(),
            "{} is not empty and was not written by `leaseline demo`; the demo starts on a fresh lake each run and deletes only its own, so give it a new or empty directory with --lake",
            path.display()
        );
        std::fs::remove_dir_all(path)
            .with_context(|| format!("removing the previous demo lake {}", path.display()))?;
        info!(lake = %path.display(), "replaced the previous demo run's lake");
    }
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::write(
        path.join(DEMO_MARKER),
        "written by `leaseline demo`; the next run replaces this directory\n",
    )
    .with_context(|| format!("marking {} as the demo's", path.display()))?;
    Ok(Lake::open(dir)?)
}

/// The lake as a `--lake` argument a person can paste.
pub fn lake_arg(lake: &Lake) -> String {
    let url = lake.store().url();
    match url.to_file_path() {
        Ok(p) => p.display().to_string(),
        Err(()) => url.to_string(),
    }
}

/// Where to look, printed once the servers listen.
pub fn banner(http: &str, pg: Option<std::net::SocketAddr>, lake: &str) -> String {
    let psql = match pg {
        Some(a) => format!(
            "psql \"host={} port={} user=leaseline dbname=leaseline sslmode=disable\"",
            a.ip(),
            a.port()
        ),
        None => "(PostgreSQL protocol off)".to_string(),
    };
    format!(
        r#"
leaseline demo: a simulated fleet of leases, live.

  lake        {lake}
  HTTP API    http://{http}/api/v1/sql   (POST a query; also /metrics, /health)
  PostgreSQL  {psql}

Try:
  curl -s -X POST http://{http}/api/v1/sql -d "SELECT lease_id, holder_id, fencing_token, valid FROM lease_holders ORDER BY lease_id LIMIT 10"
  curl -s -X POST http://{http}/api/v1/sql -d "SELECT kind, lease_id, detail FROM lease_violations ORDER BY at DESC LIMIT 5"
  curl -s -X POST http://{http}/api/v1/sql -d "SELECT alertname, lease_id, state, summary FROM lease_alerts ORDER BY recorded_at DESC LIMIT 10"
  leaseline sql --lake {lake} "SELECT kind, lease_id, fencing_token, detail FROM lease_violations ORDER BY at"

Alerts print below as they fire. Ctrl-C stops (flushes everything first).
"#
    )
}
