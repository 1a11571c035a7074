use thiserror::Error;

/// Errors of the ingest pipeline. A malformed message is never one of
/// these: it becomes a row of `lease_rejects`.
#[derive(Debug, Error)]
pub enum IngestError {
    #[error("lake: {0}")]
    Lake(#[from] leaseline_lake::LakeError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("ingest stopped before its data was committed: {0}")]
    Aborted(String),
}

pub type Result<T, E = IngestError> = std::result::Result<T, E>;
