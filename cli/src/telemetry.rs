//! Logs, and OpenTelemetry export over OTLP (HTTP, protobuf) when an
//! endpoint is configured: `OTEL_EXPORTER_OTLP_ENDPOINT` (the standard
//! variable, also `--otlp-endpoint`) or `[telemetry] otlp_endpoint`.
//!
//! Traces come from the `tracing` spans (flushes, queries); metrics are the
//! same counters `/metrics` shows, read by observable instruments at each
//! export, so the two never disagree.

use std::sync::Arc;
use std::time::Duration;

use leaseline_alerts::{LeaseMetrics, LeaseTotals};
use leaseline_ingest::IngestMetrics;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The `[telemetry]` table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL (`http://collector:4318`); traces go to
    /// `/v1/traces`, metrics to `/v1/metrics`. Default: none (no export),
    /// unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    pub otlp_endpoint: Option<String>,
    /// How often metrics are exported. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub metrics_interval: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            // The default is a value here, not left to the exporter, so
            // that `Config::default()` shows what docs/configuration.md
            // documents.
            metrics_interval: Duration::from_secs(10),
        }
    }
}

/// OTLP/HTTP over reqwest's blocking client: the SDK exports from its own
/// threads, outside the Tokio runtime, and this keeps one reqwest in the
/// tree.
#[derive(Debug)]
struct BlockingClient(reqwest::blocking::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body.to_vec());
        for (k, v) in &parts.headers {
            req = req.header(k, v);
        }
        let resp = req.send()?;
        let mut out = http::Response::builder().status(resp.status().as_u16());
        for (k, v) in resp.headers() {
            out = out.header(k.as_str(), v.as_bytes());
        }
        let body = resp.bytes()?;
        Ok(out.body(body)?)
    }
}

/// What must be shut down before exit, so the last spans and metrics go out.
#[derive(Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

fn client() -> BlockingClient {
    BlockingClient(
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default(),
    )
}

/// Starts logging to stderr and, with an endpoint, OTLP export.
pub fn init(log_filter: &str, cfg: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // The Delta kernel logs every snapshot it builds at info: that is
    // leaseline's detail, not the operator's, unless asked for by name.
    let mut filter = tracing_subscriber::EnvFilter::new(log_filter);
    for quiet in ["buoyant_kernel", "buoyant_kernel_engine", "deltalake_core"] {
        if !log_filter.contains(quiet) {
            if let Ok(d) = format!("{quiet}=warn").parse() {
                filter = filter.add_directive(d);
            }
        }
    }
    let from_env = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|s| !s.is_empty());
    if cfg.otlp_endpoint.is_none() && from_env.is_none() {
        tracing_subscriber::registry().with(filter).with(fmt).init();
        return Ok(Telemetry::default());
    }
    // A configured endpoint is a base URL, as the environment variable is.
    let signal = |path: &str| {
        cfg.otlp_endpoint
            .as_ref()
            .map(|e| format!("{}/{path}", e.trim_end_matches('/')))
    };
    let resource = Resource::builder().with_service_name("leaseline").build();
    let mut spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client());
    if let Some(e) = signal("v1/traces") {
        spans = spans.with_endpoint(e);
    }
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans.build()?)
        .with_resource(resource.clone())
        .build();
    let mut metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(client());
    if let Some(e) = signal("v1/metrics") {
        metrics = metrics.with_endpoint(e);
    }
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(metrics.build()?)
        .with_interval(cfg.metrics_interval)
        .build();
    let meter = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    let otel = tracing_opentelemetry::layer().with_tracer(tracer.tracer("leaseline"));
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .init();
    tracing::info!(
        endpoint = %cfg.otlp_endpoint.clone().or(from_env).unwrap_or_default(),
        "exporting traces and metrics over OTLP"
    );
    Ok(Telemetry {
        tracer: Some(tracer),
        meter: Some(meter),
    })
}

impl Telemetry {
    /// Exports the lease and ingest counters as OTLP metrics.
    pub fn observe(&self, lease: Option<&LeaseMetrics>, ingest: Option<Arc<IngestMetrics>>) {
        let Some(provider) = &self.meter else { return };
        let meter = provider.meter("leaseline");
        if let Some(m) = ingest {
            for (name, pick) in [
                (
                    "leaseline.ingest.events",
                    (|m: &IngestMetrics| IngestMetrics::get(&m.events))
                        as fn(&IngestMetrics) -> u64,
                ),
                ("leaseline.ingest.rejects", |m| {
                    IngestMetrics::get(&m.rejects)
                }),
                ("leaseline.ingest.duplicates", |m| {
                    IngestMetrics::get(&m.duplicates)
                }),
                ("leaseline.ingest.files_written", |m| {
                    IngestMetrics::get(&m.files_written)
                }),
            ] {
                let m = m.clone();
                meter
                    .u64_observable_counter(name)
                    .with_callback(move |o| o.observe(pick(&m), &[]))
                    .build();
            }
        }
        if let Some(l) = lease {
            let totals = l.totals();
            for (name, i) in [
                ("lease.renewals", LeaseTotals::RENEWALS),
                ("lease.renewal_failures", LeaseTotals::RENEWAL_FAILURES),
                ("lease.expiry_forced", LeaseTotals::EXPIRIES),
                ("fencing_token.increments", LeaseTotals::GRANTS),
                ("lease.stale_write_rejected", LeaseTotals::STALE_WRITES),
                ("lease.violations", LeaseTotals::VIOLATIONS),
            ] {
                let t = totals.clone();
                meter
                    .u64_observable_counter(name)
                    .with_callback(move |o| o.observe(t.get(i), &[]))
                    .build();
            }
        }
    }

    /// Sends what is buffered. Call once, before exit.
    pub fn shutdown(self) {
        if let Some(t) = self.tracer {
            if let Err(e) = t.shutdown() {
                eprintln!("warning: OTLP trace export at shutdown: {e}");
            }
        }
        if let Some(m) = self.meter {
            if let Err(e) = m.shutdown() {
                eprintln!("warning: OTLP metrics export at shutdown: {e}");
            }
        }
    }
}
