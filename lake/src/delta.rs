//! The lake's tables as Delta tables, through the `deltalake` crate.
//!
//! Each table is a directory under the lake root with its own
//! `_delta_log/`: `lease_events/`, `lease_rejects/`, `lease_alerts/`. Any
//! engine that reads Delta (Spark, Trino, DuckDB, polars) opens it with no
//! leaseline code. leaseline writes the Parquet files itself (sorted,
//! zstd, page statistics, a bloom filter on `event_id`; see
//! [`crate::parquet_io`]) and commits them with `add` actions carrying the
//! standard statistics, so other engines can skip files by time.
//!
//! - Partitioned by `date` (the UTC day of the table's time column), a
//!   partition column as Delta defines it: in the log and the directory
//!   name, not in the files.
//! - `fencing_token` and `max_token`, unsigned 64-bit in the contract, are
//!   `decimal(20,0)` in the tables: Delta has no unsigned type, and a
//!   `long` cannot hold the top half of the range.
//! - Commits go through the default log store: a commit is a create-only
//!   put of the next `_delta_log/<version>.json` (conditional put), so two
//!   writers can never both create one version. Local disks, S3 (which
//!   honours `If-None-Match` since 2024), GCS and Azure all support it, so
//!   no lock table is needed.
//! - A checkpoint every [`CHECKPOINT_INTERVAL`] commits, written after the
//!   commit that reaches it, so opening a table reads one checkpoint and at
//!   most that many commits.
//! - Table properties hold the schema version ([`SCHEMA_VERSION_PROPERTY`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use chrono::{DateTime, Utc};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake::kernel::{Action, Add, DataType, Remove, StructField, StructType, Transaction};
use deltalake::logstore::{default_logstore, StorageConfig};
use deltalake::protocol::checkpoints::{cleanup_metadata, create_checkpoint};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::table::config::TablePropertiesExt;
use deltalake::{DeltaTable, DeltaTableError};
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use serde_json::json;

use crate::error::{LakeError, Result};
use crate::manifest::{DataFile, KafkaRange, Offsets, Table, TableChange};
use crate::store::LakeStore;

/// Commits between checkpoints.
pub const CHECKPOINT_INTERVAL: u64 = 100;

/// The table property naming the leaseline schema version of the table.
pub const SCHEMA_VERSION_PROPERTY: &str = "leaseline.schemaVersion";

/// `add` tags leaseline keeps for itself: exact time bounds (the standard
/// statistics are for other engines) and the compaction level.
const TAG_MIN_TS: &str = "leaseline.minTsUs";
const TAG_MAX_TS: &str = "leaseline.maxTsUs";
const TAG_LEVEL: &str = "leaseline.level";
/// `<version>.<index>`: the commit that added the file and its place in
/// it. Snapshots list files in that order, as rows arrived, whatever order
/// the log replays them in.
const TAG_ADDED: &str = "leaseline.added";

/// The partition column of every table.
pub const PARTITION_COLUMN: &str = "date";

/// The column a table is partitioned by day on.
pub fn time_column(table: Table) -> &'static str {
    match table {
        Table::LeaseEvents => "ts",
        Table::LeaseRejects => "ingested_at",
        Table::LeaseAlerts => "recorded_at",
        Table::LeaseTimeline => "acquired_at",
        Table::LeaseViolations => "at",
        // A context event is expired with the day of events it is one of.
        Table::LeaseContext => "ts",
    }
}

/// The columns stored as `decimal(20,0)` in place of `UInt64`.
pub const U64_STORAGE: ArrowType = ArrowType::Decimal128(20, 0);

/// A schema as the tables store it: unsigned 64-bit columns as
/// [`U64_STORAGE`].
pub fn storage_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            ArrowType::UInt64 => Field::new(f.name(), U64_STORAGE, f.is_nullable()),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The Delta schema of a table: its stored columns and `date`.
fn delta_schema(table: Table) -> Result<StructType> {
    let arrow = storage_schema(&crate::parquet_io::schema_of(table));
    let s: StructType = arrow.as_ref().try_into_kernel()?;
    let mut fields: Vec<StructField> = s.fields().cloned().collect();
    fields.push(StructField::new(PARTITION_COLUMN, DataType::DATE, true));
    StructType::try_new(fields).map_err(|e| LakeError::Delta(e.to_string()))
}

/// The app id of the `txn` that holds a topic-partition's position in the
/// table, whichever consumer group consumed it: the lake, not the group,
/// decides where ingestion resumes, so a restart under another group id
/// reads nothing twice.
pub fn app_id(topic: &str, partition: i32) -> String {
    format!("leaseline:{topic}:{partition}")
}

/// The app id of the `txn` each commit also carries for the consumer group
/// that made it (as kafka-delta-ingest names its own): which group has
/// consumed how far, for whoever reads the log.
pub fn group_app_id(group: &str, topic: &str, partition: i32) -> String {
    format!("leaseline:{group}:{topic}:{partition}")
}

/// A handle on one Delta table of the lake (not yet loaded).
pub(crate) fn handle(store: &LakeStore, table: Table) -> Result<DeltaTable> {
    let (root, location) = store.delta_location(table.name())?;
    let prefix = object_store::path::Path::from_url_path(location.path())?;
    let prefixed: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(root.clone(), prefix));
    let log_store = default_logstore(prefixed, root, &location, &StorageConfig::default());
    Ok(DeltaTable::new(log_store))
}

/// Loads a table's newest version; false if the table does not exist.
pub(crate) async fn load(t: &mut DeltaTable, store: &LakeStore, table: Table) -> Result<bool> {
    let r = if t.version().is_some() {
        t.update_incremental(None).await
    } else {
        // The kernel reports a missing table in more ways than one; a
        // table is its log: its first commit, or, once old commits are
        // cleaned up, the checkpoint pointer. Two HEADs, not a listing of
        // a log that may hold thousands of commits.
        let log = format!("{table}/_delta_log");
        if !store.exists(&format!("{log}/{:020}.json", 0)).await?
            && !store.exists(&format!("{log}/_last_checkpoint")).await?
        {
            return Ok(false);
        }
        t.load().await
    };
    match r {
        Ok(()) => Ok(true),
        Err(DeltaTableError::NotATable(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// One table as a process sees it: the Delta snapshot it last read and
/// what it knows of the table since, its own commits included.
///
/// A writer does not read its own commits back. deltalake refreshes a
/// snapshot by replaying every file the table holds, so a snapshot brought
/// up to date after each commit made commits slower as files accumulated
/// (half a second each at 1,700 files). Instead [`Loaded::commit`] applies
/// the commit to [`Loaded::state`], and [`Loaded::refresh`] reads the log
/// only when a version it did not write exists: one HEAD per table when
/// nothing changed. The snapshot stays at the version it was read at; it
/// serves the protocol check of a commit and, brought forward on demand,
/// the `txn` lookups of partitions not seen yet.
pub(crate) struct Loaded {
    table: DeltaTable,
    state: Option<TableState>,
}

/// What is known of a table at one version.
pub(crate) struct TableState {
    pub version: u64,
    pub files: Arc<Vec<DataFile>>,
    pub committed_at: Option<DateTime<Utc>>,
    /// `txn` versions by lake-wide app id, as far as looked up or written
    /// (None: looked up, no such transaction).
    txns: HashMap<String, Option<i64>>,
}

impl Loaded {
    pub(crate) fn new(store: &LakeStore, table: Table) -> Result<Self> {
        Ok(Loaded {
            table: handle(store, table)?,
            state: None,
        })
    }

    pub(crate) fn state(&self) -> Option<&TableState> {
        self.state.as_ref()
    }

    /// Brings the state to the table's newest version; false if the table
    /// does not exist (and `create` is false).
    pub(crate) async fn refresh(
        &mut self,
        store: &LakeStore,
        table: Table,
        create: bool,
    ) -> Result<bool> {
        if let Some(s) = &self.state {
            let next = format!("{table}/_delta_log/{:020}.json", s.version + 1);
            if !store.exists(&next).await? {
                return Ok(true);
            }
            // Read afresh from the last checkpoint: bounded by the
            // checkpoint interval, where an incremental update replays
            // every file already known.
            self.table = handle(store, table)?;
        }
        if !load(&mut self.table, store, table).await? {
            if !create {
                return Ok(false);
            }
            self::create(&mut self.table, store, table).await?;
        }
        check_schema_version(&self.table, table)?;
        self.state = Some(TableState {
            version: self.table.version().unwrap_or(0),
            files: Arc::new(files(&self.table, table)?),
            committed_at: committed_at(&self.table),
            txns: HashMap::new(),
        });
        Ok(true)
    }

    /// The positions (`txn` versions) of the given partitions at the
    /// state's version.
    pub(crate) async fn txn_versions(&mut self, partitions: &[(String, i32)]) -> Result<Offsets> {
        let mut out = Offsets::new();
        let Some(state) = &mut self.state else {
            return Ok(out);
        };
        for (topic, p) in partitions {
            let id = app_id(topic, *p);
            let v = match state.txns.get(&id) {
                Some(v) => *v,
                None => {
                    if self.table.version() != Some(state.version) {
                        self.table.update_incremental(Some(state.version)).await?;
                    }
                    let v = self
                        .table
                        .snapshot()?
                        .transaction_version(self.table.log_store().as_ref(), id.clone())
                        .await?;
                    state.txns.insert(id, v);
                    v
                }
            };
            if let Some(v) = v {
                out.entry(topic.clone()).or_default().insert(*p, v);
            }
        }
        Ok(out)
    }
}

/// Creates the table if nobody has; a writer that lost the race to create
/// it loads the winner's.
pub(crate) async fn create(t: &mut DeltaTable, store: &LakeStore, table: Table) -> Result<()> {
    if let Some(root) = store.local_root() {
        std::fs::create_dir_all(root.join(table.name()))?;
    }
    let mut config: HashMap<String, Option<String>> = HashMap::new();
    config.insert(
        "delta.checkpointInterval".into(),
        Some(CHECKPOINT_INTERVAL.to_string()),
    );
    config.insert(
        SCHEMA_VERSION_PROPERTY.into(),
        Some(leaseline_schema::SCHEMA_VERSION.to_string()),
    );
    let created = t
        .create()
        .with_table_name(table.name())
        .with_columns(delta_schema(table)?.fields().cloned())
        .with_partition_columns([PARTITION_COLUMN])
        .with_configuration(config)
        .with_raise_if_key_not_exists(false)
        .with_save_mode(SaveMode::Ignore)
        .await;
    match created {
        Ok(_) => {}
        Err(DeltaTableError::VersionAlreadyExists(_)) => {}
        Err(DeltaTableError::Transaction { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if !load(t, store, table).await? {
        return Err(LakeError::Delta(format!("{table} could not be created")));
    }
    check_schema_version(t, table)
}

/// Refuses a table written by a newer leaseline.
pub(crate) fn check_schema_version(t: &DeltaTable, table: Table) -> Result<()> {
    let snapshot = t.snapshot()?;
    let found = snapshot
        .metadata()
        .configuration()
        .get(SCHEMA_VERSION_PROPERTY)
        .and_then(|v| v.parse::<u32>().ok());
    match found {
        Some(found) if found > leaseline_schema::SCHEMA_VERSION => Err(LakeError::SchemaVersion {
            found,
            supported: leaseline_schema::SCHEMA_VERSION,
        }),
        Some(_) => Ok(()),
        None => Err(LakeError::Delta(format!(
            "{table} is a Delta table leaseline did not create (no {SCHEMA_VERSION_PROPERTY} property)"
        ))),
    }
}

fn tag<'a>(tags: &'a Option<HashMap<String, Option<String>>>, key: &str) -> Option<&'a str> {
    tags.as_ref()?.get(key)?.as_deref()
}

fn stat_ts(stats: &serde_json::Value, kind: &str, column: &str) -> Option<i64> {
    let s = stats.get(kind)?.get(column)?.as_str()?;
    Some(DateTime::parse_from_rfc3339(s).ok()?.timestamp_micros())
}

/// The data files of a loaded table.
pub(crate) fn files(t: &DeltaTable, table: Table) -> Result<Vec<DataFile>> {
    let snapshot = t.snapshot()?;
    let mut out: Vec<((u64, u64), i64, DataFile)> =
        Vec::with_capacity(snapshot.log_data().num_files());
    for view in snapshot.log_data().iter() {
        // The add action has the tags, which the file view does not show.
        #[allow(deprecated)]
        let add = view.add_action();
        let stats: serde_json::Value = add
            .stats
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let column = time_column(table);
        let min_ts_us = tag(&add.tags, TAG_MIN_TS)
            .and_then(|v| v.parse().ok())
            .or_else(|| stat_ts(&stats, "minValues", column))
            .unwrap_or(i64::MIN);
        let max_ts_us = tag(&add.tags, TAG_MAX_TS)
            .and_then(|v| v.parse().ok())
            .or_else(|| stat_ts(&stats, "maxValues", column))
            .unwrap_or(i64::MAX);
        let rows = stats
            .get("numRecords")
            .and_then(|n| n.as_u64())
            .or_else(|| view.num_records().map(|n| n as u64))
            .unwrap_or(0);
        let path = percent_decode(&add.path);
        let added_in = tag(&add.tags, TAG_ADDED)
            .and_then(|v| {
                let (version, index) = v.split_once('.')?;
                Some((version.parse().ok()?, index.parse().ok()?))
            })
            .unwrap_or((u64::MAX, 0));
        out.push((
            added_in,
            add.modification_time,
            DataFile {
                table,
                path: format!("{}/{path}", table.name()),
                rows,
                bytes: add.size.max(0) as u64,
                min_ts_us,
                max_ts_us,
                level: tag(&add.tags, TAG_LEVEL)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            },
        ));
    }
    // In the order they were committed (files another tool added, without
    // our tag, by their time), then by path: a stable order readers can
    // rely on, as rows arrived.
    out.sort_by(|a, b| (a.0, a.1, &a.2.path).cmp(&(b.0, b.1, &b.2.path)));
    Ok(out.into_iter().map(|(_, _, f)| f).collect())
}

/// Delta paths are URIs: undo the percent-encoding another tool may have
/// applied.
fn percent_decode(p: &str) -> String {
    if !p.contains('%') {
        return p.to_string();
    }
    object_store::path::Path::from_url_path(p)
        .map(|p| p.to_string())
        .unwrap_or_else(|_| p.to_string())
}

fn ts_string(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn partition_values(f: &DataFile) -> HashMap<String, Option<String>> {
    HashMap::from([(PARTITION_COLUMN.to_string(), f.date().map(str::to_string))])
}

fn add_action(f: &DataFile, data_change: bool, now_ms: i64, added: (u64, usize)) -> Add {
    let column = time_column(f.table);
    let stats = json!({
        "numRecords": f.rows,
        "minValues": { column: ts_string(f.min_ts_us) },
        "maxValues": { column: ts_string(f.max_ts_us) },
        "nullCount": { column: 0 },
    });
    Add {
        path: f.table_path().to_string(),
        partition_values: partition_values(f),
        size: f.bytes as i64,
        modification_time: now_ms,
        data_change,
        stats: Some(stats.to_string()),
        tags: Some(HashMap::from([
            (TAG_MIN_TS.to_string(), Some(f.min_ts_us.to_string())),
            (TAG_MAX_TS.to_string(), Some(f.max_ts_us.to_string())),
            (TAG_LEVEL.to_string(), Some(f.level.to_string())),
            (
                TAG_ADDED.to_string(),
                Some(format!("{}.{}", added.0, added.1)),
            ),
        ])),
        ..Default::default()
    }
}

fn remove_action(f: &DataFile, data_change: bool, now_ms: i64) -> Remove {
    Remove {
        path: f.table_path().to_string(),
        data_change,
        deletion_timestamp: Some(now_ms),
        extended_file_metadata: Some(true),
        partition_values: Some(partition_values(f)),
        size: Some(f.bytes as i64),
        ..Default::default()
    }
}

impl Loaded {
    /// Commits one table's part of a change on exactly `expected` (the
    /// version the change was decided on). Another writer's commit since
    /// then is a [`LakeError::Conflict`]: nothing of ours is in the table,
    /// and the caller decides again on the newer version.
    ///
    /// The commit is the create-only put of `<expected + 1>.json` and
    /// nothing else: no listing of the log, no snapshot refresh (see
    /// [`Loaded`]). The caller makes it durable and then calls
    /// [`Loaded::after_commit`].
    pub(crate) async fn commit(
        &mut self,
        table: Table,
        expected: u64,
        group: &str,
        change: &TableChange,
        known: Option<&Offsets>,
    ) -> Result<u64> {
        let Some(loaded) = self.state.as_ref().map(|s| s.version) else {
            return Err(LakeError::Conflict {
                version: expected,
                reason: format!("{table} is not loaded"),
            });
        };
        if loaded != expected {
            return Err(LakeError::Conflict {
                version: expected,
                reason: format!("{table} is at version {loaded}, not {expected}"),
            });
        }
        // The change was checked against the snapshot's positions of the
        // partitions it knew; one it did not know is checked here, on
        // exactly the version the commit follows.
        let unknown: Vec<(String, i32)> = change
            .txns
            .iter()
            .filter(|r| {
                known
                    .and_then(|k| k.get(&r.topic))
                    .and_then(|p| p.get(&r.partition))
                    .is_none()
            })
            .map(|r| (r.topic.clone(), r.partition))
            .collect();
        let done = self.txn_versions(&unknown).await?;
        for r in &change.txns {
            if let Some(done) = done.get(&r.topic).and_then(|p| p.get(&r.partition)) {
                if *done > r.start {
                    return Err(LakeError::Conflict {
                        version: expected,
                        reason: format!(
                            "{}/{} offsets {}..{} overlap what {table} already holds (up to {done})",
                            r.topic, r.partition, r.start, r.end
                        ),
                    });
                }
            }
        }
        let now = Utc::now();
        let now_ms = now.timestamp_millis();
        let compaction = !change.remove.is_empty() && !change.deletes_rows;
        let mut actions: Vec<Action> = Vec::new();
        actions.extend(
            change
                .remove
                .iter()
                .map(|f| Action::Remove(remove_action(f, change.deletes_rows, now_ms))),
        );
        actions.extend(
            change
                .add
                .iter()
                .enumerate()
                .map(|(i, f)| Action::Add(add_action(f, !compaction, now_ms, (expected + 1, i)))),
        );
        let txns: Vec<Transaction> = change
            .txns
            .iter()
            .flat_map(|r: &KafkaRange| {
                let lake = app_id(&r.topic, r.partition);
                let group = (!group.is_empty()).then(|| group_app_id(group, &r.topic, r.partition));
                [Some(lake), group]
                    .into_iter()
                    .flatten()
                    .map(move |id| Transaction::new_with_last_update(id, r.end, Some(now_ms)))
            })
            .collect();
        let operation = if change.deletes_rows {
            let before = change.remove.iter().filter_map(DataFile::date).max();
            DeltaOperation::Delete {
                predicate: before.map(|d| format!("{PARTITION_COLUMN} <= '{d}'")),
            }
        } else if compaction {
            DeltaOperation::Optimize {
                predicate: None,
                target_size: change.add.iter().map(|f| f.bytes as i64).max().unwrap_or(0),
            }
        } else {
            DeltaOperation::Write {
                mode: SaveMode::Append,
                partition_by: Some(vec![PARTITION_COLUMN.to_string()]),
                predicate: None,
            }
        };
        let props = CommitProperties::default().with_application_transactions(txns);
        let log_store = self.table.log_store();
        // deltalake serialises the commit and checks it against the table's
        // protocol; the put is ours.
        let prepared = CommitBuilder::from(props)
            .with_actions(actions)
            .build(Some(self.table.snapshot()?), log_store.clone(), operation)
            .into_prepared_commit_future()
            .await?;
        let bytes = prepared.commit_or_bytes().clone();
        drop(prepared);
        let version = expected + 1;
        match log_store
            .write_commit_entry(version, bytes, uuid::Uuid::new_v4())
            .await
        {
            Ok(()) => {}
            Err(TransactionError::VersionAlreadyExists(_)) => {
                return Err(LakeError::Conflict {
                    version: expected,
                    reason: format!("another writer committed {table} version {version}"),
                })
            }
            Err(e) => return Err(DeltaTableError::from(e).into()),
        }
        let state = self.state.as_mut().expect("checked above");
        let removed: std::collections::HashSet<&str> =
            change.remove.iter().map(|f| f.path.as_str()).collect();
        let mut files: Vec<DataFile> = state
            .files
            .iter()
            .filter(|f| !removed.contains(f.path.as_str()))
            .cloned()
            .collect();
        files.extend(change.add.iter().cloned());
        state.version = version;
        state.files = Arc::new(files);
        state.committed_at = Some(now);
        for r in &change.txns {
            state
                .txns
                .insert(app_id(&r.topic, r.partition), Some(r.end));
        }
        Ok(version)
    }

    /// Once a commit is durable: the checkpoint, when the commit reaches
    /// one, and the cleanup of expired commits that a checkpoint allows.
    /// Neither is needed for correctness, so a failure is only logged. The
    /// snapshot read to write the checkpoint becomes this table's snapshot.
    pub(crate) async fn after_commit(&mut self, store: &LakeStore, table: Table, version: u64) {
        let interval = match self.table.snapshot() {
            Ok(s) => s.table_config().checkpoint_interval().get(),
            Err(_) => return,
        };
        if !(version + 1).is_multiple_of(interval) {
            return;
        }
        let written = async {
            let mut t = handle(store, table)?;
            t.load_version(version).await?;
            create_checkpoint(&t, None).await?;
            cleanup_metadata(&t, None).await?;
            Ok::<_, LakeError>(t)
        };
        match written.await {
            Ok(t) => self.table = t,
            Err(e) => tracing::warn!(%table, version, error = %e, "could not write a checkpoint"),
        }
    }
}

/// When a table's version was committed, if its log still has it.
pub(crate) fn committed_at(t: &DeltaTable) -> Option<DateTime<Utc>> {
    let s = t.snapshot().ok()?;
    let ms = s.version_timestamp(s.version())?;
    DateTime::from_timestamp_millis(ms)
}
