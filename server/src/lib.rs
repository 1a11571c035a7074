//! The query surfaces of `leaseline serve`.
//!
//! What enters: HTTP requests (SQL text, lease and violation lookups) and,
//! with [`pg`], PostgreSQL wire-protocol connections from psql or Grafana.
//! What leaves: rows from a [`leaseline_query::QueryEngine`] as JSON, CSV or
//! Arrow IPC, or PostgreSQL result sets; errors as JSON with a status that
//! says whose fault they are (400 a bad query, 503 a query over its memory
//! or time limit, 500 a bug).
//!
//! Key types: [`http::router`] and [`http::AppState`] for the HTTP API,
//! [`pg::serve`] for the PostgreSQL protocol, [`ServerError`].
//!
//! Every query surface is read-only: the engine refuses DDL, DML, `COPY`
//! and `SET`, and reads nothing but the lake's tables. The one way in is
//! [`otlp`], `POST /v1/logs`, which hands OTLP log records to ingest (an
//! opt-in, with its own token scope).

pub mod accept;
pub mod auth;
pub mod http;
pub mod otlp;
pub mod pg;
pub mod pg_auth;
pub mod pg_describe;
pub mod svg;
pub mod tls;

mod error;

pub use crate::error::ServerError;
