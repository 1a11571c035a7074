//! The audit's tables read from the lake's stored rows, so that a reader
//! (`sql`, `serve`, Grafana through them) audits only what has not
//! settled rather than the whole history.
//!
//! A writer (`serve --ingest`, `alerts/src/stored.rs`) stores each lease's
//! settled grants and violations, and with them the lease's *context*: the
//! few events before its cut that the rows from the cut on are judged
//! against (`audit/src/settle.rs`). Each row carries the lease's cut as
//! `settled_before`. A reader of snapshot `m`:
//!
//! 1. reads each lease's cut, the largest `settled_before` of its rows;
//! 2. reads the `lease_events` rows at or after their lease's cut (and
//!    every row of a lease with no cut), and the context rows stored with
//!    each lease's cut;
//! 3. settles each lease at its cut ([`Auditor::resume_all`]), which
//!    holds only if the events it was given allow that cut, so the
//!    auditor answers the rows from the cut on;
//! 4. answers the stored rows plus the auditor's.
//!
//! The answer is the whole audit's only if the stored rows account for
//! every event before their lease's cut. They do for a Kafka record below
//! the position the writer recorded for its partition with the rows. An
//! event before its lease's cut that is not below it (the writer has not
//! audited it again yet, or it came from a file), or a cut the events do
//! not allow, means the stored rows do not answer for `m` yet: the reader
//! then audits `m`'s events whole, as it does a lake without stored rows
//! (decided so: it is exact, and it happens only while a late event
//! waits for its writer, or on a lake mixing imported files with Kafka).
//!
//! Of each file, the lease ids, times and Kafka positions are read first
//! (the strings as dictionaries, so each distinct lease id of a batch is
//! looked up once);
//! only the rows from their lease's cut on are then decoded (a Parquet row
//! selection), on blocking threads, two files at a time, while the audit
//! takes the rows already read. A file whose newest event (the manifest
//! says) is older than each of its leases' cuts has no row to audit: of
//! such a file only the dictionaries of lease ids and topics are read
//! (each row group's dictionary page alone, when its data pages only index
//! it), in the same pool of two, between the reads of the files no cut
//! is past ([`before_cuts`]). Which leases a file
//! holds is known only from those dictionaries, so a file older than every
//! cut is checked this way, and so is one between the oldest and newest
//! cuts: a lease that went quiet keeps its cut before its last grant, and
//! the oldest cut with it, but has no row in the files after. Of a file
//! older than every cut the Kafka positions are taken from the row
//! groups' statistics (an upper bound, checked against the recorded
//! positions like the rows' own offsets, and read row by row if it does
//! not pass); of a file between the cuts, too recent for a bound to be
//! far below the recorded positions, they are read. Compaction keeps the
//! files that the cuts fall within as ingest wrote them, a few seconds
//! each, until the cuts pass them (`Lake::compact`).
//! Once the stored rows reach a few minutes behind the newest events,
//! that is most of the lake.
//!
//! The stored rows are computed with the writer's tolerances
//! (`audit.skew`, `audit.event_window`...): a reader configured
//! differently reads them as they are.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, DictionaryArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, TimestampMicrosecondType};
use futures::StreamExt;
use leaseline_audit::{AuditConfig, Auditor, StoredFiles};
use leaseline_lake::parquet_io::{self, Batches, Source};
use leaseline_lake::{Lake, LakeError, Manifest, Table};
use leaseline_schema::{EventColumns, SETTLED_BEFORE};

use tracing::debug;

use crate::audit::{derive, joined, push_lake_batch, AuditTables, BATCHES_AHEAD};
use crate::{QueryError, Result};

/// The columns that place a `lease_events` row against its lease's cut
/// and say whether the stored rows account for it.
const PLACE: [&str; 5] = [
    "lease_id",
    "ts",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
];

/// Of [`PLACE`], the strings read as dictionaries: a batch repeats a few
/// thousand lease ids and one topic.
const DICTIONARY: [&str; 2] = ["lease_id", "kafka_topic"];

/// The derived tables of `m` from its stored audit rows; `None` when it
/// has none, or they do not answer for `m` (see the module docs).
pub(crate) async fn from_stored(
    lake: &Lake,
    m: &Manifest,
    config: AuditConfig,
) -> Result<Option<AuditTables>> {
    if !config.read_stored {
        return Ok(None);
    }
    let stored: Vec<_> = m
        .files
        .iter()
        .filter(|f| Table::STORED_AUDIT.contains(&f.table))
        .collect();
    if stored.is_empty() {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let cuts = lake.stored_cuts(&stored).await?;
    let cuts_read = started.elapsed();
    let mut auditor = Auditor::new(config);
    // Decoding and auditing each take a core: a blocking thread reads the
    // files while this task pushes the rows already read.
    let cuts = Arc::new(cuts);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(BATCHES_AHEAD);
    let store = lake.store().clone();
    let oldest_cut = cuts.values().copied().min().unwrap_or(i64::MIN);
    let newest_cut = cuts.values().copied().max().unwrap_or(i64::MIN);
    // A file older than every cut is before its leases' cuts, if each has
    // one; a file no cut is past has rows to audit; a file between may be
    // before its own leases' cuts (a lease that went quiet long ago holds
    // the oldest cut back, but has no row in the newer files).
    let (mut before, mut tail, mut between) = (Vec::new(), Vec::new(), Vec::new());
    for f in m.files_of(Table::LeaseEvents) {
        let file = (f.path.clone(), f.max_ts_us, f.rows);
        match f.max_ts_us {
            t if t < oldest_cut => before.push(file),
            t if t >= newest_cut => tail.push(file),
            _ => between.push(file),
        }
    }
    // At most these rows are audited, most of them in leases with a cut;
    // no more than the audit may hold, since after a quiet lease's cut
    // every file is between and most are before their own leases' cuts.
    let mut rows = tail
        .iter()
        .chain(&between)
        .map(|(_, _, rows)| *rows as usize)
        .sum::<usize>();
    if config.max_events_held > 0 {
        rows = rows.min(config.max_events_held);
    }
    auditor.reserve(rows, rows / cuts.len().max(1));
    // The leases' context goes to the auditor beside the events, decoded
    // on a thread of its own: most of it while the files before every cut
    // are checked, when the auditor has nothing else to take.
    let context = {
        let (store, cuts, tx) = (lake.store().clone(), cuts.clone(), tx.clone());
        let paths: Vec<String> = m
            .files_of(Table::LeaseContext)
            .map(|f| f.path.clone())
            .collect();
        tokio::spawn(async move {
            for path in paths {
                let bytes = store.get(&path).await?;
                let (cuts, tx) = (cuts.clone(), tx.clone());
                tokio::task::spawn_blocking(move || {
                    current_context(bytes, &path, &cuts, oldest_cut, &tx)
                })
                .await
                .map_err(joined)??;
            }
            Ok::<_, QueryError>(())
        })
    };
    let reader_cuts = cuts.clone();
    let reader = tokio::spawn(async move {
        // The writer's recorded position must be past these: of each file
        // before every cut, and of the others.
        let mut found_before = Vec::new();
        let mut settled = SettledOffsets::new();
        // Two jobs at a time, whatever their kind, beside the auditor. The
        // auditor takes rows more slowly than two threads read them, so the
        // files wholly before their leases' cuts (which hold nothing to
        // audit but the rows of a lease without a cut) are checked between
        // the reads of the files no cut is past, while it catches up: a
        // read comes first, so that it has rows from the start, and one
        // comes last, so that it is not left waiting while checks finish.
        // Of a file between the cuts the offsets are read, not bounded
        // from statistics: it is too recent for a bound to be far below
        // the recorded positions. Rows reach the auditor in any order, and
        // each job's offsets are merged.
        let checks = before
            .into_iter()
            .map(|(path, newest, _)| Job::Check(path, newest, true))
            .chain(
                between
                    .into_iter()
                    .map(|(path, newest, _)| Job::Check(path, newest, false)),
            );
        let reads = tail.into_iter().map(|(path, _, _)| Job::Read(path));
        let jobs = interleave(reads.collect(), checks.collect());
        let run = |job: Job| {
            let (store, cuts, tx) = (store.clone(), reader_cuts.clone(), tx.clone());
            async move { job.run(&store, cuts, tx).await }
        };
        let done = futures::stream::iter(jobs.into_iter().map(run)).buffer_unordered(2);
        futures::pin_mut!(done);
        let mut read = 0;
        while let Some(done) = done.next().await {
            match done? {
                Done::Read(Ok(found)) => {
                    read += 1;
                    merge_settled(&mut settled, found)
                }
                Done::Read(Err(path)) => return Ok::<_, QueryError>(Err(path)),
                Done::Checked(path, newest, found, bound) => {
                    found_before.push((path, newest, found, bound))
                }
            }
        }
        Ok(Ok((found_before, settled, read)))
    });
    // Lake rows hold each `event_id` once, and a lease's context is
    // before its cut while its other rows read are not: no id repeats.
    while let Some(batch) = rx.recv().await {
        push_lake_batch(&mut auditor, &batch)?;
    }
    let (found_before, tail_settled, files_read) = match reader.await.map_err(joined)?? {
        Ok(read) => read,
        Err(path) => {
            debug!(file = %path, "an event before its lease's cut has no Kafka position; auditing every event");
            return Ok(None);
        }
    };
    let events_read = started.elapsed();
    context.await.map_err(joined)??;
    let mut settled = tail_settled.clone();
    let files_before = found_before.len();
    for (_, _, found, _) in &found_before {
        merge_settled(&mut settled, found.clone());
    }
    let mut accounted = accounted_for(lake, m, &settled).await?;
    // Offsets from statistics are upper bounds, which may not show what the
    // rows themselves would: those files are read again, row by row.
    if accounted == Some(false) && found_before.iter().any(|(_, _, _, bound)| *bound) {
        let Some(exact) = exact_offsets(lake, &cuts, found_before, tail_settled).await? else {
            return Ok(None);
        };
        settled = exact;
        accounted = accounted_for(lake, m, &settled).await?;
    }
    match accounted {
        None => {
            debug!("the stored audit tables moved on while read; auditing every event");
            return Ok(None);
        }
        Some(false) => {
            debug!("an event before its lease's cut is past the stored rows' position; auditing every event");
            return Ok(None);
        }
        Some(true) => {}
    }
    let failed = auditor.resume_all(cuts.iter().map(|(l, &c)| (l.as_str(), c)));
    if let Some(lease) = failed.first() {
        debug!(lease_id = %lease, "the events read do not allow the lease's stored cut; auditing every event");
        return Ok(None);
    }
    let resumed = started.elapsed();
    let mut tables = derive(&mut auditor, m.version);
    debug!(
        leases = cuts.len(),
        events = auditor.len(),
        files_before_cuts = files_before,
        files_read,
        cuts_ms = cuts_read.as_millis(),
        events_ms = (events_read - cuts_read).as_millis(),
        resume_ms = (resumed - events_read).as_millis(),
        derive_ms = (started.elapsed() - resumed).as_millis(),
        "the audit's tables are the stored audit rows and the events after them"
    );
    let list = |t| {
        m.files_of(t)
            .map(|f| (f.path.clone(), f.bytes))
            .collect::<Vec<_>>()
    };
    tables.stored = Some(std::sync::Arc::new(StoredFiles {
        timeline: list(Table::LeaseTimeline),
        violations: list(Table::LeaseViolations),
    }));
    Ok(Some(tables))
}

/// Sends the rows of a `lease_context` file stored at their lease's cut.
/// A lease's context rows carry its cut, which only moves forward: rows
/// stored at a cut older than every lease's are superseded, and so are the
/// files (one per store commit) that hold only such rows.
fn current_context(
    bytes: bytes::Bytes,
    path: &str,
    cuts: &HashMap<String, i64>,
    oldest_cut: i64,
    tx: &tokio::sync::mpsc::Sender<RecordBatch>,
) -> Result<()> {
    let mut columns: Vec<&str> = EventColumns::COLUMNS.to_vec();
    columns.push(SETTLED_BEFORE);
    for batch in parquet_io::column_reader_from(bytes, &columns, SETTLED_BEFORE, oldest_cut)? {
        let batch = batch.map_err(LakeError::from)?;
        let cut_of = batch
            .column_by_name(SETTLED_BEFORE)
            .ok_or_else(|| LakeError::Delta(format!("{path} lacks {SETTLED_BEFORE}")))?
            .as_primitive::<TimestampMicrosecondType>();
        let ids = batch
            .column_by_name("lease_id")
            .ok_or_else(|| LakeError::Delta(format!("{path} lacks lease_id")))?
            .as_string::<i32>();
        let current: arrow::array::BooleanArray = (0..batch.num_rows())
            .map(|i| Some(!ids.is_null(i) && cuts.get(ids.value(i)) == Some(&cut_of.value(i))))
            .collect();
        let batch =
            arrow::compute::filter_record_batch(&batch, &current).map_err(LakeError::from)?;
        if batch.num_rows() > 0 && tx.blocking_send(batch).is_err() {
            // The auditor side failed, and says why.
            break;
        }
    }
    Ok(())
}

/// The largest offset of each Kafka partition's rows before their lease's
/// cut, by `(topic, partition)`; partitions are few.
type SettledOffsets = Vec<((String, i32), i64)>;

/// `checks` spread evenly between the first and the last of `reads`.
fn interleave<T>(reads: Vec<T>, checks: Vec<T>) -> Vec<T> {
    let (c, span) = (checks.len(), reads.len().saturating_sub(1));
    // Read i at i·(c+1) and check k at (k+1)·span: the checks fall
    // strictly between the first read, at 0, and the last, at span·(c+1);
    // a tie (one read or none) goes to the read.
    let mut jobs: Vec<(usize, u8, T)> = reads
        .into_iter()
        .enumerate()
        .map(|(i, j)| (i * (c + 1), 0, j))
        .chain(
            checks
                .into_iter()
                .enumerate()
                .map(|(k, j)| ((k + 1) * span, 1, j)),
        )
        .collect();
    jobs.sort_by_key(|&(at, kind, _)| (at, kind));
    jobs.into_iter().map(|(_, _, j)| j).collect()
}

/// A reader's unit of work on one `lease_events` file.
enum Job {
    /// Audit the rows at or after their lease's cut ([`read_tail`]).
    Read(String),
    /// See whether the file (path, newest event) is wholly before
    /// its leases' cuts, its offsets bounded from statistics when `true`
    /// ([`before_cuts`]); read it as [`Job::Read`] when it is not.
    Check(String, i64, bool),
}

enum Done {
    /// The file's offsets of rows before their cuts, or its path when one
    /// such row has no Kafka position.
    Read(std::result::Result<SettledOffsets, String>),
    /// A file wholly before its leases' cuts: path, newest event, the
    /// largest offset of each partition and whether those are bounds.
    Checked(String, i64, SettledOffsets, bool),
}

impl Job {
    async fn run(
        self,
        store: &leaseline_lake::LakeStore,
        cuts: Arc<HashMap<String, i64>>,
        tx: tokio::sync::mpsc::Sender<RecordBatch>,
    ) -> Result<Done> {
        let path = match self {
            Job::Read(path) => path,
            Job::Check(path, newest, sure) => {
                let file = Source::of(store, &path).await?;
                let check = cuts.clone();
                let found =
                    tokio::task::spawn_blocking(move || before_cuts(&file, &check, newest, sure))
                        .await
                        .map_err(joined)??;
                match found {
                    Some((found, bound)) => return Ok(Done::Checked(path, newest, found, bound)),
                    // Read at once, in the check's turn, not after every
                    // other job, when the auditor may have nothing else.
                    None => path,
                }
            }
        };
        let bytes = store.get(&path).await?;
        let found = tokio::task::spawn_blocking(move || read_tail(bytes, &cuts, &tx))
            .await
            .map_err(joined)??;
        Ok(Done::Read(found.ok_or(path)))
    }
}

/// The offsets of the files before every cut read row by row where
/// `found` holds a bound from statistics, merged with `tail`'s; `None`
/// when such a file holds a row no stored row can account for.
async fn exact_offsets(
    lake: &Lake,
    cuts: &Arc<HashMap<String, i64>>,
    found: Vec<(String, i64, SettledOffsets, bool)>,
    mut settled: SettledOffsets,
) -> Result<Option<SettledOffsets>> {
    for (path, newest, offsets, bound) in found {
        let offsets = match bound {
            false => offsets,
            true => {
                let (file, cuts) = (Source::of(lake.store(), &path).await?, cuts.clone());
                let exact =
                    tokio::task::spawn_blocking(move || before_cuts(&file, &cuts, newest, false))
                        .await
                        .map_err(joined)??;
                match exact {
                    Some((offsets, _)) => offsets,
                    None => return Ok(None),
                }
            }
        };
        merge_settled(&mut settled, offsets);
    }
    Ok(Some(settled))
}

/// Whether the positions recorded with `m`'s stored rows are past every
/// offset of `settled`; `None` when the stored tables moved on while read.
async fn accounted_for(
    lake: &Lake,
    m: &Manifest,
    settled: &SettledOffsets,
) -> Result<Option<bool>> {
    let partitions: Vec<(String, i32)> = settled.iter().map(|(k, _)| k.clone()).collect();
    let Some(positions) = lake.stored_positions(m, &partitions).await? else {
        return Ok(None);
    };
    Ok(Some(settled.iter().all(|((topic, p), offset)| {
        positions
            .get(topic)
            .and_then(|ps| ps.get(p))
            .is_some_and(|&next| *offset < next)
    })))
}

/// Sends the rows of one `lease_events` file that the reader audits (at or
/// after their lease's cut), and returns the largest Kafka offset of the
/// file's other rows in each partition; `None` if one of those has no
/// Kafka position.
fn read_tail(
    bytes: bytes::Bytes,
    cuts: &HashMap<String, i64>,
    tx: &tokio::sync::mpsc::Sender<RecordBatch>,
) -> Result<Option<SettledOffsets>> {
    let (mut settled, mut keep) = (SettledOffsets::new(), Vec::new());
    for batch in parquet_io::dictionary_reader(bytes.clone(), &PLACE, &DICTIONARY)? {
        let batch = batch.map_err(LakeError::from)?;
        if !place(&batch, cuts, &mut settled, &mut keep)? {
            return Ok(None);
        }
    }
    if !keep.iter().any(|&k| k) {
        return Ok(Some(settled));
    }
    for batch in parquet_io::selected_reader(bytes, &EventColumns::COLUMNS, &keep)? {
        let batch = batch.map_err(LakeError::from)?;
        if batch.num_rows() > 0 && tx.blocking_send(batch).is_err() {
            // The auditor side failed, and says why.
            break;
        }
    }
    Ok(Some(settled))
}

/// Of a `lease_events` file whose newest row is at `newest`, the largest
/// Kafka offset of each partition's rows when each of its leases has a
/// cut after `newest` (every row is before its lease's cut); `None` when
/// a row might be audited after all or accounted for by nothing: a lease
/// without such a cut, no Kafka position, rows of more than one topic
/// (the caller then reads the file row by row, [`read_tail`]). Reads no
/// time and decodes each batch's lease ids once, as a dictionary.
///
/// With `from_statistics`, the partitions and offsets are taken from each
/// row group's statistics when it has them, without decoding them (the
/// offsets are most of the bytes). A row group of one partition gives its
/// largest offset; one of several gives its largest offset to each
/// partition in its range: an upper bound, marked by the returned `true`,
/// which shows the rows accounted for whenever the recorded positions are
/// past it (files this old are far below them), and otherwise the caller
/// reads the file again without statistics. The lease ids and the topic
/// then come from the row groups' dictionary pages when those hold every
/// value ([`parquet_io::dictionary_values`]), and no row is decoded.
///
fn before_cuts(
    file: &Source,
    cuts: &HashMap<String, i64>,
    newest: i64,
    from_statistics: bool,
) -> Result<Option<(SettledOffsets, bool)>> {
    let settled = |lease: &str| cuts.get(lease).is_some_and(|&cut| cut > newest);
    const COLUMNS: [&str; 4] = ["lease_id", "kafka_topic", "kafka_partition", "kafka_offset"];
    // Partitions index a vector: a number past this is no Kafka partition
    // the reader expects, and is left to the row-by-row reading.
    const PARTITIONS: i64 = 1 << 16;
    let footer = file.footer()?;
    let ranges: Option<Vec<Vec<(i64, i64)>>> = match from_statistics {
        true => parquet_io::int_ranges(&footer, &COLUMNS[2..])
            .into_iter()
            .map(|r| r.filter(|r| (0..PARTITIONS).contains(&r[0].0) && r[0].1 < PARTITIONS))
            .collect(),
        false => None,
    };
    let columns = match ranges {
        Some(_) => &COLUMNS[..2],
        None => &COLUMNS[..],
    };
    let mut topic: Option<String> = None;
    let mut largest: Vec<i64> = Vec::new();
    let mut raise = |p: usize, o: i64| {
        if largest.len() <= p {
            largest.resize(p + 1, i64::MIN);
        }
        largest[p] = largest[p].max(o);
    };
    // A file with a lease not settled past `newest` fails on its lease
    // ids' dictionary pages, when those hold every value, before any row
    // is decoded. With the offsets from statistics, only the topic is
    // left to read then, from its dictionary pages too.
    let ids = file.dictionary_values(&footer, "lease_id")?;
    if ids.iter().flatten().flatten().any(|lease| !settled(lease)) {
        return Ok(None);
    }
    // The topics' pages are read only when the lease ids' could be.
    let topics = match ids.is_some() && ranges.is_some() {
        true => file.dictionary_values(&footer, "kafka_topic")?,
        false => None,
    };
    if let Some(topics) = &topics {
        for name in topics.iter().flatten() {
            if topic.get_or_insert_with(|| name.clone()) != name {
                return Ok(None);
            }
        }
    }
    let batches: Batches = match topics {
        Some(_) => Box::new(std::iter::empty()),
        None => file.dictionary_reader(&footer, columns, &DICTIONARY)?,
    };
    let mut checked: Option<arrow::array::ArrayRef> = None;
    for batch in batches {
        let batch = batch.map_err(LakeError::from)?;
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| LakeError::Delta(format!("lease_events lacks {name}")))
        };
        let (Some(ids), Some(topics)) = (
            column("lease_id")?.as_dictionary_opt::<Int32Type>(),
            column("kafka_topic")?.as_dictionary_opt::<Int32Type>(),
        ) else {
            return Ok(None);
        };
        if ids.null_count() + topics.null_count() > 0 {
            return Ok(None);
        }
        // A row group's batches share its dictionary: checked once.
        if !checked
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, ids.values()))
        {
            let names = ids.values().as_string::<i32>();
            if names.null_count() > 0 || !names.iter().flatten().all(settled) {
                return Ok(None);
            }
            checked = Some(ids.values().clone());
        }
        let names = topics.values().as_string::<i32>();
        let [Some(name)] = names.iter().collect::<Vec<_>>()[..] else {
            return Ok(None);
        };
        if topic.get_or_insert_with(|| name.to_string()) != name {
            return Ok(None);
        }
        if ranges.is_some() {
            continue;
        }
        let partition = column("kafka_partition")?.as_primitive::<Int32Type>();
        let offset = column("kafka_offset")?.as_primitive::<Int64Type>();
        if partition.null_count() + offset.null_count() > 0 {
            return Ok(None);
        }
        for (&p, &o) in partition.values().iter().zip(offset.values().iter()) {
            if !(0..PARTITIONS).contains(&i64::from(p)) {
                return Ok(None);
            }
            raise(p as usize, o);
        }
    }
    let Some(topic) = topic else {
        return Ok(Some((SettledOffsets::new(), false)));
    };
    let mut bound = false;
    for r in ranges.iter().flatten() {
        let ((first, last), (_, offset)) = (r[0], r[1]);
        bound |= first != last;
        for p in first..=last {
            raise(p as usize, offset);
        }
    }
    let found = largest
        .into_iter()
        .enumerate()
        .filter(|(_, o)| *o != i64::MIN)
        .map(|(p, o)| ((topic.clone(), p as i32), o))
        .collect();
    Ok(Some((found, bound)))
}

/// Takes the offsets of `found` into `settled`, the largest of each
/// partition.
fn merge_settled(settled: &mut SettledOffsets, found: SettledOffsets) {
    for (key, o) in found {
        match settled.iter_mut().find(|(k, _)| *k == key) {
            Some((_, at)) => *at = (*at).max(o),
            None => settled.push((key, o)),
        }
    }
}

/// Appends to `keep`, for each row of `batch` (of [`PLACE`]'s columns),
/// whether the reader audits it (at or after its lease's cut), and notes
/// the Kafka position of each row it does not. False if a row before its
/// lease's cut has no Kafka position: nothing says the stored rows
/// account for it.
fn place(
    batch: &RecordBatch,
    cuts: &HashMap<String, i64>,
    settled: &mut SettledOffsets,
    keep: &mut Vec<bool>,
) -> Result<bool> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| LakeError::Delta(format!("lease_events lacks {name}")))
    };
    // Read as dictionaries (`DICTIONARY`); another writer's file may
    // hold plain strings.
    let dictionary = |name: &str| -> Result<DictionaryArray<Int32Type>> {
        let c = column(name)?;
        Ok(match c.as_dictionary_opt::<Int32Type>() {
            Some(d) => d.clone(),
            None => {
                let t = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
                arrow::compute::cast(c, &t)
                    .map_err(LakeError::from)?
                    .as_dictionary::<Int32Type>()
                    .clone()
            }
        })
    };
    let ids = dictionary("lease_id")?;
    let ts = column("ts")?.as_primitive::<TimestampMicrosecondType>();
    let topic = dictionary("kafka_topic")?;
    let partition = column("kafka_partition")?.as_primitive::<Int32Type>();
    let offset = column("kafka_offset")?.as_primitive::<Int64Type>();
    // Each distinct lease id of the batch is looked up once: its cut, or
    // none (every row of a lease with no stored rows is audited).
    let names = ids.values().as_string::<i32>();
    let cut_of: Vec<Option<i64>> = (0..names.len())
        .map(|k| {
            (!names.is_null(k))
                .then(|| cuts.get(names.value(k)).copied())
                .flatten()
        })
        .collect();
    let topics = topic.values().as_string::<i32>();
    let (id_keys, topic_keys) = (ids.keys(), topic.keys());
    // By the topic's key in this batch: no string per row.
    let mut largest: Vec<((usize, i32), i64)> = Vec::new();
    for i in 0..batch.num_rows() {
        let cut = if ids.is_null(i) {
            None
        } else {
            cut_of[id_keys.value(i) as usize]
        };
        let audited = cut.is_none_or(|cut| ts.value(i) >= cut);
        keep.push(audited);
        if audited {
            continue;
        }
        let t = topic_keys.value(i) as usize;
        if topic.is_null(i) || topics.is_null(t) || partition.is_null(i) || offset.is_null(i) {
            return Ok(false);
        }
        // Partitions are few: a scan beats hashing a key per row.
        let (p, o) = (partition.value(i), offset.value(i));
        match largest.iter_mut().find(|(k, _)| *k == (t, p)) {
            Some((_, at)) => *at = (*at).max(o),
            None => largest.push(((t, p), o)),
        }
    }
    merge_settled(
        settled,
        largest
            .into_iter()
            .map(|((t, p), o)| ((topics.value(t).to_string(), p), o))
            .collect(),
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaseline_lake::{Change, KafkaRange};
    use leaseline_schema::{decode, EventBatchBuilder, Origin};

    /// A `lease_events` file of `(lease, topic, partition, offset)` rows.
    fn file(rows: &[(&str, &str, i32, i64)]) -> Source {
        Source::Fetched(
            parquet_io::encode(Table::LeaseEvents, &events(rows))
                .unwrap()
                .into(),
        )
    }

    /// `lease_events` rows of `(lease, topic, partition, offset)`.
    fn events(rows: &[(&str, &str, i32, i64)]) -> RecordBatch {
        let mut b = EventBatchBuilder::new();
        for (i, (lease, topic, partition, offset)) in rows.iter().enumerate() {
            let line = format!(
                r#"{{"ts":"2026-09-14T10:00:00Z","kind":"renewed","source":"holder","lease_id":"{lease}","holder_id":"h","fencing_token":1,"event_id":"e-{i}"}}"#
            );
            let ev = decode(line.as_bytes()).unwrap();
            // An empty topic: the event came from a file.
            let origin = match *topic {
                "" => Origin::File {
                    path: "in.jsonl",
                    line: i as u64 + 1,
                },
                topic => Origin::Kafka {
                    topic,
                    partition: *partition,
                    offset: *offset,
                },
            };
            b.append(&ev, &origin, 0);
        }
        b.finish()
    }

    fn cuts(leases: &[&str]) -> HashMap<String, i64> {
        leases.iter().map(|l| (l.to_string(), 1)).collect()
    }

    #[test]
    fn a_file_before_every_cut_gives_each_partitions_largest_offset() {
        let f = file(&[
            ("a", "t", 0, 7),
            ("b", "t", 1, 3),
            ("a", "t", 0, 9),
            ("c", "t", 2, 1),
        ]);
        let leases = cuts(&["a", "b", "c"]);
        let sorted = |(mut found, bound): (SettledOffsets, bool)| {
            found.sort();
            (found, bound)
        };
        let t = |p: i32, o: i64| (("t".to_string(), p), o);
        let rows = before_cuts(&f, &leases, 0, false).unwrap().unwrap();
        assert_eq!(sorted(rows), (vec![t(0, 9), t(1, 3), t(2, 1)], false));
        // From statistics, a row group of three partitions gives its largest
        // offset to each, and says it is a bound.
        let stats = before_cuts(&f, &leases, 0, true).unwrap().unwrap();
        assert_eq!(sorted(stats), (vec![t(0, 9), t(1, 9), t(2, 9)], true));
        // Of one partition, the statistics are exact.
        let f = file(&[("a", "t", 4, 7), ("b", "t", 4, 12), ("c", "t", 4, 2)]);
        let stats = before_cuts(&f, &leases, 0, true).unwrap().unwrap();
        assert_eq!(stats, (vec![t(4, 12)], false));
    }

    #[test]
    fn a_file_is_before_its_own_leases_cuts_whatever_the_oldest_cut() {
        // Rows at 2026-09-14T10:00:00Z; `z`, quiet since long before, holds
        // the oldest cut back and has no row in the file.
        let newest = 1_789_380_000_000_000;
        let f = file(&[("a", "t", 0, 7), ("b", "t", 0, 9)]);
        let mut cuts: HashMap<String, i64> = [("a", newest + 1), ("b", newest + 5), ("z", 1)]
            .map(|(l, c)| (l.to_string(), c))
            .into();
        let t = |p: i32, o: i64| (("t".to_string(), p), o);
        for from_statistics in [false, true] {
            let found = before_cuts(&f, &cuts, newest, from_statistics).unwrap();
            assert_eq!(found, Some((vec![t(0, 9)], false)));
        }
        // A cut at the file's newest event leaves a row to audit.
        cuts.insert("b".into(), newest);
        for from_statistics in [false, true] {
            assert_eq!(
                before_cuts(&f, &cuts, newest, from_statistics).unwrap(),
                None
            );
        }
    }

    #[test]
    fn a_file_of_several_row_groups_sends_its_rows_after_the_cuts_in_order() {
        // Two rows per row group; `a`'s rows are before its cut, `b`'s and
        // the cut-less `c`'s are audited.
        let rows = [
            ("a", "t", 0, 1),
            ("b", "t", 1, 2),
            ("a", "t", 0, 3),
            ("a", "t", 2, 4),
            ("a", "t", 0, 6),
            ("c", "t", 2, 5),
            ("b", "t", 1, 7),
        ];
        let batch = parquet_io::to_storage(&events(&rows)).unwrap();
        let mut bytes = Vec::new();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let bytes = bytes::Bytes::from(bytes);
        let footer = parquet_io::footer(&bytes).unwrap();
        assert_eq!(footer.metadata().num_row_groups(), 4);

        // After every event of `a`; `b`'s cut is before all of them.
        let cuts: HashMap<String, i64> = [("a".to_string(), i64::MAX), ("b".to_string(), 1)].into();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let mut settled = read_tail(bytes, &cuts, &tx).unwrap().unwrap();
        drop(tx);
        settled.sort();
        // The largest offset of each partition's rows before their cut.
        let t = |p: i32, o: i64| (("t".to_string(), p), o);
        assert_eq!(settled, vec![t(0, 6), t(2, 4)]);
        let mut sent = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            let ids = batch.column_by_name("event_id").unwrap().as_string::<i32>();
            sent.extend(ids.iter().map(|id| id.unwrap().to_string()));
        }
        assert_eq!(sent, ["e-1", "e-5", "e-6"]);
    }

    /// A lake of one `lease_events` file, one row group: lease `a` at
    /// offsets 0 and 1000 of partition 0, `b` at 0 and 5 of partition 1;
    /// then their grants stored with a cut after those events and the
    /// positions 1001 and `next_of_1`.
    async fn stored_lake(next_of_1: i64) -> (tempfile::TempDir, Lake, Manifest) {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        let rows = events(&[
            ("a", "t", 0, 0),
            ("a", "t", 0, 1000),
            ("b", "t", 1, 0),
            ("b", "t", 1, 5),
        ]);
        let base = lake.latest().await.unwrap();
        let append = Change::Append {
            files: lake.write(Table::LeaseEvents, &rows).await.unwrap(),
            kafka: vec![],
            reject_kafka: vec![],
        };
        let m = lake.commit(&base, &append).await.unwrap();
        // 2026-09-14T10:01:00Z, a minute after the events.
        let cut = 1_789_380_060_000_000_i64;
        let lines: String = ["a", "b"]
            .iter()
            .map(|lease| {
                format!(
                    r#"{{"lease_id":"{lease}","fencing_token":1,"holder_id":"h","acquired_at":1789380000000000,"end_kind":"released","renewals":0,"renew_failures":0,"writes_accepted":0,"stale_writes_rejected":0,"acquired_by":"coordinator","settled_before":{cut}}}"#
                ) + "\n"
            })
            .collect();
        let grants =
            arrow::json::ReaderBuilder::new(leaseline_schema::STORED_TIMELINE_SCHEMA.clone())
                .build(std::io::Cursor::new(lines))
                .unwrap()
                .next()
                .unwrap()
                .unwrap();
        let at = |partition: i32, next: i64| KafkaRange {
            topic: "t".into(),
            partition,
            start: next,
            end: next,
        };
        let settle = Change::Settle {
            add: lake.write(Table::LeaseTimeline, &grants).await.unwrap(),
            remove: vec![],
            kafka: vec![at(0, 1001), at(1, next_of_1)],
        };
        let m = lake.commit(&m, &settle).await.unwrap();
        (dir, lake, m)
    }

    #[tokio::test]
    async fn a_bound_the_positions_are_not_past_is_read_again_row_by_row() {
        // The row group's statistics bound partition 1 by offset 1000, which
        // its position (6) is not past; its rows (up to 5) are.
        let (_dir, lake, m) = stored_lake(6).await;
        let tables = from_stored(&lake, &m, AuditConfig::default())
            .await
            .unwrap();
        assert!(tables.is_some_and(|t| t.stored.is_some()));
        // A position not past the rows either: the stored rows do not
        // answer, and the caller audits every event.
        let (_dir, lake, m) = stored_lake(5).await;
        let tables = from_stored(&lake, &m, AuditConfig::default())
            .await
            .unwrap();
        assert!(tables.is_none());
    }

    #[test]
    fn a_files_lease_ids_and_topic_come_from_its_dictionary_pages() {
        let f = file(&[("b", "t", 0, 7), ("a", "t", 0, 8), ("b", "t", 1, 9)]);
        let footer = f.footer().unwrap();
        let mut ids = f
            .dictionary_values(&footer, "lease_id")
            .unwrap()
            .unwrap()
            .concat();
        ids.sort();
        assert_eq!(ids, ["a", "b"]);
        let topics = f.dictionary_values(&footer, "kafka_topic").unwrap();
        assert_eq!(topics.unwrap().concat(), ["t"]);
        // A column with a null (an event from a file has no topic) is left
        // to the rows.
        let f = file(&[("a", "t", 0, 7), ("a", "", 0, 0)]);
        let topics = f.dictionary_values(&f.footer().unwrap(), "kafka_topic");
        assert_eq!(topics.unwrap(), None);
    }

    #[test]
    fn a_lease_without_a_cut_or_a_second_topic_is_left_to_the_rows() {
        for from_statistics in [false, true] {
            let check = |f: &Source| before_cuts(f, &cuts(&["a"]), 0, from_statistics).unwrap();
            assert_eq!(check(&file(&[("a", "t", 0, 7), ("new", "t", 0, 8)])), None);
            assert_eq!(check(&file(&[("a", "t", 0, 7), ("a", "u", 0, 8)])), None);
            assert_eq!(check(&file(&[("a", "t", 0, 7), ("a", "", 0, 0)])), None);
        }
    }

    #[test]
    fn checks_fall_between_the_first_and_the_last_read() {
        let spread = |r: usize, c: usize| -> String {
            interleave(vec!['r'; r], vec!['c'; c]).into_iter().collect()
        };
        assert_eq!(spread(3, 2), "rcrcr");
        assert_eq!(spread(4, 2), "rrcrcr");
        assert_eq!(spread(3, 5), "rccrcccr");
        assert_eq!(spread(1, 2), "rcc");
        assert_eq!(spread(0, 2), "cc");
        assert_eq!(spread(2, 0), "rr");
    }
}
