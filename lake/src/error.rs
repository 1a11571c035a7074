use thiserror::Error;

/// Everything that can go wrong reading or writing the lake.
#[derive(Debug, Error)]
pub enum LakeError {
    #[error("invalid lake location {location:?}: {reason}")]
    Location { location: String, reason: String },
    /// A reader was pointed at a location that holds no lake. Readers never
    /// create one, so that a typo is an error rather than an empty answer.
    #[error("no lake at {location}: {reason}")]
    NotFound { location: String, reason: String },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Another writer committed a version this commit did not account for.
    /// The caller reloads the latest manifest and decides again.
    #[error("commit conflict at lake version {version}: {reason}")]
    Conflict { version: u64, reason: String },
    #[error("delta: {0}")]
    Delta(String),
    #[error("local file system: {0}")]
    Io(#[from] std::io::Error),
    #[error("lake schema version {found} is newer than this leaseline understands ({supported})")]
    SchemaVersion { found: u32, supported: u32 },
}

impl From<deltalake::DeltaTableError> for LakeError {
    fn from(e: deltalake::DeltaTableError) -> Self {
        match e {
            deltalake::DeltaTableError::ObjectStore { source } => LakeError::Store(source),
            other => LakeError::Delta(other.to_string()),
        }
    }
}

impl From<object_store::path::Error> for LakeError {
    fn from(e: object_store::path::Error) -> Self {
        LakeError::Store(e.into())
    }
}

pub type Result<T, E = LakeError> = std::result::Result<T, E>;
