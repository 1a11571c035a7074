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
//! selection), on a blocking thread while the audit takes the rows already
//! read.
//!
//! The stored rows are computed with the writer's tolerances
//! (`audit.skew`, `audit.event_window`...): a reader configured
//! differently reads them as they are.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, DictionaryArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, TimestampMicrosecondType};
use leaseline_audit::{AuditConfig, Auditor, StoredFiles};
use leaseline_lake::{parquet_io, Lake, LakeError, Manifest, Table};
use leaseline_schema::{EventColumns, LeaseEvent, SETTLED_BEFORE};

use tracing::debug;

use crate::audit::{derive, joined, AuditTables, BATCHES_AHEAD};
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
    let files: Vec<String> = m
        .files_of(Table::LeaseEvents)
        .map(|f| f.path.clone())
        .collect();
    let reader_cuts = cuts.clone();
    let reader = tokio::spawn(async move {
        // The writer's recorded position must be past these.
        let mut settled = SettledOffsets::new();
        for path in files {
            let bytes = store.get(&path).await?;
            let (tx, cuts) = (tx.clone(), reader_cuts.clone());
            let found = tokio::task::spawn_blocking(move || read_tail(bytes, &cuts, settled, &tx))
                .await
                .map_err(joined)??;
            let Some(found) = found else {
                return Ok::<_, QueryError>(Err(path));
            };
            settled = found;
        }
        Ok(Ok(settled))
    });
    while let Some(batch) = rx.recv().await {
        push(&mut auditor, &batch, |_| true)?;
    }
    let settled = match reader.await.map_err(joined)?? {
        Ok(settled) => settled,
        Err(path) => {
            debug!(file = %path, "an event before its lease's cut has no Kafka position; auditing every event");
            return Ok(None);
        }
    };
    let events_read = started.elapsed();
    let mut context_columns: Vec<&str> = EventColumns::COLUMNS.to_vec();
    context_columns.push(SETTLED_BEFORE);
    // A lease's context rows carry its cut, which only moves forward: rows
    // stored at a cut older than every lease's are superseded, and so are
    // the files (one per store commit) that hold only such rows.
    let oldest_cut = cuts.values().copied().min().unwrap_or(i64::MIN);
    for f in m.files_of(Table::LeaseContext) {
        let bytes = lake.store().get(&f.path).await?;
        let batches =
            parquet_io::column_reader_from(bytes, &context_columns, SETTLED_BEFORE, oldest_cut)?;
        for batch in batches {
            let batch = batch.map_err(LakeError::from)?;
            let cut_of = batch
                .column_by_name(SETTLED_BEFORE)
                .ok_or_else(|| LakeError::Delta(format!("{} lacks {SETTLED_BEFORE}", f.path)))?
                .as_primitive::<TimestampMicrosecondType>()
                .clone();
            // A lease's context at an earlier cut is superseded.
            push(&mut auditor, &batch, |(i, e)| {
                cuts.get(&*e.lease_id) == Some(&cut_of.value(i))
            })?;
        }
    }
    let partitions: Vec<(String, i32)> = settled.iter().map(|(k, _)| k.clone()).collect();
    let Some(positions) = lake.stored_positions(m, &partitions).await? else {
        debug!("the stored audit tables moved on while read; auditing every event");
        return Ok(None);
    };
    let accounted = settled.iter().all(|((topic, p), offset)| {
        positions
            .get(topic)
            .and_then(|ps| ps.get(p))
            .is_some_and(|&next| *offset < next)
    });
    if !accounted {
        debug!("an event before its lease's cut is past the stored rows' position; auditing every event");
        return Ok(None);
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

/// The largest offset of each Kafka partition's rows before their lease's
/// cut, by `(topic, partition)`; partitions are few.
type SettledOffsets = Vec<((String, i32), i64)>;

/// Sends the rows of one `lease_events` file that the reader audits (at or
/// after their lease's cut), and adds the file's other rows to `settled`;
/// `None` if one of those has no Kafka position.
fn read_tail(
    bytes: bytes::Bytes,
    cuts: &HashMap<String, i64>,
    mut settled: SettledOffsets,
    tx: &tokio::sync::mpsc::Sender<RecordBatch>,
) -> Result<Option<SettledOffsets>> {
    let mut keep = Vec::new();
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
        let t = topics.value(t);
        let (p, o) = (partition.value(i), offset.value(i));
        match settled.iter_mut().find(|((st, sp), _)| st == t && *sp == p) {
            Some((_, at)) => *at = (*at).max(o),
            None => settled.push(((t.to_string(), p), o)),
        }
    }
    Ok(true)
}

/// Pushes the rows of `batch` that `wanted` takes (by row index and
/// event). Lake rows hold each `event_id` once, and a lease's context is
/// before its cut while its other rows read are not, so no id repeats.
fn push(
    auditor: &mut Auditor,
    batch: &RecordBatch,
    wanted: impl Fn((usize, &LeaseEvent<'_>)) -> bool,
) -> Result<()> {
    let cols = EventColumns::new(batch)?;
    let mut events: Vec<LeaseEvent<'_>> = Vec::with_capacity(cols.len());
    for i in 0..cols.len() {
        let e = cols.event(i)?;
        if wanted((i, &e)) {
            events.push(e);
        }
    }
    auditor.push_all_unique(&events);
    Ok(())
}
