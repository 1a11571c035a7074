//! The lake writer: buffers decoded messages and commits them to the lake
//! with the Kafka ranges they cover, de-duplicated by `event_id`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch};
use leaseline_lake::{
    origin_key, parquet_io, slot_of, Change, DataFile, KafkaRange, Lake, LakeError, Manifest,
    Origins, PendingRows, PendingSnapshot, RecentIds, Seen, Table,
};
use leaseline_schema::{decode, DecodeError, EventBatchBuilder, Origin, RejectBatchBuilder};
use tracing::{debug, info, warn};

use crate::config::FlushPolicy;
use crate::error::Result;
use crate::fanout::Fanout;
use crate::hooks::{IngestMetrics, InputPartition, Notice};

/// What happened to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Event,
    Duplicate,
    Reject,
}

/// Running totals since the writer opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub events: u64,
    pub duplicates: u64,
    pub rejects: u64,
    pub files_written: u64,
    pub commits: u64,
}

/// What one flush committed.
#[derive(Debug, Default, Clone)]
pub struct FlushReport {
    pub events: u64,
    pub rejects: u64,
    pub files: Vec<DataFile>,
    /// Partitions whose buffered rows were dropped because another writer
    /// had already committed past them: the consumer must seek them back to
    /// the lake's offset (or has lost them in a rebalance).
    pub lost_partitions: Vec<(String, i32)>,
    pub version: u64,
    /// The `lease_events` rows of the lake at `version`.
    pub lake_events: u64,
}

/// The end of a flush, for those waiting on one (see
/// [`LakeWriter::flushes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Flushes ended since the writer opened.
    pub epoch: u64,
    /// Whether the last one committed (or had nothing to commit).
    pub ok: bool,
}

/// Buffers messages and commits them atomically to the lake.
pub struct LakeWriter {
    lake: Lake,
    /// Shared with the pending rows' readers, who read exactly this
    /// snapshot plus the rows.
    manifest: Arc<Manifest>,
    /// Files the writer has seen (their ids are in `seen` if their minute
    /// is resident).
    known_files: HashSet<String>,
    /// Ids of the newest minutes of event time (see [`RecentIds`]).
    seen: RecentIds,
    /// Ids of buffered events whose minute is older than `seen` holds, by
    /// minute: checked against the lake when the buffer is committed.
    late: BTreeMap<i32, HashSet<String>>,
    /// [`origin_key`]s of the rejects in `known_files`
    /// and in the buffer: a file imported again, or a topic read again by
    /// another consumer group, keeps each reject once.
    reject_lines: HashSet<u128>,
    events: EventBatchBuilder,
    rejects: RejectBatchBuilder,
    /// Buffered Kafka ranges: (topic, partition, first offset, next offset).
    ranges: Vec<KafkaRange>,
    buffered_rows: usize,
    buffered_bytes: u64,
    first_buffered: Option<Instant>,
    stats: WriterStats,
    /// Where buffered rows are published for readers in this process.
    pending: Option<PendingRows>,
    /// Buffered rows already taken out of the builders to be published;
    /// they are written by the next flush, before the builders' rest.
    published_events: Vec<RecordBatch>,
    published_rejects: Vec<RecordBatch>,
    /// Committed events for consumers in this process.
    fanout: Option<Fanout>,
    metrics: Option<Arc<IngestMetrics>>,
    flushed: tokio::sync::watch::Sender<Flushed>,
    /// The event time of the last message pushed, if it decoded, for the
    /// Kafka source's [`crate::align`]ment.
    last_event_ts: Option<i64>,
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

impl LakeWriter {
    /// Opens a writer on the lake's newest version, loading the
    /// `event_id`s of its newest minutes ([`RecentIds`]).
    pub async fn open(lake: Lake) -> Result<Self> {
        let manifest = lake.latest().await?;
        let newest = manifest
            .files_of(Table::LeaseEvents)
            .map(|f| slot_of(f.max_ts_us))
            .max();
        let mut seen = RecentIds::starting_at(newest);
        let files: Vec<&DataFile> = manifest.files.iter().collect();
        lake.load_event_ids(&files, &mut seen).await?;
        let mut reject_lines = HashSet::new();
        lake.load_reject_lines(&files, &mut reject_lines).await?;
        let known_files = manifest.files.iter().map(|f| f.path.clone()).collect();
        info!(
            version = manifest.version,
            files = manifest.files.len(),
            event_ids = seen.len(),
            minutes = seen.resident_slots(),
            "opened lake"
        );
        Ok(LakeWriter {
            lake,
            manifest: Arc::new(manifest),
            known_files,
            seen,
            late: BTreeMap::new(),
            reject_lines,
            events: EventBatchBuilder::new(),
            rejects: RejectBatchBuilder::new(),
            ranges: Vec::new(),
            buffered_rows: 0,
            buffered_bytes: 0,
            first_buffered: None,
            stats: WriterStats::default(),
            fanout: None,
            metrics: None,
            pending: None,
            published_events: Vec::new(),
            published_rejects: Vec::new(),
            flushed: tokio::sync::watch::Sender::new(Flushed::default()),
            last_event_ts: None,
        })
    }

    /// The end of every flush from now on: a row pushed before a flush
    /// began is committed when that flush ends `ok`, and gone when not.
    pub fn flushes(&self) -> tokio::sync::watch::Receiver<Flushed> {
        self.flushed.subscribe()
    }

    /// Attaches the fan-out of committed events and counters (see
    /// [`crate::IngestHooks`]); the pending buffer is attached with
    /// [`LakeWriter::publish_to`].
    pub fn attach(&mut self, fanout: Option<Fanout>, metrics: Option<Arc<IngestMetrics>>) {
        self.fanout = fanout;
        self.metrics = metrics;
    }

    /// Publishes buffered rows through `pending` from now on (see
    /// [`LakeWriter::publish`]).
    pub fn publish_to(&mut self, pending: PendingRows) {
        self.pending = Some(pending);
        self.publish();
    }

    /// Makes every row buffered so far visible to readers of the pending
    /// rows, with the manifest version they follow. Cheap enough to call a
    /// few times a second: only rows added since the last call are moved.
    pub fn publish(&mut self) {
        let Some(pending) = &self.pending else {
            return;
        };
        if !self.events.is_empty() {
            self.published_events.push(self.events.finish());
        }
        if !self.rejects.is_empty() {
            self.published_rejects.push(self.rejects.finish());
        }
        pending.publish(PendingSnapshot {
            base: Some(self.manifest.clone()),
            events: self.published_events.clone(),
            rejects: self.published_rejects.clone(),
        });
    }

    /// After a flush (or its failure) the buffered rows are either in the
    /// lake or gone: readers see the lake at the writer's version alone.
    fn unpublish(&mut self) {
        self.published_events.clear();
        self.published_rejects.clear();
        if let Some(pending) = &self.pending {
            pending.publish(PendingSnapshot {
                base: Some(self.manifest.clone()),
                ..PendingSnapshot::default()
            });
        }
    }

    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// The `event_id`s held in memory for de-duplication, and the first
    /// minute they cover (minutes since 1970-01-01; `None` while every
    /// minute is).
    pub fn ids_in_memory(&self) -> (usize, Option<i32>) {
        (self.seen.len(), self.seen.cutoff())
    }

    pub fn buffered_rows(&self) -> usize {
        self.buffered_rows
    }

    /// Passes on what a source says about an input partition, behind the
    /// events read before it (see [`crate::fanout`]).
    pub fn signal(&mut self, what: Notice<'_>) {
        if let Some(f) = &mut self.fanout {
            f.notice(what);
        }
    }

    /// Sends the partition notices queued while nothing is buffered; with
    /// rows buffered they wait for the commit.
    pub async fn send_notices(&mut self) {
        if self.buffered_rows == 0 {
            if let Some(f) = &mut self.fanout {
                f.send().await;
            }
        }
    }

    /// Sends the queued partition notices and waits, at most `timeout`,
    /// for the consumers to have handled everything sent (see
    /// [`crate::fanout`]); true when they have, or when there are none.
    pub async fn sync_fanout(&mut self, timeout: std::time::Duration) -> bool {
        match &mut self.fanout {
            Some(f) => f.sync(timeout).await,
            None => true,
        }
    }

    /// True if the lake already holds this Kafka message.
    pub fn already_committed(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.manifest
            .next_offset(topic, partition)
            .is_some_and(|next| offset < next)
    }

    /// Decodes one message and buffers it as an event, a duplicate (which
    /// only advances offsets) or a reject.
    pub fn push(&mut self, payload: &[u8], origin: Origin<'_>) -> Pushed {
        let now = now_us();
        let outcome = match decode(payload) {
            Ok(ev) => {
                self.last_event_ts = Some(ev.ts_us);
                let fresh = match ev.event_id.as_deref() {
                    Some(id) if !id.is_empty() => {
                        let slot = slot_of(ev.ts_us);
                        match self.seen.insert(slot, id) {
                            Seen::New => true,
                            Seen::Duplicate => false,
                            Seen::Unknown => {
                                self.late.entry(slot).or_default().insert(id.to_string())
                            }
                        }
                    }
                    _ => true,
                };
                if fresh {
                    self.events.append(&ev, &origin, now);
                    self.stats.events += 1;
                    if let Some(f) = &mut self.fanout {
                        let (from, offset) = match origin.kafka_position() {
                            Some((topic, partition, offset)) => {
                                (InputPartition { topic, partition }, Some(offset))
                            }
                            None => (InputPartition::FILE, None),
                        };
                        f.event(&ev, from, offset);
                    }
                    if let Some(m) = &self.metrics {
                        IngestMetrics::add(&m.events, 1);
                    }
                    Pushed::Event
                } else {
                    self.duplicate()
                }
            }
            Err(err) => self.refuse(payload, &err, origin, now),
        };
        self.advance(payload, origin);
        outcome
    }

    /// The event time of the last message pushed, once: None if it did not
    /// decode, or if nothing was pushed since the last call.
    pub fn take_event_time(&mut self) -> Option<i64> {
        self.last_event_ts.take()
    }

    /// Buffers a message refused before decoding (see
    /// [`crate::pipeline::Polled::Refused`]).
    pub fn push_refused(
        &mut self,
        payload: &[u8],
        err: &DecodeError,
        origin: Origin<'_>,
    ) -> Pushed {
        let outcome = self.refuse(payload, err, origin, now_us());
        self.advance(payload, origin);
        outcome
    }

    /// Keeps a reject once by its origin: a file imported again, or a
    /// topic read again by another consumer group, adds nothing.
    fn refuse(
        &mut self,
        payload: &[u8],
        err: &DecodeError,
        origin: Origin<'_>,
        now: i64,
    ) -> Pushed {
        if self.reject_lines.insert(origin_key(&origin)) {
            self.rejects.append(payload, err, &origin, now);
            self.stats.rejects += 1;
            if let Some(m) = &self.metrics {
                IngestMetrics::add(&m.rejects, 1);
            }
            Pushed::Reject
        } else {
            self.duplicate()
        }
    }

    fn duplicate(&mut self) -> Pushed {
        self.stats.duplicates += 1;
        if let Some(m) = &self.metrics {
            IngestMetrics::add(&m.duplicates, 1);
        }
        Pushed::Duplicate
    }

    /// Counts a buffered message and the Kafka offsets it covers.
    fn advance(&mut self, payload: &[u8], origin: Origin<'_>) {
        if let Some((topic, partition, offset)) = origin.kafka_position() {
            match self
                .ranges
                .iter_mut()
                .find(|r| r.partition == partition && r.topic == topic)
            {
                Some(r) => r.end = offset + 1,
                None => self.ranges.push(KafkaRange {
                    topic: topic.to_string(),
                    partition,
                    start: offset,
                    end: offset + 1,
                }),
            }
        }
        self.buffered_rows += 1;
        self.buffered_bytes += payload.len() as u64;
        self.first_buffered.get_or_insert_with(Instant::now);
    }

    /// Whether rows are buffered.
    pub fn is_buffering(&self) -> bool {
        self.buffered_rows > 0
    }

    /// With the input quiet: whether the buffer is old enough to flush
    /// ([`FlushPolicy::idle_flush`]).
    pub fn idle_flush_due(&self, policy: &FlushPolicy) -> bool {
        self.first_buffered
            .is_some_and(|t| t.elapsed() >= policy.idle_flush)
    }

    pub fn should_flush(&self, policy: &FlushPolicy) -> bool {
        self.buffered_rows >= policy.max_rows
            || self.buffered_bytes >= policy.max_bytes.as_u64()
            || self
                .first_buffered
                .is_some_and(|t| t.elapsed() >= policy.flush_interval)
    }

    /// Reloads the newest manifest and learns the ids of files other
    /// writers added (for example after being assigned partitions another
    /// ingester had).
    pub async fn refresh(&mut self) -> Result<()> {
        let (fresh, _) = self.load_unknown().await?;
        self.seen.merge(&fresh);
        Ok(())
    }

    /// Reloads the newest manifest; returns the ids of the files in it we
    /// did not know, without adding them to `seen`, and the line keys of
    /// the rejects in them that came from files.
    async fn load_unknown(&mut self) -> Result<(RecentIds, HashSet<u128>)> {
        let latest = self.lake.latest().await?;
        let unknown: Vec<&DataFile> = latest
            .files
            .iter()
            .filter(|f| !self.known_files.contains(&f.path))
            .collect();
        // Every minute of them: our buffered events of any minute are
        // checked against them.
        let mut fresh = RecentIds::new();
        self.lake.load_event_ids(&unknown, &mut fresh).await?;
        let mut lines = HashSet::new();
        self.lake.load_reject_lines(&unknown, &mut lines).await?;
        self.reject_lines.extend(lines.iter().copied());
        for f in &unknown {
            self.known_files.insert(f.path.clone());
        }
        // Ids of files that compaction replaced stay in `seen`: their rows
        // live on in the merged file.
        self.manifest = Arc::new(latest);
        Ok((fresh, lines))
    }

    /// Writes everything buffered and commits it, with the Kafka ranges it
    /// covers, in one manifest version. On a conflict with another writer
    /// it reloads, drops rows the lake now already holds (ranges another
    /// writer committed, ids another writer added) and tries again.
    ///
    /// If this returns an error nothing was committed and the buffer is
    /// gone: the caller must not commit Kafka offsets and should restart
    /// from the lake's offsets.
    #[tracing::instrument(name = "lake.flush", skip_all, fields(rows = self.buffered_rows))]
    pub async fn flush(&mut self) -> Result<FlushReport> {
        let started = Instant::now();
        let result = self.flush_buffer().await;
        if let (Some(m), Ok(r)) = (&self.metrics, &result) {
            if !r.files.is_empty() {
                let us = started.elapsed().as_micros() as u64;
                IngestMetrics::add(&m.flushes, 1);
                IngestMetrics::add(&m.flush_micros, us);
                m.last_flush_micros
                    .store(us, std::sync::atomic::Ordering::Relaxed);
                IngestMetrics::add(&m.files_written, r.files.len() as u64);
                IngestMetrics::add(&m.commits, 1);
            }
        }
        if self.pending.is_some() {
            // The rows stay published until the commit is decided, so a
            // reader never misses them in between.
            self.unpublish();
        }
        if let Some(f) = &mut self.fanout {
            match &result {
                // Only now, with the rows in the lake.
                Ok(r) => {
                    if !r.files.is_empty() {
                        f.committed(r.version, r.lake_events);
                    }
                    f.send().await
                }
                // The rows are gone from the buffer and will be read again.
                Err(_) => f.drop_events(),
            }
        }
        let ok = result.is_ok();
        self.flushed.send_modify(|f| {
            f.epoch += 1;
            f.ok = ok;
        });
        result
    }

    /// Takes the buffered rows of one table: those already published, then
    /// the builder's rest, as one batch.
    fn take_buffer(&mut self, table: Table) -> Result<RecordBatch> {
        let (published, rest) = match table {
            Table::LeaseEvents => (
                std::mem::take(&mut self.published_events),
                self.events.finish(),
            ),
            Table::LeaseRejects => (
                std::mem::take(&mut self.published_rejects),
                self.rejects.finish(),
            ),
            _ => return Ok(RecordBatch::new_empty(parquet_io::schema_of(table))),
        };
        if published.is_empty() {
            return Ok(rest);
        }
        let all: Vec<RecordBatch> = published.into_iter().chain([rest]).collect();
        Ok(leaseline_lake::parquet_io::concat(table, &all)?)
    }

    async fn flush_buffer(&mut self) -> Result<FlushReport> {
        let mut report = FlushReport::default();
        if self.buffered_rows == 0 {
            return Ok(report);
        }
        let mut events = self.take_buffer(Table::LeaseEvents)?;
        let mut rejects = self.take_buffer(Table::LeaseRejects)?;
        let mut ranges = std::mem::take(&mut self.ranges);
        self.buffered_rows = 0;
        self.buffered_bytes = 0;
        self.first_buffered = None;
        events = self.drop_late_duplicates(events).await?;

        loop {
            let mut files = self.lake.write(Table::LeaseEvents, &events).await?;
            files.extend(self.lake.write(Table::LeaseRejects, &rejects).await?);
            let change = Change::Append {
                files: files.clone(),
                kafka: ranges.clone(),
                reject_kafka: reject_ranges(&rejects, &ranges),
            };
            match self.lake.commit(&self.manifest, &change).await {
                Ok(m) => {
                    for f in &files {
                        self.known_files.insert(f.path.clone());
                    }
                    self.stats.files_written += files.len() as u64;
                    self.stats.commits += 1;
                    report.events = events.num_rows() as u64;
                    report.rejects = rejects.num_rows() as u64;
                    report.version = m.version;
                    report.lake_events = m.rows_of(Table::LeaseEvents);
                    report.files = files;
                    self.manifest = Arc::new(m);
                    // The late ids are in the lake now, where the next
                    // late duplicate is looked up; the buffer's recent ids
                    // are committed, so minutes may leave memory.
                    self.late.clear();
                    self.seen.evict();
                    debug!(
                        version = report.version,
                        events = report.events,
                        rejects = report.rejects,
                        "flushed"
                    );
                    return Ok(report);
                }
                Err(LakeError::Conflict { reason, .. }) => {
                    debug!(%reason, "commit conflict; rebasing");
                    let (fresh, fresh_lines) = self.load_unknown().await?;
                    if !fresh_lines.is_empty() {
                        rejects = drop_lines(&rejects, &fresh_lines)?;
                    }
                    let lost: Vec<KafkaRange> = ranges
                        .iter()
                        .filter(|r| {
                            self.manifest
                                .next_offset(&r.topic, r.partition)
                                .is_some_and(|done| done > r.start)
                        })
                        .cloned()
                        .collect();
                    if !lost.is_empty() {
                        warn!(
                            partitions = ?lost.iter().map(|r| (&r.topic, r.partition)).collect::<Vec<_>>(),
                            "another writer committed these partitions first; dropping our rows for them"
                        );
                        if let Some(f) = &mut self.fanout {
                            f.retain_events(|_, (topic, partition)| {
                                !lost
                                    .iter()
                                    .any(|r| r.partition == *partition && *r.topic == **topic)
                            });
                        }
                        let (kept, dropped_ids) = drop_partitions(&events, &lost)?;
                        // Their ids must not count as seen: when the
                        // partition is consumed again they are new.
                        for id in &dropped_ids {
                            self.seen.remove(id);
                            for ids in self.late.values_mut() {
                                ids.remove(id);
                            }
                        }
                        self.stats.events -= dropped_ids.len() as u64;
                        events = kept;
                        let kept = drop_partitions(&rejects, &lost)?.0;
                        // Nor do their rejects' keys.
                        let kept_keys: HashSet<u128> =
                            row_keys(&kept).into_iter().flatten().collect();
                        for key in row_keys(&rejects).into_iter().flatten() {
                            if !kept_keys.contains(&key) {
                                self.reject_lines.remove(&key);
                            }
                        }
                        rejects = kept;
                        ranges.retain(|r| !lost.contains(r));
                        report
                            .lost_partitions
                            .extend(lost.iter().map(|r| (r.topic.clone(), r.partition)));
                    }
                    self.seen.merge(&fresh);
                    if !fresh.is_empty() {
                        events = self.drop_duplicates(&events, |id| fresh.contains(id))?;
                    }
                    if events.num_rows() == 0 && rejects.num_rows() == 0 && ranges.is_empty() {
                        return Ok(report);
                    }
                }
                // The lake deleted the files it did not commit.
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Drops buffered events found to be duplicates after they were
    /// counted as events: from the batch, from what consumers will be
    /// sent, and from the counts.
    fn drop_duplicates(
        &mut self,
        events: &RecordBatch,
        is_duplicate: impl Fn(&str) -> bool,
    ) -> Result<RecordBatch> {
        let before = events.num_rows();
        let kept = drop_ids(events, &is_duplicate)?;
        if let Some(f) = &mut self.fanout {
            f.retain_events(|ev, _| {
                !ev.event_id
                    .as_deref()
                    .is_some_and(|id| !id.is_empty() && is_duplicate(id))
            });
        }
        let dropped = (before - kept.num_rows()) as u64;
        self.stats.duplicates += dropped;
        self.stats.events -= dropped;
        if let Some(m) = &self.metrics {
            IngestMetrics::add(&m.duplicates, dropped);
            m.events
                .fetch_sub(dropped, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(kept)
    }

    /// Drops the buffered events of minutes no longer in memory whose ids
    /// the lake already holds: each minute's ids are looked up in the files
    /// whose events span that minute ([`Lake::find_event_ids`]).
    async fn drop_late_duplicates(&mut self, events: RecordBatch) -> Result<RecordBatch> {
        if self.late.is_empty() {
            return Ok(events);
        }
        // The newest snapshot, not the writer's: compaction may have
        // replaced (and vacuum deleted) the day's files since.
        let latest = self.lake.latest().await?;
        let mut found: HashSet<String> = HashSet::new();
        // Each file once, with the ids of every late minute it spans: a
        // compacted file spans a day of minutes.
        for f in latest.files_of(Table::LeaseEvents) {
            let ids: Vec<&str> = self
                .late
                .range(slot_of(f.min_ts_us)..=slot_of(f.max_ts_us))
                .flat_map(|(_, ids)| ids.iter().map(String::as_str))
                .collect();
            if !ids.is_empty() {
                found.extend(self.lake.find_event_ids(&[f], &ids).await?);
            }
        }
        debug!(
            late = self.late.values().map(HashSet::len).sum::<usize>(),
            duplicates = found.len(),
            "checked events of minutes not in memory against the lake"
        );
        if found.is_empty() {
            return Ok(events);
        }
        let events = self.drop_duplicates(&events, |id| found.contains(id))?;
        for ids in self.late.values_mut() {
            ids.retain(|id| !found.contains(id));
        }
        Ok(events)
    }

    /// Forgets everything buffered (after a failed flush) and reloads the
    /// lake's state, so that consumption restarts from the lake's offsets
    /// and de-duplication matches what is committed.
    pub async fn reset(&mut self) -> Result<()> {
        self.events = EventBatchBuilder::new();
        self.rejects = RejectBatchBuilder::new();
        if let Some(f) = &mut self.fanout {
            f.drop_events();
        }
        self.published_events.clear();
        self.published_rejects.clear();
        self.ranges.clear();
        self.buffered_rows = 0;
        self.buffered_bytes = 0;
        self.first_buffered = None;
        let fresh = LakeWriter::open(self.lake.clone()).await?;
        self.manifest = fresh.manifest;
        self.known_files = fresh.known_files;
        self.seen = fresh.seen;
        self.late.clear();
        self.reject_lines = fresh.reject_lines;
        Ok(())
    }
}

/// Removes the rows of the lost partitions; returns the rest and the
/// event ids (if the batch has that column) of the removed rows.
fn drop_partitions(batch: &RecordBatch, lost: &[KafkaRange]) -> Result<(RecordBatch, Vec<String>)> {
    let origins = Origins::of(batch);
    let keep: Vec<bool> = (0..batch.num_rows())
        .map(|i| {
            origins
                .kafka(i)
                .is_none_or(|(t, p, _)| !lost.iter().any(|r| r.partition == p && r.topic == t))
        })
        .collect();
    let mut dropped = Vec::new();
    if let Some(ids) = batch.column_by_name("event_id") {
        let ids = ids.as_string::<i32>();
        for (i, k) in keep.iter().enumerate() {
            if !k {
                dropped.push(ids.value(i).to_string());
            }
        }
    }
    Ok((parquet_io::filter_rows(batch, &keep)?, dropped))
}

/// The `lease_rejects` range of each partition with Kafka rejects in the
/// batch: from its first reject to the end of what the flush covers.
fn reject_ranges(rejects: &RecordBatch, ranges: &[KafkaRange]) -> Vec<KafkaRange> {
    let origins = Origins::of(rejects);
    let mut out: Vec<KafkaRange> = Vec::new();
    for (t, p, o) in (0..rejects.num_rows()).filter_map(|i| origins.kafka(i)) {
        match out.iter_mut().find(|r| r.partition == p && r.topic == t) {
            Some(r) => r.start = r.start.min(o),
            None => {
                let end = ranges
                    .iter()
                    .find(|r| r.partition == p && r.topic == t)
                    .map_or(o + 1, |r| r.end);
                out.push(KafkaRange {
                    topic: t.to_string(),
                    partition: p,
                    start: o,
                    end,
                });
            }
        }
    }
    out
}

/// Each reject's line key (from a file) or Kafka key, if it has either.
fn row_keys(rejects: &RecordBatch) -> Vec<Option<u128>> {
    let origins = Origins::of(rejects);
    (0..rejects.num_rows()).map(|i| origins.key(i)).collect()
}

/// Removes the rejects whose keys are in `lines`.
fn drop_lines(rejects: &RecordBatch, lines: &HashSet<u128>) -> Result<RecordBatch> {
    let keep: Vec<bool> = row_keys(rejects)
        .into_iter()
        .map(|k| !k.is_some_and(|k| lines.contains(&k)))
        .collect();
    Ok(parquet_io::filter_rows(rejects, &keep)?)
}

/// Removes the events whose id `drop` names.
fn drop_ids(batch: &RecordBatch, drop: impl Fn(&str) -> bool) -> Result<RecordBatch> {
    let col = batch
        .column_by_name("event_id")
        .expect("event_id")
        .as_string::<i32>();
    let keep: Vec<bool> = col
        .iter()
        .map(|id| !id.is_some_and(|id| !id.is_empty() && drop(id)))
        .collect();
    Ok(parquet_io::filter_rows(batch, &keep)?)
}
