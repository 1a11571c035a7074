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
            ServerError::Query(e) if e.is_client_error() => StatusCode::BAD_REQUEST,
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
            _ => "internal",
        }
    }
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
