//! Rebuilding the live engine from the lake, so that a restart, a
//! rebalance or a takeover loses no alert and records none twice.
//!
//! The protocol:
//! - The engine of `serve --ingest` hears of every event the lake commits
//!   for the partitions it reads, in Kafka order, with its offset
//!   ([`leaseline_ingest::Committed::Event`]). [`Positions`] keeps, per
//!   input partition, the offset after the last event the engine was given.
//! - When a Kafka partition is assigned, its history is read from the lake
//!   (the rows of `lease_events` that came from that partition) and every
//!   row at or after the partition's position is given to the engine,
//!   before any event read after the assignment. The lake holds every event
//!   below the offset consumption resumes at, so after a restart (clean or
//!   SIGKILL) the engine knows the same history as before it, and its
//!   pending alerts come back.
//! - An event is given once: a committed event whose offset lies below the
//!   partition's position was already read from the lake, and is skipped.
//!   File input (no offsets) is never rebuilt: each import and demo run
//!   has its own engine from its first event.
//! - What `lease_alerts` already holds ([`crate::history::Recorded`], read
//!   again at each assignment) is neither recorded nor sent a second time:
//!   the rebuilt engine raises the alerts of the history again, and those
//!   recorded before the restart are passed over. An alert whose row was
//!   not yet written when the process died is sent and recorded once now.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type};
use leaseline_lake::{Lake, Table};
use leaseline_schema::{EventColumns, LeaseEvent};

use crate::clock::PartitionKey;
use crate::error::Result;

/// Per input partition, the offset after the last event given to the
/// engine.
#[derive(Debug, Default)]
pub struct Positions(HashMap<PartitionKey, i64>);

impl Positions {
    /// Whether the event at `offset` of `p` is new to the engine; if so,
    /// the position moves past it. Events without an offset are always new.
    pub fn take(&mut self, p: &PartitionKey, offset: Option<i64>) -> bool {
        let Some(offset) = offset else {
            return true;
        };
        match self.0.get_mut(p) {
            Some(next) if offset < *next => false,
            Some(next) => {
                *next = offset + 1;
                true
            }
            None => {
                self.0.insert(p.clone(), offset + 1);
                true
            }
        }
    }

    /// Each partition with the offset after the last event given.
    pub fn iter(&self) -> impl Iterator<Item = (&PartitionKey, i64)> {
        self.0.iter().map(|(p, next)| (p, *next))
    }

    /// Whether the record at `offset` of `topic`'s `partition` was given
    /// to the engine.
    pub fn given(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.0
            .iter()
            .any(|((t, p), next)| &**t == topic && *p == partition && offset < *next)
    }
}

/// The rows of `lease_events` that came from Kafka, by partition, as the
/// lake's newest snapshot holds them.
pub struct PartitionHistory {
    /// The manifest version read.
    pub version: u64,
    batch: RecordBatch,
    cols: EventColumns,
    /// Row indices by partition, in offset order.
    rows: HashMap<(String, i32), Vec<(i64, usize)>>,
}

impl PartitionHistory {
    /// The `lease_events` rows of the snapshot read.
    pub fn rows(&self) -> u64 {
        self.batch.num_rows() as u64
    }

    /// Reads the lake's `lease_events`.
    pub async fn load(lake: &Lake) -> Result<PartitionHistory> {
        let m = lake.latest().await?;
        let batch = lake.read_table(&m, Table::LeaseEvents).await?;
        Self::from_batch(m.version, batch)
    }

    fn from_batch(version: u64, batch: RecordBatch) -> Result<PartitionHistory> {
        let cols = EventColumns::new(&batch)?;
        let mut rows: HashMap<(String, i32), Vec<(i64, usize)>> = HashMap::new();
        let (Some(topic), Some(part), Some(off)) = (
            batch.column_by_name("kafka_topic"),
            batch.column_by_name("kafka_partition"),
            batch.column_by_name("kafka_offset"),
        ) else {
            return Ok(PartitionHistory {
                version,
                batch,
                cols,
                rows,
            });
        };
        let (topic, part, off) = (
            topic.as_string::<i32>(),
            part.as_primitive::<Int32Type>(),
            off.as_primitive::<Int64Type>(),
        );
        for i in 0..batch.num_rows() {
            if topic.is_null(i) || part.is_null(i) || off.is_null(i) {
                continue;
            }
            rows.entry((topic.value(i).to_string(), part.value(i)))
                .or_default()
                .push((off.value(i), i));
        }
        for r in rows.values_mut() {
            r.sort_unstable();
        }
        Ok(PartitionHistory {
            version,
            batch,
            cols,
            rows,
        })
    }

    /// Gives `take` every event of `p` the engine has not had, in offset
    /// order, moving `positions` past them. Returns how many.
    pub fn replay(
        &self,
        p: &PartitionKey,
        positions: &mut Positions,
        take: impl FnMut(&LeaseEvent<'_>),
    ) -> Result<usize> {
        self.replay_until(p, positions, None, take)
    }

    /// [`PartitionHistory::replay`], of the offsets below `until` only
    /// (all of them for `None`); a later call gives the rest.
    pub fn replay_until(
        &self,
        p: &PartitionKey,
        positions: &mut Positions,
        until: Option<i64>,
        mut take: impl FnMut(&LeaseEvent<'_>),
    ) -> Result<usize> {
        let Some(rows) = self.rows.get(&(p.0.to_string(), p.1)) else {
            return Ok(0);
        };
        let mut n = 0;
        for &(offset, i) in rows {
            if until.is_some_and(|u| offset >= u) {
                break;
            }
            if positions.take(p, Some(offset)) {
                take(&self.cols.event(i)?);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Rows read.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn p(n: i32) -> PartitionKey {
        (Arc::from("t"), n)
    }

    #[test]
    fn an_event_below_the_position_was_given_already() {
        let mut pos = Positions::default();
        assert!(pos.take(&p(0), Some(5)));
        assert!(!pos.take(&p(0), Some(5)));
        assert!(!pos.take(&p(0), Some(3)));
        assert!(pos.take(&p(0), Some(6)));
        // Partitions are apart.
        assert!(pos.take(&p(1), Some(0)));
        assert!(!pos.take(&p(1), Some(0)));
    }

    #[test]
    fn file_input_has_no_offsets_and_is_always_new() {
        let mut pos = Positions::default();
        let file: PartitionKey = (Arc::from(""), 0);
        assert!(pos.take(&file, None));
        assert!(pos.take(&file, None));
    }

    fn history(rows: &[(i32, i64, &str)]) -> PartitionHistory {
        use leaseline_schema::{EventBatchBuilder, Origin};
        let mut b = EventBatchBuilder::new();
        for (part, offset, id) in rows {
            let json = format!(
                r#"{{"ts":"2026-01-01T00:00:00Z","kind":"acquired","source":"coordinator","lease_id":"l","holder_id":"h","fencing_token":1,"ttl_ms":1000,"event_id":"{id}"}}"#
            );
            let ev = leaseline_schema::decode(json.as_bytes()).unwrap();
            let origin = Origin::Kafka {
                topic: "t",
                partition: *part,
                offset: *offset,
            };
            b.append(&ev, &origin, 0);
        }
        PartitionHistory::from_batch(1, b.finish()).unwrap()
    }

    #[test]
    fn a_partition_is_replayed_from_its_position_in_offset_order() {
        let h = history(&[(0, 2, "c"), (1, 0, "x"), (0, 0, "a"), (0, 1, "b")]);
        let mut pos = Positions::default();
        // The engine already had offset 0 of partition 0, live.
        assert!(pos.take(&p(0), Some(0)));
        let mut got = Vec::new();
        let n = h
            .replay(&p(0), &mut pos, |e| {
                got.push(e.event_id.as_deref().unwrap().to_string())
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(got, ["b", "c"]);
        // A second assignment gives nothing twice, and the live copy of a
        // replayed event is skipped.
        assert_eq!(h.replay(&p(0), &mut pos, |_| {}).unwrap(), 0);
        assert!(!pos.take(&p(0), Some(2)));
        assert!(pos.take(&p(0), Some(3)));
        // An unknown partition has no history.
        assert_eq!(h.replay(&p(7), &mut pos, |_| {}).unwrap(), 0);
    }
}
