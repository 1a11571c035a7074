//! A lake table as exactly the files its manifest names.
//!
//! DataFusion's `ListingTable` resolves each URL by listing: a file that is
//! gone is taken for an empty folder, and its rows silently drop out of
//! the answer. Here the files come from the manifest with their sizes, so
//! nothing is listed, and a missing or unreadable file fails the query
//! when it is opened.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use object_store::path::Path;
use object_store::ObjectMeta;

/// The files of one table at one manifest version.
#[derive(Debug)]
pub(crate) struct ManifestFiles {
    schema: SchemaRef,
    store: ObjectStoreUrl,
    files: Vec<ObjectMeta>,
}

impl ManifestFiles {
    /// `files` are `(url, bytes)`: each file's full URL in one store.
    pub(crate) fn new(schema: SchemaRef, files: Vec<(url::Url, u64)>) -> Result<Self> {
        let store = match files.first() {
            Some((u, _)) => ObjectStoreUrl::parse(&u[..url::Position::BeforePath])?,
            None => ObjectStoreUrl::local_filesystem(),
        };
        let files = files
            .into_iter()
            .map(|(u, size)| {
                Ok(ObjectMeta {
                    location: Path::from_url_path(u.path())
                        .map_err(|e| DataFusionError::External(Box::new(e)))?,
                    // Not used to read a file; the manifest has no mtime.
                    last_modified: chrono::DateTime::UNIX_EPOCH,
                    size,
                    e_tag: None,
                    version: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(ManifestFiles {
            schema,
            store,
            files,
        })
    }
}

#[async_trait::async_trait]
impl TableProvider for ManifestFiles {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters reach the Parquet reader for row-group pruning, and are
    /// applied again above it.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The session's Parquet options, filter pushdown among them (see
        // `QueryEngine::empty_session`); the format's own defaults would leave
        // it off whatever the session says.
        let format = ParquetFormat::default().with_options(state.default_table_options().parquet);
        // Round robin over as many groups as the session reads in
        // parallel; no row statistics are declared, so that `count(*)`
        // opens every file too, and a missing one fails it.
        let n = state
            .config()
            .target_partitions()
            .max(1)
            .min(self.files.len().max(1));
        let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); n];
        for (i, meta) in self.files.iter().enumerate() {
            groups[i % n].push(PartitionedFile::new_from_meta(meta.clone()));
        }
        let config = FileScanConfigBuilder::new(
            self.store.clone(),
            format.file_source(self.schema.clone().into()),
        )
        .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
        .with_projection_indices(projection.cloned())?
        .with_limit(limit)
        .build();
        format.create_physical_plan(state, config).await
    }
}
