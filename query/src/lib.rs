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
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use futures::TryStreamExt;
use leaseline_audit::AuditConfig;
use leaseline_lake::{parquet_io, Lake, LakeError, Manifest, PendingRows, PendingSnapshot, Table};
use leaseline_schema::ReadError;

/// The alert history table, written by `leaseline-alerts` under this folder
/// of the lake.
pub const ALERTS_TABLE: &str = "lease_alerts";

pub mod audit;
mod coop;
pub mod depth;
pub mod executor;
mod files;
mod limits;
pub mod memory;
pub mod output;
mod stored;

pub use crate::audit::{AuditCache, AuditTables, AuditView, LiveAudit};
use crate::audit::{AuditSource, AuditTableProvider};
pub use crate::depth::MAX_EXPR_DEPTH;
pub use crate::limits::QueryLimits;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// DataFusion's own category is kept so a caller can tell a bad query
    /// from a bug: see [`QueryError::is_client_error`].
    #[error("{}", describe(.0))]
    DataFusion(#[from] DataFusionError),
    #[error("lake: {0}")]
    Lake(#[from] LakeError),
    /// A `lease_events` file the audit could not read as events.
    #[error("{0}")]
    Events(#[from] ReadError),
    /// The query ran longer than [`QueryLimits::timeout`].
    #[error("query timed out after {0:?} (the limit is query.timeout)")]
    Timeout(std::time::Duration),
    /// Expressions nested deeper than [`MAX_EXPR_DEPTH`] (SQLSTATE 54001,
    /// statement too complex).
    #[error(
        "statement too complex: expressions nest more than {} levels deep (write long alternatives as `IN (...)`)",
        MAX_EXPR_DEPTH
    )]
    TooComplex,
    /// Files the manifest names are gone from storage: the query failed
    /// reading them, and any answer without them would be wrong.
    #[error(
        "the lake is damaged: {version} names {} data file{} that storage does not have: {}",
        missing.len(),
        if missing.len() == 1 { "" } else { "s" },
        missing.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
    )]
    Damaged {
        version: String,
        missing: Vec<String>,
    },
    /// Every place for a running query stayed taken for the queue timeout
    /// (HTTP 503, SQLSTATE 53300).
    #[error(
        "too many queries: {running} are running and none finished within {waited:?} (query.max_concurrent, query.queue_timeout)"
    )]
    Busy {
        running: usize,
        waited: std::time::Duration,
    },
    /// The query's task ended without an answer (it panicked).
    #[error("the query failed inside leaseline: {0}")]
    Aborted(String),
}

impl QueryError {
    /// True when the query itself is wrong (syntax, unknown column, a
    /// refused statement): HTTP 400 rather than 500.
    pub fn is_client_error(&self) -> bool {
        match self {
            QueryError::DataFusion(e) => is_client_error(e),
            QueryError::TooComplex => true,
            QueryError::Lake(_)
            | QueryError::Events(_)
            | QueryError::Timeout(_)
            | QueryError::Damaged { .. }
            | QueryError::Busy { .. }
            | QueryError::Aborted(_) => false,
        }
    }

    /// True when the query is well formed but a value it computes is
    /// refused: a division by zero, a string that does not cast, a month
    /// 13, an invalid regular expression, an overflow. The query's fault
    /// (HTTP 400), though it shows only once values are computed.
    pub fn is_bad_value(&self) -> bool {
        use datafusion::arrow::error::ArrowError;
        let QueryError::DataFusion(e) = self else {
            return false;
        };
        if invalid_regex(e) {
            return true;
        }
        match e.find_root() {
            DataFusionError::ArrowError(a, _) => matches!(
                a.as_ref(),
                ArrowError::DivideByZero
                    | ArrowError::CastError(_)
                    | ArrowError::ParseError(_)
                    | ArrowError::ArithmeticOverflow(_)
                    | ArrowError::InvalidArgumentError(_)
                    | ArrowError::ComputeError(_)
            ),
            // What functions say of their arguments (a negative count, an
            // unknown date_trunc unit); reading the lake fails otherwise
            // (I/O, object store, Parquet).
            DataFusionError::Execution(_) => true,
            _ => false,
        }
    }

    /// True when the query ran out of its memory or time budget: HTTP 503.
    pub fn is_resource_exhausted(&self) -> bool {
        match self {
            QueryError::Timeout(_) | QueryError::Busy { .. } => true,
            QueryError::DataFusion(e) => {
                matches!(e.find_root(), DataFusionError::ResourcesExhausted(_))
            }
            _ => false,
        }
    }
}

/// Back into DataFusion's error, for table providers: a DataFusion error
/// keeps its category, anything else is external.
pub(crate) fn into_datafusion(e: QueryError) -> DataFusionError {
    match e {
        QueryError::DataFusion(e) => e,
        other => DataFusionError::External(Box::new(other)),
    }
}

/// DataFusion's message for a person: each wrapper's text once, with no
/// Debug rendering of the parser's error and no backtrace.
fn describe(e: &DataFusionError) -> String {
    match e {
        // Its Display is `SQL error: ParserError("...")`; the parser's own
        // Display says the same thing readably.
        DataFusionError::SQL(p, _) => format!("SQL error: {p}"),
        DataFusionError::Context(ctx, inner) => format!("{ctx}: {}", describe(inner)),
        DataFusionError::Diagnostic(_, inner) => describe(inner),
        DataFusionError::Shared(inner) => describe(inner),
        DataFusionError::External(inner) => match inner.downcast_ref::<DataFusionError>() {
            Some(df) => describe(df),
            None => inner.to_string(),
        },
        other => other.strip_backtrace(),
    }
}

/// Every table a query can name, for hints in error messages.
pub fn table_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Table::QUERIED.iter().map(|t| t.name()).collect();
    names.extend(AuditView::ALL.iter().map(|v| v.name()));
    names
}

/// DataFusion says a pattern does not compile as `Context("Invalid
/// regex", External(..))`, and External alone says nothing.
fn invalid_regex(e: &DataFusionError) -> bool {
    match e {
        DataFusionError::Context(ctx, inner) => {
            ctx.starts_with("Invalid regex") || invalid_regex(inner)
        }
        DataFusionError::Diagnostic(_, inner) => invalid_regex(inner),
        DataFusionError::Shared(inner) => invalid_regex(inner),
        _ => false,
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

/// A collected query result.
#[derive(Debug, Clone)]
pub struct QueryResult {
    pub schema: arrow::datatypes::SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// A result read as it is computed: see [`QueryEngine::stream`].
pub struct QueryStream {
    pub schema: arrow::datatypes::SchemaRef,
    pub rows: futures::stream::BoxStream<'static, Result<RecordBatch>>,
    /// The lake version the query read.
    pub lake_version: u64,
    /// The lake version the audit's tables answered for, when the query
    /// read them: an earlier one than `lake_version` while the alert
    /// engine of a `serve --ingest` catches up (see [`LiveAudit`]).
    pub audit_version: Option<u64>,
}

/// What a [`QueryStream`] holds while rows remain.
struct Streaming {
    engine: QueryEngine,
    rx: Option<tokio::sync::mpsc::Receiver<Result<RecordBatch>>>,
    /// Dropping it aborts the query.
    work: tokio_util::task::AbortOnDropHandle<()>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Runs read-only SQL over the lake.
#[derive(Debug, Clone)]
pub struct QueryEngine {
    lake: Lake,
    audit: Arc<AuditCache>,
    /// The auditor of this process's alert engine, when it has one.
    live_audit: Option<Arc<LiveAudit>>,
    limits: QueryLimits,
    /// Rows an ingester in this process consumed but has not flushed.
    pending: Option<PendingRows>,
    /// Places for queries running at once, shared by every surface.
    admission: Arc<tokio::sync::Semaphore>,
    /// The memory every query of the process reserves from.
    pool: Arc<dyn MemoryPool>,
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
            live_audit: None,
            limits: QueryLimits::default(),
            pending: None,
            admission: Arc::new(tokio::sync::Semaphore::new(
                QueryLimits::default().max_concurrent.max(1),
            )),
            pool: memory::process_pool(&QueryLimits::default()),
        }
    }

    /// The same engine, also showing the rows an ingester in this process
    /// publishes before flushing them (`leaseline serve --ingest`).
    pub fn with_pending(mut self, pending: PendingRows) -> Self {
        self.pending = Some(pending);
        self
    }

    /// The same engine, answering the audit's tables from `auditor`
    /// whenever it holds a snapshot's events: the alert engine's, in a
    /// process that ingests (see [`LiveAudit`]).
    pub fn with_live_audit(mut self, auditor: leaseline_audit::SharedAuditor) -> Self {
        self.live_audit = Some(Arc::new(LiveAudit::new(auditor)));
        self
    }

    /// The alert engine's auditor as the audit tables see it, if given.
    pub fn live_audit(&self) -> Option<&Arc<LiveAudit>> {
        self.live_audit.as_ref()
    }

    /// What a query reads: a manifest and the rows not yet in it. Buffered
    /// rows come with the version they follow, and are read with exactly
    /// that version (a newer one may already hold them); without buffered
    /// rows, the newest version.
    async fn snapshot(&self) -> Result<(Manifest, Option<Arc<PendingSnapshot>>)> {
        if let Some(p) = &self.pending {
            let snap = p.snapshot();
            if !snap.is_empty() {
                if let Some(m) = &snap.base {
                    return Ok((Manifest::clone(m), Some(snap)));
                }
            }
        }
        Ok((self.lake.latest().await?, None))
    }

    /// The same engine with other per-query limits.
    pub fn with_limits(mut self, limits: QueryLimits) -> Self {
        executor::set_priority(limits.sched_idle, limits.nice);
        self.limits = limits;
        self.admission = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent.max(1)));
        self.pool = memory::process_pool(&limits);
        self
    }

    /// A place to run one query: at most [`QueryLimits::max_concurrent`]
    /// hold one at once; the others wait up to
    /// [`QueryLimits::queue_wait`], then are refused as busy. A flood of
    /// queries then slows into a queue instead of splitting the memory
    /// and cores until every one of them fails.
    pub async fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let wait = self.admission.clone().acquire_owned();
        let waited = self.limits.queue_wait();
        match tokio::time::timeout(waited, wait).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => Err(QueryError::Busy {
                running: self.limits.max_concurrent,
                waited,
            }),
        }
    }

    pub fn limits(&self) -> &QueryLimits {
        &self.limits
    }

    pub fn audit_cache(&self) -> &Arc<AuditCache> {
        &self.audit
    }

    /// The audit's tables of the lake's newest version.
    pub async fn audit_tables(&self) -> Result<Arc<AuditTables>> {
        let m = self.lake.latest().await?;
        self.audit_source(m, None).tables().await
    }

    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    /// A session with every table of the lake's newest version registered.
    pub async fn session(&self) -> Result<SessionContext> {
        Ok(self.session_and_audit().await?.0)
    }

    /// [`QueryEngine::session`], with the source of its audit tables and
    /// the lake version it reads.
    async fn session_and_audit(&self) -> Result<(SessionContext, Arc<AuditSource>, u64)> {
        let (manifest, pending) = self.snapshot().await?;
        let (ctx, source) = self.session_with(&manifest, pending.as_deref())?;
        Ok((ctx, source, manifest.version))
    }

    /// A session over one manifest snapshot.
    pub fn session_at(&self, manifest: &Manifest) -> Result<SessionContext> {
        Ok(self.session_with(manifest, None)?.0)
    }

    fn session_with(
        &self,
        manifest: &Manifest,
        pending: Option<&PendingSnapshot>,
    ) -> Result<(SessionContext, Arc<AuditSource>)> {
        let ctx = self.empty_session()?;
        for table in Table::QUERIED {
            ctx.register_table(table.name(), self.provider_with(manifest, table, pending)?)?;
        }
        let source = self.audit_source(manifest.clone(), pending);
        for view in AuditView::ALL {
            ctx.register_table(
                view.name(),
                Arc::new(AuditTableProvider {
                    view,
                    source: source.clone(),
                }),
            )?;
        }
        Ok((ctx, source))
    }

    /// A long-lived session whose tables read the lake's newest snapshot at
    /// every scan, for servers that keep one context (the PostgreSQL wire
    /// protocol). Its memory limit is shared by all queries that run in it
    /// at once.
    pub fn live_session(&self) -> Result<SessionContext> {
        let ctx = self.empty_session()?;
        for table in Table::QUERIED {
            ctx.register_table(
                table.name(),
                Arc::new(LiveTable {
                    engine: self.clone(),
                    kind: LiveKind::Lake(table),
                }),
            )?;
        }
        for view in AuditView::ALL {
            ctx.register_table(
                view.name(),
                Arc::new(LiveTable {
                    engine: self.clone(),
                    kind: LiveKind::Audit(view),
                }),
            )?;
        }
        Ok(ctx)
    }

    fn empty_session(&self) -> Result<SessionContext> {
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("leaseline", "public");
        // Hash joins collect their build side whole rather than hashing
        // both sides into partitions. The filter a join pushes into its
        // probe side's scan is then `event_id IN (...)` itself, which the
        // lake's bloom filters and statistics prune row groups by: looking
        // up a violation's evidence reads only the row groups of
        // `lease_events` that may hold its ids. Partitioned, the filter is
        // a per-partition CASE no pruning can read, and the whole probe
        // side is hashed and buffered between the two partitions. One
        // hash table holds no more than its partitions together.
        config.options_mut().optimizer.repartition_joins = false;
        // Whether filters are applied while Parquet is decoded is each
        // scan's choice, by what its filters keep
        // (`files::decode_filtered`): DataFusion decodes by selection when
        // either the session or the scan says so. The cheaper filters run
        // first.
        config.options_mut().execution.parquet.pushdown_filters = false;
        config.options_mut().execution.parquet.reorder_filters = true;
        // A runtime per session, so the memory limit is per query, drawing
        // on the process's pool. Spilling is off: a read-only service
        // writes no temporary files, and a query over its budget fails
        // clearly instead of filling a disk.
        let pool = memory::QueryPool::shared(self.pool.clone(), &self.limits);
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()?;
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(coop::AmplifiersCooperate))
            .build();
        let ctx = SessionContext::new_with_state(state);
        memory::bounded::install(&ctx, &pool);
        let store = self.lake.store();
        // A local lake's store is rooted at the lake directory, while
        // DataFusion resolves file:// URLs from the file system root with
        // its own store; remote stores are rooted at the bucket, as
        // DataFusion expects.
        if !store.is_local() {
            ctx.register_object_store(store.url(), store.object_store());
        }
        Ok(ctx)
    }

    /// What the audit tables of one snapshot are computed from.
    fn audit_source(&self, m: Manifest, pending: Option<&PendingSnapshot>) -> Arc<AuditSource> {
        Arc::new(AuditSource::new(
            self.lake.clone(),
            m,
            self.audit.clone(),
            self.live_audit.clone(),
            pending.map(|p| p.events.clone()).unwrap_or_default(),
        ))
    }

    /// The lake's files of `table`, plus the buffered rows if any.
    fn provider_with(
        &self,
        m: &Manifest,
        table: Table,
        pending: Option<&PendingSnapshot>,
    ) -> Result<Arc<dyn TableProvider>> {
        let lake = self.table_provider(m, table)?;
        let rows = pending.map(|p| p.rows_of(table)).unwrap_or_default();
        if rows.iter().all(|b| b.num_rows() == 0) {
            return Ok(lake);
        }
        let mem = MemTable::try_new(parquet_io::schema_of(table), vec![rows.to_vec()])?;
        Ok(Arc::new(WithPending {
            lake,
            pending: Arc::new(mem),
        }))
    }

    fn table_provider(&self, m: &Manifest, table: Table) -> Result<Arc<dyn TableProvider>> {
        let schema = parquet_io::schema_of(table);
        let files: Vec<(url::Url, u64)> = m
            .files_of(table)
            .map(|f| {
                let url = self
                    .lake
                    .store()
                    .url()
                    .join(&f.path)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                Ok((url, f.bytes))
            })
            .collect::<Result<_, DataFusionError>>()?;
        if files.is_empty() {
            return Ok(Arc::new(MemTable::try_new(schema, vec![vec![]])?));
        }
        Ok(Arc::new(files::ManifestFiles::new(schema, files)?))
    }

    /// Runs one read-only statement under the engine's limits and collects
    /// its result.
    pub async fn sql(&self, query: &str) -> Result<Vec<RecordBatch>> {
        Ok(self.query(query).await?.batches)
    }

    /// Like [`QueryEngine::sql`], with the result's schema (which an empty
    /// result still has).
    pub async fn query(&self, query: &str) -> Result<QueryResult> {
        let stream = self.stream(query, None).await?;
        let schema = stream.schema.clone();
        let batches = stream.rows.try_collect().await?;
        Ok(QueryResult { schema, batches })
    }

    /// Runs one read-only statement under the engine's limits; its rows
    /// are computed while they are read, a few batches ahead of the
    /// reader. `max_rows` keeps the first rows only, as a `LIMIT` around
    /// the query would.
    ///
    /// Errors before the first row (a bad query, a damaged lake, the
    /// memory limit reached at once) are this call's; later ones end the
    /// stream. The query's place among the running ones and its timeout
    /// last until the last row is read or the stream is dropped: a reader
    /// that stops reading is cut off at the timeout, and dropping the
    /// stream stops the query.
    #[tracing::instrument(name = "sql.query", skip_all, fields(sql = %query))]
    pub async fn stream(&self, query: &str, max_rows: Option<usize>) -> Result<QueryStream> {
        use futures::StreamExt;

        let permit = self.admit().await?;
        let limit = self.limits.timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        // Two batches ahead: enough to keep the plan busy while one is
        // sent, and the most a slow reader makes the server hold.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        let engine = self.clone();
        let query = query.to_string();
        let work = executor::spawn(async move {
            let started = async {
                depth::check(&query).map_err(|_| QueryError::TooComplex)?;
                let (ctx, audit, lake_version) = engine.session_and_audit().await?;
                let mut df = ctx.sql_with_options(&query, read_only_options()).await?;
                if let Some(n) = max_rows {
                    df = df.limit(0, Some(n))?;
                }
                let schema = Arc::new(df.schema().as_arrow().clone());
                let mut rows = df.execute_stream().await?;
                let first = rows.next().await.transpose()?;
                // Scans of the audit's tables have run by the first batch.
                let versions = (lake_version, audit.answered_version());
                Ok::<_, QueryError>((schema, first, versions, rows))
            };
            match started.await {
                Err(e) => {
                    let _ = first_tx.send(Err(e));
                }
                Ok((schema, first, versions, mut rows)) => {
                    let more = first.is_some();
                    if first_tx.send(Ok((schema, first, versions))).is_err() || !more {
                        return;
                    }
                    while let Some(batch) = rows.next().await {
                        let failed = batch.is_err();
                        if tx.send(batch.map_err(QueryError::from)).await.is_err() || failed {
                            return;
                        }
                    }
                }
            }
        });
        let (schema, first, (lake_version, audit_version)) =
            match tokio::time::timeout_at(deadline, first_rx).await {
                Err(_) => return Err(QueryError::Timeout(limit)),
                Ok(Err(_)) => {
                    // The task ended without a word: it panicked.
                    return Err(match work.await {
                        Err(join) => QueryError::Aborted(join.to_string()),
                        Ok(()) => QueryError::Aborted("the query ended without an answer".into()),
                    });
                }
                Ok(Ok(Err(e))) => return Err(self.diagnose(e).await),
                Ok(Ok(Ok(started))) => started,
            };
        let state = Streaming {
            engine: self.clone(),
            rx: first.is_some().then_some(rx),
            work,
            _permit: permit,
        };
        let head = futures::stream::iter(first.map(Ok));
        let tail = futures::stream::unfold(Some(state), move |state| async move {
            let mut st = state?;
            let rx = st.rx.as_mut()?;
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => Some((Err(QueryError::Timeout(limit)), None)),
                Ok(None) => match (&mut st.work).await {
                    // The task ended early: it panicked.
                    Err(join) => Some((Err(QueryError::Aborted(join.to_string())), None)),
                    Ok(()) => None,
                },
                Ok(Some(Ok(batch))) => Some((Ok(batch), Some(st))),
                Ok(Some(Err(e))) => {
                    let e = st.engine.diagnose(e).await;
                    Some((Err(e), None))
                }
            }
        });
        Ok(QueryStream {
            schema,
            rows: head.chain(tail).boxed(),
            lake_version,
            audit_version,
        })
    }

    /// Runs `work` on the query runtime (see [`executor`]) under the
    /// engine's query timeout. On timeout, or when the caller stops
    /// waiting, the work is aborted, not only abandoned.
    pub async fn with_timeout<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let _permit = self.admit().await?;
        match tokio::time::timeout(self.limits.timeout, executor::spawn(work)).await {
            Err(_) => Err(QueryError::Timeout(self.limits.timeout)),
            Ok(Err(join)) => Err(QueryError::Aborted(join.to_string())),
            Ok(Ok(Ok(r))) => Ok(r),
            Ok(Ok(Err(e))) => Err(self.diagnose(e).await),
        }
    }

    /// A failure to read the lake may be damage: files the manifest names
    /// that storage lost. Then that is the error, not the reader's
    /// message about one file.
    async fn diagnose(&self, e: QueryError) -> QueryError {
        if e.is_client_error() || e.is_resource_exhausted() {
            return e;
        }
        match self.lake.check_files().await {
            Ok((m, missing)) if !missing.is_empty() => QueryError::Damaged {
                version: m.versions_naming(&missing),
                missing,
            },
            _ => e,
        }
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

/// The commits the live tables of a statement read: the newest lake
/// version any of its scans took, and the oldest version the audit's tables
/// answered for. A surface that plans through one long-lived session (the
/// PostgreSQL protocol) learns them with [`recording_versions`], since its
/// scans each take the newest snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VersionsRead {
    pub lake: Option<u64>,
    pub audit: Option<u64>,
}

impl VersionsRead {
    /// The audit's tables answered for an earlier commit than the lake's
    /// tables were read at (the alert engine is catching up).
    pub fn audit_behind(&self) -> Option<(u64, u64)> {
        match (self.audit, self.lake) {
            (Some(audit), Some(lake)) if audit < lake => Some((audit, lake)),
            _ => None,
        }
    }

    fn note(&mut self, lake: u64, audit: Option<u64>) {
        self.lake = Some(self.lake.map_or(lake, |v| v.max(lake)));
        if let Some(a) = audit {
            self.audit = Some(self.audit.map_or(a, |v| v.min(a)));
        }
    }
}

tokio::task_local! {
    static VERSIONS_READ: std::cell::Cell<VersionsRead>;
}

/// Runs `work` (the planning of statements over a [`QueryEngine::live_session`])
/// and returns what its live tables' scans read. Scans run while a plan is
/// made, so `work` must include making the physical plan.
pub async fn recording_versions<F: std::future::Future>(work: F) -> (F::Output, VersionsRead) {
    VERSIONS_READ
        .scope(std::cell::Cell::new(VersionsRead::default()), async move {
            let out = work.await;
            (out, VERSIONS_READ.with(std::cell::Cell::get))
        })
        .await
}

/// Which table a [`LiveTable`] is.
#[derive(Debug, Clone, Copy)]
enum LiveKind {
    Lake(Table),
    Audit(AuditView),
}

/// A table that resolves the lake's newest snapshot when scanned. It only
/// scans: writes through it are refused by DataFusion's defaults.
#[derive(Debug)]
struct LiveTable {
    engine: QueryEngine,
    kind: LiveKind,
}

#[async_trait::async_trait]
impl TableProvider for LiveTable {
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        match self.kind {
            LiveKind::Lake(t) => parquet_io::schema_of(t),
            LiveKind::Audit(v) => v.schema(),
        }
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        // The audit's tables are tables to their users: psql's `\dt` and
        // Grafana's table picker list base tables only.
        datafusion::datasource::TableType::Base
    }

    /// As the table it resolves to. Without this the lake's scans get no
    /// filters: the plan's predicate still reaches the Parquet reader
    /// later, for pruning, but a scan given no filters decodes by
    /// selection, twice the work for a filter that keeps the keepalives
    /// (`files::decode_filtered`).
    fn supports_filters_pushdown(
        &self,
        filters: &[&datafusion::logical_expr::Expr],
    ) -> datafusion::error::Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        use datafusion::logical_expr::TableProviderFilterPushDown::{Inexact, Unsupported};
        Ok(vec![
            match self.kind {
                LiveKind::Lake(_) => Inexact,
                LiveKind::Audit(_) => Unsupported,
            };
            filters.len()
        ])
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::logical_expr::Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        let (m, pending) = self.engine.snapshot().await.map_err(into_datafusion)?;
        let version = m.version;
        let (provider, source): (Arc<dyn TableProvider>, _) = match self.kind {
            LiveKind::Lake(t) => (
                self.engine
                    .provider_with(&m, t, pending.as_deref())
                    .map_err(into_datafusion)?,
                None,
            ),
            LiveKind::Audit(view) => {
                let source = self.engine.audit_source(m, pending.as_deref());
                let provider = Arc::new(AuditTableProvider {
                    view,
                    source: source.clone(),
                });
                (provider, Some(source))
            }
        };
        let plan = provider.scan(state, projection, filters, limit).await?;
        // The audit's scan has derived its tables by now.
        let audit = source.and_then(|s| s.answered_version());
        let _ = VERSIONS_READ.try_with(|read| {
            let mut r = read.get();
            r.note(version, audit);
            read.set(r);
        });
        Ok(plan)
    }
}

/// A lake table with rows not yet flushed to it: a union of the two scans.
#[derive(Debug)]
struct WithPending {
    lake: Arc<dyn TableProvider>,
    pending: Arc<MemTable>,
}

#[async_trait::async_trait]
impl TableProvider for WithPending {
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        self.lake.schema()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    /// The lake's scan takes the filters, as [`LiveTable`]'s; the buffered
    /// rows are few, and the filters run again above both.
    fn supports_filters_pushdown(
        &self,
        filters: &[&datafusion::logical_expr::Expr],
    ) -> datafusion::error::Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        Ok(vec![
            datafusion::logical_expr::TableProviderFilterPushDown::Inexact;
            filters.len()
        ])
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::logical_expr::Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        let lake = self.lake.scan(state, projection, filters, limit).await?;
        let pending = self.pending.scan(state, projection, filters, limit).await?;
        datafusion::physical_plan::union::UnionExec::try_new(vec![lake, pending])
    }
}
