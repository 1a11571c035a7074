//! The manifest: leaseline's view of the lake at one moment, which data
//! files make up each table and how far each Kafka partition has been
//! consumed, built from the tables' Delta logs (see [`crate::delta`]).
//!
//! Each table (`lease_events`, `lease_rejects`, `lease_alerts`) is its own
//! Delta table, so a commit changes one table at a time. A [`Change`] is
//! checked against the manifest it was decided on by [`Change::apply`], a
//! pure function, and then committed table by table, each on exactly the
//! Delta version the manifest holds: a writer that raced another gets a
//! conflict, reloads and decides again.
//!
//! Exactly once from Kafka rests on Delta's `txn` actions, one per
//! topic-partition, whose version is the next offset to consume:
//!
//! - An append commits `lease_rejects` first, then `lease_events`; each
//!   commit carries the `txn` of the partitions whose rows it adds, in the
//!   same commit as the rows.
//! - Consumption resumes at `lease_events`' versions ([`Manifest::kafka`]).
//!   A writer that died between the two commits left `lease_rejects` ahead
//!   ([`Manifest::reject_kafka`]); the messages in between are read again
//!   and only their events are kept, since their rejects are committed.
//! - A range that starts below what a table's `txn` already covers is
//!   refused: a zombie writer can never add rows twice.
//!
//! The stored audit tables (`lease_timeline`, `lease_violations`) take
//! [`Change::Settle`]: the rows an auditor let go of, and files rewritten
//! without the rows of leases it audited again. Which rows are stored is
//! told by the rows themselves (each carries its lease's cut), and a
//! writer decides what to add on exactly the versions it commits on, so a
//! conflict makes it read the rows committed since and decide again.
//! `lease_timeline`'s `txn` per partition ([`Manifest::stored_kafka`]) is
//! how far the writer's audit had been given that partition: the stored
//! rows answer for every event below it, and a writer whose audit is
//! behind it is refused, as a zombie ingester is.
//!
//! Files leave a table two ways. Compaction removes files and adds the
//! merged one in one commit (the rows stay). Expiry removes whole `date`
//! partitions past the retention, rows and all. Both need every file they
//! remove to still be there: two compactors, or a compactor and an expiry,
//! never both remove one file.

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
    LeaseAlerts,
    /// The audit's settled grants (see `alerts/src/stored.rs`).
    LeaseTimeline,
    /// The audit's settled violations.
    LeaseViolations,
    /// The events the settled leases' later rows are judged against.
    LeaseContext,
}

impl Table {
    pub const ALL: [Table; 6] = [
        Table::LeaseEvents,
        Table::LeaseRejects,
        Table::LeaseAlerts,
        Table::LeaseTimeline,
        Table::LeaseViolations,
        Table::LeaseContext,
    ];

    /// The tables SQL reads as they are stored. The stored audit tables
    /// are only part of what SQL answers as `lease_timeline` and
    /// `lease_violations` (their rows not settled yet are in memory).
    pub const QUERIED: [Table; 3] = [Table::LeaseEvents, Table::LeaseRejects, Table::LeaseAlerts];

    /// The tables of settled audit rows.
    pub const STORED_AUDIT: [Table; 3] = [
        Table::LeaseTimeline,
        Table::LeaseViolations,
        Table::LeaseContext,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::LeaseEvents => "lease_events",
            Table::LeaseRejects => "lease_rejects",
            Table::LeaseAlerts => "lease_alerts",
            Table::LeaseTimeline => "lease_timeline",
            Table::LeaseViolations => "lease_violations",
            Table::LeaseContext => "lease_context",
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
    /// (event `ts` for events, `ingested_at` for rejects, `recorded_at` for
    /// alerts), microseconds.
    pub min_ts_us: i64,
    pub max_ts_us: i64,
    /// How many compactions the rows went through (0 = written by ingest).
    #[serde(default)]
    pub level: u32,
}

impl DataFile {
    /// The file's path inside its table's directory, as the Delta log
    /// names it (`date=2026-09-14/0193...parquet`).
    pub fn table_path(&self) -> &str {
        self.path
            .strip_prefix(self.table.name())
            .map(|p| p.trim_start_matches('/'))
            .unwrap_or(&self.path)
    }

    /// The `date` partition value (`2026-09-14`) of the file.
    pub fn date(&self) -> Option<&str> {
        self.table_path().split('/').next()?.strip_prefix("date=")
    }
}

/// Topic → partition → next offset to consume.
pub type Offsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// A snapshot of the lake.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Grows with every commit to any table: the sum over the tables of
    /// their Delta version + 1 (0 before any table exists). Only for
    /// ordering snapshots; a table is read at its own [`Manifest::tables`]
    /// version.
    pub version: u64,
    /// The Delta version of each table that exists.
    pub tables: BTreeMap<Table, u64>,
    pub schema_version: u32,
    pub committed_at: DateTime<Utc>,
    pub files: Vec<DataFile>,
    /// `lease_events`' `txn` versions for the partitions asked about (see
    /// [`crate::Lake::track_partitions`]): where ingestion resumes. The
    /// lake, not the consumer group, decides that.
    pub kafka: Offsets,
    /// `lease_rejects`' `txn` versions: rejects of offsets below them are
    /// already committed.
    pub reject_kafka: Offsets,
    /// The stored `lease_timeline`'s `txn` versions: the stored audit
    /// rows of a partition's leases answer for its events below them.
    pub stored_kafka: Offsets,
}

impl Manifest {
    /// The state before the first commit.
    pub fn empty() -> Self {
        Manifest {
            version: 0,
            tables: BTreeMap::new(),
            schema_version: leaseline_schema::SCHEMA_VERSION,
            committed_at: DateTime::<Utc>::UNIX_EPOCH,
            files: Vec::new(),
            kafka: BTreeMap::new(),
            reject_kafka: BTreeMap::new(),
            stored_kafka: BTreeMap::new(),
        }
    }

    pub fn files_of(&self, table: Table) -> impl Iterator<Item = &DataFile> {
        self.files.iter().filter(move |f| f.table == table)
    }

    pub fn rows_of(&self, table: Table) -> u64 {
        self.files_of(table).map(|f| f.rows).sum()
    }

    /// Where consumption of a partition resumes: the next offset
    /// `lease_events` has not covered.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.kafka.get(topic)?.get(&partition).copied()
    }

    /// The next offset whose reject `lease_rejects` has not covered.
    pub fn next_reject_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.reject_kafka.get(topic)?.get(&partition).copied()
    }

    /// The versions of the tables that name `paths`, as a reader should
    /// see them named: `lease_events version 4, lease_rejects version 2`.
    pub fn versions_naming(&self, paths: &[String]) -> String {
        let mut named: Vec<String> = Vec::new();
        for t in Table::ALL {
            if paths.iter().any(|p| p.starts_with(&format!("{t}/"))) {
                named.push(format!(
                    "{t} version {}",
                    self.tables.get(&t).copied().unwrap_or(0)
                ));
            }
        }
        named.join(", ")
    }

    fn offsets_of(&self, table: Table) -> Option<&Offsets> {
        match table {
            Table::LeaseEvents => Some(&self.kafka),
            Table::LeaseRejects => Some(&self.reject_kafka),
            Table::LeaseTimeline => Some(&self.stored_kafka),
            _ => None,
        }
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
    /// New files, and the Kafka ranges they cover: `kafka` for
    /// `lease_events` (every message of the range), `reject_kafka` for
    /// `lease_rejects` (from the range's first reject on).
    Append {
        files: Vec<DataFile>,
        kafka: Vec<KafkaRange>,
        reject_kafka: Vec<KafkaRange>,
    },
    /// Files of one table merged into larger ones; the rows stay the same.
    Compact {
        remove: Vec<String>,
        add: Vec<DataFile>,
    },
    /// Whole `date` partitions past the retention, removed with their
    /// rows (of any tables).
    Expire { remove: Vec<String> },
    /// Settled rows of the stored audit tables: new files, and files
    /// replaced by `add` files that hold their rows but those of leases
    /// audited again (whose new rows `add` also holds). `kafka` are the
    /// positions the writer's audit was given up to (empty ranges at the
    /// next offset): the rows stored for those partitions' leases answer
    /// for every event below them.
    Settle {
        add: Vec<DataFile>,
        remove: Vec<String>,
        kafka: Vec<KafkaRange>,
    },
}

/// What one table's commit of a change holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableChange {
    pub add: Vec<DataFile>,
    pub remove: Vec<DataFile>,
    pub txns: Vec<KafkaRange>,
    /// The removed rows are gone, not rewritten into the added files.
    pub deletes_rows: bool,
}

impl Change {
    /// The tables this change commits to, in the order they must be
    /// committed (`lease_events` last: it decides where consumption
    /// resumes), each with what its commit holds.
    pub fn per_table(&self, base: &Manifest) -> Vec<(Table, TableChange)> {
        let mut out: BTreeMap<Table, TableChange> = BTreeMap::new();
        match self {
            Change::Append {
                files,
                kafka,
                reject_kafka,
            } => {
                for f in files {
                    out.entry(f.table).or_default().add.push(f.clone());
                }
                if !kafka.is_empty() {
                    out.entry(Table::LeaseEvents).or_default().txns = kafka.clone();
                }
                if !reject_kafka.is_empty() {
                    out.entry(Table::LeaseRejects).or_default().txns = reject_kafka.clone();
                }
            }
            Change::Compact { remove, add } => {
                for f in base.files.iter().filter(|f| remove.contains(&f.path)) {
                    out.entry(f.table).or_default().remove.push(f.clone());
                }
                for f in add {
                    out.entry(f.table).or_default().add.push(f.clone());
                }
            }
            Change::Expire { remove } | Change::Settle { remove, .. } => {
                for f in base.files.iter().filter(|f| remove.contains(&f.path)) {
                    let tc = out.entry(f.table).or_default();
                    tc.remove.push(f.clone());
                    tc.deletes_rows = true;
                }
                if let Change::Settle { add, kafka, .. } = self {
                    for f in add {
                        out.entry(f.table).or_default().add.push(f.clone());
                    }
                    if !kafka.is_empty() {
                        out.entry(Table::LeaseTimeline).or_default().txns = kafka.clone();
                    }
                }
            }
        }
        let order = |t: &Table| match t {
            Table::LeaseRejects => 0,
            Table::LeaseAlerts => 1,
            Table::LeaseTimeline => 2,
            Table::LeaseViolations => 3,
            Table::LeaseContext => 4,
            Table::LeaseEvents => 5,
        };
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort_by_key(|(t, _)| order(t));
        v
    }

    /// Checks that this change still makes sense on `base`, and builds the
    /// next manifest from it: every table it touches one Delta version on.
    pub fn apply(&self, base: &Manifest, now: DateTime<Utc>) -> Result<Manifest> {
        let conflict = |reason: String| LakeError::Conflict {
            version: base.version,
            reason,
        };
        let mut next = base.clone();
        next.schema_version = leaseline_schema::SCHEMA_VERSION;
        next.committed_at = now;
        let per_table = self.per_table(base);
        if let Change::Compact { remove, add } = self {
            for p in remove {
                if !base.files.iter().any(|f| &f.path == p) {
                    return Err(conflict(format!("{p} is no longer in the lake")));
                }
            }
            if per_table.len() > 1 {
                return Err(conflict("a compaction spans more than one table".into()));
            }
            next.files.retain(|f| !remove.contains(&f.path));
            next.files.extend(add.iter().cloned());
        }
        if let Change::Expire { remove } | Change::Settle { remove, .. } = self {
            for p in remove {
                if !base.files.iter().any(|f| &f.path == p) {
                    return Err(conflict(format!("{p} is no longer in the lake")));
                }
            }
            next.files.retain(|f| !remove.contains(&f.path));
        }
        if let Change::Settle { add, .. } = self {
            if let Some(f) = add.iter().find(|f| !Table::STORED_AUDIT.contains(&f.table)) {
                return Err(conflict(format!(
                    "{} is not a stored audit table's file",
                    f.path
                )));
            }
            next.files.extend(add.iter().cloned());
        }
        for (table, change) in &per_table {
            if let Some(done) = base.offsets_of(*table) {
                for r in &change.txns {
                    if let Some(done) = done.get(&r.topic).and_then(|p| p.get(&r.partition)) {
                        if *done > r.start {
                            return Err(conflict(format!(
                                "{}/{} offsets {}..{} overlap what {table} already holds (up to {done})",
                                r.topic, r.partition, r.start, r.end
                            )));
                        }
                    }
                }
            }
            if let Change::Append { .. } = self {
                next.files.extend(change.add.iter().cloned());
            }
            let offsets = match table {
                Table::LeaseEvents => Some(&mut next.kafka),
                Table::LeaseRejects => Some(&mut next.reject_kafka),
                Table::LeaseTimeline => Some(&mut next.stored_kafka),
                _ => None,
            };
            if let Some(offsets) = offsets {
                for r in &change.txns {
                    offsets
                        .entry(r.topic.clone())
                        .or_default()
                        .insert(r.partition, r.end);
                }
            }
            // A table not yet created fails the commit; the count is moot.
            *next.tables.entry(*table).or_insert(0) += 1;
            next.version += 1;
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(table: Table, path: &str) -> DataFile {
        DataFile {
            table,
            path: format!("{table}/date=2026-09-14/{path}"),
            rows: 1,
            bytes: 1,
            min_ts_us: 0,
            max_ts_us: 0,
            level: 0,
        }
    }

    fn range(start: i64, end: i64) -> KafkaRange {
        KafkaRange {
            topic: "t".into(),
            partition: 0,
            start,
            end,
        }
    }

    fn lake() -> Manifest {
        let mut m = Manifest::empty();
        for t in Table::ALL {
            m.tables.insert(t, 0);
            m.version += 1;
        }
        m
    }

    #[test]
    fn append_advances_offsets_and_refuses_overlap() {
        let m0 = lake();
        let a = Change::Append {
            files: vec![file(Table::LeaseEvents, "a")],
            kafka: vec![range(0, 10)],
            reject_kafka: vec![],
        };
        let m1 = a.apply(&m0, Utc::now()).unwrap();
        assert_eq!(m1.version, m0.version + 1);
        assert_eq!(m1.tables[&Table::LeaseEvents], 1);
        assert_eq!(m1.tables[&Table::LeaseRejects], 0);
        assert_eq!(m1.next_offset("t", 0), Some(10));
        // Replaying the same range on top of itself is a conflict: a zombie
        // writer that lost its partitions can never add the rows twice.
        assert!(matches!(
            a.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        let b = Change::Append {
            files: vec![file(Table::LeaseEvents, "b")],
            kafka: vec![range(12, 20)],
            reject_kafka: vec![],
        };
        let m2 = b.apply(&m1, Utc::now()).unwrap();
        assert_eq!(m2.next_offset("t", 0), Some(20));
        assert_eq!(m2.files.len(), 2);
    }

    #[test]
    fn rejects_commit_first_and_carry_their_own_offsets() {
        let m0 = lake();
        let a = Change::Append {
            files: vec![
                file(Table::LeaseEvents, "e"),
                file(Table::LeaseRejects, "r"),
            ],
            kafka: vec![range(0, 10)],
            reject_kafka: vec![range(4, 10)],
        };
        let order: Vec<Table> = a.per_table(&m0).into_iter().map(|(t, _)| t).collect();
        assert_eq!(order, vec![Table::LeaseRejects, Table::LeaseEvents]);
        let m1 = a.apply(&m0, Utc::now()).unwrap();
        assert_eq!(m1.version, m0.version + 2);
        assert_eq!(m1.next_reject_offset("t", 0), Some(10));
        // A writer that died after the rejects' commit left lease_rejects
        // ahead. Reading the range again, its rejects must start at 10.
        let mut crashed = m0.clone();
        crashed.reject_kafka = m1.reject_kafka.clone();
        crashed.tables.insert(Table::LeaseRejects, 1);
        let again = Change::Append {
            files: vec![file(Table::LeaseEvents, "e2")],
            kafka: vec![range(0, 12)],
            reject_kafka: vec![range(4, 12)],
        };
        assert!(matches!(
            again.apply(&crashed, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        let filtered = Change::Append {
            files: vec![file(Table::LeaseEvents, "e2")],
            kafka: vec![range(0, 12)],
            reject_kafka: vec![range(11, 12)],
        };
        let m = filtered.apply(&crashed, Utc::now()).unwrap();
        assert_eq!(m.next_offset("t", 0), Some(12));
        assert_eq!(m.next_reject_offset("t", 0), Some(12));
    }

    #[test]
    fn settling_adds_audit_rows_and_replaces_files_still_there() {
        let mut m = lake();
        m.files = vec![
            file(Table::LeaseEvents, "e"),
            file(Table::LeaseTimeline, "t1"),
            file(Table::LeaseViolations, "v1"),
        ];
        let s = Change::Settle {
            add: vec![
                file(Table::LeaseTimeline, "t2"),
                file(Table::LeaseViolations, "v2"),
            ],
            remove: vec![m.files[1].path.clone()],
            kafka: vec![KafkaRange {
                topic: "t".into(),
                partition: 0,
                start: 7,
                end: 7,
            }],
        };
        let order: Vec<Table> = s.per_table(&m).into_iter().map(|(t, _)| t).collect();
        assert_eq!(order, vec![Table::LeaseTimeline, Table::LeaseViolations]);
        let m1 = s.apply(&m, Utc::now()).unwrap();
        let paths: Vec<&str> = m1.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "lease_events/date=2026-09-14/e",
                "lease_violations/date=2026-09-14/v1",
                "lease_timeline/date=2026-09-14/t2",
                "lease_violations/date=2026-09-14/v2",
            ]
        );
        assert_eq!(m1.tables[&Table::LeaseTimeline], 1);
        assert_eq!(m1.tables[&Table::LeaseEvents], 0);
        assert_eq!(m1.stored_kafka["t"][&0], 7);
        // A writer whose audit is behind what is stored is refused.
        let behind = Change::Settle {
            add: vec![file(Table::LeaseTimeline, "t3")],
            remove: vec![],
            kafka: vec![KafkaRange {
                topic: "t".into(),
                partition: 0,
                start: 5,
                end: 5,
            }],
        };
        assert!(matches!(
            behind.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        // Another writer replaced t1 first: deciding again is required, or
        // the rows of t1 carried into t2 would be stored twice.
        assert!(matches!(
            s.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        // Only the stored audit tables take settled rows.
        let wrong = Change::Settle {
            add: vec![file(Table::LeaseEvents, "x")],
            remove: vec![],
            kafka: vec![],
        };
        assert!(matches!(
            wrong.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
    }

    #[test]
    fn compact_requires_its_inputs_and_one_table() {
        let mut m = lake();
        m.files = vec![file(Table::LeaseEvents, "a"), file(Table::LeaseEvents, "b")];
        let c = Change::Compact {
            remove: vec![m.files[0].path.clone(), m.files[1].path.clone()],
            add: vec![file(Table::LeaseEvents, "c")],
        };
        let m1 = c.apply(&m, Utc::now()).unwrap();
        assert_eq!(m1.files, vec![file(Table::LeaseEvents, "c")]);
        assert_eq!(m1.tables[&Table::LeaseEvents], 1);
        assert!(matches!(
            c.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        let mixed = Change::Compact {
            remove: vec![m1.files[0].path.clone()],
            add: vec![file(Table::LeaseRejects, "d")],
        };
        assert!(matches!(
            mixed.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
    }

    #[test]
    fn expiry_removes_rows_of_any_table_and_only_files_still_there() {
        let mut m = lake();
        m.files = vec![
            file(Table::LeaseEvents, "old"),
            file(Table::LeaseRejects, "old-r"),
            file(Table::LeaseEvents, "new"),
        ];
        let c = Change::Expire {
            remove: vec![m.files[0].path.clone(), m.files[1].path.clone()],
        };
        let per_table = c.per_table(&m);
        assert_eq!(per_table.len(), 2);
        assert!(per_table
            .iter()
            .all(|(_, tc)| tc.deletes_rows && tc.add.is_empty() && tc.remove.len() == 1));
        let m1 = c.apply(&m, Utc::now()).unwrap();
        assert_eq!(m1.files, vec![file(Table::LeaseEvents, "new")]);
        assert_eq!(m1.version, m.version + 2);
        // Compacted (or expired) meanwhile: decided again.
        assert!(matches!(
            c.apply(&m1, Utc::now()),
            Err(LakeError::Conflict { .. })
        ));
        // A compaction keeps its rows.
        let compact = Change::Compact {
            remove: vec![m.files[2].path.clone()],
            add: vec![file(Table::LeaseEvents, "merged")],
        };
        assert!(compact.per_table(&m).iter().all(|(_, tc)| !tc.deletes_rows));
    }

    #[test]
    fn paths_inside_a_table() {
        let f = file(Table::LeaseRejects, "x.parquet");
        assert_eq!(f.table_path(), "date=2026-09-14/x.parquet");
        assert_eq!(f.date(), Some("2026-09-14"));
    }
}
