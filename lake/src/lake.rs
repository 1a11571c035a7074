//! The lake handle: snapshots, commits, compaction and vacuum, on the
//! tables' Delta logs (see [`crate::delta`] and [`crate::manifest`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use chrono::Utc;
use tracing::{debug, info, warn};

use crate::dedup::{slot_of, RecentIds};
use crate::delta;
use crate::error::{LakeError, Result};
use crate::manifest::{Change, DataFile, Manifest, Table};
use crate::merge;
use crate::parquet_io;
use crate::store::LakeStore;

/// Compaction settings.
#[derive(Debug, Clone)]
pub struct CompactionPolicy {
    /// Files at least this large are left alone; smaller ones are merged
    /// into files of about this size.
    pub target_file_bytes: u64,
    /// At most this many input files per merge, to bound memory.
    pub max_inputs: usize,
    /// How long a `lease_events` file may wait for its leases' cuts (the
    /// stored audit rows, `query/src/stored.rs`) to pass its newest event
    /// before it is merged anyway; zero merges at once. See
    /// [`Lake::compact`].
    pub unsettled_wait: Duration,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            target_file_bytes: 128 * 1024 * 1024,
            max_inputs: 64,
            // Three of the audit's default windows (10 min): cuts trail
            // the newest events by about one and a half.
            unsettled_wait: Duration::from_secs(1800),
        }
    }
}

/// What one compaction pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactionReport {
    pub merged_files: usize,
    pub written_files: usize,
    pub rows: u64,
}

/// Whose Kafka positions [`Lake::latest`] reads: the consumer group and the
/// partitions it has been assigned.
#[derive(Debug, Default)]
struct KafkaScope {
    group: String,
    partitions: BTreeSet<(String, i32)>,
}

struct Inner {
    tables: tokio::sync::Mutex<BTreeMap<Table, delta::Loaded>>,
    scope: Mutex<KafkaScope>,
    /// Writers create missing tables; readers never do.
    writable: bool,
}

/// A lake: its store and the protocol to change it.
#[derive(Clone)]
pub struct Lake {
    store: LakeStore,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lake").field("store", &self.store).finish()
    }
}

/// The directory of the lake format before Delta tables.
const LEGACY_MANIFEST_DIR: &str = "_manifest";

/// Commits [`Lake::rows_only_added`] reads at most; past that, reading
/// them costs more than the answer saves.
const MAX_COMMITS_READ: u64 = 1000;

impl Lake {
    fn with_store(store: LakeStore, writable: bool) -> Self {
        Lake {
            store,
            inner: Arc::new(Inner {
                tables: tokio::sync::Mutex::new(BTreeMap::new()),
                scope: Mutex::new(KafkaScope::default()),
                writable,
            }),
        }
    }

    /// Opens (creating if needed) a lake to write to.
    pub fn open(location: &str) -> Result<Self> {
        Ok(Self::with_store(LakeStore::open(location)?, true))
    }

    /// Opens a lake that must already exist: at least its `lease_events`
    /// table. Only writers create lakes; a reader that created one would
    /// answer a mistyped path with an empty, clean-looking history.
    pub async fn open_existing(location: &str) -> Result<Self> {
        let lake = Self::with_store(LakeStore::open_existing(location)?, false);
        let m = lake.latest().await?;
        if m.tables.is_empty() {
            let legacy = !lake.store.list(LEGACY_MANIFEST_DIR).await?.is_empty();
            return Err(LakeError::NotFound {
                location: location.to_string(),
                reason: if legacy {
                    "it holds a lake in the format before Delta tables (_manifest/); \
                     convert it with `leaseline migrate`"
                        .to_string()
                } else {
                    "nothing has been committed there (no Delta tables)".to_string()
                },
            });
        }
        Ok(lake)
    }

    pub fn store(&self) -> &LakeStore {
        &self.store
    }

    /// True when the location holds a lake in the format before Delta
    /// tables.
    pub async fn is_legacy(&self) -> Result<bool> {
        Ok(!self.store.list(LEGACY_MANIFEST_DIR).await?.is_empty())
    }

    /// From now on, snapshots carry the Kafka positions of these
    /// partitions for `group` ([`Manifest::kafka`]). A consumer calls it
    /// when it is assigned partitions, before reading where to resume.
    pub fn track_partitions(
        &self,
        group: &str,
        partitions: impl IntoIterator<Item = (String, i32)>,
    ) {
        let mut s = self.inner.scope.lock().unwrap_or_else(|p| p.into_inner());
        if s.group != group {
            s.group = group.to_string();
            s.partitions.clear();
        }
        s.partitions.extend(partitions);
    }

    fn scope(&self) -> (String, Vec<(String, i32)>) {
        let s = self.inner.scope.lock().unwrap_or_else(|p| p.into_inner());
        (s.group.clone(), s.partitions.iter().cloned().collect())
    }

    /// The newest snapshot, or [`Manifest::empty`] for a new lake.
    pub async fn latest(&self) -> Result<Manifest> {
        let (_, partitions) = self.scope();
        let mut tables = self.inner.tables.lock().await;
        let mut m = Manifest::empty();
        // One table after another, in `Table::ALL`'s order (the events
        // first, the stored audit tables after them). Refreshed
        // concurrently (cbfc7ad to 36a0d3d), which opened a lake in half
        // the time, readers of a lake being written reported violations
        // that were not there.
        for table in Table::ALL {
            let loaded = match tables.entry(table) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(delta::Loaded::new(&self.store, table)?)
                }
            };
            if !loaded
                .refresh(&self.store, table, self.inner.writable)
                .await?
            {
                continue;
            }
            let state = loaded.state().expect("refreshed");
            if let Some(at) = state.committed_at {
                m.committed_at = m.committed_at.max(at);
            }
            m.tables.insert(table, state.version);
            m.version += state.version + 1;
            m.files.extend(state.files.iter().cloned());
            if !partitions.is_empty() {
                match table {
                    Table::LeaseEvents => m.kafka = loaded.txn_versions(&partitions).await?,
                    Table::LeaseRejects => {
                        m.reject_kafka = loaded.txn_versions(&partitions).await?
                    }
                    Table::LeaseTimeline => {
                        m.stored_kafka = loaded.txn_versions(&partitions).await?
                    }
                    _ => {}
                }
            }
        }
        Ok(m)
    }

    /// The newest manifest and the files it names that storage no longer
    /// has. Each such file is rows a query would fail to read. A file
    /// vacuumed after a newer version replaced it is not missing: the
    /// check is repeated on the newer version.
    pub async fn check_files(&self) -> Result<(Manifest, Vec<String>)> {
        let mut m = self.latest().await?;
        for _ in 0..3 {
            let missing = self.missing_files(&m).await?;
            let newest = self.latest().await?;
            if missing.is_empty() || newest.version == m.version {
                return Ok((m, missing));
            }
            m = newest;
        }
        let missing = self.missing_files(&m).await?;
        Ok((m, missing))
    }

    /// The files `m` names that storage does not have: one listing per
    /// table.
    pub async fn missing_files(&self, m: &Manifest) -> Result<Vec<String>> {
        let mut missing = Vec::new();
        for table in Table::ALL {
            let present: HashSet<String> = self
                .store
                .list(table.name())
                .await?
                .into_iter()
                .map(|(p, _, _)| p)
                .collect();
            missing.extend(
                m.files_of(table)
                    .filter(|f| !present.contains(&f.path))
                    .map(|f| f.path.clone()),
            );
        }
        Ok(missing)
    }

    /// Commits `change` on top of `base`, one Delta commit per table it
    /// touches ([`Change::per_table`] order). Fails with
    /// [`LakeError::Conflict`] if another writer committed first, or if the
    /// change no longer fits the base; the caller reloads and decides
    /// again. Files of tables whose commit did not happen are deleted;
    /// those of tables committed before a later table's conflict stay
    /// committed (the reloaded snapshot shows them).
    pub async fn commit(&self, base: &Manifest, change: &Change) -> Result<Manifest> {
        match self.commit_tables(base, change).await {
            Ok(next) => Ok(next),
            Err((committed, e)) => {
                self.discard_added(change, committed).await;
                Err(e)
            }
        }
    }

    /// Commits table by table; on failure, says how many tables committed.
    async fn commit_tables(
        &self,
        base: &Manifest,
        change: &Change,
    ) -> std::result::Result<Manifest, (usize, LakeError)> {
        let next = change.apply(base, Utc::now()).map_err(|e| (0, e))?;
        let per_table = change.per_table(base);
        let (group, _) = self.scope();
        // Snapshots from now on carry the positions of what we commit.
        if let Change::Append { kafka, .. } = change {
            self.track_partitions(&group, kafka.iter().map(|r| (r.topic.clone(), r.partition)));
        }
        let mut tables = self.inner.tables.lock().await;
        for (i, (table, tc)) in per_table.iter().enumerate() {
            let result = match (base.tables.get(table), tables.get_mut(table)) {
                (Some(expected), Some(loaded)) => {
                    let known = match table {
                        Table::LeaseEvents => Some(&base.kafka),
                        Table::LeaseRejects => Some(&base.reject_kafka),
                        Table::LeaseTimeline => Some(&base.stored_kafka),
                        _ => None,
                    };
                    loaded.commit(*table, *expected, &group, tc, known).await
                }
                _ => Err(LakeError::Conflict {
                    version: base.version,
                    reason: format!("{table} did not exist when the change was decided"),
                }),
            };
            let version = result.map_err(|e| (i, e))?;
            // The object store renames the commit into place without an
            // fsync; the offsets it records count only once it would
            // survive a power cut.
            if self.store.is_local() {
                let rel = format!("{table}/_delta_log/{version:020}.json");
                self.store.sync(&rel).map_err(|e| (i + 1, e))?;
            }
            if let Some(loaded) = tables.get_mut(table) {
                loaded.after_commit(&self.store, *table, version).await;
            }
        }
        debug!(
            version = next.version,
            tables = per_table.len(),
            "committed"
        );
        Ok(next)
    }

    /// Deletes the files `change` adds to its tables from the `from`-th on
    /// (in commit order): they were never committed.
    async fn discard_added(&self, change: &Change, from: usize) {
        let files: Vec<DataFile> = change
            .per_table(&Manifest::empty())
            .into_iter()
            .skip(from)
            .flat_map(|(_, tc)| tc.add)
            .collect();
        self.discard(&files).await;
    }

    /// Appends rows to a table with no Kafka position (alerts, for one):
    /// written, then committed on the newest version, again on a conflict.
    pub async fn append(&self, table: Table, batch: &RecordBatch) -> Result<Vec<DataFile>> {
        let files = self.write(table, batch).await?;
        if files.is_empty() {
            return Ok(files);
        }
        let mut tries = 0;
        loop {
            let base = self.latest().await?;
            let change = Change::Append {
                files: files.clone(),
                kafka: Vec::new(),
                reject_kafka: Vec::new(),
            };
            match self.commit_tables(&base, &change).await.map_err(|(_, e)| e) {
                Ok(_) => return Ok(files),
                Err(LakeError::Conflict { .. }) if tries < 100 => tries += 1,
                Err(e) => {
                    self.discard(&files).await;
                    return Err(e);
                }
            }
        }
    }

    /// Writes a batch of a table as data files (not yet committed).
    pub async fn write(&self, table: Table, batch: &RecordBatch) -> Result<Vec<DataFile>> {
        parquet_io::write_table(&self.store, table, batch, 0).await
    }

    /// Deletes data files that were written but never committed.
    pub async fn discard(&self, files: &[DataFile]) {
        for f in files {
            if let Err(e) = self.store.delete(&f.path).await {
                warn!(path = %f.path, error = %e, "could not delete uncommitted file; vacuum will");
            }
        }
    }

    /// Adds the `event_id`s of the given event files to `ids`, those of
    /// minutes `ids` keeps in memory. The newest files are read first and,
    /// for a windowed set ([`RecentIds::starting_at`]), [`RecentIds::evict`]
    /// runs after each, so that a writer opening on a lake of a fast fleet
    /// holds its budget of ids, not days of them.
    pub async fn load_event_ids(&self, files: &[&DataFile], ids: &mut RecentIds) -> Result<()> {
        use arrow::datatypes::TimestampMicrosecondType;
        let mut files: Vec<&&DataFile> = files
            .iter()
            .filter(|f| f.table == Table::LeaseEvents)
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.max_ts_us));
        for f in files {
            if !ids.is_resident(slot_of(f.max_ts_us)) {
                continue;
            }
            for b in parquet_io::read_columns(&self.store, &f.path, &["event_id", "ts"]).await? {
                let (Some(col), Some(ts)) = (b.column_by_name("event_id"), b.column_by_name("ts"))
                else {
                    continue;
                };
                let ts = ts.as_primitive::<TimestampMicrosecondType>();
                for (id, ts) in col.as_string::<i32>().iter().zip(ts.iter()) {
                    if let (Some(id), Some(ts)) = (id, ts) {
                        if !id.is_empty() {
                            ids.add(slot_of(ts), id);
                        }
                    }
                }
            }
            // A set open on every minute (`RecentIds::new`, the ids of
            // another writer's new files) keeps them all: buffered events
            // of any age are checked against it.
            if ids.cutoff().is_some() {
                ids.evict();
            }
        }
        Ok(())
    }

    /// Which of `ids` the given event files hold. A file's bloom filter on
    /// `event_id` rules out, without reading rows, the row groups that hold
    /// none of them; the `event_id` column of the rest is read to be sure.
    /// Only the footer, the filters and those columns are fetched.
    pub async fn find_event_ids(
        &self,
        files: &[&DataFile],
        ids: &[&str],
    ) -> Result<HashSet<String>> {
        use futures::TryStreamExt;
        use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
        let mut found = HashSet::new();
        if ids.is_empty() {
            return Ok(found);
        }
        let wanted: HashSet<&str> = ids.iter().copied().collect();
        for f in files.iter().filter(|f| f.table == Table::LeaseEvents) {
            let reader = parquet_io::RangeReader::new(&self.store, &f.path, f.bytes);
            let mut builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
            let column = builder
                .parquet_schema()
                .columns()
                .iter()
                .position(|c| c.name() == "event_id");
            let mut groups = Vec::new();
            for rg in 0..builder.metadata().num_row_groups() {
                let maybe = match column {
                    Some(c) => match builder.get_row_group_column_bloom_filter(rg, c).await? {
                        Some(bloom) => ids.iter().any(|id| bloom.check(*id)),
                        None => true,
                    },
                    None => true,
                };
                if maybe {
                    groups.push(rg);
                }
            }
            if groups.is_empty() {
                continue;
            }
            let mask = ProjectionMask::columns(builder.parquet_schema(), ["event_id"]);
            let mut stream = builder
                .with_row_groups(groups)
                .with_projection(mask)
                .build()?;
            while let Some(b) = stream.try_next().await? {
                let b = parquet_io::from_storage(b)?;
                let col = b.column(0).as_string::<i32>();
                for id in col.iter().flatten() {
                    if wanted.contains(id) {
                        found.insert(id.to_string());
                    }
                }
            }
        }
        Ok(found)
    }

    /// Adds the identity of every reject in `files`: its
    /// [`line_key`](crate::dedup::line_key) if it came from a file, its
    /// [`kafka_key`](crate::dedup::kafka_key) if from Kafka. Reading the
    /// same input again then keeps each reject once.
    pub async fn load_reject_lines(
        &self,
        files: &[&DataFile],
        keys: &mut HashSet<u128>,
    ) -> Result<()> {
        let columns = [
            "file_path",
            "file_line",
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
        ];
        for f in files.iter().filter(|f| f.table == Table::LeaseRejects) {
            for b in parquet_io::read_columns(&self.store, &f.path, &columns).await? {
                let origins = crate::dedup::Origins::of(&b);
                keys.extend((0..b.num_rows()).filter_map(|i| origins.key(i)));
            }
        }
        Ok(())
    }

    /// Whether every commit of `table` after version `from`, up to `to`,
    /// kept every row it found: appends, and compactions (their removes
    /// carry `dataChange: false`). An expiry's remove, a commit no longer
    /// in the log (cleaned up after a checkpoint) or more commits than
    /// are worth reading answer `false`: the caller then treats the rows
    /// as possibly removed, which is always right.
    pub async fn rows_only_added(&self, table: Table, from: u64, to: u64) -> Result<bool> {
        if to.saturating_sub(from) > MAX_COMMITS_READ {
            return Ok(false);
        }
        for v in from + 1..=to {
            let path = format!("{}/_delta_log/{v:020}.json", table.name());
            let Ok(bytes) = self.store.get(&path).await else {
                return Ok(false);
            };
            for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let action: serde_json::Value = serde_json::from_slice(line)
                    .map_err(|e| LakeError::Delta(format!("{path}: {e}")))?;
                if let Some(remove) = action.get("remove") {
                    if remove.get("dataChange") != Some(&serde_json::Value::Bool(false)) {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Reads every row of a table at a manifest version.
    pub async fn read_table(&self, m: &Manifest, table: Table) -> Result<RecordBatch> {
        let mut batches = Vec::new();
        for f in m.files_of(table) {
            batches.extend(parquet_io::read_file(&self.store, &f.path).await?);
        }
        parquet_io::concat(table, &batches)
    }

    /// Reads the `lease_events` rows of some leases at a manifest version,
    /// with `columns` (`lease_id` among them): their whole histories, for
    /// auditing them again. One pass over the files whatever the number of
    /// leases; each file is filtered as it is read, so memory holds those
    /// leases' rows and one batch of a file at a time.
    pub async fn read_leases(
        &self,
        m: &Manifest,
        leases: &HashSet<&str>,
        columns: &[&str],
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for f in m.files_of(Table::LeaseEvents) {
            let bytes = self.store.get(&f.path).await?;
            for batch in parquet_io::column_reader(bytes, columns)? {
                let batch = batch?;
                let Some(ids) = batch.column_by_name("lease_id") else {
                    continue;
                };
                let mask: arrow::array::BooleanArray = ids
                    .as_string::<i32>()
                    .iter()
                    .map(|id| Some(id.is_some_and(|id| leases.contains(id))))
                    .collect();
                if mask.true_count() > 0 {
                    out.push(arrow::compute::filter_record_batch(&batch, &mask)?);
                }
            }
        }
        Ok(out)
    }

    /// The cut of each lease in the stored audit tables' `files`: the
    /// largest `settled_before` of its rows. Every row of the lease from
    /// before it is stored.
    pub async fn stored_cuts(
        &self,
        files: &[&DataFile],
    ) -> Result<std::collections::HashMap<String, i64>> {
        use futures::{StreamExt, TryStreamExt};
        let paths: Vec<String> = files
            .iter()
            .filter(|f| Table::STORED_AUDIT.contains(&f.table))
            .map(|f| f.path.clone())
            .collect();
        // Decoding takes a core per file: two at a time.
        let mut each = futures::stream::iter(paths.into_iter().map(|path| {
            let store = self.store.clone();
            async move {
                let bytes = store.get(&path).await?;
                tokio::task::spawn_blocking(move || cuts_of(bytes, &path))
                    .await
                    .map_err(|e| LakeError::Io(std::io::Error::other(e)))?
            }
        }))
        .buffer_unordered(2);
        let mut cuts: std::collections::HashMap<String, i64> = Default::default();
        while let Some(found) = each.try_next().await? {
            for (id, at) in found {
                match cuts.get_mut(&id) {
                    Some(c) => *c = (*c).max(at),
                    None => {
                        cuts.insert(id, at);
                    }
                }
            }
        }
        Ok(cuts)
    }

    /// The positions recorded with `m`'s stored audit rows for each of
    /// `partitions` (`lease_timeline`'s `txn`, see
    /// `alerts/src/stored.rs`): below it, every event of the partition is
    /// accounted for by the stored rows. `None` when this handle has
    /// moved to a newer version of the table than `m`'s since.
    pub async fn stored_positions(
        &self,
        m: &Manifest,
        partitions: &[(String, i32)],
    ) -> Result<Option<crate::manifest::Offsets>> {
        let Some(&version) = m.tables.get(&Table::LeaseTimeline) else {
            return Ok(Some(Default::default()));
        };
        let mut tables = self.inner.tables.lock().await;
        let Some(loaded) = tables.get_mut(&Table::LeaseTimeline) else {
            return Ok(None);
        };
        if loaded.state().map(|s| s.version) != Some(version) {
            return Ok(None);
        }
        Ok(Some(loaded.txn_versions(partitions).await?))
    }

    /// The stored audit files of `m` that hold rows of `leases`, and files
    /// written (not committed) with their other rows: what a
    /// [`Change::Settle`] removes and adds to void those leases' rows.
    pub async fn rewrite_without(
        &self,
        m: &Manifest,
        leases: &HashSet<&str>,
    ) -> Result<(Vec<String>, Vec<DataFile>)> {
        let (mut remove, mut add) = (Vec::new(), Vec::new());
        if leases.is_empty() {
            return Ok((remove, add));
        }
        for f in m
            .files
            .iter()
            .filter(|f| Table::STORED_AUDIT.contains(&f.table))
        {
            // The lease ids first: most files hold none of the leases.
            let bytes = self.store.get(&f.path).await?;
            let mut holds = false;
            for batch in parquet_io::column_reader(bytes.clone(), &["lease_id"])? {
                let batch = batch?;
                if let Some(ids) = batch.column_by_name("lease_id") {
                    holds |= ids
                        .as_string::<i32>()
                        .iter()
                        .any(|id| id.is_some_and(|id| leases.contains(id)));
                }
            }
            if !holds {
                continue;
            }
            let mut kept = Vec::new();
            let schema = parquet_io::schema_of(f.table);
            let all: Vec<&str> = schema.fields().iter().map(|c| c.name().as_str()).collect();
            for batch in parquet_io::column_reader(bytes, &all)? {
                let batch = batch?;
                let ids = batch
                    .column_by_name("lease_id")
                    .ok_or_else(|| LakeError::Delta(format!("{} lacks lease_id", f.path)))?
                    .as_string::<i32>();
                let keep: Vec<bool> = ids
                    .iter()
                    .map(|id| !id.is_some_and(|id| leases.contains(id)))
                    .collect();
                kept.push(parquet_io::filter_rows(&batch, &keep)?);
            }
            remove.push(f.path.clone());
            let rest = parquet_io::concat(f.table, &kept)?;
            match parquet_io::write_table(&self.store, f.table, &rest, f.level).await {
                Ok(files) => add.extend(files),
                Err(e) => {
                    self.discard(&add).await;
                    return Err(e);
                }
            }
        }
        Ok((remove, add))
    }

    /// The `lease_context` files of `m` rewritten without their superseded
    /// rows: the files a [`Change::Settle`] removes and the files written
    /// (not committed) with the rows kept. A reader takes a lease's context
    /// at its latest cut only (`query/src/stored.rs`) and every settle
    /// stores the context again at the new cut, so without this the table
    /// grows by the context of every lease at every settle. `cut_of` gives
    /// each lease's cut as the commit leaves it; a row stored at an older
    /// cut is dropped, and a row of a lease it does not know is kept.
    /// Streamed batch by batch: what is held is the rows kept.
    pub async fn drop_superseded_context(
        &self,
        m: &Manifest,
        cut_of: impl Fn(&str) -> Option<i64>,
    ) -> Result<(Vec<String>, Vec<DataFile>)> {
        let schema = parquet_io::schema_of(Table::LeaseContext);
        let all: Vec<&str> = schema.fields().iter().map(|c| c.name().as_str()).collect();
        let (mut remove, mut kept) = (Vec::new(), Vec::new());
        for f in m.files_of(Table::LeaseContext) {
            let bytes = self.store.get(&f.path).await?;
            for batch in parquet_io::column_reader(bytes, &all)? {
                let batch = batch?;
                let (ids, cut) = ids_and_cuts(&batch, &f.path)?;
                let keep: Vec<bool> = (0..batch.num_rows())
                    .map(|i| cut_of(ids.value(i)).is_none_or(|c| cut.value(i) >= c))
                    .collect();
                if keep.iter().any(|&k| k) {
                    kept.push(parquet_io::filter_rows(&batch, &keep)?);
                }
            }
            remove.push(f.path.clone());
        }
        let rows = parquet_io::concat(Table::LeaseContext, &kept)?;
        drop(kept);
        let add = self.write(Table::LeaseContext, &rows).await?;
        Ok((remove, add))
    }

    /// Merges small files of the same table and day into larger ones.
    /// Rows are neither added nor lost: the merged file replaces its inputs
    /// in a single commit, so a reader sees either the inputs or the output.
    ///
    /// A `lease_events` file holding a lease whose cut is not past the
    /// file's newest event is left as it is, for at most
    /// [`CompactionPolicy::unsettled_wait`] behind the newest event. A
    /// reader of the stored audit rows decodes, of a file with rows from
    /// their lease's cut on, every row, and of a file wholly before its
    /// leases' cuts only the dictionaries: merged at once, a few minutes of
    /// rows after the cuts would be spread over every page of a file of
    /// many minutes (a 7.7 M-row file took 3.7 s to count where small files
    /// of the same rows took 1.7 s). Waiting keeps them in the small files
    /// ingest wrote, each of a few seconds, until the cuts pass them. The
    /// wait is bounded because a lease held for hours keeps its cut before
    /// its grant, and its files would otherwise never be merged.
    pub async fn compact(&self, policy: &CompactionPolicy) -> Result<CompactionReport> {
        let mut report = CompactionReport::default();
        let base = self.latest().await?;
        let waiting = self.unsettled(&base, policy).await?;
        let mut groups: std::collections::BTreeMap<(Table, String), Vec<&DataFile>> =
            Default::default();
        for f in &base.files {
            if f.bytes >= policy.target_file_bytes / 2 || waiting.contains(&f.path) {
                continue;
            }
            let day = f.path.split('/').nth(1).unwrap_or_default().to_string();
            groups.entry((f.table, day)).or_default().push(f);
        }
        let mut base = base.clone();
        for ((table, _day), files) in groups {
            let mut chunk: Vec<&DataFile> = Vec::new();
            let mut chunk_bytes = 0;
            let mut chunks = Vec::new();
            for f in files {
                chunk_bytes += f.bytes;
                chunk.push(f);
                if chunk_bytes >= policy.target_file_bytes || chunk.len() >= policy.max_inputs {
                    chunks.push(std::mem::take(&mut chunk));
                    chunk_bytes = 0;
                }
            }
            chunks.push(chunk);
            for chunk in chunks.into_iter().filter(|c| c.len() >= 2) {
                let level = chunk.iter().map(|f| f.level).max().unwrap_or(0) + 1;
                let (added, rows) = self.merge(table, &chunk, level).await?;
                let change = Change::Compact {
                    remove: chunk.iter().map(|f| f.path.clone()).collect(),
                    add: added.clone(),
                };
                // Ingest keeps appending meanwhile: retry on top of its
                // commits; give up only if our inputs went away.
                let committed = loop {
                    match self.commit_tables(&base, &change).await.map_err(|(_, e)| e) {
                        Ok(m) => break Some(m),
                        Err(LakeError::Conflict { .. }) => {
                            base = self.latest().await?;
                            if change.apply(&base, Utc::now()).is_err() {
                                break None;
                            }
                        }
                        Err(e) => {
                            self.discard(&added).await;
                            return Err(e);
                        }
                    }
                };
                match committed {
                    Some(m) => {
                        report.merged_files += chunk.len();
                        report.written_files += added.len();
                        report.rows += rows;
                        base = m;
                    }
                    None => self.discard(&added).await,
                }
            }
        }
        if report.merged_files > 0 {
            info!(
                merged = report.merged_files,
                written = report.written_files,
                rows = report.rows,
                "compacted"
            );
        }
        Ok(report)
    }

    /// The small `lease_events` files of `m` that compaction leaves for a
    /// later pass ([`Lake::compact`]): newer than the wait, and holding a
    /// lease with a cut at or before their newest event. A lease without a
    /// cut holds nothing back: its rows are read whole either way.
    async fn unsettled(&self, m: &Manifest, policy: &CompactionPolicy) -> Result<HashSet<String>> {
        let mut waiting = HashSet::new();
        let wait = i64::try_from(policy.unsettled_wait.as_micros()).unwrap_or(i64::MAX);
        let Some(newest) = m.files_of(Table::LeaseEvents).map(|f| f.max_ts_us).max() else {
            return Ok(waiting);
        };
        let recent: Vec<&DataFile> = m
            .files_of(Table::LeaseEvents)
            .filter(|f| f.bytes < policy.target_file_bytes / 2)
            .filter(|f| f.max_ts_us > newest.saturating_sub(wait))
            .collect();
        let stored: Vec<&DataFile> = m
            .files
            .iter()
            .filter(|f| Table::STORED_AUDIT.contains(&f.table))
            .collect();
        if wait == 0 || recent.is_empty() || stored.is_empty() {
            return Ok(waiting);
        }
        let cuts = Arc::new(self.stored_cuts(&stored).await?);
        let Some(&oldest) = cuts.values().min() else {
            return Ok(waiting);
        };
        for f in recent {
            if f.max_ts_us < oldest {
                continue;
            }
            // Of a local file only the footer and dictionary pages are
            // read: a file may wait through many passes.
            let file = parquet_io::Source::of(&self.store, &f.path).await?;
            let (cuts, newest_here) = (cuts.clone(), f.max_ts_us);
            let held = tokio::task::spawn_blocking(move || {
                Ok::<_, LakeError>(
                    lease_ids(&file)?
                        .iter()
                        .any(|id| cuts.get(id).is_some_and(|&cut| cut <= newest_here)),
                )
            })
            .await
            .map_err(|e| LakeError::Io(std::io::Error::other(e)))??;
            if held {
                waiting.insert(f.path.clone());
            }
        }
        if !waiting.is_empty() {
            debug!(
                files = waiting.len(),
                "lease_events files left until their leases' cuts pass them"
            );
        }
        Ok(waiting)
    }

    /// Writes the rows of `chunk` (files of one table and day) as one
    /// sorted file, merged as the inputs are decoded ([`crate::merge`]).
    /// An input out of the table's order (none that leaseline writes) is
    /// merged by sorting the chunk whole instead. Returns the files written,
    /// not yet committed, and their rows.
    async fn merge(
        &self,
        table: Table,
        chunk: &[&DataFile],
        level: u32,
    ) -> Result<(Vec<DataFile>, u64)> {
        let mut inputs = Vec::with_capacity(chunk.len());
        for f in chunk {
            inputs.push(self.store.get(&f.path).await?);
        }
        let merged = tokio::task::spawn_blocking(move || merge::merge_sorted(table, inputs))
            .await
            .map_err(|e| LakeError::Io(std::io::Error::other(e)))?;
        match merged {
            Ok(m) => {
                let day = chunk[0]
                    .path
                    .split('/')
                    .nth(1)
                    .unwrap_or("date=out-of-range");
                let path = format!(
                    "{}/{day}/{}.parquet",
                    table.name(),
                    uuid::Uuid::new_v4().simple()
                );
                let bytes = m.bytes.len() as u64;
                self.store.put(&path, m.bytes).await?;
                let file = DataFile {
                    table,
                    path,
                    rows: m.rows,
                    bytes,
                    min_ts_us: m.min_ts_us,
                    max_ts_us: m.max_ts_us,
                    level,
                };
                Ok((vec![file], m.rows))
            }
            Err(Err(e)) => Err(e),
            Err(Ok(merge::Unsorted)) => {
                warn!(%table, files = chunk.len(), "an input of a merge is not sorted; sorting them whole");
                let mut batches = Vec::new();
                for f in chunk {
                    batches.extend(parquet_io::read_file(&self.store, &f.path).await?);
                }
                let all = parquet_io::concat(table, &batches)?;
                let rows = all.num_rows() as u64;
                Ok((
                    parquet_io::write_table(&self.store, table, &all, level).await?,
                    rows,
                ))
            }
        }
    }

    /// Removes the `date` partitions of `lease_events` and `lease_rejects`
    /// before `before` (a UTC day), rows and all, in one Delta commit per
    /// table; vacuum deletes their files once the retention has passed.
    /// Every answer derived from the events (the audit's tables, alerts
    /// rebuilt from history) loses the rows with them. Returns the files
    /// and rows removed.
    pub async fn expire(&self, before: chrono::NaiveDate) -> Result<(usize, u64)> {
        let before = before.format("%Y-%m-%d").to_string();
        for _ in 0..100 {
            let base = self.latest().await?;
            let old: Vec<&DataFile> = base
                .files
                .iter()
                .filter(|f| matches!(f.table, Table::LeaseEvents | Table::LeaseRejects))
                .filter(|f| f.date().is_some_and(|d| d < before.as_str()))
                .collect();
            if old.is_empty() {
                return Ok((0, 0));
            }
            let rows = old.iter().map(|f| f.rows).sum();
            let change = Change::Expire {
                remove: old.iter().map(|f| f.path.clone()).collect(),
            };
            match self.commit_tables(&base, &change).await {
                Ok(_) => {
                    info!(files = old.len(), rows, before = %before, "expired old partitions");
                    return Ok((old.len(), rows));
                }
                // Ingest or compaction committed meanwhile: decide again.
                Err((_, LakeError::Conflict { .. })) => continue,
                Err((_, e)) => return Err(e),
            }
        }
        Err(LakeError::Conflict {
            version: 0,
            reason: "expiry kept conflicting with other writers".into(),
        })
    }

    /// Deletes, in every table, the files compaction removed more than
    /// `retention` ago and the data files no version names that are older
    /// than that (left by a writer that died between writing and
    /// committing): Delta's vacuum, in full mode. A reader that started
    /// before a compaction reads the replaced files for at most
    /// `retention`.
    pub async fn vacuum(&self, retention: Duration) -> Result<usize> {
        let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let mut deleted = 0;
        for table in Table::ALL {
            let mut t = delta::handle(&self.store, table)?;
            if !delta::load(&mut t, &self.store, table).await? {
                continue;
            }
            let (_, metrics) = t
                .vacuum()
                .with_retention_period(retention)
                .with_enforce_retention_duration(false)
                .with_mode(deltalake::operations::vacuum::VacuumMode::Full)
                .await?;
            deleted += metrics.files_deleted.len();
        }
        if deleted > 0 {
            info!(deleted, "vacuumed");
        }
        Ok(deleted)
    }
}

/// The distinct lease ids of a `lease_events` file: from its dictionary
/// pages when those hold every value, else from its rows.
fn lease_ids(file: &parquet_io::Source) -> Result<HashSet<String>> {
    let meta = file.footer()?;
    if let Some(groups) = file.dictionary_values(&meta, "lease_id")? {
        return Ok(groups.into_iter().flatten().collect());
    }
    let mut ids = HashSet::new();
    for batch in file.dictionary_reader(&meta, &["lease_id"], &["lease_id"])? {
        let batch = batch?;
        let column = batch.column(0);
        // Another writer's file may hold plain strings; of another type
        // nothing is known, and the file does not wait.
        let names = match column.as_dictionary_opt::<arrow::datatypes::Int32Type>() {
            Some(d) => d.values().as_string_opt::<i32>().cloned(),
            None => column.as_string_opt::<i32>().cloned(),
        };
        let Some(names) = names else { continue };
        ids.extend(names.iter().flatten().map(str::to_string));
    }
    Ok(ids)
}

/// The largest cut of each lease in one stored audit file. A file's rows
/// are sorted by lease: read as a dictionary, each batch's lease ids are
/// looked up once each rather than once a row.
fn cuts_of(bytes: bytes::Bytes, path: &str) -> Result<Vec<(String, i64)>> {
    let columns = ["lease_id", leaseline_schema::SETTLED_BEFORE];
    let mut found = Vec::new();
    for batch in parquet_io::dictionary_reader(bytes, &columns, &columns[..1])? {
        let batch = batch?;
        let (Some(ids), Some(cut)) = (
            batch
                .column_by_name("lease_id")
                .and_then(|c| c.as_dictionary_opt::<arrow::datatypes::Int32Type>()),
            batch.column_by_name(leaseline_schema::SETTLED_BEFORE),
        ) else {
            return Err(lacks_cut_columns(path));
        };
        let cut = cut.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let names = ids.values().as_string::<i32>();
        let mut largest = vec![i64::MIN; arrow::array::Array::len(names)];
        for (key, at) in ids.keys().iter().zip(cut.values().iter()) {
            if let Some(key) = key {
                let l = &mut largest[key as usize];
                *l = (*l).max(*at);
            }
        }
        for (k, at) in largest.into_iter().enumerate() {
            if at != i64::MIN {
                found.push((names.value(k).to_string(), at));
            }
        }
    }
    Ok(found)
}

/// The lease ids and cuts (`settled_before`) of a batch of a stored
/// audit table read from `path`.
fn ids_and_cuts<'a>(
    batch: &'a RecordBatch,
    path: &str,
) -> Result<(
    &'a arrow::array::StringArray,
    &'a arrow::array::TimestampMicrosecondArray,
)> {
    let (Some(ids), Some(cut)) = (
        batch.column_by_name("lease_id"),
        batch.column_by_name(leaseline_schema::SETTLED_BEFORE),
    ) else {
        return Err(lacks_cut_columns(path));
    };
    Ok((
        ids.as_string::<i32>(),
        cut.as_primitive::<arrow::datatypes::TimestampMicrosecondType>(),
    ))
}

fn lacks_cut_columns(path: &str) -> LakeError {
    LakeError::Delta(format!(
        "{path} lacks lease_id or {}",
        leaseline_schema::SETTLED_BEFORE
    ))
}
