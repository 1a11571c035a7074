//! The leaseline lake: lease events, rejects and alerts as Delta tables
//! under one root (a directory or an `object_store` URL).
//!
//! What enters: Arrow batches of `lease_events` and `lease_rejects`
//! (schemas from `leaseline-schema`) and [`Change`]s to commit.
//! What leaves: [`Manifest`] snapshots naming the data files of each table
//! and the Kafka offsets they cover, and the files' contents.
//!
//! Key types: [`Lake`] (open, [`Lake::latest`], [`Lake::commit`],
//! [`Lake::compact`], [`Lake::vacuum`]), [`Manifest`], [`Change`],
//! [`DataFile`], [`EventIdSet`] (de-duplication by `event_id`),
//! [`PendingRows`] (rows a writer buffers, for readers in its process).
//!
//! Layout (see `docs/lake.md`):
//!
//! ```text
//! <root>/lease_events/_delta_log/00000000000000000042.json
//! <root>/lease_events/date=2026-09-14/<uuid>.parquet
//! <root>/lease_rejects/_delta_log/...
//! <root>/lease_rejects/date=2026-11-29/<uuid>.parquet
//! <root>/lease_alerts/_delta_log/...
//! ```

mod dedup;
pub mod delta;
mod error;
mod lake;
mod manifest;
mod merge;
mod migrate;
pub mod parquet_io;
mod pending;
mod store;

pub use crate::dedup::{
    day_of, kafka_key, kafka_record_key, line_key, origin_key, slot_of, EventIdSet, Origins,
    RecentIds, Seen, MAX_RESIDENT_SLOTS, RESIDENT_IDS,
};
pub use crate::error::{LakeError, Result};
pub use crate::lake::{CompactionPolicy, CompactionReport, Lake};
pub use crate::manifest::{Change, DataFile, KafkaRange, Manifest, Offsets, Table, TableChange};
pub use crate::migrate::{migrate, MigrationReport};
pub use crate::pending::{PendingRows, PendingSnapshot};
pub use crate::store::LakeStore;
