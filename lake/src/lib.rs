//! The leaseline lake: lease events and rejects as Parquet files under one
//! root (a directory or an `object_store` URL), tied together by a manifest.
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
//! Layout (see `docs/lake.md` for why it is our own manifest):
//!
//! ```text
//! <root>/_manifest/00000000000000000042.json   one snapshot per commit
//! <root>/lease_events/date=2026-09-14/<uuid>.parquet
//! <root>/lease_rejects/date=2026-11-29/<uuid>.parquet
//! ```

mod dedup;
mod error;
mod lake;
mod manifest;
pub mod parquet_io;
mod pending;
mod store;

pub use crate::dedup::{line_key, EventIdSet};
pub use crate::error::{LakeError, Result};
pub use crate::lake::{CompactionPolicy, CompactionReport, Lake};
pub use crate::manifest::{Change, DataFile, KafkaRange, Manifest, RemovedFile, Table};
pub use crate::pending::{PendingRows, PendingSnapshot};
pub use crate::store::LakeStore;
