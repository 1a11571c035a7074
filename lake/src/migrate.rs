//! Converting a lake in the format before Delta tables into Delta tables,
//! in place.
//!
//! That format kept one JSON snapshot per commit under `_manifest/`, naming
//! the Parquet files of `lease_events` and `lease_rejects` and the Kafka
//! offsets consumed; `lease_alerts` was a folder of Parquet files outside
//! it. The newest snapshot is the source of truth until the migration is
//! done:
//!
//! 1. Every file the snapshot names (and every `lease_alerts` file) is
//!    read and written again in the tables' stored form, and each table
//!    gets one Delta commit of all its files, `lease_events` with a `txn`
//!    per partition at the snapshot's offsets (for the consumer group
//!    given), so ingestion resumes exactly where it stopped.
//! 2. Row counts are compared with the snapshot's: any difference stops
//!    the migration before anything old is touched.
//! 3. `_manifest/` is renamed `_manifest.migrated/`, then the old files are
//!    deleted, then `_manifest.migrated/`.
//!
//! A migration that died before step 3 is started over: the Delta logs and
//! files it wrote are deleted first. One that died during step 3 resumes
//! there.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;
use tracing::info;

use crate::error::{LakeError, Result};
use crate::lake::Lake;
use crate::manifest::{Change, DataFile, KafkaRange, Table};
use crate::parquet_io;
use crate::store::LakeStore;

const OLD_DIR: &str = "_manifest";
const DONE_DIR: &str = "_manifest.migrated";

#[derive(Debug, Deserialize)]
struct OldFile {
    table: String,
    path: String,
    rows: u64,
}

#[derive(Debug, Deserialize)]
struct OldManifest {
    version: u64,
    files: Vec<OldFile>,
    #[serde(default)]
    kafka: BTreeMap<String, BTreeMap<i32, i64>>,
    #[serde(default)]
    removed: Vec<OldRemoved>,
}

#[derive(Debug, Deserialize)]
struct OldRemoved {
    path: String,
}

/// What a migration did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The old format's newest version.
    pub from_version: u64,
    pub events: u64,
    pub rejects: u64,
    pub alerts: u64,
    pub files_written: usize,
    pub files_deleted: usize,
}

async fn newest(store: &LakeStore, dir: &str) -> Result<Option<(String, OldManifest)>> {
    let mut names: Vec<String> = store
        .list(dir)
        .await?
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.ends_with(".json"))
        .collect();
    names.sort();
    let Some(rel) = names.pop() else {
        return Ok(None);
    };
    let bytes = store.get(&rel).await?;
    let m: OldManifest = serde_json::from_slice(&bytes)
        .map_err(|e| LakeError::Delta(format!("{rel} is not a manifest of the old format: {e}")))?;
    Ok(Some((rel, m)))
}

fn table_of(name: &str) -> Option<Table> {
    Table::QUERIED.into_iter().find(|t| t.name() == name)
}

/// Converts the lake at `location` in place. `group` is the consumer group
/// whose positions the old offsets become. A lake already in Delta form is
/// an error, and so is a location with no lake.
pub async fn migrate(location: &str, group: &str) -> Result<MigrationReport> {
    let store = LakeStore::open_existing(location)?;
    if let Some((_, old)) = newest(&store, DONE_DIR).await? {
        let deleted = finish(&store, &old).await?;
        return Ok(MigrationReport {
            from_version: old.version,
            files_deleted: deleted,
            ..Default::default()
        });
    }
    let Some((_, old)) = newest(&store, OLD_DIR).await? else {
        let lake = Lake::open_existing(location).await;
        return Err(match lake {
            Ok(_) => LakeError::Delta(format!("{location} is already a lake of Delta tables")),
            Err(e) => e,
        });
    };
    // Start over from whatever a migration that died left.
    let named: HashSet<&str> = old
        .files
        .iter()
        .map(|f| f.path.as_str())
        .chain(old.removed.iter().map(|r| r.path.as_str()))
        .collect();
    let old_alerts: Vec<String> = store
        .list(Table::LeaseAlerts.name())
        .await?
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.ends_with(".parquet") && !p.contains("/_delta_log/"))
        .collect();
    for table in Table::QUERIED {
        for (p, _, _) in store.list(table.name()).await? {
            let ours = p.contains("/_delta_log/")
                || (table != Table::LeaseAlerts && !named.contains(p.as_str()));
            if ours {
                store.delete(&p).await?;
            }
        }
    }
    // Alerts of the old format carry no marker of their own: after the
    // cleanup above, every alert file is one.
    let lake = Lake::open(location)?;
    lake.track_partitions(group, []);
    let mut report = MigrationReport {
        from_version: old.version,
        ..Default::default()
    };
    let mut expected: BTreeMap<Table, u64> = BTreeMap::new();
    let mut by_table: BTreeMap<Table, Vec<String>> = BTreeMap::new();
    for f in &old.files {
        let table = table_of(&f.table).ok_or_else(|| {
            LakeError::Delta(format!(
                "the old manifest names an unknown table {}",
                f.table
            ))
        })?;
        *expected.entry(table).or_default() += f.rows;
        by_table.entry(table).or_default().push(f.path.clone());
    }
    by_table.insert(Table::LeaseAlerts, old_alerts.clone());
    for (table, paths) in &by_table {
        let mut written: Vec<DataFile> = Vec::new();
        let mut rows = 0u64;
        for p in paths {
            let batches = parquet_io::read_file(&store, p).await?;
            let batch = parquet_io::concat(*table, &conform(*table, batches)?)?;
            rows += batch.num_rows() as u64;
            written.extend(lake.write(*table, &batch).await?);
        }
        if *table != Table::LeaseAlerts {
            let want = expected.get(table).copied().unwrap_or(0);
            if rows != want {
                lake.discard(&written).await;
                return Err(LakeError::Delta(format!(
                    "{table}: the old manifest counts {want} rows, its files hold {rows}; nothing was changed"
                )));
            }
        } else {
            *expected.entry(*table).or_default() = rows;
        }
        let kafka: Vec<KafkaRange> = match table {
            // Offsets become positions of both tables: every reject below
            // them is in the lake too.
            Table::LeaseEvents | Table::LeaseRejects => old
                .kafka
                .iter()
                .flat_map(|(topic, parts)| {
                    parts.iter().map(move |(p, next)| KafkaRange {
                        topic: topic.clone(),
                        partition: *p,
                        start: 0,
                        end: *next,
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let base = lake.latest().await?;
        let change = match table {
            Table::LeaseRejects => Change::Append {
                files: written.clone(),
                kafka: Vec::new(),
                reject_kafka: kafka,
            },
            _ => Change::Append {
                files: written.clone(),
                kafka,
                reject_kafka: Vec::new(),
            },
        };
        lake.commit(&base, &change).await?;
        report.files_written += written.len();
        match table {
            Table::LeaseEvents => report.events = rows,
            Table::LeaseRejects => report.rejects = rows,
            Table::LeaseAlerts => report.alerts = rows,
            _ => {}
        }
    }
    let m = lake.latest().await?;
    for table in Table::QUERIED {
        let (want, got) = (expected.get(&table).copied().unwrap_or(0), m.rows_of(table));
        if want != got {
            return Err(LakeError::Delta(format!(
                "{table}: {want} rows in the old format, {got} in the Delta table; the old format is kept"
            )));
        }
    }
    // The point of no return: from here on a rerun finishes, not restarts.
    for (p, _, _) in store.list(OLD_DIR).await? {
        let name = p.rsplit('/').next().unwrap_or(&p).to_string();
        let bytes = store.get(&p).await?;
        store
            .put(&format!("{DONE_DIR}/{name}"), bytes.to_vec())
            .await?;
    }
    for (p, _, _) in store.list(OLD_DIR).await? {
        store.delete(&p).await?;
    }
    let mut old = old;
    old.files.extend(old_alerts.into_iter().map(|path| OldFile {
        table: Table::LeaseAlerts.name().into(),
        path,
        rows: 0,
    }));
    // Keep the alert files named for a resumed finish.
    report.files_deleted = finish(&store, &old).await?;
    info!(?report, "migrated to Delta tables");
    Ok(report)
}

/// Deletes the old format's files and, last, its manifests.
async fn finish(store: &LakeStore, old: &OldManifest) -> Result<usize> {
    let mut deleted = 0;
    for p in old
        .files
        .iter()
        .map(|f| f.path.as_str())
        .chain(old.removed.iter().map(|r| r.path.as_str()))
    {
        store.delete(p).await?;
        deleted += 1;
    }
    for (p, _, _) in store.list(DONE_DIR).await? {
        store.delete(&p).await?;
    }
    // A directory holds no object, but would still look like the old
    // format to a person or a tool.
    if let Some(root) = store.local_root() {
        for dir in [OLD_DIR, DONE_DIR] {
            let _ = std::fs::remove_dir(root.join(dir));
        }
    }
    Ok(deleted)
}

/// Old files' batches in the table's Arrow schema (field metadata and
/// nullability as the schema says).
fn conform(
    table: Table,
    batches: Vec<arrow::array::RecordBatch>,
) -> Result<Vec<arrow::array::RecordBatch>> {
    let schema = parquet_io::schema_of(table);
    batches
        .into_iter()
        .map(|b| {
            let cols = schema
                .fields()
                .iter()
                .map(|f| {
                    let c = b.column_by_name(f.name()).ok_or_else(|| {
                        LakeError::Delta(format!("an old {table} file has no column {}", f.name()))
                    })?;
                    Ok(if c.data_type() == f.data_type() {
                        c.clone()
                    } else {
                        arrow::compute::cast(c, f.data_type())?
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(arrow::array::RecordBatch::try_new(schema.clone(), cols)?)
        })
        .collect()
}
