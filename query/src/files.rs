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
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The session's Parquet options; the format's own defaults would
        // ignore them. Whether filters are applied while decoding is this
        // scan's own choice (the session leaves it off).
        let mut options = state.default_table_options().parquet;
        options.global.pushdown_filters = decode_filtered(filters);
        let format = ParquetFormat::default().with_options(options);
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

/// Kinds of event that come with every keepalive or every grant: a filter
/// keeping one of them keeps a large share of a lease's events.
const BULK_KINDS: [&str; 3] = ["renewed", "write_accepted", "acquired"];

/// Columns with a handful of values across the whole lake.
const FEW_VALUED: [&str; 2] = ["source", "backend"];

/// Whether a scan with these filters applies them while Parquet is decoded
/// ("late materialization": the filters' own columns first, the others
/// only for the rows they keep) rather than on whole decoded batches.
///
/// Decoding by selection pays when the filters keep few rows: one lease,
/// one holder, a violation's event ids, a rare kind such as
/// `write_rejected` (five times faster on a 50 M-event lake). When they
/// keep a large share spread over every row group, skipping costs more
/// than it saves: the holders' keepalives, a third of all events, took
/// twice as long, and `acquired`, a tenth, 1.2 times (BENCHMARKS.md). So
/// every filter of the scan must be one of those wide ones for it to
/// decode whole batches: on `kind` keeping a [`BULK_KINDS`] kind, on a
/// [`FEW_VALUED`] column, or on a column's nullness. A scan with no filter
/// at all still decodes by selection: a join's or a top-k's filter, made
/// while the query runs (the ids of a violation's evidence), reaches it
/// then. Either way row groups are pruned by the filters' statistics.
pub(crate) fn decode_filtered(filters: &[Expr]) -> bool {
    use datafusion::logical_expr::utils::split_conjunction;
    filters.is_empty()
        || filters
            .iter()
            .flat_map(|f| split_conjunction(f))
            .any(|f| !keeps_many(f))
}

/// Whether one conjunct surely keeps a large share of the rows.
fn keeps_many(filter: &Expr) -> bool {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    use datafusion::scalar::ScalarValue;
    fn column(e: &Expr) -> Option<&str> {
        match e {
            Expr::Column(c) => Some(c.name.as_str()),
            Expr::Cast(c) => column(&c.expr),
            Expr::TryCast(c) => column(&c.expr),
            _ => None,
        }
    }
    fn text(e: &Expr) -> Option<&str> {
        match e {
            Expr::Literal(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::Utf8View(Some(s))
                | ScalarValue::LargeUtf8(Some(s)),
                _,
            ) => Some(s.as_str()),
            Expr::Cast(c) => text(&c.expr),
            _ => None,
        }
    }
    // `col` equal to one of `values`, each a literal text or `None`.
    let keeps = |col: &str, values: Vec<Option<&str>>| {
        values.iter().all(Option::is_some)
            && (FEW_VALUED.contains(&col)
                || (col == "kind" && values.iter().flatten().any(|v| BULK_KINDS.contains(v))))
    };
    match filter {
        Expr::IsNotNull(_) | Expr::IsNull(_) => true,
        // Keeps at least what either side keeps. A short IN list reaches
        // the scan as such a chain.
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => keeps_many(left) || keeps_many(right),
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) => match (column(left), column(right)) {
            (Some(c), None) => keeps(c, vec![text(right)]),
            (None, Some(c)) => keeps(c, vec![text(left)]),
            _ => false,
        },
        Expr::InList(list) if !list.negated => match column(&list.expr) {
            Some(c) => keeps(c, list.list.iter().map(text).collect()),
            None => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    #[test]
    fn filters_keeping_few_rows_are_applied_while_decoding() {
        for narrow in [
            col("lease_id").eq(lit("orders/00004")),
            col("kind").eq(lit("write_rejected")),
            col("kind").in_list(vec![lit("expired"), lit("fenced")], false),
            col("kind")
                .eq(lit("expired"))
                .or(col("kind").eq(lit("fenced"))),
            col("event_id").in_list(vec![lit("a"), lit("b")], false),
            col("ts").gt(lit(5)),
            // Not sure to keep many: the default holds.
            col("kind").not_eq(lit("renewed")),
            col("kind").in_list(vec![lit("renewed")], true),
        ] {
            assert!(decode_filtered(std::slice::from_ref(&narrow)), "{narrow}");
            // One narrow filter among wide ones is enough.
            let with_wide = [col("source").eq(lit("holder")), narrow.clone()];
            assert!(decode_filtered(&with_wide), "{narrow} with a wide one");
            assert!(
                decode_filtered(&[col("backend").is_not_null().and(narrow.clone())]),
                "{narrow} in a conjunction"
            );
        }
        // No filter: a join's or a top-k's may come while the query runs.
        assert!(decode_filtered(&[]));
    }

    #[test]
    fn filters_keeping_a_large_share_of_rows_are_applied_to_whole_batches() {
        // Keepalive health and slow acquisitions (docs/incident-queries.md).
        let keepalives = [
            col("kind").in_list(vec![lit("renewed"), lit("renew_failed")], false),
            col("source").eq(lit("holder")),
        ];
        assert!(!decode_filtered(&keepalives));
        // The same IN list as the planner hands it to the scan.
        let chained = col("kind")
            .eq(lit("renewed"))
            .or(col("kind").eq(lit("renew_failed")));
        assert!(!decode_filtered(&[
            chained,
            col("source").eq(lit("holder"))
        ]));
        let acquisitions = [col("kind")
            .eq(lit("acquired"))
            .and(col("latency_ms").is_not_null())];
        assert!(!decode_filtered(&acquisitions));
        assert!(!decode_filtered(&[lit("backend-a").eq(col("backend"))]));
        assert!(!decode_filtered(&[col("kind").eq(lit("write_accepted"))]));
    }
}
