//! Ingest: lease events from Kafka and NDJSON files into the lake, exactly
//! once, nothing lost.
//!
//! What enters: Kafka messages ([`kafka::run`]) or NDJSON lines
//! ([`import::import`]), one event each, decoded strictly by
//! `leaseline-schema`.
//! What leaves: commits to the lake (`leaseline-lake`): valid events, de-
//! duplicated by `event_id`, in `lease_events`; every malformed message,
//! byte for byte with its reason and origin, in `lease_rejects`; and the
//! Kafka offsets those rows cover, in the same commit.
//!
//! Attachments ([`IngestHooks`]): a tap that sees each accepted event as
//! it is consumed (the alert engine), [`IngestMetrics`] for `/metrics`,
//! and the buffer queries read before a flush.
//!
//! Key types: [`LakeWriter`] (buffer, flush, conflict handling),
//! [`FlushPolicy`], [`KafkaConfig`], [`CompactionConfig`], [`IngestError`].
//! Ingest never reads through the query layer.

pub mod config;
mod error;
mod hooks;
pub mod import;
pub mod kafka;
mod writer;

pub use crate::config::{is_secret_property, CompactionConfig, FlushPolicy, KafkaConfig};
pub use crate::error::{IngestError, Result};
pub use crate::hooks::{EventTap, IngestHooks, IngestMetrics, InputPartition, Tapped};
pub use crate::writer::{FlushReport, LakeWriter, Pushed, WriterStats};
