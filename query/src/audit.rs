//! The audit's answers as SQL tables: `lease_timeline`, `lease_violations`
//! and `lease_holders`.
//!
//! They are computed by `leaseline-audit` (the same engine the alerts run)
//! from the `lease_events` rows of one manifest snapshot. An [`AuditCache`]
//! keeps the engine between queries and feeds it only the files a newer
//! snapshot appended, so the common case (a few new files since the last
//! query) costs little and a repeated query costs nothing. A compaction
//! (the same rows in new files) changes nothing the engine holds, so the
//! files it wrote stand for those it replaced; a snapshot that removed
//! rows (an expiry), or whose compacted files hold rows the engine never
//! had, is audited from scratch. The tables are only computed when a
//! query scans one of them.
//!
//! A process that also feeds an alert engine (`serve --ingest`) gives its
//! auditor to the query engine as a [`LiveAudit`]: when that auditor holds
//! exactly a snapshot's events (see [`SharedAuditor`]), the tables come
//! from it and the cache stays empty, so the process keeps one copy of the
//! history. Rows an ingester has buffered but not committed are then not in
//! the derived tables until their commit, a fraction of a second later.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use leaseline_audit::table::{holders_batch, timeline_batch, violations_batch};
use leaseline_audit::window::HeldWindow;
use leaseline_audit::{AuditConfig, Auditor, SharedAuditor, StoredFiles};
use leaseline_lake::{parquet_io, DataFile, Lake, LakeError, Manifest, Table};
use leaseline_schema::{EventColumns, LeaseEvent};
use tokio::sync::Mutex;

use crate::{QueryError, Result};

/// The three derived tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditView {
    Timeline,
    Violations,
    Holders,
}

impl AuditView {
    pub const ALL: [AuditView; 3] = [
        AuditView::Timeline,
        AuditView::Violations,
        AuditView::Holders,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AuditView::Timeline => "lease_timeline",
            AuditView::Violations => "lease_violations",
            AuditView::Holders => "lease_holders",
        }
    }

    pub fn schema(self) -> SchemaRef {
        match self {
            AuditView::Timeline => leaseline_schema::TIMELINE_SCHEMA.clone(),
            AuditView::Violations => leaseline_schema::VIOLATIONS_SCHEMA.clone(),
            AuditView::Holders => leaseline_schema::HOLDERS_SCHEMA.clone(),
        }
    }
}

/// The derived tables of one snapshot.
#[derive(Debug, Clone)]
pub struct AuditTables {
    /// The manifest version they answer for.
    pub version: u64,
    pub timeline: Vec<RecordBatch>,
    pub violations: Vec<RecordBatch>,
    pub holders: Vec<RecordBatch>,
    /// Files of the lake's stored audit tables whose rows complete
    /// `timeline` and `violations` (an auditor that released its settled
    /// rows to the lake).
    pub stored: Option<Arc<StoredFiles>>,
}

impl AuditTables {
    pub fn get(&self, view: AuditView) -> &[RecordBatch] {
        match view {
            AuditView::Timeline => &self.timeline,
            AuditView::Violations => &self.violations,
            AuditView::Holders => &self.holders,
        }
    }
}

struct CacheState {
    auditor: Auditor,
    /// The `lease_events` files already pushed into `auditor`, with their
    /// rows.
    files: HashMap<String, u64>,
    version: Option<u64>,
    /// `lease_events`' Delta version at `version`: what says which events
    /// `auditor` holds. A snapshot's `version` only orders snapshots: an
    /// ingester's own snapshot (its commit on top of one older than
    /// another table's commit) can carry the number of a different one.
    events_version: Option<u64>,
    /// The last tables answered, with the table versions of their
    /// snapshot, which identify it.
    tables: Option<(BTreeMap<Table, u64>, Arc<AuditTables>)>,
}

impl CacheState {
    fn empty(config: AuditConfig) -> CacheState {
        CacheState {
            auditor: Auditor::new(config),
            files: HashMap::new(),
            version: None,
            events_version: None,
            tables: None,
        }
    }

    /// The files to push to bring the auditor to snapshot `m` when, since
    /// its own, `lease_events` was only appended to and compacted, and no
    /// compacted file holds rows it has not pushed: then the compacted
    /// files hold exactly the rows of the files they replaced, and the
    /// new uncompacted files are the appends. `None` otherwise (an
    /// expiry, or an append compacted before the cache saw it), and the
    /// caller audits `m` from scratch.
    async fn after_compaction<'m>(
        &self,
        lake: &Lake,
        m: &'m Manifest,
    ) -> Result<Option<Vec<&'m DataFile>>> {
        let (Some(from), Some(&to)) = (self.events_version, m.tables.get(&Table::LeaseEvents))
        else {
            return Ok(None);
        };
        let present: HashSet<&str> = m
            .files_of(Table::LeaseEvents)
            .map(|f| f.path.as_str())
            .collect();
        let removed: u64 = self
            .files
            .iter()
            .filter(|(path, _)| !present.contains(path.as_str()))
            .map(|(_, rows)| rows)
            .sum();
        let new: Vec<&DataFile> = m
            .files_of(Table::LeaseEvents)
            .filter(|f| !self.files.contains_key(&f.path))
            .collect();
        // Rows are conserved by compaction: the compacted files' rows
        // beyond those removed would be appends the cache never pushed.
        let compacted: u64 = new.iter().filter(|f| f.level > 0).map(|f| f.rows).sum();
        if compacted != removed || !lake.rows_only_added(Table::LeaseEvents, from, to).await? {
            return Ok(None);
        }
        Ok(Some(new.into_iter().filter(|f| f.level == 0).collect()))
    }
}

/// Keeps the audit engine between queries; see the module docs.
pub struct AuditCache {
    config: AuditConfig,
    state: Mutex<CacheState>,
    rebuilds: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for AuditCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditCache")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AuditCache {
    pub fn new(config: AuditConfig) -> AuditCache {
        AuditCache {
            config,
            state: Mutex::new(CacheState::empty(config)),
            rebuilds: Default::default(),
        }
    }

    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// The derived tables of snapshot `m`.
    ///
    /// The work runs in its own task: a query that times out or is
    /// cancelled must not leave the shared engine with half a file pushed.
    pub async fn tables(self: &Arc<Self>, lake: &Lake, m: &Manifest) -> Result<Arc<AuditTables>> {
        let (cache, lake, m) = (self.clone(), lake.clone(), m.clone());
        tokio::spawn(async move { cache.update(&lake, &m).await })
            .await
            .map_err(joined)?
    }

    /// The derived tables of snapshot `m` plus `pending` rows not in it,
    /// leaving the cached engine at `m`: the rows are audited on a copy.
    pub async fn tables_with(
        self: &Arc<Self>,
        lake: &Lake,
        m: &Manifest,
        pending: Vec<RecordBatch>,
    ) -> Result<Arc<AuditTables>> {
        let (cache, lake, m) = (self.clone(), lake.clone(), m.clone());
        tokio::spawn(async move {
            cache.update(&lake, &m).await?;
            let mut auditor = {
                let mut st = cache.state.lock().await;
                if st.version.is_some()
                    && st.events_version == m.tables.get(&Table::LeaseEvents).copied()
                {
                    // Once per snapshot, not once per clone: the pending
                    // rows are checked against the lake's ids.
                    st.auditor.index_event_ids();
                    st.auditor.clone()
                } else {
                    drop(st);
                    audit_snapshot(&lake, &m, cache.config).await?
                }
            };
            for batch in &pending {
                push_batch(&mut auditor, batch)?;
            }
            // A buffered event older than what the audit keeps as events:
            // its lease is audited again from the lake and the buffer.
            reload_stale(&mut auditor, &lake, &m, &pending).await?;
            Ok(Arc::new(derive(&mut auditor, m.version)))
        })
        .await
        .map_err(joined)?
    }

    /// Snapshots audited from scratch rather than from the cached engine
    /// (the first one included).
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn update(&self, lake: &Lake, m: &Manifest) -> Result<Arc<AuditTables>> {
        let mut st = self.state.lock().await;
        if let Some((_, t)) = st.tables.as_ref().filter(|(of, _)| *of == m.tables) {
            return Ok(t.clone());
        }
        // The stored rows and what has not settled, when they answer for
        // `m`; the engine's cache is then not needed.
        if let Some(t) = crate::stored::from_stored(lake, m, self.config).await? {
            let tables = Arc::new(t);
            if st
                .tables
                .as_ref()
                .is_none_or(|(_, t)| t.version < m.version)
            {
                *st = CacheState::empty(self.config);
                st.tables = Some((m.tables.clone(), tables.clone()));
            }
            return Ok(tables);
        }
        let files: Vec<&str> = m
            .files_of(Table::LeaseEvents)
            .map(|f| f.path.as_str())
            .collect();
        let appended_only =
            files.len() >= st.files.len() && st.files.keys().all(|f| files.contains(&f.as_str()));
        let newer = st.version.is_none_or(|v| m.version > v);
        let fresh = if !newer || st.version.is_none() {
            None
        } else if appended_only {
            Some(
                m.files_of(Table::LeaseEvents)
                    .filter(|f| !st.files.contains_key(&f.path))
                    .collect::<Vec<_>>(),
            )
        } else {
            st.after_compaction(lake, m).await?
        };
        if let Some(fresh) = fresh {
            let paths: Vec<&str> = fresh.iter().map(|f| f.path.as_str()).collect();
            if let Err(e) = push_files(&mut st.auditor, lake, m, &paths).await {
                // Part of a file may be in; pushing it again would count
                // its id-less events twice.
                *st = CacheState::empty(self.config);
                return Err(e);
            }
            // Compacted files stand for the files they replaced.
            st.files = m
                .files_of(Table::LeaseEvents)
                .map(|f| (f.path.clone(), f.rows))
                .collect();
            st.version = Some(m.version);
            st.events_version = m.tables.get(&Table::LeaseEvents).copied();
            let tables = Arc::new(derive(&mut st.auditor, m.version));
            st.tables = Some((m.tables.clone(), tables.clone()));
            return Ok(tables);
        }
        if newer {
            // Rows may have gone (an expiry), or a compacted file holds
            // rows the engine has and rows it has not: events without an
            // `event_id` would count twice if pushed again, so start over.
            self.rebuilds
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut auditor = Auditor::new(self.config);
            push_files(&mut auditor, lake, m, &files).await?;
            let tables = Arc::new(derive(&mut auditor, m.version));
            *st = CacheState {
                auditor,
                files: m
                    .files_of(Table::LeaseEvents)
                    .map(|f| (f.path.clone(), f.rows))
                    .collect(),
                version: Some(m.version),
                events_version: m.tables.get(&Table::LeaseEvents).copied(),
                tables: Some((m.tables.clone(), tables.clone())),
            };
            return Ok(tables);
        }
        // An older snapshot than the cache's (a slow concurrent query):
        // answer it on the side, leaving the cache as it is.
        drop(st);
        let mut auditor = Auditor::new(self.config);
        push_files(&mut auditor, lake, m, &files).await?;
        Ok(Arc::new(derive(&mut auditor, m.version)))
    }
}

/// How long a query waits for the process's alert engine to take a commit
/// the query reads, before it audits the lake itself: the engine takes a
/// commit within milliseconds unless it is far behind.
const LIVE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The events an auditor held and its release count
/// ([`Auditor::generation`]) when tables were derived from it.
type DerivedFrom = (usize, u64);

/// How old tables derived from the alert engine's auditor may be to answer
/// a query while the engine is behind ingest. Catching up, the engine
/// takes events continuously, so every query would otherwise derive the
/// tables again, holding the lock the engine's feeder waits on for each:
/// at 16 clients that held ingest up for most of the time.
const BEHIND_REUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// The derived tables of an auditor the process feeds as the lake commits
/// (its alert engine's); see the module docs.
pub struct LiveAudit {
    shared: SharedAuditor,
    /// The tables, and the number of events and the release they were
    /// derived from.
    derived: std::sync::Mutex<Option<(DerivedFrom, std::time::Instant, Arc<AuditTables>)>>,
    /// Reads answered from the shared auditor for their own snapshot, for
    /// an earlier one, and those that audited the lake instead.
    answered: std::sync::atomic::AtomicU64,
    behind: std::sync::atomic::AtomicU64,
    passed: std::sync::atomic::AtomicU64,
    /// The runtime the shared auditor's feeder runs on, if known.
    serving: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for LiveAudit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAudit").finish_non_exhaustive()
    }
}

impl LiveAudit {
    pub fn new(shared: SharedAuditor) -> LiveAudit {
        LiveAudit {
            shared,
            derived: std::sync::Mutex::new(None),
            answered: Default::default(),
            behind: Default::default(),
            passed: Default::default(),
            serving: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Reads answered from the shared auditor for their snapshot, reads
    /// answered for an earlier snapshot it held whole, and reads that
    /// audited the lake instead.
    pub fn reads(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.answered.load(Relaxed),
            self.behind.load(Relaxed),
            self.passed.load(Relaxed),
        )
    }

    /// The tables for snapshot `m` when the auditor holds every event of
    /// it; else, when ingest has committed past what the auditor has
    /// taken, the tables of the newest snapshot before `m` it held whole
    /// (their `version` says which); none otherwise. Derived again only
    /// after new events.
    pub async fn tables(self: &Arc<Self>, m: &Manifest) -> Result<Option<Arc<AuditTables>>> {
        let (live, version, rows) = (self.clone(), m.version, m.rows_of(Table::LeaseEvents));
        let work = move || {
            use std::sync::atomic::Ordering::Relaxed;
            let asked = version;
            let mut version = version;
            // A commit the engine has not taken yet: it soon will. Rows of
            // another writer's commit never reach it, so the wait is bounded.
            if !live.shared.wait_to_cover(version, rows, LIVE_WAIT) {
                // Catching up, ingest commits faster than the engine
                // takes commits: the newest one it holds whole answers.
                match live.shared.newest_whole(version) {
                    Some(whole) => {
                        let derived = live.derived.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some((_, _, t)) = derived
                            .as_ref()
                            .filter(|(_, at, _)| at.elapsed() < BEHIND_REUSE)
                        {
                            // Their version says which commit they
                            // answer for.
                            live.behind.fetch_add(1, Relaxed);
                            return Some(t.clone());
                        }
                        version = whole;
                    }
                    None => {
                        live.passed.fetch_add(1, Relaxed);
                        return None;
                    }
                }
            }
            let mut auditor = live.shared.lock();
            // A lease's answers are wrong until it is audited again from
            // the lake, which the engine is doing; a lease audited again
            // answers rows the stored tables still hold until the engine
            // commits their removal; and rows released to the stored
            // tables need those tables' files.
            let released = auditor.generation() > 0;
            if auditor.stale_leases() > 0
                || !auditor.voided().is_empty()
                || (released && auditor.stored().is_none())
            {
                live.passed.fetch_add(1, Relaxed);
                return None;
            }
            if version == asked {
                live.answered.fetch_add(1, Relaxed);
            } else {
                live.behind.fetch_add(1, Relaxed);
            }
            let key = (auditor.len(), auditor.generation());
            let mut derived = live.derived.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, _, t)) = derived.as_ref().filter(|(k, _, _)| *k == key) {
                // The same events, read for another snapshot holding them
                // (a compaction, a commit of the stored tables).
                return Some(if t.version == version {
                    t.clone()
                } else {
                    Arc::new(AuditTables {
                        version,
                        ..AuditTables::clone(t)
                    })
                });
            }
            let mut t = derive(&mut auditor, version);
            t.stored = auditor.stored();
            let t = Arc::new(t);
            *derived = Some((key, std::time::Instant::now(), t.clone()));
            Some(t)
        };
        // The feeder waits for this lock: the work runs on the serving
        // runtime's blocking threads, at their priority, not the query
        // threads' lower one (see [`crate::executor`]).
        match &self.serving {
            Some(handle) => handle.spawn_blocking(work).await,
            None => tokio::task::spawn_blocking(work).await,
        }
        .map_err(joined)
    }
}

/// An auditor fed every event of snapshot `m`, for callers that want the
/// engine's own types (`leaseline check`) rather than tables.
pub async fn audit_snapshot(lake: &Lake, m: &Manifest, config: AuditConfig) -> Result<Auditor> {
    let mut auditor = Auditor::new(config);
    let files: Vec<&str> = m
        .files_of(Table::LeaseEvents)
        .map(|f| f.path.as_str())
        .collect();
    push_files(&mut auditor, lake, m, &files).await?;
    Ok(auditor)
}

/// Batches decoded ahead of the auditor: enough to keep it busy while the
/// reader decodes the next, few enough to bound the memory in flight.
pub(crate) const BATCHES_AHEAD: usize = 2;

/// A task of the audit's work that panicked or was cancelled, as a query
/// error.
pub(crate) fn joined(e: tokio::task::JoinError) -> QueryError {
    QueryError::DataFusion(DataFusionError::External(Box::new(e)))
}

/// Rows pushed between two settles of a lake read (see
/// [`AuditConfig::event_window`]). The events held peak at a window's
/// worth plus this many, and each settle audits the events held again, so
/// fewer rows cost more time for little memory: at 3 M events (200
/// leases), a quarter of this took a third longer for a peak within the
/// spread between runs (`scripts/bench-sql-memory.sh`).
const SETTLE_ROWS: usize = 1 << 20;

/// Settles what is `window` behind the newest event, keeping the rows,
/// narrowing the window while it holds more than its budget of events
/// (`audit/src/window.rs`); nothing without a window.
fn settle(auditor: &mut Auditor, window: &mut Option<HeldWindow>) {
    let (Some(w), Some(latest)) = (window.as_mut(), auditor.latest_ts()) else {
        return;
    };
    w.settle_behind(latest, latest.saturating_sub(w.width_us()), |cutoff| {
        auditor.settle_keeping(cutoff);
        auditor.held()
    });
}

/// Audits again, from their whole history in snapshot `m` and `extra`
/// (rows not in it), the leases given an event older than what their
/// audit let go of. The auditor must hold exactly `m`'s and `extra`'s
/// events: a history read while files remain to be pushed would have
/// those files' events counted twice.
async fn reload_stale(
    auditor: &mut Auditor,
    lake: &Lake,
    m: &Manifest,
    extra: &[RecordBatch],
) -> Result<()> {
    let stale = auditor.take_stale();
    if stale.is_empty() {
        return Ok(());
    }
    let wanted: std::collections::HashSet<&str> = stale.iter().map(|l| &**l).collect();
    let mut batches = lake.read_leases(m, &wanted, &EventColumns::COLUMNS).await?;
    batches.extend(extra.iter().cloned());
    EventColumns::for_each_history(&batches, &stale, |lease, events| {
        auditor.reload(lease, events, &[])
    })?;
    Ok(())
}

/// Pushes the events of `files` (of snapshot `m`), settling as it goes
/// ([`AuditConfig::event_window`], [`AuditConfig::max_events_held`]) and auditing again at the end the
/// leases that late rows made stale. Decoding Parquet and auditing each
/// take a core, so a blocking thread reads the files batch by batch while
/// this task pushes the batches already decoded.
async fn push_files(
    auditor: &mut Auditor,
    lake: &Lake,
    m: &Manifest,
    files: &[&str],
) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(BATCHES_AHEAD);
    let store = lake.store().clone();
    let files: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    let reader = tokio::spawn(async move {
        for f in files {
            let bytes = match store.get(&f).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
            let tx = tx.clone();
            // Stops when the auditor side hung up (it failed) or on error.
            let go_on = tokio::task::spawn_blocking(move || {
                let reader = match parquet_io::column_reader(bytes, &EventColumns::COLUMNS) {
                    Ok(reader) => reader,
                    Err(e) => return tx.blocking_send(Err(e.into())).map(|_| false),
                };
                for batch in reader {
                    let failed = batch.is_err();
                    tx.blocking_send(batch.map_err(|e| LakeError::from(e).into()))?;
                    if failed {
                        return Ok(false);
                    }
                }
                Ok(true)
            })
            .await;
            if !matches!(go_on, Ok(Ok(true))) {
                return;
            }
        }
    });
    let config = auditor.config();
    let mut window = HeldWindow::new(config.event_window, config.max_events_held);
    let mut since_settle = 0;
    while let Some(batch) = rx.recv().await {
        let batch = batch?;
        since_settle += batch.num_rows();
        push_lake_batch(auditor, &batch)?;
        if since_settle >= SETTLE_ROWS {
            settle(auditor, &mut window);
            since_settle = 0;
        }
    }
    // The channel closes when the reader is done or has sent its error;
    // a reader that panicked is a bug to report, not an empty file.
    reader.await.map_err(joined)?;
    settle(auditor, &mut window);
    reload_stale(auditor, lake, m, &[]).await
}

/// Pushes the events of one `lease_events` batch.
pub fn push_batch(auditor: &mut Auditor, batch: &RecordBatch) -> Result<()> {
    push_rows(batch, |events| auditor.push_all(events))
}

/// Pushes a batch of a lake file. Ingest keeps one row per `event_id`
/// across the whole table, so the ids need no duplicate lookup.
pub(crate) fn push_lake_batch(auditor: &mut Auditor, batch: &RecordBatch) -> Result<()> {
    push_rows(batch, |events| auditor.push_all_unique(events))
}

/// Events go to the auditor this many at a time. A reader's batch holds
/// up to 64 Ki rows, and as events of about 300 bytes each they would be
/// a fresh 20 MB allocation per batch, faulted in page by page and
/// written once (13 % of the CPU time of reading the audit's tables on a
/// 50 M-event lake); a slice this size is reused while in cache.
const PUSH_SLICE: usize = 1024;

/// Runs `push` on the rows of `batch` in order, as events borrowing the
/// batch, [`PUSH_SLICE`] at a time. A row that is no event fails the
/// call, with the slices before it pushed (a caller that keeps its
/// auditor after an error starts it again).
fn push_rows(batch: &RecordBatch, mut push: impl FnMut(&[LeaseEvent<'_>]) -> usize) -> Result<()> {
    let cols = EventColumns::new(batch)?;
    let mut events: Vec<LeaseEvent<'_>> = Vec::with_capacity(PUSH_SLICE.min(cols.len()));
    for i in 0..cols.len() {
        events.push(cols.event(i)?);
        if events.len() == PUSH_SLICE {
            push(&events);
            events.clear();
        }
    }
    if !events.is_empty() {
        push(&events);
    }
    Ok(())
}

/// Reads the auditor's answers as the three tables.
pub fn derive(auditor: &mut Auditor, version: u64) -> AuditTables {
    AuditTables {
        version,
        timeline: in_batches(&auditor.timeline(), timeline_batch),
        violations: in_batches(&auditor.violations(), violations_batch),
        holders: in_batches(&auditor.holders(), holders_batch),
        stored: None,
    }
}

/// Rows per batch of a derived table. One batch of a whole big table made
/// DataFusion reserve all of it at once when repartitioning, which failed
/// under the default 1 GiB query limit on a 10-million-event lake.
const DERIVED_BATCH_ROWS: usize = 8192;

/// The table as batches of at most [`DERIVED_BATCH_ROWS`] rows (one empty
/// batch for an empty table), in order.
fn in_batches<T>(rows: &[T], batch: impl Fn(&[T]) -> RecordBatch) -> Vec<RecordBatch> {
    if rows.is_empty() {
        return vec![batch(rows)];
    }
    rows.chunks(DERIVED_BATCH_ROWS).map(batch).collect()
}

/// A derived table in a session: computed on first scan from the cache.
pub(crate) struct AuditTableProvider {
    pub view: AuditView,
    pub source: Arc<AuditSource>,
}

/// What the derived tables of one query session are computed from: one snapshot, and
/// the engine's cache.
pub(crate) struct AuditSource {
    pub lake: Lake,
    pub manifest: Manifest,
    pub cache: Arc<AuditCache>,
    /// The process's alert engine's auditor, tried first.
    pub live: Option<Arc<LiveAudit>>,
    /// `lease_events` rows not yet in `manifest` (buffered by an ingester
    /// in this process).
    pub pending: Vec<RecordBatch>,
    tables: tokio::sync::OnceCell<Arc<AuditTables>>,
}

impl AuditSource {
    pub fn new(
        lake: Lake,
        manifest: Manifest,
        cache: Arc<AuditCache>,
        live: Option<Arc<LiveAudit>>,
        pending: Vec<RecordBatch>,
    ) -> AuditSource {
        AuditSource {
            lake,
            manifest,
            cache,
            live,
            pending,
            tables: tokio::sync::OnceCell::new(),
        }
    }

    /// The version the tables answered for, once a scan has read them.
    pub(crate) fn answered_version(&self) -> Option<u64> {
        self.tables.get().map(|t| t.version)
    }

    pub(crate) async fn tables(&self) -> Result<Arc<AuditTables>> {
        self.tables
            .get_or_try_init(|| async {
                if let Some(live) = &self.live {
                    if let Some(t) = live.tables(&self.manifest).await? {
                        return Ok(t);
                    }
                }
                if self.pending.iter().all(|b| b.num_rows() == 0) {
                    self.cache.tables(&self.lake, &self.manifest).await
                } else {
                    self.cache
                        .tables_with(&self.lake, &self.manifest, self.pending.clone())
                        .await
                }
            })
            .await
            .cloned()
    }
}

impl std::fmt::Debug for AuditTableProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditTableProvider")
            .field("view", &self.view)
            .field("version", &self.source.manifest.version)
            .finish()
    }
}

#[async_trait]
impl TableProvider for AuditTableProvider {
    fn schema(&self) -> SchemaRef {
        self.view.schema()
    }

    fn table_type(&self) -> TableType {
        // Listed with the lake's tables by psql's `\dt` and Grafana.
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let tables = self.source.tables().await.map_err(crate::into_datafusion)?;
        // One partition keeps the rows in the engine's order for plans
        // that do not repartition.
        let batches = tables.get(self.view).to_vec();
        let mem = MemTable::try_new(self.view.schema(), vec![batches])?;
        let live = mem.scan(state, projection, filters, limit).await?;
        let files = match (&tables.stored, self.view) {
            (Some(s), AuditView::Timeline) => &s.timeline,
            (Some(s), AuditView::Violations) => &s.violations,
            _ => return Ok(live),
        };
        if files.is_empty() {
            return Ok(live);
        }
        // The settled rows, read from the lake as they are stored; their
        // `settled_before` column is not one of the view's.
        let root = self.source.lake.store().url();
        let urls = files
            .iter()
            .map(|(path, bytes)| {
                Ok((
                    root.join(path)
                        .map_err(|e| DataFusionError::External(Box::new(e)))?,
                    *bytes,
                ))
            })
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let stored = crate::files::ManifestFiles::new(self.view.schema(), urls)?
            .scan(state, projection, filters, limit)
            .await?;
        datafusion::physical_plan::union::UnionExec::try_new(vec![stored, live])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaseline_schema::{decode, EventBatchBuilder, Origin};

    /// Five leases' grants (acquired, renewed twice, released, one second
    /// apart), interleaved, and at the end a grant to another holder while
    /// the last of lease `l/0` is held.
    fn history() -> Vec<String> {
        let steps = ["acquired", "renewed", "renewed", "released"];
        let mut lines: Vec<String> = (0..2500)
            .map(|i| {
                let (lease, k) = (i % 5, i / 5);
                format!(
                    r#"{{"ts":"2026-09-14T10:{:02}:{:02}Z","kind":"{}","source":"holder","lease_id":"l/{lease}","holder_id":"h","fencing_token":{},"ttl_ms":10000,"event_id":"e-{i}"}}"#,
                    k / 60,
                    k % 60,
                    steps[k % 4],
                    k / 4 + 1,
                )
            })
            .collect();
        lines.push(
            r#"{"ts":"2026-09-14T10:08:17Z","kind":"acquired","source":"holder","lease_id":"l/0","holder_id":"h2","fencing_token":1000,"ttl_ms":10000,"event_id":"e-late"}"#
                .to_string(),
        );
        lines
    }

    #[test]
    fn a_batch_pushed_in_slices_is_audited_as_one_push_of_every_event() {
        let lines = history();
        assert!(lines.len() > 2 * PUSH_SLICE);
        let events: Vec<LeaseEvent<'_>> = lines
            .iter()
            .map(|l| decode(l.as_bytes()).unwrap())
            .collect();
        let mut b = EventBatchBuilder::new();
        for (i, ev) in events.iter().enumerate() {
            let origin = Origin::File {
                path: "in.jsonl",
                line: i as u64 + 1,
            };
            b.append(ev, &origin, 0);
        }
        let batch = b.finish();

        let mut sliced = Auditor::new(AuditConfig::default());
        push_batch(&mut sliced, &batch).unwrap();
        let mut whole = Auditor::new(AuditConfig::default());
        assert_eq!(whole.push_all(&events), lines.len());

        assert_eq!(sliced.len(), lines.len());
        let timeline = sliced.timeline();
        assert_eq!(timeline.len(), 5 * 125 + 1);
        assert_eq!(timeline, whole.timeline());
        let violations = sliced.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].fencing_token, 1000);
        assert_eq!(violations, whole.violations());
    }
}
