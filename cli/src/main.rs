//! `leaseline`: the command that wires the crates together.
//!
//! `ingest` consumes Kafka into the lake, `import` loads NDJSON files,
//! `sql` queries the lake, `check` audits the lake or NDJSON files and exits
//! 1 on any safety violation, `compact` merges small files, `watch`
//! observes a lock service and reports its transitions. Configuration
//! comes from defaults, then `--config FILE`, then environment variables
//! and flags (`leaseline help <command>` lists them).

/// jemalloc rather than glibc's malloc: a long-running `serve --ingest`
/// settles its audit, stores rows and compacts files in transient bursts of
/// allocation, and glibc kept those peaks resident (BENCHMARKS.md, "Memory
/// of a long-running ingester"); jemalloc hands freed pages back.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (`_RJEM_MALLOC_CONF` in the
/// environment still overrides them). By default it returns freed pages to
/// the system only while the process allocates, over 10 s; a background
/// thread returning them over 1 s kept `serve --ingest` at about two thirds
/// of the RSS over a 50 M-event backlog (BENCHMARKS.md, "Memory of a
/// long-running ingester").
#[cfg(not(target_env = "msvc"))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000\0";

mod alerting;
mod check;
mod config;
mod demo;
mod serve;
mod simulate;
mod telemetry;
mod terminal;
mod watch;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bytesize::ByteSize;
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use leaseline_ingest::import::{import, ImportInput};
use leaseline_ingest::kafka;
use leaseline_lake::{CompactionPolicy, Lake, Table};
use leaseline_query::QueryEngine;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::Config;
use leaseline_query::output::{self, Format};

#[derive(Debug, Parser)]
#[command(
    name = "leaseline",
    version,
    about = "Audits distributed-lock leases from their transition events"
)]
struct Cli {
    /// Configuration file (TOML); flags and environment variables override it.
    #[arg(long, global = true, env = "LEASELINE_CONFIG")]
    config: Option<PathBuf>,
    /// Log filter, e.g. `info` or `leaseline_ingest=debug`.
    #[arg(long, global = true, env = "LEASELINE_LOG", default_value = "info")]
    log: String,
    /// Export traces and metrics over OTLP/HTTP to this base URL
    /// (`http://collector:4318`).
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Where `serve` and `demo` listen, and who may connect.
#[derive(Debug, Args)]
struct ListenArgs {
    /// Address of the HTTP API (port 0 picks a free port; the log says
    /// which).
    #[arg(long, env = "LEASELINE_HTTP_LISTEN")]
    http_listen: Option<std::net::SocketAddr>,
    /// Address of the PostgreSQL wire protocol (port 0 picks a free port).
    #[arg(long, env = "LEASELINE_PG_LISTEN")]
    pg_listen: Option<std::net::SocketAddr>,
    /// Do not serve the PostgreSQL protocol.
    #[arg(long, env = "LEASELINE_NO_PG")]
    no_pg: bool,
    /// The PostgreSQL user (default `leaseline`).
    #[arg(long, env = "LEASELINE_PG_USER")]
    pg_user: Option<String>,
    /// The PostgreSQL password; required unless `--pg-listen` is a
    /// loopback address.
    #[arg(long, env = "LEASELINE_PG_PASSWORD", hide_env_values = true)]
    pg_password: Option<String>,
    /// PostgreSQL connections open at once; more are refused (53300).
    #[arg(long, env = "LEASELINE_PG_MAX_CONNECTIONS")]
    pg_max_connections: Option<usize>,
    /// A file whose first line is the PostgreSQL password.
    #[arg(long, env = "LEASELINE_PG_PASSWORD_FILE")]
    pg_password_file: Option<PathBuf>,
    /// A TOML file of more PostgreSQL users (`[[users]]` with `name` and
    /// `scram` or `password_file`).
    #[arg(long, env = "LEASELINE_PG_USERS_FILE")]
    pg_users_file: Option<PathBuf>,
    /// Close a PostgreSQL connection idle this long (e.g. `5m`; `0s`: never).
    #[arg(long, env = "LEASELINE_PG_IDLE_TIMEOUT", value_parser = humantime::parse_duration)]
    pg_idle_timeout: Option<Duration>,
    /// A TOML file of the HTTP API's bearer tokens (`[[tokens]]` with
    /// `name`, `sha256` and `scopes`); required unless `--http-listen` is
    /// a loopback address.
    #[arg(long, env = "LEASELINE_HTTP_TOKENS_FILE")]
    http_tokens_file: Option<PathBuf>,
    /// A host name clients use for this server (repeatable); `Host` and
    /// `Origin` naming any other are refused.
    #[arg(
        long = "allowed-host",
        env = "LEASELINE_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Serve `/metrics` on this address instead of the HTTP API's.
    #[arg(long, env = "LEASELINE_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The TLS certificate chain (PEM) for HTTP and PostgreSQL; with it,
    /// neither serves plaintext. SIGHUP reloads it.
    #[arg(long, env = "LEASELINE_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert-file`.
    #[arg(long, env = "LEASELINE_TLS_KEY_FILE")]
    tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that HTTP clients must present a certificate
    /// of (mutual TLS).
    #[arg(long, env = "LEASELINE_HTTP_CLIENT_CA_FILE")]
    http_client_ca_file: Option<PathBuf>,
    /// Open connections per HTTP listener; one more gets one answer
    /// (`/health`, or 503) and is closed.
    #[arg(long, env = "LEASELINE_HTTP_MAX_CONNECTIONS")]
    http_max_connections: Option<usize>,
    /// How long an HTTP connection has for its TLS handshake, and a
    /// request for its head (e.g. `10s`).
    #[arg(long, env = "LEASELINE_HTTP_HEADER_TIMEOUT", value_parser = humantime::parse_duration)]
    http_header_timeout: Option<Duration>,
    /// How long a kept-alive HTTP connection may wait for its next request.
    #[arg(long, env = "LEASELINE_HTTP_IDLE_TIMEOUT", value_parser = humantime::parse_duration)]
    http_idle_timeout: Option<Duration>,
}

impl ListenArgs {
    fn apply(self, cfg: &mut Config) {
        if let Some(a) = self.http_listen {
            cfg.serve.http_listen = a;
        }
        if let Some(a) = self.pg_listen {
            cfg.serve.pg_listen = Some(a);
        }
        if self.no_pg {
            cfg.serve.pg_listen = None;
        }
        if let Some(u) = self.pg_user {
            cfg.serve.pg_user = u;
        }
        if self.pg_password.is_some() {
            cfg.serve.pg_password = self.pg_password;
        }
        if let Some(n) = self.pg_max_connections {
            cfg.serve.pg_max_connections = n;
        }
        if self.pg_password_file.is_some() {
            cfg.serve.pg_password_file = self.pg_password_file;
        }
        if self.pg_users_file.is_some() {
            cfg.serve.pg_users_file = self.pg_users_file;
        }
        if let Some(t) = self.pg_idle_timeout {
            cfg.serve.pg_idle_timeout = t;
        }
        if self.http_tokens_file.is_some() {
            cfg.serve.http_tokens_file = self.http_tokens_file;
        }
        if !self.allowed_hosts.is_empty() {
            cfg.serve.allowed_hosts = self.allowed_hosts;
        }
        if self.metrics_listen.is_some() {
            cfg.serve.metrics_listen = self.metrics_listen;
        }
        if self.tls_cert_file.is_some() {
            cfg.serve.tls_cert_file = self.tls_cert_file;
        }
        if self.tls_key_file.is_some() {
            cfg.serve.tls_key_file = self.tls_key_file;
        }
        if self.http_client_ca_file.is_some() {
            cfg.serve.http_client_ca_file = self.http_client_ca_file;
        }
        if let Some(n) = self.http_max_connections {
            cfg.serve.http_max_connections = n;
        }
        if let Some(t) = self.http_header_timeout {
            cfg.serve.http_header_timeout = t;
        }
        if let Some(t) = self.http_idle_timeout {
            cfg.serve.http_idle_timeout = t;
        }
    }
}

#[derive(Debug, Args)]
struct LakeArgs {
    /// The lake's root: a directory or an object store URL.
    #[arg(long, env = "LEASELINE_LAKE")]
    lake: Option<String>,
}

#[derive(Debug, Args)]
struct FlushArgs {
    /// Flush after this many buffered messages.
    #[arg(long, env = "LEASELINE_FLUSH_MAX_ROWS")]
    flush_max_rows: Option<usize>,
    /// Flush after this many buffered bytes (e.g. `64MiB`).
    #[arg(long, env = "LEASELINE_FLUSH_MAX_BYTES")]
    flush_max_bytes: Option<ByteSize>,
    /// Flush at most this long after the first buffered message (e.g. `2s`);
    /// alerts wait for the commit of their event.
    #[arg(long, env = "LEASELINE_FLUSH_INTERVAL", value_parser = humantime::parse_duration)]
    flush_interval: Option<Duration>,
    /// When the input goes quiet, flush once the first buffered message is
    /// this old (e.g. `100ms`): a trickle of events reaches the lake and
    /// the alerts this soon.
    #[arg(long, env = "LEASELINE_FLUSH_IDLE", value_parser = humantime::parse_duration)]
    flush_idle: Option<Duration>,
}

#[derive(Debug, Args)]
struct IngestArgs {
    #[command(flatten)]
    flush: FlushArgs,
    /// Bootstrap brokers, `host:port[,host:port]`.
    #[arg(long, env = "LEASELINE_KAFKA_BROKERS")]
    brokers: Option<String>,
    /// Topic to consume (repeat, or comma-separate in the env var).
    #[arg(long = "topic", env = "LEASELINE_KAFKA_TOPICS", value_delimiter = ',')]
    topics: Vec<String>,
    /// Consumer group id.
    #[arg(long, env = "LEASELINE_KAFKA_GROUP_ID")]
    group_id: Option<String>,
    /// What a message holds: `json` (one contract event), or `otlp_proto`
    /// / `otlp_json` (an OpenTelemetry logs export, as the Collector's
    /// Kafka exporter writes it; each log record an event).
    #[arg(long, env = "LEASELINE_KAFKA_ENCODING")]
    encoding: Option<leaseline_ingest::otlp::Encoding>,
    /// A librdkafka property, `key=value` (repeatable), e.g. for TLS or SASL.
    #[arg(
        long = "kafka-property",
        env = "LEASELINE_KAFKA_PROPERTIES",
        value_delimiter = ';',
        hide_env_values = true
    )]
    kafka_properties: Vec<String>,
    /// A librdkafka property read from the first line of a file,
    /// `key=path` (repeatable), for secrets: `sasl.password=/run/secrets/kafka`.
    #[arg(
        long = "kafka-property-file",
        env = "LEASELINE_KAFKA_PROPERTY_FILES",
        value_delimiter = ';'
    )]
    kafka_property_files: Vec<String>,
    /// How far ahead in event time a partition may be read of the slowest
    /// one still being read before it is paused (e.g. `30s`; the default,
    /// `0s`, never pauses; see docs/configuration.md for the broker it
    /// needs).
    #[arg(long = "kafka-max-drift", env = "LEASELINE_KAFKA_MAX_DRIFT", value_parser = humantime::parse_duration)]
    kafka_max_drift: Option<Duration>,
    /// Do not compact or vacuum in the background.
    #[arg(long, env = "LEASELINE_NO_COMPACTION")]
    no_compaction: bool,
    /// How often background compaction runs (e.g. `60s`).
    #[arg(long, env = "LEASELINE_COMPACTION_INTERVAL", value_parser = humantime::parse_duration)]
    compaction_interval: Option<Duration>,
}

impl IngestArgs {
    fn apply(self, cfg: &mut Config) -> anyhow::Result<()> {
        self.flush.apply(cfg);
        if let Some(b) = self.brokers {
            cfg.kafka.brokers = b;
        }
        if !self.topics.is_empty() {
            cfg.kafka.topics = self.topics;
        }
        if let Some(g) = self.group_id {
            cfg.kafka.group_id = g;
        }
        if let Some(e) = self.encoding {
            cfg.kafka.encoding = e;
        }
        for p in self.kafka_properties.iter().filter(|p| !p.is_empty()) {
            let (k, v) = key_value("--kafka-property", p)?;
            cfg.kafka.properties.insert(k.into(), v.into());
        }
        for p in self.kafka_property_files.iter().filter(|p| !p.is_empty()) {
            let (k, path) = key_value("--kafka-property-file", p)?;
            cfg.kafka.property_files.insert(k.into(), path.into());
        }
        if let Some(d) = self.kafka_max_drift {
            cfg.kafka.max_drift = d;
        }
        if self.no_compaction {
            cfg.compaction.enabled = false;
        }
        if let Some(i) = self.compaction_interval {
            cfg.compaction.interval = i;
        }
        Ok(())
    }
}

/// `sql` and `timeline` keep the priority they were started with: a
/// person is waiting for the answer, and no ingest shares the process
/// for the query threads to yield to. Idle-class threads there would wait
/// for any busy process of the machine (a `serve` catching up, a build)
/// until the query timed out. The configuration file's `query.sched_idle`
/// and `query.nice` are those of `serve`; `sql` still takes its flags.
fn at_the_callers_priority(cfg: &mut Config) {
    cfg.query.sched_idle = false;
    cfg.query.nice = 0;
}

/// A `key=value` flag (`key=path` for files), trimmed.
pub(crate) fn key_value<'a>(flag: &str, p: &'a str) -> anyhow::Result<(&'a str, &'a str)> {
    let (k, v) = p
        .split_once('=')
        .with_context(|| format!("{flag} {p:?} is not key=value"))?;
    Ok((k.trim(), v.trim()))
}

#[derive(Debug, Args)]
struct QueryArgs {
    /// Memory one query may hold (e.g. `1GiB`).
    #[arg(long, env = "LEASELINE_QUERY_MAX_MEMORY_BYTES")]
    query_max_memory_bytes: Option<ByteSize>,
    /// Memory all queries of the process together may hold (e.g. `2GiB`).
    #[arg(long, env = "LEASELINE_QUERY_MEMORY_POOL_BYTES")]
    query_memory_pool_bytes: Option<ByteSize>,
    /// How long one query may run (e.g. `30s`).
    #[arg(long, env = "LEASELINE_QUERY_TIMEOUT", value_parser = humantime::parse_duration)]
    query_timeout: Option<Duration>,
    /// Queries running at once; the rest wait in line.
    #[arg(long, env = "LEASELINE_QUERY_MAX_CONCURRENT")]
    query_max_concurrent: Option<usize>,
    /// How long a query waits in line before it is refused as busy
    /// (default: the query timeout).
    #[arg(long, env = "LEASELINE_QUERY_QUEUE_TIMEOUT", value_parser = humantime::parse_duration)]
    query_queue_timeout: Option<Duration>,
    /// Whether query threads run only on the time the rest of the process
    /// leaves (Linux SCHED_IDLE).
    #[arg(long, env = "LEASELINE_QUERY_SCHED_IDLE")]
    query_sched_idle: Option<bool>,
    /// Scheduling priority of the query threads, as a nice value (0-19).
    #[arg(long, env = "LEASELINE_QUERY_NICE", value_parser = clap::value_parser!(i32).range(0..=19))]
    query_nice: Option<i32>,
}

impl QueryArgs {
    fn apply(&self, cfg: &mut Config) {
        if let Some(v) = self.query_max_memory_bytes {
            cfg.query.max_memory_bytes = v;
        }
        if let Some(v) = self.query_memory_pool_bytes {
            cfg.query.memory_pool_bytes = v;
        }
        if let Some(v) = self.query_timeout {
            cfg.query.timeout = v;
        }
        if let Some(v) = self.query_max_concurrent {
            cfg.query.max_concurrent = v;
        }
        if let Some(v) = self.query_queue_timeout {
            cfg.query.queue_timeout = Some(v);
        }
        if let Some(v) = self.query_sched_idle {
            cfg.query.sched_idle = v;
        }
        if let Some(v) = self.query_nice {
            cfg.query.nice = v;
        }
    }
}

#[derive(Debug, Args)]
struct AuditArgs {
    /// How late past its safe deadline a fence may come before it is a
    /// `late_fence` (e.g. `50ms`).
    #[arg(long, env = "LEASELINE_AUDIT_LATE_FENCE_TOLERANCE", value_parser = humantime::parse_duration)]
    late_fence_tolerance: Option<Duration>,
    /// How far clocks of different emitters may disagree (e.g. `250ms`).
    #[arg(long, env = "LEASELINE_AUDIT_CLOCK_SKEW_TOLERANCE", value_parser = humantime::parse_duration)]
    clock_skew_tolerance: Option<Duration>,
    /// Answer `lease_timeline` and `lease_violations` from the lake's
    /// stored audit rows when they answer for the snapshot (`true`), or
    /// audit every event (`false`).
    #[arg(long, env = "LEASELINE_AUDIT_READ_STORED")]
    audit_read_stored: Option<bool>,
}

impl AuditArgs {
    fn apply(&self, cfg: &mut Config) {
        if let Some(v) = self.late_fence_tolerance {
            cfg.audit.late_fence_tolerance = v;
        }
        if let Some(v) = self.clock_skew_tolerance {
            cfg.audit.clock_skew_tolerance = v;
        }
        if let Some(v) = self.audit_read_stored {
            cfg.audit.read_stored = v;
        }
    }
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Consume lease events from Kafka into the lake until SIGTERM or Ctrl-C.
    Ingest {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        ingest: IngestArgs,
    },
    /// Serve the HTTP API (and, with `--ingest`, consume Kafka in the same
    /// process) until SIGTERM or Ctrl-C.
    Serve {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        audit: AuditArgs,
        #[command(flatten)]
        query: QueryArgs,
        #[command(flatten)]
        listen: ListenArgs,
        /// Also consume Kafka into the lake, as `leaseline ingest` does, and
        /// evaluate the alert rules on the events as they come.
        #[arg(long, env = "LEASELINE_SERVE_INGEST")]
        ingest: bool,
        /// Take OpenTelemetry log exports on `POST /v1/logs` (OTLP/HTTP,
        /// protobuf or JSON) into the lake, each log record an event
        /// (docs/sources.md).
        #[arg(long, env = "LEASELINE_SERVE_OTLP_LOGS")]
        otlp_logs: bool,
        #[command(flatten)]
        ingest_args: IngestArgs,
        #[command(flatten)]
        alerts: alerting::AlertArgs,
    },
    /// Import NDJSON files (`-` for standard input) into the lake.
    Import {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        flush: FlushArgs,
        #[command(flatten)]
        alerts: alerting::AlertArgs,
        /// Send the alerts the imported history would have raised to the
        /// configured receivers (by default they are only recorded in
        /// `lease_alerts`).
        #[arg(long, env = "LEASELINE_IMPORT_NOTIFY")]
        notify: bool,
        /// NDJSON files, one event per line.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Run a read-only SQL query over the lake's tables.
    Sql {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        audit: AuditArgs,
        #[command(flatten)]
        limits: QueryArgs,
        /// The query, e.g. "SELECT count(*) FROM lease_events".
        query: String,
        /// Output format: table, csv, json, ndjson or arrow (an Arrow IPC
        /// stream).
        #[arg(long, default_value = "table", env = "LEASELINE_SQL_FORMAT")]
        format: Format,
        /// Print at most this many rows, the first ones (as a `LIMIT`
        /// around the query would).
        #[arg(long, env = "LEASELINE_SQL_MAX_ROWS")]
        max_rows: Option<usize>,
    },
    /// Audit the lake (or NDJSON files) and print every safety violation.
    ///
    /// Exit status: 0 when the history is clean, 1 when there is any
    /// violation, 2 when it could not be checked.
    Check {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        audit: AuditArgs,
        /// NDJSON files to audit instead of the lake (`-` for standard input).
        /// With files, the alert rules are replayed over them too: the
        /// alerts that would have fired are listed on stderr, recorded in
        /// `lease_alerts` of the lake when `--lake` is given, and sent to
        /// the receivers only with `--notify`.
        files: Vec<String>,
        #[command(flatten)]
        alerts: alerting::AlertArgs,
        /// Send the replayed alerts to the configured receivers.
        #[arg(long, env = "LEASELINE_CHECK_NOTIFY")]
        notify: bool,
        /// Output format.
        #[arg(
            long,
            value_enum,
            default_value = "text",
            env = "LEASELINE_CHECK_FORMAT"
        )]
        format: check::CheckFormat,
    },
    /// Run everything in one process on a simulated fleet: no Kafka, no
    /// other service. Serves SQL over HTTP and the PostgreSQL protocol,
    /// prints alerts, stops on Ctrl-C.
    Demo {
        /// The demo's lake (default `./data/demo`).
        #[arg(long, env = "LEASELINE_DEMO_LAKE", default_value = "./data/demo")]
        lake: String,
        #[command(flatten)]
        listen: ListenArgs,
        #[command(flatten)]
        alerts: alerting::AlertArgs,
        #[command(flatten)]
        sim: demo::DemoArgs,
    },
    /// Draw a lease's timeline (grants, keepalives, writes, violations) as SVG.
    Timeline {
        #[command(flatten)]
        lake: LakeArgs,
        #[command(flatten)]
        audit: AuditArgs,
        /// The lease.
        lease_id: String,
        /// From this time (RFC 3339 or epoch ms); default: the data's start.
        #[arg(long, env = "LEASELINE_TIMELINE_FROM")]
        from: Option<String>,
        /// Until this time; default: the data's end.
        #[arg(long, env = "LEASELINE_TIMELINE_TO")]
        to: Option<String>,
        /// Where to write the SVG (`-`: standard output).
        #[arg(long, env = "LEASELINE_TIMELINE_SVG")]
        svg: String,
    },
    /// Observe a lock service and report its grants, renewals, releases
    /// and expiries as coordinator events, to Kafka or straight into a lake,
    /// until SIGTERM or Ctrl-C.
    Watch {
        #[command(subcommand)]
        backend: watch::WatchCommand,
    },
    /// Generate lease traffic (with faults on switches) to NDJSON or Kafka.
    Simulate {
        #[command(flatten)]
        sim: simulate::SimArgs,
    },
    /// Print the SCRAM-SHA-256 verifier of a PostgreSQL password, for
    /// `serve.pg_users` (`scram = "..."`): the configuration then holds no
    /// password. Reads the password from the first line of standard input.
    PgVerifier {},
    /// Merge small files now and delete files replaced long enough ago.
    Compact {
        #[command(flatten)]
        lake: LakeArgs,
        /// Size merged files aim for (e.g. `128MiB`).
        #[arg(long, env = "LEASELINE_COMPACTION_TARGET_FILE_BYTES")]
        target_file_bytes: Option<ByteSize>,
        /// Keep replaced files this long before deleting them (e.g. `1h`, `0s`).
        #[arg(long, env = "LEASELINE_COMPACTION_RETENTION", value_parser = humantime::parse_duration)]
        retention: Option<Duration>,
        /// Remove the days of `lease_events` and `lease_rejects` older than
        /// this (e.g. `90d`), or `forever` to keep them.
        #[arg(long, env = "LEASELINE_KEEP_EVENTS")]
        keep_events: Option<leaseline_ingest::Keep>,
    },
    /// Convert a lake of the format before Delta tables (`_manifest/`) into
    /// Delta tables, in place, with the same rows (see docs/upgrading.md).
    Migrate {
        #[command(flatten)]
        lake: LakeArgs,
        /// The consumer group whose Kafka positions the old offsets become
        /// (default: `kafka.group_id`).
        #[arg(long, env = "LEASELINE_KAFKA_GROUP_ID")]
        group_id: Option<String>,
    },
}

impl FlushArgs {
    fn apply(&self, cfg: &mut Config) {
        if let Some(v) = self.flush_max_rows {
            cfg.flush.max_rows = v;
        }
        if let Some(v) = self.flush_max_bytes {
            cfg.flush.max_bytes = v;
        }
        if let Some(v) = self.flush_interval {
            cfg.flush.flush_interval = v;
        }
        if let Some(v) = self.flush_idle {
            cfg.flush.idle_flush = v;
        }
    }
}

impl LakeArgs {
    fn location<'a>(&'a self, cfg: &'a Config) -> &'a str {
        self.lake.as_deref().unwrap_or(&cfg.lake)
    }

    /// For writers: creates the lake if there is none.
    fn open(&self, cfg: &Config) -> anyhow::Result<Lake> {
        let location = self.location(cfg);
        Lake::open(location).with_context(|| format!("opening lake {location}"))
    }

    /// For readers: a location with no lake is an error, never an empty
    /// history.
    async fn open_existing(&self, cfg: &Config) -> anyhow::Result<Lake> {
        Ok(Lake::open_existing(self.location(cfg)).await?)
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut tcfg = cfg.telemetry.clone();
    if cli.otlp_endpoint.is_some() {
        tcfg.otlp_endpoint = cli.otlp_endpoint.clone();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // 2 for every failure: `check` exits 1 for violations, so its own
    // failures must differ, and every command says it the same way.
    let failure = std::process::ExitCode::from(2);
    // Outside the runtime: the OTLP exporters' blocking HTTP client runs its
    // own, and must not be created or dropped inside an async context.
    let telemetry = match telemetry::init(&cli.log, &tcfg) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: setting up OpenTelemetry export: {e:#}");
            return failure;
        }
    };
    let result = rt.block_on(run(cli, cfg, &telemetry));
    telemetry.shutdown();
    match result {
        Ok(code) => code,
        // The reader of our output went away (`| head`): it has what it
        // wanted.
        Err(_) if terminal::stdout_closed() => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", terminal::error_text(&e));
            if let Some(h) = terminal::hint(&e) {
                eprintln!("hint: {h}");
            }
            failure
        }
    }
}

async fn run(
    cli: Cli,
    mut cfg: Config,
    telemetry: &telemetry::Telemetry,
) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match cli.command {
        Command::Ingest { lake, ingest } => {
            ingest.apply(&mut cfg)?;
            let lake = lake.open(&cfg)?;
            run_ingest(lake, cfg).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Serve {
            lake,
            audit,
            query,
            listen,
            ingest,
            otlp_logs,
            ingest_args,
            alerts,
        } => {
            alerts.apply(&mut cfg)?;
            listen.apply(&mut cfg);
            audit.apply(&mut cfg);
            query.apply(&mut cfg);
            ingest_args.apply(&mut cfg)?;
            if ingest {
                cfg.serve.ingest = true;
            }
            if otlp_logs {
                cfg.serve.otlp_logs = true;
            }
            // Without --ingest or --otlp-logs, serve only reads.
            let lake = if cfg.serve.ingest || cfg.serve.otlp_logs {
                lake.open(&cfg)?
            } else {
                lake.open_existing(&cfg).await?
            };
            let source = if cfg.serve.ingest {
                serve::Source::Kafka
            } else {
                serve::Source::Lake
            };
            serve::run(lake, cfg, source, telemetry)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Import {
            lake,
            flush,
            alerts,
            notify,
            files,
        } => {
            flush.apply(&mut cfg);
            alerts.apply(&mut cfg)?;
            let lake = lake.open(&cfg)?;
            run_import(lake, &cfg, files, notify)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Sql {
            lake,
            audit,
            limits,
            query,
            format,
            max_rows,
        } => {
            audit.apply(&mut cfg);
            at_the_callers_priority(&mut cfg);
            limits.apply(&mut cfg);
            let engine = QueryEngine::with_audit_config(lake.open_existing(&cfg).await?, cfg.audit)
                .with_limits(cfg.query);
            // Rows are printed as they come, so a large result needs no
            // more memory than a few batches (the table format excepted:
            // its column widths depend on every row).
            let mut result = engine.stream(&query, max_rows).await?;
            let mut enc = output::Encoder::new(format, result.schema.clone())?;
            let mut out = terminal::stdout();
            while let Some(batch) = result.rows.next().await {
                out.write_all(&enc.write(&batch?)?)?;
            }
            out.write_all(&enc.finish()?)?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            lake,
            audit,
            files,
            alerts,
            notify,
            format,
        } => {
            audit.apply(&mut cfg);
            alerts.apply(&mut cfg)?;
            let mut engine =
                leaseline_alerts::AlertEngine::new(cfg.alerts.clone(), cfg.audit, None);
            let (mut auditor, malformed) = if files.is_empty() {
                (
                    check::audit_lake(&lake.open_existing(&cfg).await?, cfg.audit).await?,
                    0,
                )
            } else {
                check::audit_files(&files, cfg.audit, Some(&mut engine))?
            };
            let summary = check::report(&mut auditor, malformed, format, &mut terminal::stdout())?;
            {
                // Files are new history: their alerts are recorded in the
                // lake given with them. A lake's own alerts were recorded
                // when its events came in, so a lake is only replayed.
                let record = match (files.is_empty(), lake.lake.as_deref()) {
                    (false, Some(_)) => Some(lake.open(&cfg)?),
                    (true, _) => {
                        check::replay_lake(&lake.open_existing(&cfg).await?, &mut engine).await?;
                        None
                    }
                    (false, None) => None,
                };
                let changes =
                    alerting::finish_replay(&mut engine, record.as_ref(), &cfg, notify).await?;
                let fired = alerting::summarize(&changes);
                if !fired.is_empty() {
                    eprintln!(
                        "alerts that would have fired{}:\n{}",
                        match (&record, notify) {
                            (_, true) => " (sent to the receivers)",
                            (Some(_), false) => " (recorded in lease_alerts; nobody notified)",
                            (None, false) => " (nobody notified; --notify sends them)",
                        },
                        fired.trim_end()
                    );
                }
            }
            Ok(if summary.violations > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Watch { backend } => watch::run(backend, &cfg).await.map(|()| ExitCode::SUCCESS),
        Command::Simulate { sim } => simulate::run(sim).await.map(|()| ExitCode::SUCCESS),
        Command::Timeline {
            lake,
            audit,
            lease_id,
            from,
            to,
            svg,
        } => {
            audit.apply(&mut cfg);
            at_the_callers_priority(&mut cfg);
            let engine = QueryEngine::with_audit_config(lake.open_existing(&cfg).await?, cfg.audit)
                .with_limits(cfg.query);
            let from = leaseline_server::http::time_param("--from", &from)?;
            let to = leaseline_server::http::time_param("--to", &to)?;
            // An unknown lease is an error (exit 2), never an empty picture.
            let picture = leaseline_server::svg::lease_svg(&engine, &lease_id, from, to).await?;
            if svg == "-" {
                let mut out = terminal::stdout();
                out.write_all(picture.as_bytes())?;
                out.flush()?;
            } else {
                std::fs::write(&svg, picture).with_context(|| format!("writing {svg}"))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            lake,
            listen,
            alerts,
            sim,
        } => {
            alerts.apply(&mut cfg)?;
            listen.apply(&mut cfg);
            // Small files, often: a demo wants to show data in the lake.
            cfg.flush.flush_interval = cfg.flush.flush_interval.min(Duration::from_secs(5));
            let lake = demo::fresh_lake(&lake)?;
            serve::run(lake, cfg, serve::Source::Simulator(sim.config()), telemetry)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::PgVerifier {} => {
            let password = read_password()?;
            anyhow::ensure!(
                !password.is_empty(),
                "the password is empty: give a real one on standard input"
            );
            println!(
                "{}",
                leaseline_server::pg_auth::ScramVerifier::new(&password)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact {
            lake,
            target_file_bytes,
            retention,
            keep_events,
        } => {
            if let Some(t) = target_file_bytes {
                cfg.compaction.target_file_bytes = t;
            }
            if let Some(r) = retention {
                cfg.compaction.retention = r;
            }
            if let Some(k) = keep_events {
                cfg.compaction.keep_events = k;
            }
            let lake = lake.open_existing(&cfg).await?;
            if let Some(first) = cfg
                .compaction
                .keep_events
                .first_day_kept(chrono::Utc::now())
            {
                let (files, rows) = lake.expire(first).await?;
                println!("removed {rows} rows in {files} files of the days before {first}");
            }
            let report = lake.compact(&policy(&cfg)).await?;
            let deleted = lake.vacuum(cfg.compaction.retention).await?;
            println!(
                "merged {} files into {} ({} rows); deleted {} replaced or orphaned files",
                report.merged_files, report.written_files, report.rows, deleted
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { lake, group_id } => {
            let location = lake.location(&cfg).to_string();
            let group = group_id.unwrap_or_else(|| cfg.kafka.group_id.clone());
            let r = leaseline_lake::migrate(&location, &group)
                .await
                .with_context(|| format!("migrating lake {location}"))?;
            println!(
                "migrated {location} from version {} of the old format: {} events, {} rejects, {} alerts in {} files; {} old files deleted",
                r.from_version, r.events, r.rejects, r.alerts, r.files_written, r.files_deleted
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Compaction's settings: a `lease_events` file waits for the cuts of
/// the stored audit rows for three audit windows, as the cuts trail the
/// newest events by about one and a half ([`Lake::compact`]).
fn policy(cfg: &Config) -> CompactionPolicy {
    CompactionPolicy {
        target_file_bytes: cfg.compaction.target_file_bytes.as_u64(),
        unsettled_wait: cfg.audit.event_window.saturating_mul(3),
        ..CompactionPolicy::default()
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn run_ingest(lake: Lake, cfg: Config) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutdown requested");
        signal_stop.cancel();
    });
    ingest_until(lake, &cfg, Input::Kafka, stop, Default::default()).await
}

/// What an ingest run reads.
pub(crate) enum Input {
    /// The `[kafka]` topics, and any requests of the hooks' intake.
    Kafka,
    /// Nothing but the requests of the hooks' intake (`POST /v1/logs`).
    Requests,
}

/// Ingests `input` into the lake until `stop` is cancelled, compacting in
/// the background; returns after the final flush (and offset commit).
pub(crate) async fn ingest_until(
    lake: Lake,
    cfg: &Config,
    input: Input,
    stop: CancellationToken,
    hooks: leaseline_ingest::IngestHooks,
) -> anyhow::Result<()> {
    let compactor = cfg.compaction.enabled.then(|| {
        let lake = lake.clone();
        let c = cfg.compaction.clone();
        let policy = policy(cfg);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(c.interval);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Some(first) = c.keep_events.first_day_kept(chrono::Utc::now()) {
                    if let Err(e) = lake.expire(first).await {
                        error!(error = %e, "removing expired days failed; will retry");
                    }
                }
                if let Err(e) = lake.compact(&policy).await {
                    error!(error = %e, "compaction failed; will retry");
                }
                if let Err(e) = lake.vacuum(c.retention).await {
                    error!(error = %e, "vacuum failed; will retry");
                }
            }
        })
    });

    // Stop consuming, flush, commit offsets; then stop the background work.
    let stats = match input {
        Input::Kafka => kafka::run(lake, &cfg.kafka, cfg.flush.clone(), stop, hooks).await?,
        Input::Requests => {
            leaseline_ingest::intake::run(lake, cfg.flush.clone(), stop, hooks).await?
        }
    };
    if let Some(c) = compactor {
        c.abort();
    }
    info!(
        events = stats.events,
        duplicates = stats.duplicates,
        rejects = stats.rejects,
        files = stats.files_written,
        "ingest stopped cleanly"
    );
    Ok(())
}

async fn run_import(
    lake: Lake,
    cfg: &Config,
    files: Vec<String>,
    notify: bool,
) -> anyhow::Result<()> {
    let total: u64 = files
        .iter()
        .filter(|f| *f != "-")
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let inputs = files
        .iter()
        .map(|f| ImportInput::open(f))
        .collect::<Result<Vec<_>, _>>()?;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template"),
    );
    let (fanout, engine) = alerting::replay_fanout(cfg, lake.clone());
    let progress = bar.clone();
    let summary = import(lake.clone(), inputs, &cfg.flush, Some(fanout), move |b| {
        progress.set_position(b)
    })
    .await?;
    bar.finish_and_clear();
    println!(
        "imported {} lines: {} events, {} duplicates, {} rejects; {} files written in {:.2}s ({:.0} lines/s)",
        summary.lines,
        summary.events,
        summary.duplicates,
        summary.rejects,
        summary.files_written,
        summary.elapsed.as_secs_f64(),
        summary.events_per_second()
    );
    let m = lake.latest().await?;
    println!(
        "lake {}: {} events and {} rejects in {} files (lease_events version {})",
        lake.store().url(),
        m.rows_of(Table::LeaseEvents),
        m.rows_of(Table::LeaseRejects),
        m.files_of(Table::LeaseEvents).count() + m.files_of(Table::LeaseRejects).count(),
        m.tables
            .get(&Table::LeaseEvents)
            .copied()
            .unwrap_or_default()
    );
    // The import has dropped the fan-out: the engine has every event.
    let mut engine = engine.await.context("the alert replay task failed")??;
    let changes = alerting::finish_replay(&mut engine, Some(&lake), cfg, notify).await?;
    let fired = changes
        .iter()
        .filter(|a| a.state == leaseline_alerts::AlertState::Firing)
        .count();
    if fired > 0 {
        println!(
            "{fired} alerts would have fired ({}; recorded in lease_alerts):\n{}",
            if notify {
                "sent to the receivers"
            } else {
                "nobody notified; --notify sends them"
            },
            alerting::summarize(&changes).trim_end()
        );
    } else {
        println!("no alert would have fired");
    }
    Ok(())
}

/// The first line of standard input, without its line break. At a
/// terminal it asks, and what is typed is not echoed.
fn read_password() -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    // SAFETY: tcgetattr/tcsetattr on standard input with a zeroed termios
    // that tcgetattr fills; the previous mode is restored below.
    let saved = terminal.then(|| unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        (libc::tcgetattr(0, &mut t) == 0).then(|| {
            let mut quiet = t;
            quiet.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &quiet);
            t
        })
    });
    if terminal {
        eprint!("PostgreSQL password: ");
    }
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    if let Some(Some(t)) = saved {
        // SAFETY: restores the mode saved above.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        eprintln!();
    }
    read.context("reading the password from standard input")?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(all(test, not(target_env = "msvc")))]
mod allocator_tests {
    /// jemalloc runs with the settings the binary gives it.
    #[test]
    fn jemalloc_returns_freed_pages_from_a_background_thread_within_a_second() {
        assert!(tikv_jemalloc_ctl::background_thread::read().unwrap());
        // SAFETY: `opt.dirty_decay_ms` is an ssize_t, read as isize.
        let decay: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"opt.dirty_decay_ms\0") }.unwrap();
        assert_eq!(decay, 1000);
    }
}
