//! What other parts of a process may attach to ingest without ingest
//! knowing them: the fan-out of committed events (the alert engine),
//! counters for `/metrics`, and the buffer that queries read before a flush.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leaseline_lake::PendingRows;

use crate::fanout::Fanout;

/// An input partition: a Kafka topic-partition. File input (NDJSON, the
/// simulator) is one partition, with an empty topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InputPartition<'a> {
    pub topic: &'a str,
    pub partition: i32,
}

impl InputPartition<'static> {
    /// The one partition of file input.
    pub const FILE: InputPartition<'static> = InputPartition {
        topic: "",
        partition: 0,
    };
}

/// What a source says about an input partition, in the order it happens.
#[derive(Debug, Clone, Copy)]
pub enum Notice<'a> {
    /// The partition is now read by this process.
    Assigned(InputPartition<'a>),
    /// The partition is no longer read by this process.
    Revoked(InputPartition<'a>),
    /// Everything the partition held when ingest last looked has been
    /// read: nothing of it is waiting.
    CaughtUp(InputPartition<'a>),
}

/// Optional attachments of one ingest run.
#[derive(Default)]
pub struct IngestHooks {
    pub pending: Option<PendingRows>,
    /// Where committed events go (see [`crate::fanout`]).
    pub fanout: Option<Fanout>,
    pub metrics: Option<Arc<IngestMetrics>>,
    /// Requests that push into this run's writer (see [`crate::intake`]).
    pub intake: Option<crate::intake::Intake>,
}

/// Ingest's own health, read by the binary's `/metrics`.
#[derive(Debug, Default)]
pub struct IngestMetrics {
    pub events: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejects: AtomicU64,
    pub files_written: AtomicU64,
    pub commits: AtomicU64,
    pub flushes: AtomicU64,
    /// Sum of flush durations, microseconds.
    pub flush_micros: AtomicU64,
    /// The last flush's duration, microseconds.
    pub last_flush_micros: AtomicU64,
    /// Times a partition was paused for being read too far ahead of the
    /// others in event time (see [`crate::align`]).
    pub partition_pauses: AtomicU64,
    /// Partitions paused now.
    pub partitions_paused: AtomicU64,
    /// Messages behind the partition's high watermark, from librdkafka's
    /// statistics: (topic, partition) to lag.
    pub lag: Mutex<BTreeMap<(String, i32), i64>>,
}

impl IngestMetrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn lags(&self) -> Vec<((String, i32), i64)> {
        self.lag
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}
