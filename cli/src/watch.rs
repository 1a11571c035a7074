//! `leaseline watch <backend>`: a coordinator adapter. A backend of
//! `leaseline-watch` observes a lock service; its events go to Kafka
//! (emit's `KafkaSink`, keyed by `lease_id`) or, with `--lake`, straight
//! into the lake through the same ingest loop and writer as `import`, so
//! the lake's de-duplication by `event_id` is what makes a repeated
//! report one event.
//!
//! The lake sink is a bounded channel into the loop. Its `flush` returns
//! once every message offered before it has been handed to the writer and
//! the writer holds nothing uncommitted: only then does the watcher save
//! its state file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use leaseline_emit::{EmitError, KafkaSink, Sink};
use leaseline_ingest::pipeline::{self, Polled, SharedWriter, Source, Step};
use leaseline_ingest::LakeWriter;
use leaseline_lake::Lake;
use leaseline_schema::Origin;
use leaseline_watch::etcd::{Etcd, EtcdConfig};
use leaseline_watch::postgres::{self, Postgres, PostgresConfig};
use leaseline_watch::redis::{Redis, RedisConfig, TokenFrom, ValueLayout};
use leaseline_watch::zookeeper::{ZooKeeper, ZooKeeperConfig};
use leaseline_watch::{Backend, WatchConfig, WatchStats};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::Config;

/// The lock services `watch` can observe.
#[derive(Debug, clap::Subcommand)]
pub enum WatchCommand {
    /// Redis locks taken with `SET key value NX PX ttl` (docs/sources.md).
    Redis(RedisArgs),
    /// etcd v3 locks and elections of its `concurrency` package, as
    /// `etcdctl lock` and `etcdctl elect` make them (docs/sources.md).
    Etcd(EtcdArgs),
    /// Leases kept as rows of a PostgreSQL table, changes notified by a
    /// trigger (docs/sources.md).
    Postgres(PostgresArgs),
    /// ZooKeeper locks (the lock recipe, Curator's InterProcessMutex):
    /// ephemeral sequential nodes under a root (docs/sources.md).
    Zookeeper(ZooKeeperArgs),
}

/// Flags of `leaseline watch zookeeper`.
#[derive(Debug, clap::Args)]
pub struct ZooKeeperArgs {
    /// The ensemble, `host:port[,host:port]`.
    #[arg(
        long,
        env = "LEASELINE_WATCH_ZOOKEEPER_CONNECT",
        default_value = "127.0.0.1:2181"
    )]
    connect: String,
    /// The locks are the children of this node.
    #[arg(long, env = "LEASELINE_WATCH_ZOOKEEPER_ROOT", default_value = "/locks")]
    root: String,
    /// Where to ask `dump` whether a lock's session still lives, to tell a
    /// release from a session's expiry (`host:port`; in an ensemble, the
    /// leader). Default: the first server of `--connect`.
    #[arg(long, env = "LEASELINE_WATCH_ZOOKEEPER_DUMP_AT")]
    dump_at: Option<String>,
    /// The watcher's own session timeout.
    #[arg(long, env = "LEASELINE_WATCH_ZOOKEEPER_SESSION_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    session_timeout: Duration,
    /// A request the server does not answer within this long is a lost
    /// connection.
    #[arg(long, env = "LEASELINE_WATCH_ZOOKEEPER_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    common: CommonArgs,
}

/// Flags of `leaseline watch postgres`.
#[derive(Debug, clap::Args)]
pub struct PostgresArgs {
    /// The database, `postgres://user[:password]@host:port/dbname` (or
    /// libpq's `key=value` form). Without TLS.
    #[arg(
        long,
        env = "LEASELINE_WATCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    url: String,
    /// The lease table, `name` or `schema.name`, with columns `name text
    /// primary key, holder text, token bigint, expires_at timestamptz`.
    #[arg(long, env = "LEASELINE_WATCH_POSTGRES_TABLE", default_value = "leases")]
    table: String,
    /// Install (or replace) the table's notification trigger at each
    /// connect; needs the right to create functions and triggers.
    #[arg(long, env = "LEASELINE_WATCH_POSTGRES_INSTALL")]
    install: bool,
    /// Print the SQL that installs the table's notification trigger, and
    /// exit.
    #[arg(long)]
    print_install_sql: bool,
    /// A query the server does not answer within this long is a lost
    /// connection.
    #[arg(long, env = "LEASELINE_WATCH_POSTGRES_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    common: CommonArgs,
}

/// Flags of `leaseline watch redis`.
#[derive(Debug, clap::Args)]
pub struct RedisArgs {
    /// The Redis server, `redis://[user:password@]host:port[/db]`.
    #[arg(
        long,
        env = "LEASELINE_WATCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/0",
        hide_env_values = true
    )]
    url: String,
    /// The locks' keys start with this; the `lease_id` is the rest of the
    /// key.
    #[arg(long, env = "LEASELINE_WATCH_REDIS_PREFIX")]
    prefix: String,
    /// The key of a lock's fencing token counter, `{key}` standing for the
    /// lock's key.
    #[arg(
        long,
        env = "LEASELINE_WATCH_REDIS_TOKEN_KEY",
        default_value = "{key}:token"
    )]
    token_key: String,
    /// Read the fencing token from this part (from 0) of the value cut at
    /// `--value-separator`, instead of a counter key.
    #[arg(
        long,
        env = "LEASELINE_WATCH_REDIS_TOKEN_PART",
        requires = "value_separator"
    )]
    token_part: Option<usize>,
    /// Cut the value at this separator; without it the whole value is the
    /// holder.
    #[arg(long, env = "LEASELINE_WATCH_REDIS_VALUE_SEPARATOR")]
    value_separator: Option<String>,
    /// The part (from 0) of the value that names the holder.
    #[arg(
        long,
        env = "LEASELINE_WATCH_REDIS_HOLDER_PART",
        default_value_t = 0,
        requires = "value_separator"
    )]
    holder_part: usize,
    /// Do not turn on keyspace notifications with `CONFIG SET`: the server
    /// is set up already (or changes are seen at resyncs only).
    #[arg(long, env = "LEASELINE_WATCH_REDIS_NO_CONFIGURE")]
    no_configure: bool,
    /// A read Redis does not answer within this long is a lost connection.
    #[arg(long, env = "LEASELINE_WATCH_REDIS_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    common: CommonArgs,
}

/// Flags of `leaseline watch etcd`.
#[derive(Debug, clap::Args)]
pub struct EtcdArgs {
    /// The cluster's client endpoints, `http://host:port` (comma-separated
    /// or repeated).
    #[arg(
        long,
        env = "LEASELINE_WATCH_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    endpoints: Vec<String>,
    /// The locks' keys start with this (`/` added when missing): a lock or
    /// election `NAME` under it is `<prefix>NAME/<lease hex>`, and its
    /// `lease_id` is `NAME`.
    #[arg(long, env = "LEASELINE_WATCH_ETCD_PREFIX")]
    prefix: String,
    /// The user, for a cluster with authentication on.
    #[arg(long, env = "LEASELINE_WATCH_ETCD_USER", requires = "password")]
    user: Option<String>,
    /// The user's password.
    #[arg(long, env = "LEASELINE_WATCH_ETCD_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// A call etcd does not answer within this long is a lost connection.
    #[arg(long, env = "LEASELINE_WATCH_ETCD_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// How often the TTL left of each owner's lease is read: renewals
    /// are seen this often, and it keeps an expiry told from a revoke.
    #[arg(long, env = "LEASELINE_WATCH_ETCD_LEASE_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    lease_poll_interval: Duration,
    #[command(flatten)]
    common: CommonArgs,
}

/// Flags every backend shares: where events go, resync, resume.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// Write events into this lake instead of producing them to Kafka.
    #[arg(long, env = "LEASELINE_WATCH_LAKE", conflicts_with = "brokers")]
    lake: Option<String>,
    /// Produce events to these Kafka brokers, `host:port[,host:port]`.
    #[arg(long, env = "LEASELINE_WATCH_BROKERS")]
    brokers: Option<String>,
    /// The topic to produce to.
    #[arg(long, env = "LEASELINE_WATCH_TOPIC", default_value = "lease-events")]
    topic: String,
    /// A librdkafka property of the producer, `key=value` (repeatable),
    /// e.g. for TLS or SASL.
    #[arg(
        long = "kafka-property",
        env = "LEASELINE_WATCH_KAFKA_PROPERTIES",
        value_delimiter = ';',
        hide_env_values = true
    )]
    kafka_properties: Vec<String>,
    /// Where what was reported is kept across restarts. Without it, locks
    /// that end while the watcher is stopped are never reported.
    #[arg(long, env = "LEASELINE_WATCH_STATE_FILE")]
    state_file: Option<PathBuf>,
    /// How often every lock is read again, for changes whose notification
    /// was lost (e.g. `30s`).
    #[arg(long, env = "LEASELINE_WATCH_RESYNC_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    resync_interval: Duration,
    /// How often the state file is brought up to date.
    #[arg(long, env = "LEASELINE_WATCH_CHECKPOINT_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    checkpoint_interval: Duration,
    /// The longest wait between reconnects to a lost lock service.
    #[arg(long, env = "LEASELINE_WATCH_MAX_BACKOFF", default_value = "10s", value_parser = humantime::parse_duration)]
    max_backoff: Duration,
}

/// Events waiting for the sink: enough for a burst of transitions, small
/// enough that a stalled sink holds the watcher back soon.
const SINK_CAPACITY: usize = 10_000;

/// Runs a watcher until SIGINT or SIGTERM.
pub async fn run(cmd: WatchCommand, cfg: &Config) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        info!("shutdown requested");
        signal_stop.cancel();
    });
    match cmd {
        WatchCommand::Redis(a) => {
            let token = match a.token_part {
                Some(i) => TokenFrom::ValuePart(i),
                None => TokenFrom::Counter(a.token_key),
            };
            let backend = Redis::new(RedisConfig {
                url: a.url,
                prefix: a.prefix,
                layout: ValueLayout {
                    separator: a.value_separator,
                    holder_part: a.holder_part,
                },
                token,
                configure_notifications: !a.no_configure,
                timeout: a.timeout,
            })?;
            watch(backend, a.common, cfg, stop).await
        }
        WatchCommand::Etcd(a) => {
            let backend = Etcd::new(EtcdConfig {
                endpoints: a.endpoints,
                prefix: a.prefix,
                user: a.user.zip(a.password),
                timeout: a.timeout,
                lease_poll_interval: a.lease_poll_interval,
            })?;
            watch(backend, a.common, cfg, stop).await
        }
        WatchCommand::Postgres(a) => {
            if a.print_install_sql {
                let sql = postgres::install_sql(&a.table).map_err(anyhow::Error::msg)?;
                print!("{sql}");
                return Ok(());
            }
            let backend = Postgres::new(PostgresConfig {
                url: a.url,
                table: a.table,
                install: a.install,
                timeout: a.timeout,
            })?;
            watch(backend, a.common, cfg, stop).await
        }
        WatchCommand::Zookeeper(a) => {
            let backend = ZooKeeper::new(ZooKeeperConfig {
                connect: a.connect,
                root: a.root,
                dump_at: a.dump_at,
                session_timeout: a.session_timeout,
                timeout: a.timeout,
            })?;
            watch(backend, a.common, cfg, stop).await
        }
    }
}

async fn watch<B: Backend>(
    backend: B,
    args: CommonArgs,
    cfg: &Config,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let stats = Arc::new(WatchStats::default());
    let config = WatchConfig {
        resync_interval: args.resync_interval.max(Duration::from_millis(10)),
        checkpoint_interval: args.checkpoint_interval.max(Duration::from_millis(10)),
        state_file: args.state_file,
        backoff_max: args.max_backoff,
        ..WatchConfig::default()
    };
    let origin = format!("watch:{}:{}", backend.name(), backend.describe());
    if let Some(location) = args.lake {
        let lake = Lake::open(&location).with_context(|| format!("opening lake {location}"))?;
        let writer: SharedWriter = Arc::new(Mutex::new(LakeWriter::open(lake).await?));
        let (sink, source) = lake_feed(writer.clone(), origin);
        let ended = sink.ended.clone();
        let policy = cfg.flush.clone();
        // The loop ends when the watcher drops the sink: the channel
        // closes, and what is left is flushed.
        let ingest = tokio::spawn(async move {
            let r = pipeline::run(source, writer, policy, CancellationToken::new()).await;
            ended.store(true, Ordering::Release);
            r
        });
        let watched =
            leaseline_watch::run(backend, Arc::new(sink), config, stats.clone(), stop).await;
        let ingested = ingest.await.context("the lake writer")?;
        watched?;
        ingested?;
    } else {
        let brokers = args
            .brokers
            .context("give --lake DIR, or --brokers for Kafka")?;
        let mut kc = rdkafka::ClientConfig::new();
        kc.set("bootstrap.servers", &brokers);
        for p in args.kafka_properties.iter().filter(|p| !p.is_empty()) {
            let (k, v) = crate::key_value("--kafka-property", p)?;
            kc.set(k, v);
        }
        let sink = KafkaSink::new(kc, &args.topic, SINK_CAPACITY)?;
        leaseline_watch::run(backend, Arc::new(sink), config, stats.clone(), stop).await?;
    }
    info!(
        events = WatchStats::get(&stats.events),
        reconnects = WatchStats::get(&stats.reconnects),
        unreadable = WatchStats::get(&stats.unreadable),
        notifications = WatchStats::get(&stats.notifications),
        resyncs = WatchStats::get(&stats.resyncs),
        "watch stopped"
    );
    Ok(())
}

/// What the lake sink and its source share.
#[derive(Default)]
struct Progress {
    offered: AtomicU64,
    /// Messages the source has handed to the writer.
    taken: AtomicU64,
}

/// The watcher's side of the channel into the ingest loop.
struct LakeSink {
    tx: SyncSender<Vec<u8>>,
    progress: Arc<Progress>,
    writer: SharedWriter,
    /// The ingest loop has returned: nothing more will be committed.
    ended: Arc<AtomicBool>,
}

/// The ingest loop's side: one input partition, in the order sent.
struct FeedSource {
    rx: Receiver<Vec<u8>>,
    progress: Arc<Progress>,
    origin: String,
    line: u64,
}

fn lake_feed(writer: SharedWriter, origin: String) -> (LakeSink, FeedSource) {
    let (tx, rx) = std::sync::mpsc::sync_channel(SINK_CAPACITY);
    let progress = Arc::new(Progress::default());
    (
        LakeSink {
            tx,
            progress: progress.clone(),
            writer,
            ended: Arc::new(AtomicBool::new(false)),
        },
        FeedSource {
            rx,
            progress,
            origin,
            line: 0,
        },
    )
}

impl Sink for LakeSink {
    fn offer(&self, _key: &str, payload: &[u8]) -> Result<(), EmitError> {
        match self.tx.try_send(payload.to_vec()) {
            Ok(()) => {
                self.progress.offered.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(EmitError::Full),
            Err(TrySendError::Disconnected(_)) => {
                Err(EmitError::Sink("the lake writer has stopped".into()))
            }
        }
    }

    fn flush(&self, timeout: Duration) -> Result<(), EmitError> {
        let target = self.progress.offered.load(Ordering::Acquire);
        let started = Instant::now();
        loop {
            if self.ended.load(Ordering::Acquire) {
                return Err(EmitError::Sink("the lake writer has stopped".into()));
            }
            // The writer's lock is held through a flush, so an empty buffer
            // seen here is a committed one, unless the flush that emptied it
            // failed (the rows are gone, and the loop is ending).
            if self.progress.taken.load(Ordering::Acquire) >= target {
                let w = pipeline::lock(&self.writer);
                if !w.is_buffering() {
                    let last = *w.flushes().borrow();
                    if last.epoch > 0 && !last.ok {
                        return Err(EmitError::Sink("the lake commit failed".into()));
                    }
                    return Ok(());
                }
            }
            if started.elapsed() >= timeout {
                return Err(EmitError::Sink("the lake did not commit in time".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Source for FeedSource {
    fn poll(&mut self, timeout: Duration, take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step {
        let mut next = match self.rx.recv_timeout(timeout) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => return Step::More,
            Err(RecvTimeoutError::Disconnected) => return Step::End,
        };
        loop {
            self.line += 1;
            let more = take(Polled::Message(
                &next,
                Origin::File {
                    path: &self.origin,
                    line: self.line,
                },
            ));
            self.progress.taken.fetch_add(1, Ordering::AcqRel);
            if !more {
                return Step::More;
            }
            next = match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Empty) => return Step::More,
                Err(TryRecvError::Disconnected) => return Step::End,
            };
        }
    }
}
