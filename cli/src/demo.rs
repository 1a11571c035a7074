//! `leaseline demo`: everything in one process, no Kafka, no other
//! service. The simulator feeds the same lake writer that Kafka ingest
//! uses, in real time, into a local lake; `serve` answers SQL over HTTP and
//! the PostgreSQL protocol, and alerts print on the console (and go to an
//! Alertmanager if one is configured).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaseline_ingest::{FlushPolicy, IngestHooks, LakeWriter};
use leaseline_lake::Lake;
use leaseline_schema::Origin;
use leaseline_sim::SimConfig;
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
    /// Fault rates per grant: crashes, pauses longer than the TTL, and a
    /// faulty coordinator's double grants.
    #[arg(long, default_value_t = 0.01)]
    pub crash: f64,
    #[arg(long, default_value_t = 0.02)]
    pub pause: f64,
    #[arg(long, default_value_t = 0.005)]
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

/// Pushes simulated events into the lake as the wall clock reaches their
/// time, publishing them to queries every 100 ms and flushing by `policy`,
/// until `stop`; then flushes the rest.
pub async fn feed(
    lake: Lake,
    policy: FlushPolicy,
    sim: SimConfig,
    stop: Arc<AtomicBool>,
    hooks: IngestHooks,
) -> anyhow::Result<()> {
    let events = leaseline_sim::simulate(&sim).events;
    info!(
        events = events.len(),
        leases = sim.leases,
        "simulator running"
    );
    let mut w = LakeWriter::open(lake).await?;
    if let Some(p) = hooks.pending {
        w.publish_to(p);
    }
    w.attach(hooks.tap, hooks.metrics);
    let mut next = 0usize;
    let mut last_publish = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = chrono::Utc::now().timestamp_millis();
        while next < events.len() && events[next].0 <= now {
            w.push(
                events[next].1.as_bytes(),
                Origin::File {
                    path: "simulator",
                    line: next as u64 + 1,
                },
            );
            next += 1;
        }
        if last_publish.elapsed() >= Duration::from_millis(100) {
            w.publish();
            last_publish = Instant::now();
        }
        if w.should_flush(&policy) {
            w.flush().await?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.flush().await?;
    info!(events = next, "simulator stopped; everything flushed");
    Ok(())
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

Alerts print below as they fire. Ctrl-C stops (flushes everything first).
"#
    )
}
