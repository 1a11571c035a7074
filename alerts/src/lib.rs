//! leaseline's alerts: rules over lease events, evaluated as they stream
//! in, by event time, with the same audit engine that answers SQL.
//!
//! What enters: decoded [`LeaseEvent`](leaseline_schema::LeaseEvent)s, in
//! any order, from ingest (live) or from stored history (replay), and a
//! watermark that says how far event time has surely come.
//! What leaves: [`Alert`] state changes (pending, firing, resolved) with
//! the labels `alertname`, `lease_id`, `holder_id`, `backend`, `severity`
//! and annotations that cite the evidence; the lease metrics of
//! `/metrics` ([`LeaseMetrics`]); deliveries to Alertmanager's API v2 and
//! JSON webhooks ([`Notifier`]); and rows of the `lease_alerts` table
//! ([`AlertHistory`]).
//!
//! Key types: [`AlertEngine`] (the rules; see its module for how lateness
//! works), [`AlertsConfig`] (rules, thresholds, windows, severities,
//! receivers; validated at start-up), [`live::run`] (the engine inside a
//! running service) and [`live::replay`] (the engine over old data).

mod alert;
pub mod clock;
mod config;
mod engine;
mod error;
mod history;
pub mod live;
mod metrics;
mod notify;
pub mod rebuild;
mod settling;
mod stored;
mod text;

pub use crate::alert::{Alert, AlertKey, AlertName, AlertState};
pub use crate::config::{
    AlertsConfig, BasicAuth, ChurnRule, EventRule, LatencyRule, MetricsConfig, ReceiverConfig,
    ReceiverKind, ReceiverTls, RenewalFailureRule, RulesConfig, Severity, ViolationRule,
};
pub use crate::engine::AlertEngine;
pub use crate::error::{AlertError, Result};
pub use crate::history::{AlertHistory, Recorded, ALERTS_DIR};
pub use crate::metrics::{LeaseMetrics, LeaseTotals};
pub use crate::notify::Notifier;
pub use crate::settling::Settling;
