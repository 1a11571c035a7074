//! The alert crate's one error type.

/// What can go wrong in the alert engine, its delivery and its history.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    /// The `[alerts]` configuration is impossible; the message names the field.
    #[error("alert configuration: {0}")]
    Config(String),
    #[error("alert history: {0}")]
    Lake(#[from] leaseline_lake::LakeError),
    #[error("alert history: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("alert history: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("rebuilding alerts from the lake: {0}")]
    Read(#[from] leaseline_schema::ReadError),
}

pub type Result<T, E = AlertError> = std::result::Result<T, E>;
