//! The lease transition event of `docs/event-contract.md`, version 1.1.
//!
//! What enters: the bytes of one message (a Kafka value, an NDJSON line).
//! What leaves: a typed [`LeaseEvent`] or a [`DecodeError`] whose
//! [`RejectReason`] is a stable code (`missing_field:lease_id`,
//! `wrong_type:fencing_token`, ...), and Arrow batches for the two lake
//! tables, `lease_events` ([`EVENTS_SCHEMA`], built by
//! [`EventBatchBuilder`]) and `lease_rejects` ([`REJECTS_SCHEMA`], built by
//! [`RejectBatchBuilder`]), and the alert history `lease_alerts`
//! ([`ALERTS_SCHEMA`]); and back: [`EventColumns`] reads `lease_events`
//! rows as events for the audit.
//!
//! This crate sits at the bottom of the workspace: ingest, the audit, query
//! and alerts all agree on the event through it.

mod arrow;
mod audit;
mod decode;
mod event;
mod read;

pub use crate::arrow::{
    context_batch, EventBatchBuilder, RejectBatchBuilder, ALERTS_SCHEMA, CONTRACT_COLUMNS,
    EVENTS_SCHEMA, REJECTS_SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY, STORED_CONTEXT_SCHEMA,
};
pub use crate::audit::{
    HOLDERS_SCHEMA, SETTLED_BEFORE, STORED_TIMELINE_SCHEMA, STORED_VIOLATIONS_SCHEMA,
    TIMELINE_SCHEMA, VIOLATIONS_SCHEMA,
};
pub use crate::decode::{
    decode, decode_str, decode_str_by_serde, decode_str_fast_only, DecodeError, Field,
    RejectReason, MAX_DURATION_MS, MAX_ID_BYTES, MAX_TS_US, MIN_TS_US,
};
pub use crate::event::{Kind, LeaseEvent, Origin, Source};
pub use crate::read::{EventColumns, ReadError};
