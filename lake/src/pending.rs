//! Rows consumed but not yet committed, shared with readers in the same
//! process so that they see fresh events before the Parquet file holding
//! them is flushed.
//!
//! The writer publishes the rows it buffers together with the manifest
//! version they come after; a reader takes one [`PendingSnapshot`] and reads
//! the lake at exactly that version plus those rows, so a flush running
//! meanwhile can neither hide a row nor show it twice.

use std::sync::{Arc, RwLock};

use arrow::array::RecordBatch;

use crate::manifest::{Manifest, Table};

/// What a reader sees besides the lake.
#[derive(Debug, Clone, Default)]
pub struct PendingSnapshot {
    /// The snapshot the rows are not yet part of; `None` before a writer
    /// published anything.
    pub base: Option<Arc<Manifest>>,
    pub events: Vec<RecordBatch>,
    pub rejects: Vec<RecordBatch>,
}

impl PendingSnapshot {
    pub fn rows_of(&self, table: Table) -> &[RecordBatch] {
        match table {
            Table::LeaseEvents => &self.events,
            Table::LeaseRejects => &self.rejects,
            _ => &[],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events
            .iter()
            .chain(&self.rejects)
            .all(|b| b.num_rows() == 0)
    }
}

/// The handle the writer publishes through and readers read from.
#[derive(Debug, Clone, Default)]
pub struct PendingRows(Arc<RwLock<Arc<PendingSnapshot>>>);

impl PendingRows {
    pub fn new() -> Self {
        Self::default()
    }

    /// The rows published last (cheap: batches are shared, not copied).
    pub fn snapshot(&self) -> Arc<PendingSnapshot> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn publish(&self, snapshot: PendingSnapshot) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snapshot);
    }
}
