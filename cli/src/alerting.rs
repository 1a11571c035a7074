//! Wiring of alerts and metrics: the engine between ingest and the
//! receivers, `/metrics` from the lease metrics and ingest's counters, and
//! the replay of imported history.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leaseline_alerts::{
    live, Alert, AlertEngine, AlertHistory, AlertState, LeaseMetrics, Notifier, ReceiverConfig,
    ReceiverKind,
};
use leaseline_ingest::{Committed, Fanout, IngestMetrics};
use leaseline_lake::Lake;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tracing::info;

use crate::config::Config;

/// Alert flags shared by `serve`, `import` and `check`.
#[derive(Debug, Clone, clap::Args)]
pub struct AlertArgs {
    /// Send alerts to this Alertmanager (base URL; repeatable).
    #[arg(
        long = "alertmanager",
        env = "LEASELINE_ALERTMANAGER_URL",
        value_delimiter = ','
    )]
    pub alertmanager: Vec<url::Url>,
    /// Send alerts to this JSON webhook (repeatable).
    #[arg(
        long = "alert-webhook",
        env = "LEASELINE_ALERT_WEBHOOK_URL",
        value_delimiter = ','
    )]
    pub webhook: Vec<url::Url>,
    /// How late an event may arrive and still count in order (e.g. `30s`).
    #[arg(long, env = "LEASELINE_ALERT_LATENESS", value_parser = humantime::parse_duration)]
    pub alert_lateness: Option<Duration>,
    /// The base URL of alert links (default: the HTTP API's address).
    #[arg(long, env = "LEASELINE_EXTERNAL_URL")]
    pub external_url: Option<url::Url>,
}

impl AlertArgs {
    pub fn apply(&self, cfg: &mut Config) -> anyhow::Result<()> {
        for (i, url) in self.alertmanager.iter().enumerate() {
            cfg.alerts.receivers.push(ReceiverConfig::new(
                ReceiverKind::Alertmanager,
                format!("alertmanager-flag-{i}"),
                url.clone(),
            ));
        }
        for (i, url) in self.webhook.iter().enumerate() {
            cfg.alerts.receivers.push(ReceiverConfig::new(
                ReceiverKind::Webhook,
                format!("webhook-flag-{i}"),
                url.clone(),
            ));
        }
        if let Some(l) = self.alert_lateness {
            cfg.alerts.lateness = l;
        }
        if let Some(u) = &self.external_url {
            cfg.alerts.external_url = Some(u.clone());
        }
        cfg.alerts.validate()?;
        Ok(())
    }
}

/// Ingest's counters, read at each scrape.
#[derive(Debug)]
struct IngestCollector(Arc<IngestMetrics>);

impl Collector for IngestCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let m = &self.0;
        let counters = [
            (
                "leaseline_ingest_events",
                "Valid events consumed (not duplicates)",
                &m.events,
            ),
            (
                "leaseline_ingest_duplicates",
                "Events dropped as duplicates of an event_id",
                &m.duplicates,
            ),
            (
                "leaseline_ingest_rejects",
                "Malformed messages kept in lease_rejects",
                &m.rejects,
            ),
            (
                "leaseline_ingest_files_written",
                "Parquet files written by flushes",
                &m.files_written,
            ),
            (
                "leaseline_ingest_flushes",
                "Flushes that committed files",
                &m.flushes,
            ),
            (
                "leaseline_ingest_partition_pauses",
                "Times a partition was paused for being read more than kafka.max_drift ahead in event time of the slowest partition still being read",
                &m.partition_pauses,
            ),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(IngestMetrics::get(v));
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let sum = ConstCounter::new(IngestMetrics::get(&m.flush_micros) as f64 / 1e6);
        sum.encode(enc.encode_descriptor(
            "leaseline_ingest_flush_seconds",
            "Time spent flushing (sum over flushes; divide by leaseline_ingest_flushes_total)",
            None,
            MetricType::Counter,
        )?)?;
        let last = ConstGauge::new(IngestMetrics::get(&m.last_flush_micros) as f64 / 1e6);
        last.encode(enc.encode_descriptor(
            "leaseline_ingest_last_flush_seconds",
            "How long the last flush took",
            None,
            MetricType::Gauge,
        )?)?;
        let paused = ConstGauge::new(IngestMetrics::get(&m.partitions_paused) as i64);
        paused.encode(enc.encode_descriptor(
            "leaseline_ingest_partitions_paused",
            "Partitions paused now for being ahead in event time (kafka.max_drift)",
            None,
            MetricType::Gauge,
        )?)?;
        let mut fam = enc.encode_descriptor(
            "leaseline_ingest_partition_lag",
            "Messages between the consumer's position and the partition's high watermark",
            None,
            MetricType::Gauge,
        )?;
        for ((topic, partition), lag) in m.lags() {
            let labels = vec![("topic", topic), ("partition", partition.to_string())];
            ConstGauge::new(lag).encode(fam.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Where the audit's SQL tables came from, in a process with an alert
/// engine.
#[derive(Debug)]
struct LiveAuditCollector(Arc<leaseline_query::LiveAudit>);

impl Collector for LiveAuditCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let (answered, behind, passed) = self.0.reads();
        let mut fam = enc.encode_descriptor(
            "leaseline_query_audit_reads",
            "Reads of the audit's SQL tables: from=\"alert_engine\" answered from the alert engine's auditor, from=\"alert_engine_earlier_commit\" answered from it for the newest commit it held whole while ingest had committed past it (catching up), from=\"lake\" audited the lake instead (another writer committed rows this process did not read), keeping a second copy of the history",
            None,
            MetricType::Counter,
        )?;
        for (from, n) in [
            ("alert_engine", answered),
            ("alert_engine_earlier_commit", behind),
            ("lake", passed),
        ] {
            ConstCounter::new(n).encode(fam.encode_family(&[("from", from)])?)?;
        }
        Ok(())
    }
}

/// The allocator's counts: memory the process's data holds (`allocated`)
/// against what the allocator keeps mapped for it (`resident`), so that a
/// growing RSS can be told apart as data or as the allocator's retention.
#[cfg(not(target_env = "msvc"))]
#[derive(Debug)]
struct AllocatorCollector;

#[cfg(not(target_env = "msvc"))]
impl Collector for AllocatorCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        use tikv_jemalloc_ctl::{epoch, stats};
        // The counts are a snapshot taken at each epoch advance.
        if epoch::advance().is_err() {
            return Ok(());
        }
        let counts = [
            ("allocated", stats::allocated::read()),
            ("active", stats::active::read()),
            ("resident", stats::resident::read()),
            ("retained", stats::retained::read()),
            ("metadata", stats::metadata::read()),
        ];
        let mut fam = enc.encode_descriptor(
            "leaseline_allocator_bytes",
            "The memory allocator's counts: allocated (in use by the process's data), active (pages holding it), resident (mapped and in RAM, with the allocator's own), retained (address space kept for reuse, not in RAM), metadata (the allocator's bookkeeping)",
            None,
            MetricType::Gauge,
        )?;
        for (kind, n) in counts {
            if let Ok(n) = n {
                ConstGauge::new(n as i64).encode(fam.encode_family(&[("kind", kind)])?)?;
            }
        }
        Ok(())
    }
}

/// Everything `/metrics` shows.
pub fn registry(
    lease: &LeaseMetrics,
    ingest: Option<Arc<IngestMetrics>>,
    live_audit: Option<Arc<leaseline_query::LiveAudit>>,
) -> Registry {
    let mut r = Registry::default();
    lease.register(&mut r);
    #[cfg(not(target_env = "msvc"))]
    r.register_collector(Box::new(AllocatorCollector));
    if let Some(m) = ingest {
        r.register_collector(Box::new(IngestCollector(m)));
    }
    if let Some(a) = live_audit {
        r.register_collector(Box::new(LiveAuditCollector(a)));
    }
    r
}

pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        out = format!("# encoding failed: {e}\n");
    }
    out
}

/// How many committed events (and partition notices) may wait for the
/// alert engine before ingest waits for it: about five seconds of a small
/// machine's full rate, to ride out the engine's pauses (settling, a
/// rebuild), and about 150 MB (a heap profile of 50 M events found some
/// 290 bytes an event) whatever the flush size.
const FANOUT_ITEMS: usize = 512 * 1024;

/// The live engine of `serve --ingest`: returns the fan-out for ingest and
/// the task that runs until ingest drops it.
pub fn start_live(
    cfg: &Config,
    lake: Lake,
    auditor: leaseline_audit::SharedAuditor,
    metrics: LeaseMetrics,
) -> anyhow::Result<(Fanout, tokio::task::JoinHandle<()>)> {
    let (fanout, rx) = Fanout::channel(FANOUT_ITEMS);
    let engine = AlertEngine::with_auditor(cfg.alerts.clone(), auditor, Some(metrics.clone()));
    let notifier = Notifier::start(
        &cfg.alerts.receivers,
        cfg.alerts.queue_capacity,
        cfg.alerts.resend_interval,
        Some(metrics),
    )?;
    info!(
        receivers = cfg.alerts.receivers.len(),
        lateness = %humantime::format_duration(cfg.alerts.lateness),
        "alert engine running"
    );
    // The audit SQL reads keeps `audit.event_window` as events, as it does
    // when it reads a lake.
    let settling =
        leaseline_alerts::Settling::new(cfg.audit.event_window, cfg.audit.max_events_held);
    let task = tokio::spawn(live::run(engine, rx, notifier, lake, settling));
    Ok((fanout, task))
}

/// A replay engine fed by ingest's fan-out, for `import`: the task ends,
/// returning the engine, when the import has dropped the fan-out. Its
/// audit keeps `alerts.replay_audit_window` of event time in memory; the
/// leases given events later than that are audited again from `lake` at
/// the end.
pub fn replay_fanout(
    cfg: &Config,
    lake: Lake,
) -> (Fanout, tokio::task::JoinHandle<anyhow::Result<AlertEngine>>) {
    let (fanout, mut rx) = Fanout::channel(FANOUT_ITEMS);
    let mut engine = AlertEngine::new(cfg.alerts.clone(), cfg.audit, None);
    let mut settling =
        leaseline_alerts::Settling::new(cfg.alerts.replay_audit_window, cfg.audit.max_events_held);
    // A replay needs no partitions: the end of the input closes the
    // lateness window (`AlertEngine::finish_replay`).
    let task = tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            for c in batch {
                if let Committed::Event(ev, _, _) = c {
                    engine.push(&ev);
                }
            }
            if let Some(s) = settling.as_mut() {
                s.step(&mut engine);
            }
        }
        if let Some(s) = settling.as_mut() {
            s.finish(&mut engine, &lake)
                .await
                .context("auditing again the leases given events later than the audit window")?;
        }
        Ok(engine)
    });
    (fanout, task)
}

/// Finishes a replay: the alerts that would have fired are recorded in
/// `lease_alerts` (when a lake is given) and sent to the receivers only
/// with `notify`. Returns them.
pub async fn finish_replay(
    engine: &mut AlertEngine,
    lake: Option<&Lake>,
    cfg: &Config,
    notify: bool,
) -> anyhow::Result<Vec<Alert>> {
    engine.finish_replay();
    let changes = engine.take_changes();
    let now = chrono::Utc::now().timestamp_micros();
    let notified = notify && !cfg.alerts.receivers.is_empty();
    if notified {
        let notifier = Notifier::start(
            &cfg.alerts.receivers,
            cfg.alerts.queue_capacity,
            cfg.alerts.resend_interval,
            None,
        )?;
        notifier.send(&changes, now);
        let left = notifier.shutdown(Duration::from_secs(30)).await;
        if left > 0 {
            anyhow::bail!("{left} alert updates could not be delivered within 30 s");
        }
    }
    if let Some(lake) = lake {
        let mut history = AlertHistory::new();
        history.record(&changes, now, notified);
        history.flush(lake).await?;
    }
    Ok(changes)
}

/// One line per alert that fired, for a command's output.
pub fn summarize(changes: &[Alert]) -> String {
    let fired: Vec<&Alert> = changes
        .iter()
        .filter(|a| a.state == AlertState::Firing)
        .collect();
    let mut s = String::new();
    for a in &fired {
        let labels: Vec<String> = a.labels().iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!(
            "  {} {{{}}}: {}\n",
            a.key.name,
            labels.join(","),
            a.summary
        ));
    }
    s
}
