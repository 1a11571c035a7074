//! The Kafka source of the ingest loop ([`crate::pipeline`]): a
//! consumer-group member.
//!
//! Exactly once into the lake comes from three rules:
//! - the lake's manifest, not the group's committed offsets, says how far
//!   each partition is consumed; messages below it are skipped, and an
//!   assigned partition starts there;
//! - offsets advance in the lake only in the same commit as the files
//!   holding their messages, and a commit fails if another writer already
//!   committed past its start (a zombie can never add rows twice);
//! - offsets are committed to the group only after the lake commit, so the
//!   group never runs ahead of the lake.
//!
//! The consumer is a `BaseConsumer` polled on the loop's blocking thread,
//! because librdkafka calls the rebalance callback from inside `poll`: on
//! revoke we must flush the partitions' rows before giving them up, with
//! the writer the loop shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use leaseline_lake::Lake;
use leaseline_schema::Origin;

use crate::align::{Alignment, Change};
use crate::config::{is_secret_property, FlushPolicy, KafkaConfig};
use crate::error::{IngestError, Result};
use crate::hooks::{IngestHooks, IngestMetrics, InputPartition, Notice};
use crate::otlp::{self, Encoding};
use crate::pipeline::{self, Polled, Source, Step};
use crate::writer::{FlushReport, LakeWriter, WriterStats};

const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

struct IngestContext {
    writer: Arc<Mutex<LakeWriter>>,
    handle: Handle,
    resume: ResumePoints,
    metrics: Option<Arc<IngestMetrics>>,
    /// The consumer group: its positions are the lake's `txn` versions.
    group: String,
    /// Which partitions are paused for being ahead in event time; None
    /// when `kafka.max_drift` is zero, so that reading unaligned takes no
    /// lock for it. Only ever locked after the writer, or alone.
    align: Option<Mutex<Alignment>>,
}

impl IngestContext {
    fn writer(&self) -> MutexGuard<'_, LakeWriter> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn align(&self) -> Option<MutexGuard<'_, Alignment>> {
        let a = self.align.as_ref()?;
        Some(a.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// `/metrics`' count of paused partitions, after any change to them
    /// (a revoked partition is no longer paused here).
    fn count_paused(&self, a: &Alignment) {
        if let Some(m) = &self.metrics {
            m.partitions_paused
                .store(a.paused() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Where each partition was (re)started, until its first message arrives.
///
/// A first message beyond that point means offsets the lake never saw are
/// gone from the broker: retention deleted them before we got there, the
/// topic is compacted or transactional, or the broker skipped them. The
/// first is data loss an operator must hear about, so every such gap is
/// logged with its size.
#[derive(Default)]
struct ResumePoints(Mutex<HashMap<(String, i32), i64>>);

impl ResumePoints {
    fn set(&self, topic: &str, partition: i32, next: i64) {
        self.lock().insert((topic.to_string(), partition), next);
    }

    fn clear(&self) {
        self.lock().clear();
    }

    fn check(&self, topic: &str, partition: i32, offset: i64) {
        let mut map = self.lock();
        if map.is_empty() {
            return;
        }
        if let Some(expected) = map.remove(&(topic.to_string(), partition)) {
            if offset > expected {
                warn!(
                    topic,
                    partition,
                    resumed_at = expected,
                    first_offset = offset,
                    missing = offset - expected,
                    "the broker has no messages between the lake's offset and the first one \
                     received (retention, compaction, transaction markers or a broker fault)"
                );
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, i32), i64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientContext for IngestContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        // Which partitions have nothing waiting: the application has read
        // up to the broker's high watermark (or, having read nothing since
        // it started there, fetches from it).
        let mut caught_up = Vec::new();
        for (topic, t) in &statistics.topics {
            for (id, p) in &t.partitions {
                let read = if p.app_offset >= 0 {
                    p.app_offset
                } else {
                    p.next_offset
                };
                if *id >= 0 && p.hi_offset >= 0 && read >= p.hi_offset {
                    caught_up.push((topic.as_str(), *id));
                }
            }
        }
        if !caught_up.is_empty() {
            let mut w = self.writer();
            for &(topic, partition) in &caught_up {
                w.signal(Notice::CaughtUp(InputPartition { topic, partition }));
            }
            drop(w);
            if let Some(mut a) = self.align() {
                for &(topic, partition) in &caught_up {
                    a.caught_up(topic, partition);
                }
            }
        }
        let Some(m) = &self.metrics else { return };
        let mut lag = m.lag.lock().unwrap_or_else(|p| p.into_inner());
        lag.clear();
        for (topic, t) in statistics.topics {
            for (id, p) in t.partitions {
                // librdkafka lists an internal partition -1 and reports -1
                // for partitions it does not consume.
                if id >= 0 && p.consumer_lag >= 0 {
                    lag.insert((topic.clone(), id), p.consumer_lag);
                }
            }
        }
    }
}

/// How long giving up partitions waits for the process's consumers to
/// write what they hold about them.
const REVOKE_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

impl ConsumerContext for IngestContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut w = self.writer();
                let parts: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                w.lake()
                    .track_partitions(&self.group, parts.iter().cloned());
                // Another ingester may have committed these partitions'
                // rows since we last looked: learn its offsets and ids.
                if let Err(e) = self.handle.block_on(w.refresh()) {
                    error!(error = %e, "could not reload the lake on assignment");
                }
                for (topic, p) in &parts {
                    if let Some(next) = w.manifest().next_offset(topic, *p) {
                        self.resume.set(topic, *p, next);
                        if let Err(e) = tpl.set_partition_offset(topic, *p, Offset::Offset(next)) {
                            warn!(topic, partition = p, error = %e, "could not set start offset");
                        }
                    }
                }
                info!(partitions = ?parts, "assigned");
                if let Err(e) = consumer.assign(tpl) {
                    error!(error = %e, "assign failed");
                }
                if let Some(mut a) = self.align() {
                    for (topic, p) in &parts {
                        a.assigned(topic, *p);
                    }
                    self.count_paused(&a);
                    // librdkafka keeps a partition's pause across its
                    // revocation; a partition assigned again starts afresh.
                    if let Err(e) = consumer.resume(tpl) {
                        warn!(error = %e, "could not resume the assigned partitions");
                    }
                }
                for (topic, partition) in &parts {
                    w.signal(Notice::Assigned(InputPartition {
                        topic,
                        partition: *partition,
                    }));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let mut w = self.writer();
                match self.handle.block_on(w.flush()) {
                    Ok(_) => commit_offsets(consumer, &w, CommitMode::Sync),
                    Err(e) => {
                        // Nothing of the buffer was committed; the next
                        // owner starts from the lake's offsets.
                        error!(error = %e, "flush on revocation failed; dropping the buffer");
                        if let Err(e) = self.handle.block_on(w.reset()) {
                            error!(error = %e, "could not reload the lake");
                        }
                    }
                }
                self.resume.clear();
                for e in tpl.elements() {
                    w.signal(Notice::Revoked(InputPartition {
                        topic: e.topic(),
                        partition: e.partition(),
                    }));
                }
                if let Some(mut a) = self.align() {
                    for e in tpl.elements() {
                        a.revoked(e.topic(), e.partition());
                    }
                    self.count_paused(&a);
                }
                // The next owner reads what this process's consumers wrote
                // about these partitions (the alert history): it must be in
                // the lake before they are given up.
                if !self.handle.block_on(w.sync_fanout(REVOKE_SYNC_TIMEOUT)) {
                    warn!(
                        timeout = ?REVOKE_SYNC_TIMEOUT,
                        "the alert engine did not confirm the revoked partitions in time; their next owner may record some alerts again"
                    );
                }
                info!(partitions = tpl.count(), "revoked");
                if let Err(e) = consumer.unassign() {
                    error!(error = %e, "unassign failed");
                }
            }
            other => {
                error!(error = ?other, "rebalance error");
                let _ = consumer.unassign();
            }
        }
    }
}

/// Commits to the group the lake's offsets of the partitions we own.
fn commit_offsets(consumer: &BaseConsumer<IngestContext>, w: &LakeWriter, mode: CommitMode) {
    let Ok(assignment) = consumer.assignment() else {
        return;
    };
    let mut tpl = TopicPartitionList::new();
    for e in assignment.elements() {
        if let Some(next) = w.manifest().next_offset(e.topic(), e.partition()) {
            let _ = tpl.add_partition_offset(e.topic(), e.partition(), Offset::Offset(next));
        }
    }
    if tpl.count() > 0 {
        if let Err(e) = consumer.commit(&tpl, mode) {
            warn!(error = %e, "committing offsets to the group failed; the lake still has them");
        }
    }
}

/// Seeks partitions we own back to the lake's offsets.
fn rewind(consumer: &BaseConsumer<IngestContext>, w: &LakeWriter, only: Option<&[(String, i32)]>) {
    let Ok(assignment) = consumer.assignment() else {
        return;
    };
    for e in assignment.elements() {
        if let Some(only) = only {
            if !only
                .iter()
                .any(|(t, p)| t == e.topic() && *p == e.partition())
            {
                continue;
            }
        }
        let to = match w.manifest().next_offset(e.topic(), e.partition()) {
            Some(n) => {
                consumer.context().resume.set(e.topic(), e.partition(), n);
                Offset::Offset(n)
            }
            None => Offset::Beginning,
        };
        if let Err(err) = consumer.seek(e.topic(), e.partition(), to, SEEK_TIMEOUT) {
            warn!(topic = e.topic(), partition = e.partition(), error = %err, "seek failed");
        }
        if let Some(mut a) = consumer.context().align() {
            a.rewound(e.topic(), e.partition());
        }
    }
}

/// Builds the librdkafka configuration: our required settings, then the
/// user's pass-through properties.
pub fn client_config(cfg: &KafkaConfig) -> Result<ClientConfig> {
    if cfg.topics.is_empty() {
        return Err(IngestError::Config("kafka.topics is empty".into()));
    }
    for key in ["enable.auto.commit", "enable.auto.offset.store"] {
        if cfg.properties.contains_key(key) {
            return Err(IngestError::Config(format!(
                "kafka property {key} is managed by leaseline (offsets are committed after the lake)"
            )));
        }
    }
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.brokers)
        .set("group.id", &cfg.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        // Bound what librdkafka prefetches: the flush buffer is the memory
        // that matters.
        .set("queued.max.messages.kbytes", "16384")
        // A fetch waits at most this long for new messages (librdkafka's
        // default is 500 ms): events must reach SQL within a second.
        .set("fetch.wait.max.ms", "100")
        // Per-partition lag for /metrics, and which partitions are caught
        // up (the alert watermark's idleness), come from librdkafka's
        // statistics.
        .set("statistics.interval.ms", "1000");
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    for (k, path) in &cfg.property_files {
        if cfg.properties.contains_key(k) {
            return Err(IngestError::Config(format!(
                "kafka property {k} is given twice, in kafka.properties and kafka.property_files"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            IngestError::Config(format!(
                "reading kafka property {k} from {}: {e}",
                path.display()
            ))
        })?;
        let value = text.lines().next().unwrap_or("");
        if value.is_empty() {
            return Err(IngestError::Config(format!(
                "kafka property {k}: the file {} is empty",
                path.display()
            )));
        }
        c.set(k, value);
    }
    Ok(c)
}

/// librdkafka's refusal of a property names its value; a secret's (a
/// password under a misspelt key, say) must not reach the log.
fn redacted(e: KafkaError, cfg: &KafkaConfig) -> KafkaError {
    match e {
        KafkaError::ClientConfig(res, desc, key, _)
            if is_secret_property(&key) || cfg.property_files.contains_key(&key) =>
        {
            KafkaError::ClientConfig(res, desc, key, "<redacted>".into())
        }
        e => e,
    }
}

/// Consumes until `stop` is cancelled, then stops in order: stop
/// consuming, flush, commit offsets, leave the group. With
/// `hooks.pending`, buffered rows are published there for queries in the
/// same process; `hooks.fanout` receives each event once it is committed.
pub async fn run(
    lake: Lake,
    cfg: &KafkaConfig,
    policy: FlushPolicy,
    stop: CancellationToken,
    hooks: IngestHooks,
) -> Result<WriterStats> {
    // The group's positions are the lake's `txn`s of its partitions.
    lake.track_partitions(&cfg.group_id, []);
    let metrics = hooks.metrics.clone();
    let writer = pipeline::open_writer(lake, hooks).await?;
    let ctx = IngestContext {
        writer: writer.clone(),
        handle: Handle::current(),
        resume: ResumePoints::default(),
        metrics,
        group: cfg.group_id.clone(),
        align: Alignment::new(cfg.max_drift).map(Mutex::new),
    };
    let consumer: BaseConsumer<IngestContext> = client_config(cfg)?
        .create_with_context(ctx)
        .map_err(|e| redacted(e, cfg))?;
    let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    info!(brokers = %cfg.brokers, topics = ?cfg.topics, group = %cfg.group_id, "consuming");
    info!(encoding = %cfg.encoding, "messages are read as {}", cfg.encoding);
    let source = KafkaSource {
        consumer,
        backoff: FIRST_BACKOFF,
        encoding: cfg.encoding,
        last_align: Instant::now(),
    };
    pipeline::run(source, writer, policy, stop).await
}

const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// A consumer-group member as a [`Source`] of the ingest loop.
struct KafkaSource {
    consumer: BaseConsumer<IngestContext>,
    /// The pause before reading again after a failed flush.
    backoff: Duration,
    encoding: Encoding,
    /// When the alignment last decided.
    last_align: Instant,
}

/// How often paused partitions are looked at again when no event asks
/// for it: resuming a little late costs nothing but a short pause.
const ALIGN_EVERY: Duration = Duration::from_millis(50);

/// Feeds the alignment the event time of the message just handed to the
/// writer from `read`, and pauses or resumes partitions as it decides.
fn align(consumer: &BaseConsumer<IngestContext>, last: &mut Instant, read: Option<(&str, i32)>) {
    let ctx = consumer.context();
    let Some(alignment) = &ctx.align else { return };
    let ts = read.and_then(|_| ctx.writer().take_event_time());
    let mut a = alignment.lock().unwrap_or_else(|p| p.into_inner());
    let ahead = match (read, ts) {
        (Some((topic, partition)), Some(ts)) => a.event(topic, partition, ts),
        _ => false,
    };
    if !ahead && last.elapsed() < ALIGN_EVERY {
        return;
    }
    *last = Instant::now();
    let changes = a.step();
    if changes.is_empty() {
        return;
    }
    ctx.count_paused(&a);
    drop(a);
    let (mut pause, mut resume) = (TopicPartitionList::new(), TopicPartitionList::new());
    for ((topic, partition), change) in &changes {
        debug!(topic, partition, ?change, "alignment");
        match change {
            Change::Pause => pause.add_partition(topic, *partition),
            Change::Resume => resume.add_partition(topic, *partition),
        };
    }
    if pause.count() > 0 {
        if let Err(e) = consumer.pause(&pause) {
            warn!(error = %e, "could not pause partitions ahead in event time");
        }
    }
    if resume.count() > 0 {
        if let Err(e) = consumer.resume(&resume) {
            warn!(error = %e, "could not resume partitions");
        }
        // A resumed partition is fetched again from the message after the
        // last one read, which may be inside a record batch: a broker that
        // answers with the next batch instead (tansu 0.6) loses the rest,
        // and that gap is logged like any other.
        if let Ok(positions) = consumer.position() {
            for e in resume.elements() {
                let at = positions
                    .find_partition(e.topic(), e.partition())
                    .and_then(|p| p.offset().to_raw());
                if let Some(next) = at.filter(|n| *n >= 0) {
                    ctx.resume.set(e.topic(), e.partition(), next);
                }
            }
        }
    }
    if let Some(m) = &ctx.metrics {
        IngestMetrics::add(&m.partition_pauses, pause.count() as u64);
    }
}

impl Source for KafkaSource {
    fn poll(&mut self, timeout: Duration, take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step {
        // The writer lock is not held while polling: the rebalance and
        // statistics callbacks run inside poll and take it.
        match self.consumer.poll(timeout) {
            None => align(&self.consumer, &mut self.last_align, None),
            Some(Ok(msg)) => {
                let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
                self.consumer
                    .context()
                    .resume
                    .check(topic, partition, offset);
                // One message a poll: the loop looks at its flush policy
                // after each. Every record of a message is handed before
                // that, since a commit covers whole messages.
                let payload = msg.payload().unwrap_or_default();
                let origin = Origin::Kafka {
                    topic,
                    partition,
                    offset,
                };
                match self.encoding {
                    Encoding::Json => {
                        let _ = take(Polled::Message(payload, origin));
                    }
                    otlp => match otlp::records(payload, otlp) {
                        Ok(records) => {
                            for (i, record) in records.iter().enumerate() {
                                let origin = Origin::KafkaRecord {
                                    topic,
                                    partition,
                                    offset,
                                    record: u32::try_from(i + 1).unwrap_or(u32::MAX),
                                };
                                let _ = take(Polled::Message(record, origin));
                            }
                        }
                        Err(err) => {
                            warn!(topic, partition, offset, error = %err, "message kept in lease_rejects");
                            let _ = take(Polled::Refused(payload, &err, origin));
                        }
                    },
                }
                align(
                    &self.consumer,
                    &mut self.last_align,
                    Some((topic, partition)),
                );
            }
            Some(Err(e)) => {
                warn!(error = %e, "kafka");
                align(&self.consumer, &mut self.last_align, None);
            }
        }
        Step::More
    }

    fn committed(&mut self, w: &LakeWriter, report: &FlushReport) {
        self.backoff = FIRST_BACKOFF;
        commit_offsets(&self.consumer, w, CommitMode::Async);
        if !report.lost_partitions.is_empty() {
            rewind(&self.consumer, w, Some(&report.lost_partitions));
        }
    }

    fn flush_failed(&mut self, w: &mut LakeWriter, error: IngestError, h: &Handle) -> Result<()> {
        // Storage trouble: nothing was committed. Start again from the
        // lake's offsets after a pause; Kafka keeps the messages meanwhile.
        error!(error = %error, retry_in = ?self.backoff, "flush failed");
        std::thread::sleep(self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
        match h.block_on(w.reset()) {
            Ok(()) => rewind(&self.consumer, w, None),
            Err(e) => error!(error = %e, "could not reload the lake; will try again"),
        }
        Ok(())
    }

    fn finish(&mut self, w: &LakeWriter) -> Result<()> {
        commit_offsets(&self.consumer, w, CommitMode::Sync);
        self.consumer.unsubscribe();
        info!("stopped consuming; offsets committed, left the group");
        Ok(())
    }
}

/// Checks that the brokers answer, for start-up errors worth reporting.
pub fn check_brokers(cfg: &KafkaConfig, timeout: Duration) -> KafkaResult<usize> {
    let probe: BaseConsumer = client_config(cfg)
        .map_err(|e| rdkafka::error::KafkaError::ClientCreation(e.to_string()))?
        .create()
        .map_err(|e| redacted(e, cfg))?;
    Ok(probe.fetch_metadata(None, timeout)?.brokers().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "s3cr3t-kafka-pw";

    fn with_password_file(dir: &std::path::Path) -> KafkaConfig {
        let file = dir.join("kafka-password");
        std::fs::write(&file, format!("{PASSWORD}\nignored second line\n")).unwrap();
        let mut cfg = KafkaConfig::default();
        cfg.properties
            .insert("security.protocol".into(), "SASL_SSL".into());
        cfg.property_files.insert("sasl.password".into(), file);
        cfg
    }

    #[test]
    fn a_property_file_sets_the_property_to_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = with_password_file(dir.path());
        let c = client_config(&cfg).unwrap();
        assert_eq!(c.get("sasl.password"), Some(PASSWORD));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        // Neither the configuration nor librdkafka's shows it.
        assert!(!format!("{cfg:?}").contains(PASSWORD));
        assert!(!format!("{c:?}").contains(PASSWORD));
    }

    #[test]
    fn a_secret_given_inline_is_not_shown_by_debug() {
        let mut cfg = KafkaConfig::default();
        cfg.properties
            .insert("sasl.password".into(), PASSWORD.into());
        cfg.properties
            .insert("ssl.key.password".into(), PASSWORD.into());
        cfg.properties.insert("client.id".into(), "visible".into());
        let shown = format!("{cfg:?}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(
            shown.contains("\"sasl.password\": \"<redacted>\""),
            "{shown}"
        );
        assert!(shown.contains("visible"), "{shown}");
    }

    #[test]
    fn a_missing_empty_or_doubled_property_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = KafkaConfig::default();
        cfg.property_files
            .insert("sasl.password".into(), dir.path().join("absent"));
        let err = client_config(&cfg).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid configuration: reading kafka property sasl.password from ")
                && err.contains("absent"),
            "{err}"
        );

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        cfg.property_files.insert("sasl.password".into(), empty);
        let err = client_config(&cfg).unwrap_err().to_string();
        assert!(err.contains("is empty"), "{err}");

        let mut cfg = with_password_file(dir.path());
        cfg.properties.insert("sasl.password".into(), "x".into());
        let err = client_config(&cfg).unwrap_err().to_string();
        assert!(err.contains("given twice"), "{err}");
    }

    #[test]
    fn librdkafka_refusing_a_file_property_does_not_print_its_value() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = with_password_file(dir.path());
        // A misspelt key: librdkafka's error names the key and the value.
        let path = cfg.property_files.remove("sasl.password").unwrap();
        cfg.property_files.insert("sasl.pasword".into(), path);
        let err = client_config(&cfg)
            .unwrap()
            .create::<BaseConsumer>()
            .map(drop)
            .map_err(|e| redacted(e, &cfg))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains(PASSWORD), "{err}");
    }
}
