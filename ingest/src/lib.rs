//! Ingest: lease events from Kafka and NDJSON files into the lake, exactly
//! once, nothing lost.
//!
//! What enters: Kafka messages ([`kafka::run`]) or NDJSON lines
//! ([`import::import`]), one event each, decoded strictly by
//! `leaseline-schema`; or OpenTelemetry log records ([`otlp`]), from Kafka
//! or from `POST /v1/logs` through an [`Intake`], each translated into the
//! contract's JSON and decoded the same way.
//! What leaves: commits to the lake (`leaseline-lake`): valid events, de-
//! duplicated by `event_id`, in `lease_events`; every malformed message,
//! byte for byte with its reason and origin, in `lease_rejects`; and the
//! Kafka offsets those rows cover, in the same commit.
//!
//! One loop ([`pipeline::run`]) drives every source (Kafka, NDJSON files,
//! the simulator) through the [`pipeline::Source`] interface.
//!
//! Attachments ([`IngestHooks`]): the [`fanout`] of committed events to the
//! alert engine, bounded and only after the lake holds them;
//! [`IngestMetrics`] for `/metrics`; and the buffer queries read before a
//! flush.
//!
//! Key types: [`LakeWriter`] (buffer, flush, conflict handling),
//! [`FlushPolicy`], [`KafkaConfig`], [`CompactionConfig`], [`IngestError`].
//! Ingest never reads through the query layer.

pub mod align;
pub mod config;
mod error;
pub mod fanout;
mod hooks;
pub mod import;
pub mod intake;
pub mod kafka;
pub mod otlp;
pub mod pipeline;
mod writer;

pub use crate::config::{is_secret_property, CompactionConfig, FlushPolicy, KafkaConfig, Keep};
pub use crate::error::{IngestError, Result};
pub use crate::fanout::{Committed, CommittedReceiver, Fanout, PartitionKey};
pub use crate::hooks::{IngestHooks, IngestMetrics, InputPartition, Notice};
pub use crate::intake::{Accepted, Intake, IntakeError};
pub use crate::writer::{FlushReport, Flushed, LakeWriter, Pushed, WriterStats};
