//! `POST /v1/logs`: OpenTelemetry log exports over OTLP/HTTP, each log
//! record a lease event (the mapping: `leaseline_ingest::otlp`).
//!
//! What a client sees, as OTLP/HTTP asks:
//! - `Content-Type: application/x-protobuf` or `application/json` picks the
//!   encoding, and the answer comes in the same one; anything else is 415.
//!   `Content-Encoding: gzip` is taken (the Collector's default).
//! - 200 once the records are committed to the lake; refused records are
//!   counted in a partial success with their reasons, and kept in
//!   `lease_rejects`.
//! - 400 for a body that is not OTLP logs (kept in `lease_rejects` as
//!   `invalid_otlp`); a client does not retry it.
//! - 503 with `Retry-After` while ingest is not running, or when the
//!   commit failed: the client retries, and the lake keeps each record once.
//! - 404 when `serve` runs without the intake (`--otlp-logs`).
//!
//! Errors carry a `google.rpc.Status` body in the request's encoding.

use std::io::Read;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use leaseline_ingest::otlp::{export_response, status_body, Encoding};
use leaseline_ingest::IntakeError;
use tracing::{info, warn};

use crate::error::ServerError;
use crate::http::AppState;

/// The largest body taken, after decompression.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

/// gRPC codes of the `Status` body.
const INVALID_ARGUMENT: i32 = 3;
const UNAVAILABLE: i32 = 14;

fn answer(status: StatusCode, encoding: Encoding, body: Vec<u8>) -> Response {
    let ct = match encoding {
        Encoding::OtlpProto => PROTOBUF,
        _ => JSON,
    };
    (status, [(header::CONTENT_TYPE, ct)], body).into_response()
}

fn refuse(status: StatusCode, code: i32, message: &str, encoding: Encoding) -> Response {
    let mut r = answer(status, encoding, status_body(code, message, encoding));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    r
}

pub async fn logs(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(intake) = &s.intake else {
        return ServerError::NotFound(
            "the OTLP log intake is off: start serve with --otlp-logs (serve.otlp_logs = true)"
                .into(),
        )
        .into_response();
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let encoding = match content_type.as_str() {
        PROTOBUF => Encoding::OtlpProto,
        JSON => Encoding::OtlpJson,
        other => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                INVALID_ARGUMENT,
                &format!("Content-Type {other:?}: OTLP/HTTP takes {PROTOBUF} or {JSON}"),
                Encoding::OtlpJson,
            )
        }
    };
    let body = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("identity") | Some("") => body,
        Some("gzip") => match gunzip(&body) {
            Ok(b) => Bytes::from(b),
            Err(message) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    INVALID_ARGUMENT,
                    &message,
                    encoding,
                )
            }
        },
        Some(other) => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                INVALID_ARGUMENT,
                &format!("Content-Encoding {other:?}: gzip or none"),
                encoding,
            )
        }
    };
    match intake.logs(body, encoding).await {
        Ok(acc) => {
            let message = acc
                .rejected
                .iter()
                .take(10)
                .map(|(n, e)| format!("record {n}: {e}"))
                .collect::<Vec<_>>()
                .join("; ");
            if !acc.rejected.is_empty() {
                warn!(
                    rejected = acc.rejected.len(),
                    events = acc.events,
                    first = %message,
                    "OTLP log records refused, kept in lease_rejects"
                );
            }
            info!(
                events = acc.events,
                duplicates = acc.duplicates,
                rejected = acc.rejected.len(),
                "OTLP logs committed"
            );
            answer(
                StatusCode::OK,
                encoding,
                export_response(acc.rejected.len(), &message, encoding),
            )
        }
        Err(IntakeError::Invalid(e)) => {
            warn!(error = %e, "OTLP body refused, kept in lease_rejects");
            refuse(
                StatusCode::BAD_REQUEST,
                INVALID_ARGUMENT,
                &e.to_string(),
                encoding,
            )
        }
        Err(e @ (IntakeError::NotRunning | IntakeError::NotCommitted(_))) => {
            warn!(error = %e, "OTLP export not committed; the client is told to retry");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                UNAVAILABLE,
                &e.to_string(),
                encoding,
            )
        }
    }
}

/// Inflates a gzip body, refusing one that inflates past [`MAX_BODY`].
fn gunzip(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the gzip body does not inflate: {e}"))?;
    if out.len() > MAX_BODY {
        return Err(format!("the body inflates past {MAX_BODY} bytes"));
    }
    Ok(out)
}
