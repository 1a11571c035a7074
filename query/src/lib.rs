//! SQL over the leaseline lake.
//!
//! What enters: SQL text, and a [`Lake`] whose newest manifest names the
//! data files of each table.
//! What leaves: Arrow record batches, or a [`QueryError`] that says whether
//! the query was at fault (a client error) or leaseline was.
//!
//! Tables: `lease_events` and `lease_rejects` (the lake's Parquet files),
//! and the audit's `lease_timeline`, `lease_violations` and `lease_holders`
//! (computed by `leaseline-audit` from `lease_events`, see [`audit`]).
//!
//! Key types: [`QueryEngine`] (a read-only DataFusion session per query over
//! a manifest snapshot), [`AuditCache`], [`QueryError`].
//!
//! Each query sees one manifest version: files that compaction replaces
//! after the snapshot stay on storage for the retention period, so a query
//! never sees a row twice or misses one.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::catalog::TableProvider;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use leaseline_audit::AuditConfig;
use leaseline_lake::{parquet_io, Lake, LakeError, Manifest, Table};
use leaseline_schema::ReadError;

pub mod audit;

pub use crate::audit::{AuditCache, AuditTables, AuditView};
use crate::audit::{AuditSource, AuditTableProvider};

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// DataFusion's own category is kept so a caller can tell a bad query
    /// from a bug: see [`QueryError::is_client_error`].
    #[error("{0}")]
    DataFusion(#[from] DataFusionError),
    #[error("lake: {0}")]
    Lake(#[from] LakeError),
    /// A `lease_events` file the audit could not read as events.
    #[error("{0}")]
    Events(#[from] ReadError),
}

impl QueryError {
    /// True when the query itself is wrong (syntax, unknown column, a
    /// refused statement): HTTP 400 rather than 500.
    pub fn is_client_error(&self) -> bool {
        match self {
            QueryError::DataFusion(e) => is_client_error(e),
            QueryError::Lake(_) | QueryError::Events(_) => false,
        }
    }

    /// True when the query ran out of its memory or other resource budget.
    pub fn is_resource_exhausted(&self) -> bool {
        matches!(self, QueryError::DataFusion(e) if matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)))
    }
}

fn is_client_error(e: &DataFusionError) -> bool {
    match e.find_root() {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => true,
        DataFusionError::Context(_, inner) => is_client_error(inner),
        _ => false,
    }
}

pub type Result<T, E = QueryError> = std::result::Result<T, E>;

/// Runs read-only SQL over the lake.
#[derive(Debug, Clone)]
pub struct QueryEngine {
    lake: Lake,
    audit: Arc<AuditCache>,
}

impl QueryEngine {
    /// An engine with the audit's default tolerances.
    pub fn new(lake: Lake) -> Self {
        Self::with_audit_config(lake, AuditConfig::default())
    }

    pub fn with_audit_config(lake: Lake, config: AuditConfig) -> Self {
        QueryEngine {
            lake,
            audit: Arc::new(AuditCache::new(config)),
        }
    }

    pub fn audit_cache(&self) -> &Arc<AuditCache> {
        &self.audit
    }

    /// The audit's tables of the lake's newest version.
    pub async fn audit_tables(&self) -> Result<Arc<AuditTables>> {
        let m = self.lake.latest().await?;
        self.audit.tables(&self.lake, &m).await
    }

    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    /// A session with every table of the lake's newest version registered.
    pub async fn session(&self) -> Result<SessionContext> {
        let manifest = self.lake.latest().await?;
        self.session_at(&manifest)
    }

    /// A session over one manifest snapshot.
    pub fn session_at(&self, manifest: &Manifest) -> Result<SessionContext> {
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("leaseline", "public");
        let ctx = SessionContext::new_with_config(config);
        let store = self.lake.store();
        // A local lake's store is rooted at the lake directory, while
        // DataFusion resolves file:// URLs from the file system root with
        // its own store; remote stores are rooted at the bucket, as
        // DataFusion expects.
        if !store.is_local() {
            ctx.register_object_store(store.url(), store.object_store());
        }
        for table in Table::ALL {
            ctx.register_table(table.name(), self.table_provider(manifest, table)?)?;
        }
        let source = Arc::new(AuditSource::new(
            self.lake.clone(),
            manifest.clone(),
            self.audit.clone(),
        ));
        for view in AuditView::ALL {
            ctx.register_table(
                view.name(),
                Arc::new(AuditTableProvider {
                    view,
                    source: source.clone(),
                }),
            )?;
        }
        Ok(ctx)
    }

    fn table_provider(&self, m: &Manifest, table: Table) -> Result<Arc<dyn TableProvider>> {
        let schema = parquet_io::schema_of(table);
        let urls: Vec<ListingTableUrl> = m
            .files_of(table)
            .map(|f| {
                let url = self
                    .lake
                    .store()
                    .url()
                    .join(&f.path)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                ListingTableUrl::parse(url.as_str())
            })
            .collect::<Result<_, DataFusionError>>()?;
        if urls.is_empty() {
            return Ok(Arc::new(MemTable::try_new(schema, vec![vec![]])?));
        }
        let options =
            ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(options)
            .with_schema(schema);
        Ok(Arc::new(ListingTable::try_new(config)?))
    }

    /// Runs one read-only statement and collects its result.
    pub async fn sql(&self, query: &str) -> Result<Vec<RecordBatch>> {
        let ctx = self.session().await?;
        run_read_only(&ctx, query).await
    }
}

/// Statements that could change anything (DDL, DML, `SET`, `COPY`) are
/// refused: every query surface is read-only.
pub fn read_only_options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Runs `query` in `ctx` with [`read_only_options`].
pub async fn run_read_only(ctx: &SessionContext, query: &str) -> Result<Vec<RecordBatch>> {
    let df = ctx.sql_with_options(query, read_only_options()).await?;
    Ok(df.collect().await?)
}
