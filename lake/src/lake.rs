//! The lake handle: manifests, commits, compaction and vacuum.

use std::collections::HashSet;
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use chrono::Utc;
use tracing::{debug, info, warn};

use crate::dedup::EventIdSet;
use crate::error::{LakeError, Result};
use crate::manifest::{
    manifest_path, parse_manifest_version, Change, DataFile, Manifest, Table, MANIFEST_DIR,
};
use crate::parquet_io;
use crate::store::LakeStore;

/// How many manifest versions to keep on storage. Readers only ever load
/// the newest; older ones are history for debugging.
const KEEP_MANIFESTS: usize = 50;

/// Compaction settings.
#[derive(Debug, Clone)]
pub struct CompactionPolicy {
    /// Files at least this large are left alone; smaller ones are merged
    /// into files of about this size.
    pub target_file_bytes: u64,
    /// At most this many input files per merge, to bound memory.
    pub max_inputs: usize,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            target_file_bytes: 128 * 1024 * 1024,
            max_inputs: 64,
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

/// A lake: its store and the protocol to change it.
#[derive(Debug, Clone)]
pub struct Lake {
    store: LakeStore,
}

impl Lake {
    pub fn open(location: &str) -> Result<Self> {
        Ok(Lake {
            store: LakeStore::open(location)?,
        })
    }

    /// Opens a lake that must already exist: at least one committed
    /// manifest. Only writers create lakes; a reader that created one would
    /// answer a mistyped path with an empty, clean-looking history.
    pub async fn open_existing(location: &str) -> Result<Self> {
        let lake = Lake {
            store: LakeStore::open_existing(location)?,
        };
        // A lake that only `check` wrote alerts to has no manifest yet.
        if lake.manifest_versions().await?.is_empty()
            && lake.store.list("lease_alerts").await?.is_empty()
        {
            return Err(LakeError::NotFound {
                location: location.to_string(),
                reason: format!("nothing has been committed there (no {MANIFEST_DIR}/ manifests)"),
            });
        }
        Ok(lake)
    }

    pub fn store(&self) -> &LakeStore {
        &self.store
    }

    /// The newest manifest, or [`Manifest::empty`] for a new lake.
    pub async fn latest(&self) -> Result<Manifest> {
        let mut versions = self.manifest_versions().await?;
        // The newest may have been pruned between list and get by another
        // writer; older ones are fine to fall back on only if so.
        while let Some(v) = versions.pop() {
            let rel = manifest_path(v);
            match self.store.get(&rel).await {
                Ok(bytes) => return Manifest::from_json(&rel, &bytes),
                Err(LakeError::Store(object_store::Error::NotFound { .. })) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Manifest::empty())
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

    /// One version's manifest, or `None` if it was pruned.
    pub async fn manifest_at(&self, version: u64) -> Result<Option<Manifest>> {
        if version == 0 {
            return Ok(Some(Manifest::empty()));
        }
        let rel = manifest_path(version);
        match self.store.get(&rel).await {
            Ok(bytes) => Ok(Some(Manifest::from_json(&rel, &bytes)?)),
            Err(LakeError::Store(object_store::Error::NotFound { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn manifest_versions(&self) -> Result<Vec<u64>> {
        let mut v: Vec<u64> = self
            .store
            .list(MANIFEST_DIR)
            .await?
            .into_iter()
            .filter_map(|(p, _, _)| parse_manifest_version(p.rsplit('/').next()?))
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// Commits `change` on top of `base`. Fails with [`LakeError::Conflict`]
    /// if another writer committed first, or if the change no longer fits
    /// the base; the caller reloads and decides again.
    pub async fn commit(&self, base: &Manifest, change: &Change) -> Result<Manifest> {
        let next = change.apply(base, Utc::now())?;
        let rel = manifest_path(next.version);
        if !self.store.put_new(&rel, next.to_json()).await? {
            return Err(LakeError::Conflict {
                version: base.version,
                reason: format!("version {} was committed by another writer", next.version),
            });
        }
        debug!(version = next.version, op = %next.operation, "committed manifest");
        if next.version.is_multiple_of(10) {
            self.prune_manifests().await;
        }
        Ok(next)
    }

    async fn prune_manifests(&self) {
        let Ok(versions) = self.manifest_versions().await else {
            return;
        };
        if versions.len() > KEEP_MANIFESTS {
            for v in &versions[..versions.len() - KEEP_MANIFESTS] {
                if let Err(e) = self.store.delete(&manifest_path(*v)).await {
                    warn!(version = v, error = %e, "could not prune old manifest");
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

    /// Adds the `event_id`s of the given event files to `ids`.
    pub async fn load_event_ids(&self, files: &[&DataFile], ids: &mut EventIdSet) -> Result<()> {
        for f in files.iter().filter(|f| f.table == Table::LeaseEvents) {
            for b in parquet_io::read_columns(&self.store, &f.path, &["event_id"]).await? {
                let col = b.column(0).as_string::<i32>();
                for id in col.iter().flatten() {
                    if !id.is_empty() {
                        ids.insert(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds the [`line_key`](crate::dedup::line_key) of every reject in
    /// `files` that came from a file, so that importing the file again
    /// keeps each of them once.
    pub async fn load_reject_lines(
        &self,
        files: &[&DataFile],
        keys: &mut HashSet<u128>,
    ) -> Result<()> {
        for f in files.iter().filter(|f| f.table == Table::LeaseRejects) {
            let columns = ["file_path", "file_line"];
            for b in parquet_io::read_columns(&self.store, &f.path, &columns).await? {
                let paths = b.column(0).as_string::<i32>();
                let lines = b.column(1).as_primitive::<arrow::datatypes::Int64Type>();
                for (p, l) in paths.iter().zip(lines.iter()) {
                    if let (Some(p), Some(l)) = (p, l) {
                        keys.insert(crate::dedup::line_key(p, l as u64));
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads every row of a table at a manifest version.
    pub async fn read_table(&self, m: &Manifest, table: Table) -> Result<RecordBatch> {
        let mut batches = Vec::new();
        for f in m.files_of(table) {
            batches.extend(parquet_io::read_file(&self.store, &f.path).await?);
        }
        parquet_io::concat(table, &batches)
    }

    /// Merges small files of the same table and day into larger ones.
    /// Rows are neither added nor lost: the merged file replaces its inputs
    /// in a single commit, so a reader sees either the inputs or the output.
    pub async fn compact(&self, policy: &CompactionPolicy) -> Result<CompactionReport> {
        let mut report = CompactionReport::default();
        let base = self.latest().await?;
        let mut groups: std::collections::BTreeMap<(Table, String), Vec<&DataFile>> =
            Default::default();
        for f in &base.files {
            if f.bytes >= policy.target_file_bytes / 2 {
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
                let mut batches = Vec::new();
                for f in &chunk {
                    batches.extend(parquet_io::read_file(&self.store, &f.path).await?);
                }
                let merged = parquet_io::concat(table, &batches)?;
                let level = chunk.iter().map(|f| f.level).max().unwrap_or(0) + 1;
                let added = parquet_io::write_table(&self.store, table, &merged, level).await?;
                let change = Change::Compact {
                    remove: chunk.iter().map(|f| f.path.clone()).collect(),
                    add: added.clone(),
                };
                // Ingest keeps appending meanwhile: retry on top of its
                // commits; give up only if our inputs went away.
                let committed = loop {
                    match self.commit(&base, &change).await {
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
                        report.rows += merged.num_rows() as u64;
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

    /// Deletes files removed by compaction more than `retention` ago, and
    /// data files older than `retention` that no manifest names (left by a
    /// writer that crashed between writing and committing).
    pub async fn vacuum(&self, retention: Duration) -> Result<usize> {
        let cutoff = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
        let mut base = self.latest().await?;
        let purged: Vec<String> = base
            .removed
            .iter()
            .filter(|r| r.removed_at < cutoff)
            .map(|r| r.path.clone())
            .collect();
        for p in &purged {
            self.store.delete(p).await?;
        }
        let mut deleted = purged.len();
        if !purged.is_empty() {
            let change = Change::Vacuum { purged };
            loop {
                match self.commit(&base, &change).await {
                    Ok(_) => break,
                    Err(LakeError::Conflict { .. }) => base = self.latest().await?,
                    Err(e) => return Err(e),
                }
            }
        }
        let known: HashSet<&str> = base
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(base.removed.iter().map(|r| r.path.as_str()))
            .collect();
        for table in Table::ALL {
            for (path, _, modified) in self.store.list(table.name()).await? {
                if modified < cutoff && !known.contains(path.as_str()) {
                    self.store.delete(&path).await?;
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}
