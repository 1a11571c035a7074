//! The manifest: the one record of which data files make up the lake and
//! how far each Kafka partition has been consumed.
//!
//! Each commit writes a complete snapshot as `_manifest/<version>.json` with
//! a create-only put. Object stores make that atomic and exclusive, so two
//! writers can never both create version N+1: the loser gets a conflict,
//! reloads and tries again. Data files are written before the manifest that
//! names them, so a reader who loads a manifest sees every file of a commit
//! or none of them.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{LakeError, Result};

/// The lake's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    LeaseEvents,
    LeaseRejects,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::LeaseEvents, Table::LeaseRejects];

    pub fn name(self) -> &'static str {
        match self {
            Table::LeaseEvents => "lease_events",
            Table::LeaseRejects => "lease_rejects",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One Parquet file of a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataFile {
    pub table: Table,
    /// Path relative to the lake root, e.g.
    /// `lease_events/date=2026-09-14/0193...parquet`.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    /// Smallest and largest partitioning timestamp in the file
    /// (event `ts` for events, `ingested_at` for rejects), microseconds.
    pub min_ts_us: i64,
    pub max_ts_us: i64,
    /// How many compactions the rows went through (0 = written by ingest).
    #[serde(default)]
    pub level: u32,
}

/// A file no longer in the lake, kept on storage until readers that may
/// still be scanning it are done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemovedFile {
    pub path: String,
    pub removed_at: DateTime<Utc>,
}

/// A snapshot of the lake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u64,
    pub schema_version: u32,
    pub committed_at: DateTime<Utc>,
    /// What produced this version (`append`, `compact`, `vacuum`).
    pub operation: String,
    pub files: Vec<DataFile>,
    /// Topic → partition → next offset to consume. The lake, not the
    /// consumer group, decides where ingestion resumes.
    pub kafka: BTreeMap<String, BTreeMap<i32, i64>>,
    pub removed: Vec<RemovedFile>,
}

impl Manifest {
    /// The state before the first commit.
    pub fn empty() -> Self {
        Manifest {
            version: 0,
            schema_version: leaseline_schema::SCHEMA_VERSION,
            committed_at: DateTime::<Utc>::UNIX_EPOCH,
            operation: "create".into(),
            files: Vec::new(),
            kafka: BTreeMap::new(),
            removed: Vec::new(),
        }
    }

    pub fn files_of(&self, table: Table) -> impl Iterator<Item = &DataFile> {
        self.files.iter().filter(move |f| f.table == table)
    }

    pub fn rows_of(&self, table: Table) -> u64 {
        self.files_of(table).map(|f| f.rows).sum()
    }

    pub fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.kafka.get(topic)?.get(&partition).copied()
    }

    pub(crate) fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest always serializes")
    }

    pub(crate) fn from_json(path: &str, bytes: &[u8]) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|source| LakeError::Manifest {
            path: path.to_string(),
            source,
        })?;
        if m.schema_version > leaseline_schema::SCHEMA_VERSION {
            return Err(LakeError::SchemaVersion {
                found: m.schema_version,
                supported: leaseline_schema::SCHEMA_VERSION,
            });
        }
        Ok(m)
    }
}

/// Consumption of one Kafka partition covered by an append: offsets
/// `start..end` (end is the next offset to consume).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRange {
    pub topic: String,
    pub partition: i32,
    pub start: i64,
    pub end: i64,
}

/// What a commit changes.
#[derive(Debug, Clone)]
pub enum Change {
    /// New files from ingest, and the Kafka ranges they cover.
    Append {
        files: Vec<DataFile>,
        kafka: Vec<KafkaRange>,
    },
    /// Files merged into larger ones; the rows stay the same.
    Compact {
        remove: Vec<String>,
        add: Vec<DataFile>,
    },
    /// Removed files deleted from storage for good.
    Vacuum { purged: Vec<String> },
}

impl Change {
    fn operation(&self) -> &'static str {
        match self {
            Change::Append { .. } => "append",
            Change::Compact { .. } => "compact",
            Change::Vacuum { .. } => "vacuum",
        }
    }

    /// Checks that this change still makes sense on `base`, and builds the
    /// next version from it.
    pub fn apply(&self, base: &Manifest, now: DateTime<Utc>) -> Result<Manifest> {
        let mut next = base.clone();
        next.version = base.version + 1;
        next.schema_version = leaseline_schema::SCHEMA_VERSION;
        next.committed_at = now;
        next.operation = self.operation().to_string();
        let conflict = |reason: String| LakeError::Conflict {
            version: base.version,
            reason,
        };
        match self {
            Change::Append { files, kafka } => {
                for r in kafka {
                    if let Some(done) = base.next_offset(&r.topic, r.partition) {
                        if done > r.start {
                            return Err(conflict(format!(
                                "{}/{} offsets {}..{} overlap what the lake already holds (up to {})",
                                r.topic, r.partition, r.start, r.end, done
                            )));
                        }
                    }
                }
                for r in kafka {
                    next.kafka
                        .entry(r.topic.clone())
                        .or_default()
                        .insert(r.partition, r.end);
                }
                next.files.extend(files.iter().cloned());
            }
            Change::Compact { remove, add } => {
                for p in remove {
                    if !base.files.iter().any(|f| &f.path == p) {
                        return Err(conflict(format!("{p} is no longer in the lake")));
                    }
                }
                next.files.retain(|f| !remove.contains(&f.path));
                next.files.extend(add.iter().cloned());
                next.removed.extend(remove.iter().map(|p| RemovedFile {
                    path: p.clone(),
                    removed_at: now,
                }));
            }
            Change::Vacuum { purged } => {
                next.removed.retain(|r| !purged.contains(&r.path));
            }
        }
        Ok(next)
    }
}

pub(crate) const MANIFEST_DIR: &str = "_manifest";

pub(crate) fn manifest_path(version: u64) -> String {
    format!("{MANIFEST_DIR}/{version:020}.json")
}

pub(crate) fn parse_manifest_version(name: &str) -> Option<u64> {
    name.strip_suffix(".json")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> DataFile {
        DataFile {
            table: Table::LeaseEvents,
            path: path.into(),
            rows: 1,
            bytes: 1,
            min_ts_us: 0,
            max_ts_us: 0,
            level: 0,
        }
    }

    #[test]
    fn append_advances_offsets_and_refuses_overlap() {
        let m0 = Manifest::empty();
        let a = Change::Append {
            files: vec![file("a")],
            kafka: vec![KafkaRange {
                topic: "t".into(),
                partition: 0,
                start: 0,
                end: 10,
            }],
        };
        let m1 = a.apply(&m0, Utc::now()).unwrap();
        assert_eq!(m1.version, 1);
        assert_eq!(m1.next_offset("t", 0), Some(10));
        // Replaying the same range on top of itself is a conflict: a zombie
        // writer that lost its partitions can never add the rows twice.
        assert!(matches!(
            a.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        let b = Change::Append {
            files: vec![file("b")],
            kafka: vec![KafkaRange {
                topic: "t".into(),
                partition: 0,
                start: 12,
                end: 20,
            }],
        };
        let m2 = b.apply(&m1, Utc::now()).unwrap();
        assert_eq!(m2.next_offset("t", 0), Some(20));
        assert_eq!(m2.files.len(), 2);
    }

    #[test]
    fn compact_requires_its_inputs() {
        let mut m = Manifest::empty();
        m.files = vec![file("a"), file("b")];
        let c = Change::Compact {
            remove: vec!["a".into(), "b".into()],
            add: vec![file("c")],
        };
        let m1 = c.apply(&m, Utc::now()).unwrap();
        assert_eq!(m1.files, vec![file("c")]);
        assert_eq!(m1.removed.len(), 2);
        assert!(matches!(
            c.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        let v = Change::Vacuum {
            purged: vec!["a".into()],
        };
        let m2 = v.apply(&m1, Utc::now()).unwrap();
        assert_eq!(m2.removed.len(), 1);
    }

    #[test]
    fn version_paths_sort_and_parse() {
        assert_eq!(manifest_path(42), "_manifest/00000000000000000042.json");
        assert_eq!(
            parse_manifest_version("00000000000000000042.json"),
            Some(42)
        );
        assert_eq!(parse_manifest_version("x.tmp"), None);
    }
}
