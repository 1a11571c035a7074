//! The engine's audit kept to a window of event time, so that memory does
//! not grow with the history it is given.
//!
//! The engine's auditor holds every event it is given until told to let
//! go. Once event time has moved `after` past a grant, the grant is
//! settled: its events are dropped.
//!
//! A replay (`leaseline import`, [`Settling::step`] and
//! [`Settling::finish`]) reads no SQL from its engine, so a settled grant
//! is dropped altogether ([`AlertEngine::settle`]); the alerts keep what
//! they need (the engine's own steps and pending violations). The newest
//! event time is the clock.
//!
//! The live engine of `serve --ingest` ([`Settling::step_live`]) is also
//! the audit its SQL tables read, so a settled grant stays as a row
//! ([`AlertEngine::settle_keeping`]), which costs far less than its
//! events. The clock is the watermark (the slowest input partition, less
//! the lateness), so that a partition that lags behind the others does not
//! make every one of its events late.
//!
//! The protocol:
//! - once the clock has moved half of `after` since the last settle (a
//!   replay looks after each commit it is given, the live engine at each
//!   turn of its loop), the audit settles everything older than `after`
//!   before it; `after` is the configured window, narrowed while it holds
//!   more events than `audit.max_events_held` (`audit/src/window.rs`), and
//!   a settle that leaves more than that narrows it and settles again;
//!   while narrowed, a settle also waits until an eighth of the budget
//!   more events came in since the last one, or half the configured
//!   window went by, so that open grants holding more than the budget do
//!   not make every turn a pass over every lease;
//! - a lease given an event older than what its audit let go of is *stale*
//!   (see `audit/src/settle.rs`): it is not settled any more, and it is
//!   audited again from its whole history in the lake, read in passes over
//!   the lake's files that each hold a bounded share of its rows. A
//!   violation the late event makes or unmakes then comes out of the audit
//!   like any other, to be confirmed by the watermark.
//! - The history read must be exactly what the engine was given, or the
//!   audit would take the events it is given later for duplicates, and
//!   their rules would never run. A replay therefore reads it at the end
//!   ([`Settling::finish`]), when the lake holds exactly the replay's
//!   input; until then a stale lease's answers are wrong, which a replay
//!   never reads (its violations are confirmed only at the end). The live
//!   engine reads it right after the committed batch that made the lease stale,
//!   keeping only the rows of the Kafka partitions it reads whose offsets
//!   lie below the position it was given up to ([`Positions`]); the lake
//!   may already hold later commits. Until the lease is audited again, the
//!   engine marks no snapshot as covered, so SQL audits the lake instead.
//!
//! Settling costs a pass over the events held, so it runs a bounded
//! number of times per span of event time rather than per commit.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type};
use leaseline_audit::window::HeldWindow;
use leaseline_lake::{Lake, Manifest, Table};
use leaseline_schema::EventColumns;
use tracing::{error, info};

use crate::clock::PartitionKey;
use crate::engine::AlertEngine;
use crate::error::Result;
use crate::rebuild::Positions;
use crate::stored::{Resume, StoredAudit};

/// The columns that say which Kafka record a row of `lease_events` came
/// from.
const ORIGIN: [&str; 3] = ["kafka_topic", "kafka_partition", "kafka_offset"];

/// About how many rows of the lake one pass of a re-audit holds.
const REREAD_ROWS: u64 = 262_144;

/// When the engine's audit settles.
#[derive(Debug, Clone)]
pub struct Settling {
    /// How far behind the clock: the configured window, narrowed while it
    /// holds more events than the budget.
    window: HeldWindow,
    /// The next cutoff to settle at.
    next: i64,
    /// Leases re-audited from the lake, for the report.
    pub reloads: u64,
    /// Stale leases not audited again yet (the lake could not be read),
    /// and when to try again.
    pending: Vec<Arc<str>>,
    retry: Backoff,
    /// The live engine's settled rows in the lake.
    stored: StoredAudit,
    /// Rows kept or leases voided since the last commit of them.
    unstored: bool,
    /// When to try that commit again after a failure.
    store_retry: Backoff,
}

/// When to try a lake read or write again after failures: a wait that
/// starts at [`RETRY_FIRST`] and doubles up to [`RETRY_MAX`].
#[derive(Debug, Clone, Default)]
struct Backoff(Option<(Instant, Duration)>);

impl Backoff {
    /// Whether the wait after the last failure is still running.
    fn waiting(&self) -> bool {
        self.0.is_some_and(|(at, _)| Instant::now() < at)
    }

    /// A failure: returns the wait before the next try.
    fn failed(&mut self) -> Duration {
        let wait = self.0.map_or(RETRY_FIRST, |(_, w)| (w * 2).min(RETRY_MAX));
        self.0 = Some((Instant::now() + wait, wait));
        wait
    }

    fn succeeded(&mut self) {
        self.0 = None;
    }
}

/// The first wait before reading the lake again for stale leases, doubled
/// after each failure up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl Settling {
    /// Settles what is `after` older than the clock, or less while that
    /// holds more than `max_held` events (none for zero); none for a zero
    /// `after`.
    pub fn new(after: Duration, max_held: usize) -> Option<Settling> {
        HeldWindow::new(after, max_held).map(|window| Settling {
            window,
            next: i64::MIN,
            reloads: 0,
            pending: Vec::new(),
            retry: Backoff::default(),
            stored: StoredAudit::new(),
            unstored: false,
            store_retry: Backoff::default(),
        })
    }

    /// The cutoff to settle at when the clock reads `now`, if it is time
    /// and worth a pass over the events held (`held()` counts them).
    fn due(&mut self, now: i64, held: impl FnOnce() -> usize) -> Option<i64> {
        let cutoff = now.saturating_sub(self.window.width_us());
        (cutoff >= self.next && self.window.worth_settling(cutoff, held()))
            .then(|| self.settling_at(cutoff))
    }

    /// Settles at `cutoff` now; the next settle is half a window later.
    fn settling_at(&mut self, cutoff: i64) -> i64 {
        self.next = cutoff.saturating_add((self.window.width_us() / 2).max(1));
        cutoff
    }

    /// Settles with `settle` at `cutoff`, then again at a narrower window
    /// behind `now` while the events held are over the budget; returns
    /// what the settles returned, summed, and the last cutoff.
    fn settle_within_budget(
        &mut self,
        engine: &mut AlertEngine,
        now: i64,
        cutoff: i64,
        settle: fn(&mut AlertEngine, i64) -> usize,
    ) -> (usize, i64) {
        let (mut settled, width) = (0, self.window.width_us());
        let cutoff = self.window.settle_behind(now, cutoff, |c| {
            settled += settle(engine, c);
            engine.held_events()
        });
        if self.window.width_us() < width {
            self.settling_at(cutoff);
            info!(
                window = %humantime::format_duration(Duration::from_micros(self.window.width_us() as u64)),
                events_held = engine.held_events(),
                "the audit's window held more events than audit.max_events_held: narrowed"
            );
        }
        (settled, cutoff)
    }

    /// A replay's: settles when due, dropping the rows, after the engine
    /// was given a commit.
    pub fn step(&mut self, engine: &mut AlertEngine) {
        let Some(newest) = engine.max_ts() else {
            return;
        };
        if let Some(cutoff) = self.due(newest, || engine.held_events()) {
            self.settle_within_budget(engine, newest, cutoff, AlertEngine::settle);
        }
    }

    /// Audits every stale lease again from `lake`, which must hold exactly
    /// the events the engine was given (the replay's input is done).
    pub async fn finish(&mut self, engine: &mut AlertEngine, lake: &Lake) -> Result<()> {
        let stale = engine.take_stale();
        if stale.is_empty() {
            return Ok(());
        }
        let m = lake.latest().await?;
        self.reload(engine, lake, &m, &stale, &EventColumns::COLUMNS, |b| {
            Ok(b.clone())
        })
        .await
    }

    /// The live engine's, at each turn of its loop (after a committed
    /// batch, or the watermark moved): settles behind the watermark when
    /// due, keeping the rows, and audits again each stale lease from the
    /// rows of the lake the engine was given. Returns whether the engine's
    /// audit answers for what it was given, so that its snapshot may be
    /// marked: false while a stale lease could not be audited again (tried
    /// again after a wait that doubles up to 30 s).
    pub async fn step_live(
        &mut self,
        engine: &mut AlertEngine,
        lake: &Lake,
        given: &Positions,
        assigned: &HashSet<PartitionKey>,
    ) -> bool {
        let watermark = engine.watermark();
        if watermark > i64::MIN {
            if let Some(cutoff) = self.due(watermark, || engine.held_events()) {
                let (grants, cutoff) = self.settle_within_budget(
                    engine,
                    watermark,
                    cutoff,
                    AlertEngine::settle_keeping,
                );
                info!(
                    before = %crate::text::fmt_ts(cutoff),
                    grants,
                    events_held = engine.held_events(),
                    "settled the audit: grants that ended before the window go to the lake's stored tables"
                );
                self.unstored = true;
            }
        }
        let answers = self.reaudit_live(engine, lake, given).await;
        if answers {
            self.store(engine, lake, given, assigned).await;
        }
        answers
    }

    /// Where the stored rows of partitions about to be replayed end (see
    /// [`crate::stored`]); none if the lake cannot tell, and the replay
    /// then keeps every row in memory (its next commit leaves out what is
    /// stored).
    pub async fn resume_point(&mut self, lake: &Lake) -> Option<Resume> {
        self.unstored = true;
        match self.stored.resume_point(lake).await {
            Ok(r) => Some(r),
            Err(e) => {
                error!(error = %e, "could not read the lake's stored audit rows; the replayed history is kept whole");
                None
            }
        }
    }

    /// Commits the rows settled since the last commit, when there are any
    /// and the last failure's wait is over, or refreshes the list of stored
    /// files now and then.
    async fn store(
        &mut self,
        engine: &mut AlertEngine,
        lake: &Lake,
        given: &Positions,
        assigned: &HashSet<PartitionKey>,
    ) {
        if self.store_retry.waiting() {
            return;
        }
        // Rows are kept by a settle, and leases voided by a re-audit or a
        // resume, each of which marks the rows unstored.
        let result = if self.unstored {
            self.stored.flush(engine, lake, given, assigned).await
        } else {
            self.stored.refresh_published(engine, lake).await
        };
        match result {
            Ok(()) => {
                self.unstored = false;
                self.store_retry.succeeded();
            }
            Err(e) => {
                let wait = self.store_retry.failed();
                error!(error = %e, retry_in = ?wait, "could not store the audit's settled rows in the lake; they stay in memory meanwhile");
            }
        }
    }

    /// Audits again each stale lease from the rows of the lake the engine
    /// was given; false while one could not be.
    async fn reaudit_live(
        &mut self,
        engine: &mut AlertEngine,
        lake: &Lake,
        given: &Positions,
    ) -> bool {
        for lease in engine.take_stale() {
            if !self.pending.contains(&lease) {
                self.pending.push(lease);
            }
        }
        if self.pending.is_empty() {
            return true;
        }
        if self.retry.waiting() {
            return false;
        }
        let stale = std::mem::take(&mut self.pending);
        let mut columns = EventColumns::COLUMNS.to_vec();
        columns.extend(ORIGIN);
        let read = async {
            let m = lake.latest().await?;
            self.reload(engine, lake, &m, &stale, &columns, |b| given_rows(b, given))
                .await
        };
        match read.await {
            Ok(()) => {
                self.retry.succeeded();
                self.unstored = true;
                true
            }
            Err(e) => {
                let wait = self.retry.failed();
                error!(error = %e, leases = stale.len(), retry_in = ?wait, "could not read the history of leases given an event older than what their audit let go of; SQL audits the lake until they are audited again");
                self.pending = stale;
                false
            }
        }
    }

    /// Audits `stale` again from their rows in `m`, as `keep` filters
    /// them, in passes over the lake's files that each hold about
    /// [`REREAD_ROWS`] rows when the leases' histories are of average size
    /// (an import out of time order can make every lease stale).
    async fn reload(
        &mut self,
        engine: &mut AlertEngine,
        lake: &Lake,
        m: &Manifest,
        stale: &[Arc<str>],
        columns: &[&str],
        keep: impl Fn(&RecordBatch) -> Result<RecordBatch>,
    ) -> Result<()> {
        let rows = m.rows_of(Table::LeaseEvents).max(1);
        let known = engine.leases_known().max(stale.len()) as u64;
        let per_pass = ((known * REREAD_ROWS / rows) as usize).clamp(1, stale.len().max(1));
        for group in stale.chunks(per_pass) {
            let wanted: HashSet<&str> = group.iter().map(|l| &**l).collect();
            let batches = lake
                .read_leases(m, &wanted, columns)
                .await?
                .iter()
                .map(&keep)
                .collect::<Result<Vec<RecordBatch>>>()?;
            EventColumns::for_each_history(&batches, group, |lease, events| {
                info!(lease_id = %lease, events = events.len(), "an event older than what the audit let go of: the lease is audited again from the lake");
                engine.reload(lease, events);
                self.reloads += 1;
            })?;
        }
        Ok(())
    }
}

/// The rows of `batch` that came from Kafka records the engine was given.
fn given_rows(batch: &RecordBatch, given: &Positions) -> Result<RecordBatch> {
    let [Some(topic), Some(part), Some(off)] = ORIGIN.map(|c| batch.column_by_name(c)) else {
        return Ok(batch.slice(0, 0));
    };
    let (topic, part, off) = (
        topic.as_string::<i32>(),
        part.as_primitive::<Int32Type>(),
        off.as_primitive::<Int64Type>(),
    );
    let mask: BooleanArray = (0..batch.num_rows())
        .map(|i| {
            Some(
                !(topic.is_null(i) || part.is_null(i) || off.is_null(i))
                    && given.given(topic.value(i), part.value(i), off.value(i)),
            )
        })
        .collect();
    Ok(arrow::compute::filter_record_batch(batch, &mask)?)
}
