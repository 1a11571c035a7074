//! The HTTP API (axum).
//!
//! - `POST /api/v1/sql`: the body is the query (or `{"query": "..."}` with
//!   `Content-Type: application/json`); the `Accept` header picks JSON rows
//!   (the default), CSV, NDJSON or an Arrow IPC stream. The response says
//!   which lake version it read (`Leaseline-Lake-Version`) and, when the
//!   query read the audit's tables, which version those answered for
//!   (`Leaseline-Audit-Version`).
//! - `GET /api/v1/leases/{lease_id}/timeline?from=&to=`: the grants of one
//!   lease that overlap `[from, to)`. Lease ids contain `/`: percent-encode
//!   it (`orders%2Forder-123`).
//! - `GET /api/v1/violations?kind=&lease_id=&from=&to=`: violations, by time.
//! - `GET /health`: 200 with the lake version when the lake can be read.
//! - `POST /v1/logs`: OTLP/HTTP log exports into the lake, with
//!   `serve --otlp-logs` ([`crate::otlp`]).
//!
//! Times are RFC 3339 (`2026-09-14T10:00:00Z`) or epoch milliseconds.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::DateTime;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::{col, lit, Expr};
use datafusion::scalar::ScalarValue;
use leaseline_audit::ViolationKind;
use leaseline_query::output::{self, Format};
use leaseline_query::{QueryEngine, QueryResult};
use serde::Deserialize;

use crate::error::ServerError;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<QueryEngine>,
    /// Renders `/metrics` in the Prometheus text format; the binary wires
    /// it, since the metrics come from ingest and alerts, which this crate
    /// does not know. `None`: 404.
    pub metrics: Option<MetricsRenderer>,
    /// Tokens and allowed host names; see [`crate::auth`].
    pub auth: Arc<crate::auth::HttpAuth>,
    /// Where `POST /v1/logs` pushes OTLP log records ([`crate::otlp`]);
    /// `None`: 404.
    pub intake: Option<leaseline_ingest::Intake>,
}

/// See [`AppState::metrics`].
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// The API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/api/v1/sql", post(sql))
        .route("/api/v1/leases/{lease_id}/timeline", get(timeline))
        .route("/api/v1/leases/{lease_id}/timeline.svg", get(timeline_svg))
        .route("/api/v1/violations", get(violations))
        .route("/metrics", get(metrics))
        .route(
            "/v1/logs",
            post(crate::otlp::logs)
                .layer(axum::extract::DefaultBodyLimit::max(crate::otlp::MAX_BODY)),
        )
        .fallback(|uri: axum::http::Uri| async move {
            ServerError::NotFound(format!("no endpoint {}", uri.path()))
        })
        .layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::auth::guard,
        ))
        .layer(axum::middleware::from_fn(crate::error::json_errors))
        .with_state(state)
}

/// `/metrics` and `/health` alone, for a listener of their own.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::auth::guard,
        ))
        .layer(axum::middleware::from_fn(crate::error::json_errors))
        .with_state(state)
}

async fn metrics(State(s): State<AppState>) -> Response {
    match &s.metrics {
        Some(render) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            render(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn health(State(s): State<AppState>) -> Response {
    match s.engine.lake().check_files().await {
        Ok((m, missing)) if missing.is_empty() => Json(serde_json::json!({
            "status": "ok",
            "lake_version": m.version,
        }))
        .into_response(),
        // Queries over the lost rows fail rather than answer without
        // them; say so before anyone asks.
        Ok((m, missing)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "damaged",
                "lake_version": m.version,
                "message": format!(
                    "{} data files named by {} are missing; queries that read them fail",
                    missing.len(),
                    m.versions_naming(&missing)
                ),
                "missing_files": missing.iter().take(20).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "unavailable",
                "message": e.to_string(),
            })),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlBody {
    query: String,
    max_rows: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SqlParams {
    /// At most this many rows, the first ones (as a `LIMIT` would).
    max_rows: Option<usize>,
}

async fn sql(
    State(s): State<AppState>,
    params: Result<Query<SqlParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServerError> {
    let Query(params) = params.map_err(|e| ServerError::BadRequest(e.body_text()))?;
    let mut max_rows = params.max_rows;
    let format = negotiate(&headers)?;
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| media_type(v) == "application/json");
    let query = if json_body {
        let body = serde_json::from_slice::<SqlBody>(&body)
            .map_err(|e| ServerError::BadRequest(format!("request body: {e}")))?;
        max_rows = max_rows.or(body.max_rows);
        body.query
    } else {
        String::from_utf8(body.to_vec())
            .map_err(|_| ServerError::BadRequest("the query is not UTF-8".into()))?
    };
    if query.trim().is_empty() {
        return Err(ServerError::BadRequest("empty query".into()));
    }
    let result = s.engine.stream(&query, max_rows).await?;
    stream_response(format, result)
}

/// The lake version a SQL answer read.
const LAKE_VERSION: header::HeaderName = header::HeaderName::from_static("leaseline-lake-version");
/// The lake version the audit's tables in a SQL answer are for.
const AUDIT_VERSION: header::HeaderName =
    header::HeaderName::from_static("leaseline-audit-version");

/// The rows as they are computed. An error after the first bytes can no
/// longer change the status: it is logged and the connection is cut
/// before the end of the body (a chunked body without its last chunk), so
/// that no client takes a cut answer for a whole one.
fn stream_response(
    format: Format,
    result: leaseline_query::QueryStream,
) -> Result<Response, ServerError> {
    use futures::StreamExt;

    let (lake_version, audit_version) = (result.lake_version, result.audit_version);
    let enc = output::Encoder::new(format, result.schema.clone())
        .map_err(|e| ServerError::Io(std::io::Error::other(e)))?;
    let body = futures::stream::unfold(
        (Some(enc), result.rows),
        |(enc, mut rows)| async move {
            let mut enc = enc?;
            let chunk = match rows.next().await {
                Some(Ok(batch)) => enc.write(&batch).map_err(std::io::Error::other),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, rows = enc.rows(), "query failed while its rows were sent; the response is cut short");
                    return Some((Err(std::io::Error::other(e)), (None, rows)));
                }
                None => {
                    let last = enc.finish().map_err(std::io::Error::other);
                    return Some((last.map(Bytes::from), (None, rows)));
                }
            };
            match chunk {
                Ok(bytes) => Some((Ok(Bytes::from(bytes)), (Some(enc), rows))),
                Err(e) => Some((Err(e), (None, rows))),
            }
        },
    )
    .filter(|chunk| std::future::ready(!matches!(chunk, Ok(b) if b.is_empty())));
    let mut resp = (StatusCode::OK, axum::body::Body::from_stream(body)).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    // Which commit the answer is for: the audit's tables may answer for
    // an earlier one than the lake's while the alert engine catches up.
    headers.insert(LAKE_VERSION, HeaderValue::from(lake_version));
    if let Some(v) = audit_version {
        headers.insert(AUDIT_VERSION, HeaderValue::from(v));
    }
    Ok(resp)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TimeRange {
    from: Option<String>,
    to: Option<String>,
}

async fn timeline(
    State(s): State<AppState>,
    Path(lease_id): Path<String>,
    Query(range): Query<TimeRange>,
    headers: HeaderMap,
) -> Result<Response, ServerError> {
    let format = negotiate(&headers)?;
    let (from, to) = (
        time_param("from", &range.from)?,
        time_param("to", &range.to)?,
    );
    let engine = s.engine.clone();
    let result = s
        .engine
        .with_timeout(async move {
            let ctx = engine.session().await?;
            let mut df = ctx
                .table("lease_timeline")
                .await
                .map_err(leaseline_query::QueryError::from)?
                .filter(col("lease_id").eq(lit(lease_id)))
                .map_err(leaseline_query::QueryError::from)?;
            // A grant overlaps [from, to) when it began before `to` and had
            // not ended by `from` (an open grant has no end).
            if let Some(to) = to {
                df = filter(df, col("acquired_at").lt(ts_lit(to)))?;
            }
            if let Some(from) = from {
                df = filter(
                    df,
                    col("ended_at")
                        .is_null()
                        .or(col("ended_at").gt(ts_lit(from))),
                )?;
            }
            collect(df, "acquired_at").await
        })
        .await?;
    respond(format, &result)
}

/// The lease's timeline as a picture (see [`crate::svg`]).
async fn timeline_svg(
    State(s): State<AppState>,
    Path(lease_id): Path<String>,
    Query(range): Query<TimeRange>,
) -> Result<Response, ServerError> {
    let (from, to) = (
        time_param("from", &range.from)?,
        time_param("to", &range.to)?,
    );
    let svg = crate::svg::lease_svg(&s.engine, &lease_id, from, to).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "image/svg+xml; charset=utf-8",
        )],
        svg,
    )
        .into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ViolationFilter {
    kind: Option<String>,
    lease_id: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

async fn violations(
    State(s): State<AppState>,
    Query(f): Query<ViolationFilter>,
    headers: HeaderMap,
) -> Result<Response, ServerError> {
    let format = negotiate(&headers)?;
    let kind = match f.kind.as_deref() {
        None => None,
        Some(k) => Some(ViolationKind::parse(k).ok_or_else(|| {
            let all: Vec<&str> = ViolationKind::ALL.iter().map(|k| k.as_str()).collect();
            ServerError::BadRequest(format!(
                "unknown violation kind {k:?}; one of {}",
                all.join(", ")
            ))
        })?),
    };
    let (from, to) = (time_param("from", &f.from)?, time_param("to", &f.to)?);
    let engine = s.engine.clone();
    let result = s
        .engine
        .with_timeout(async move {
            let ctx = engine.session().await?;
            let mut df = ctx
                .table("lease_violations")
                .await
                .map_err(leaseline_query::QueryError::from)?;
            if let Some(k) = kind {
                df = filter(df, col("kind").eq(lit(k.as_str())))?;
            }
            if let Some(l) = f.lease_id {
                df = filter(df, col("lease_id").eq(lit(l)))?;
            }
            if let Some(from) = from {
                df = filter(df, col("at").gt_eq(ts_lit(from)))?;
            }
            if let Some(to) = to {
                df = filter(df, col("at").lt(ts_lit(to)))?;
            }
            collect(df, "at").await
        })
        .await?;
    respond(format, &result)
}

fn filter(df: DataFrame, e: Expr) -> leaseline_query::Result<DataFrame> {
    Ok(df.filter(e)?)
}

async fn collect(df: DataFrame, order_by: &str) -> leaseline_query::Result<QueryResult> {
    let df = df.sort(vec![
        col(order_by).sort(true, false),
        col("lease_id").sort(true, false),
    ])?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    Ok(QueryResult { schema, batches })
}

fn ts_lit(us: i64) -> Expr {
    lit(ScalarValue::TimestampMicrosecond(
        Some(us),
        Some("UTC".into()),
    ))
}

/// Parses a time parameter: RFC 3339 or epoch milliseconds; microseconds
/// out. Times outside the years 0001 to 9999 (what the lake's events may
/// carry) are refused, as timestamp arithmetic past them fails.
pub fn time_param(name: &str, v: &Option<String>) -> Result<Option<i64>, ServerError> {
    // 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z.
    const EARLIEST_US: i64 = -62_135_596_800_000_000;
    const LATEST_US: i64 = 253_402_300_799_999_999;
    let Some(v) = v.as_deref() else {
        return Ok(None);
    };
    let us = if let Ok(ms) = v.parse::<i64>() {
        ms.checked_mul(1000)
    } else {
        let t = DateTime::parse_from_rfc3339(v).map_err(|e| {
            ServerError::BadRequest(format!(
                "{name}={v:?} is neither RFC 3339 nor epoch milliseconds: {e}"
            ))
        })?;
        Some(t.timestamp_micros())
    };
    match us {
        Some(us) if (EARLIEST_US..=LATEST_US).contains(&us) => Ok(Some(us)),
        _ => Err(ServerError::BadRequest(format!(
            "{name}={v} is out of range: times are between 0001-01-01T00:00:00Z and \
             9999-12-31T23:59:59.999Z (epoch ms -62135596800000 to 253402300799999)"
        ))),
    }
}

fn media_type(v: &str) -> &str {
    v.split(';').next().unwrap_or("").trim()
}

/// The quality an `Accept` item gives its type (`;q=0.5`), 1 when none.
fn quality(item: &str) -> f32 {
    item.split(';')
        .skip(1)
        .filter_map(|p| p.trim().strip_prefix("q="))
        .filter_map(|q| q.trim().parse::<f32>().ok())
        .next()
        .unwrap_or(1.0)
}

/// The response format from the `Accept` header: of the types we can
/// produce, the one with the highest quality, the first listed among
/// equals; never one with `q=0`. JSON when there is no header or it
/// accepts anything.
fn negotiate(headers: &HeaderMap) -> Result<Format, ServerError> {
    let Some(accept) = headers.get(header::ACCEPT) else {
        return Ok(Format::Json);
    };
    let accept = accept
        .to_str()
        .map_err(|_| ServerError::BadRequest("unreadable Accept header".into()))?;
    let mut items: Vec<&str> = accept.split(',').filter(|i| quality(i) > 0.0).collect();
    // Stable: among equal qualities the listed order stands.
    items.sort_by(|a, b| quality(b).total_cmp(&quality(a)));
    for item in items {
        let media = media_type(item);
        if matches!(media, "*/*" | "application/*" | "") {
            return Ok(Format::Json);
        }
        if let Some(f) = Format::from_media_type(media).filter(|f| *f != Format::Table) {
            return Ok(f);
        }
    }
    Err(ServerError::NotAcceptable(format!(
        "cannot answer {accept:?}; use application/json, text/csv, application/x-ndjson \
         or application/vnd.apache.arrow.stream"
    )))
}

fn respond(format: Format, result: &QueryResult) -> Result<Response, ServerError> {
    let mut body = Vec::new();
    output::write(format, &result.schema, &result.batches, &mut body)
        .map_err(|e| ServerError::Io(std::io::Error::other(e)))?;
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(accept: &str) -> Option<Format> {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        negotiate(&h).ok()
    }

    #[test]
    fn accept_quality_values_rank_the_types() {
        assert_eq!(pick("text/csv"), Some(Format::Csv));
        assert_eq!(
            pick("application/json;q=0.5, text/csv;q=0.9"),
            Some(Format::Csv)
        );
        assert_eq!(
            pick("text/csv;q=0.2, application/x-ndjson"),
            Some(Format::Ndjson)
        );
        // Equal qualities: the first listed.
        assert_eq!(pick("text/csv, application/json"), Some(Format::Csv));
        // q=0 means "not this one".
        assert_eq!(pick("text/csv;q=0"), None);
        assert_eq!(pick("text/csv;q=0, */*;q=0.1"), Some(Format::Json));
        assert_eq!(pick("image/png"), None);
    }
}
