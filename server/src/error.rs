//! The crate's error, and how the HTTP API answers it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use leaseline_query::QueryError;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A request the API cannot take: a bad parameter or body.
    #[error("{0}")]
    BadRequest(String),
    /// No format the client accepts.
    #[error("{0}")]
    NotAcceptable(String),
    /// What the request names does not exist (a lease with no events).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ServerError {
    pub fn status(&self) -> StatusCode {
        match self {
            ServerError::Query(e) if e.is_client_error() || e.is_bad_value() => {
                StatusCode::BAD_REQUEST
            }
            ServerError::Query(e) if e.is_resource_exhausted() => StatusCode::SERVICE_UNAVAILABLE,
            ServerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServerError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            ServerError::NotFound(_) => StatusCode::NOT_FOUND,
            ServerError::Query(_) | ServerError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable name of the status, for scripts.
    fn kind(status: StatusCode) -> &'static str {
        match status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::SERVICE_UNAVAILABLE => "resource_exhausted",
            StatusCode::NOT_ACCEPTABLE => "not_acceptable",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            s if s.is_client_error() => "bad_request",
            _ => "internal",
        }
    }
}

/// Middleware: every error the API answers is JSON, as its own handlers'
/// are. axum's extractors (a query string that does not parse, an unknown
/// route, a wrong method) answer in plain text or with no body; their
/// text becomes the `message`.
pub async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        // OTLP/HTTP answers its errors in protobuf when asked in it.
        .is_some_and(|v| {
            v.starts_with("application/json") || v.starts_with("application/x-protobuf")
        });
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // Extractor messages are short; a large body is not one of them.
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut out = (
        status,
        Json(Body {
            error: ServerError::kind(status),
            message,
        }),
    )
        .into_response();
    // Keep what the response said besides its body (Allow, WWW-Authenticate).
    for (k, v) in parts.headers.iter() {
        if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: String,
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, status = status.as_u16(), "request failed");
        }
        let body = Body {
            error: ServerError::kind(status),
            message: self.to_string(),
        };
        (status, Json(body)).into_response()
    }
}
