//! The live audit's settled rows, stored in the lake's `lease_timeline`
//! and `lease_violations` Delta tables, each row exactly once, so that the
//! engine of `serve --ingest` holds only what can still change.
//!
//! The protocol:
//! - Every row carries its lease's cut when it was written
//!   (`settled_before`): every row of the lease from before the cut is
//!   stored. The largest cut per lease, read from the rows, is where the
//!   lease's stored rows end; nothing else records it, so a commit of rows
//!   is all it takes.
//! - The engine settles behind the watermark ([`crate::settling`]),
//!   keeping the settled rows; [`StoredAudit::flush`] commits them as a
//!   [`Change::Settle`] and only then has the engine release them
//!   ([`AlertEngine::release_kept`]), under the audit's lock, together
//!   with the list of stored files its SQL reads them from. A query sees
//!   either the rows kept in memory and the files without them, or the
//!   files with them.
//! - A commit is decided on exactly the stored tables' versions it
//!   commits on. Before deciding, the writer reads the cuts of every
//!   stored file it has not read (another writer's, a compaction's), and
//!   leaves out the rows below them. Another commit in between is a
//!   conflict, and the writer decides again. So no row is stored twice,
//!   whichever process settled it: after a rebalance, a takeover, or two
//!   processes that both still held a lease.
//! - Each commit also records, per Kafka partition, the position the
//!   engine had been given (`lease_timeline`'s `txn`): the engine audits
//!   a late event again before it commits, so the rows stored for a
//!   partition's leases answer for every event of it below that position.
//!   A writer whose engine is behind the recorded position is refused.
//! - A restarted engine replays its partitions' history from the lake, as
//!   it did before ([`crate::rebuild`]), in two parts: the events below
//!   the recorded position, then it settles each lease replayed at its
//!   stored cut ([`StoredAudit::resume_point`]), then the rest. An event
//!   of the rest older than a lease's cut makes the lease stale, as it
//!   would have live. A cut the events held do not allow (there should be
//!   none) voids the lease instead.
//! - A lease's context (`lease_context`, the events before its cut that
//!   the rows after it are judged against) is stored again at each new
//!   cut, and a reader takes only the latest; once [`CONTEXT_FILES`]
//!   settles were stored since the table was last rewritten, a commit
//!   also rewrites it without the superseded rows, so that it holds about
//!   the current context rather than one per settle.
//! - A voided lease (also one audited again because of a late event,
//!   [`crate::settling`]) has its stored rows removed by the next commit,
//!   which rewrites the files that hold them, and its rows are stored anew
//!   once they settle again. Until that commit, the engine's SQL reads the
//!   lake ([`leaseline_audit::Auditor::voided`]).
//!
//! Decisions where the contract is silent:
//! - Rows are stored only by `serve --ingest` reading Kafka with settling
//!   on (`audit.event_window`, not zero): file input keeps every event,
//!   and an import replays its audit without storing it.
//! - A lease whose events come from more than one Kafka partition is
//!   audited by more than one process; each stores what it settled and
//!   the cuts keep the rows from being stored twice, but which process's
//!   rows a lease gets is whichever committed first.
//! - The stored tables are partitioned by the day of `acquired_at` and
//!   `at`, as `lease_events` is by `ts`, so that expiring a day of events
//!   drops the rows derived from it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaseline_audit::table::stored_batches;
use leaseline_audit::{Settled, StoredFiles};
use leaseline_lake::{Change, KafkaRange, Lake, LakeError, Manifest, Offsets, Table};
use tracing::{debug, info};

use crate::clock::PartitionKey;
use crate::engine::AlertEngine;
use crate::error::Result;
use crate::rebuild::Positions;

/// How often the list of stored files the engine's SQL reads is brought
/// up to date with commits of others (a compaction) when the engine has
/// nothing to commit.
const REFRESH: Duration = Duration::from_secs(10);

/// Commits tried before the writer waits for its next turn.
const TRIES: usize = 10;

/// Settles stored since `lease_context` was last rewritten at which a
/// commit rewrites it without the superseded rows
/// ([`Lake::drop_superseded_context`]). Each settle stores the context of
/// the leases it cut again, so the table holds a lease's context at no
/// more than this many cuts, and each rewrite reads that much.
const CONTEXT_FILES: usize = 3;

/// Where a replayed partition's stored rows end: see
/// [`StoredAudit::resume_point`].
#[derive(Debug, Default)]
pub struct Resume {
    pub cuts: HashMap<String, i64>,
    pub positions: Offsets,
}

impl Resume {
    /// The offset of `p` below which the stored rows answer for its events.
    pub fn position(&self, p: &PartitionKey) -> Option<i64> {
        self.positions.get(&*p.0)?.get(&p.1).copied()
    }
}

/// What the engine knows of the stored audit tables; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct StoredAudit {
    /// Where each lease's stored rows end, from the files in `read`.
    cuts: HashMap<String, i64>,
    /// Stored files whose rows' cuts are in `cuts`.
    read: HashSet<String>,
    /// The last time the published file list was made.
    published: Option<Instant>,
}

/// The stored audit files of a snapshot, as the engine's SQL reads them.
fn stored_files(m: &Manifest) -> Arc<StoredFiles> {
    let list = |t| {
        m.files_of(t)
            .map(|f| (f.path.clone(), f.bytes))
            .collect::<Vec<_>>()
    };
    Arc::new(StoredFiles {
        timeline: list(Table::LeaseTimeline),
        violations: list(Table::LeaseViolations),
    })
}

/// The `lease_context` files of `m` beyond one per day: the settles stored
/// since the table was last rewritten (a rewrite writes a file per day).
fn context_files_over(m: &Manifest) -> usize {
    let files = m.files_of(Table::LeaseContext);
    let (n, days) = files.fold((0, HashSet::new()), |(n, mut days), f| {
        days.insert(f.date());
        (n + 1, days)
    });
    n - days.len()
}

/// `s`'s rows from `cut` on: those before it are stored.
fn from_cut(s: &Settled, cut: i64) -> Settled {
    Settled {
        lease_id: s.lease_id.clone(),
        grants: s
            .grants
            .iter()
            .filter(|g| g.acquired_at >= cut)
            .cloned()
            .collect(),
        violations: s
            .violations
            .iter()
            .filter(|v| v.at >= cut)
            .cloned()
            .collect(),
        cut: s.cut,
        context: s.context.clone(),
    }
}

impl StoredAudit {
    pub fn new() -> StoredAudit {
        StoredAudit::default()
    }

    /// Reads the cuts of the stored files of `m` not read yet.
    async fn refresh(&mut self, lake: &Lake, m: &Manifest) -> Result<()> {
        // Files compacted away are forgotten (their rows are in the merged
        // file, read below like any other new file).
        let present: HashSet<&str> = m
            .files
            .iter()
            .filter(|f| Table::STORED_AUDIT.contains(&f.table))
            .map(|f| f.path.as_str())
            .collect();
        self.read.retain(|p| present.contains(p.as_str()));
        let fresh: Vec<_> = m
            .files
            .iter()
            .filter(|f| Table::STORED_AUDIT.contains(&f.table) && !self.read.contains(&f.path))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        for (lease, cut) in lake.stored_cuts(&fresh).await? {
            let c = self.cuts.entry(lease).or_insert(i64::MIN);
            *c = (*c).max(cut);
        }
        self.read.extend(fresh.iter().map(|f| f.path.clone()));
        Ok(())
    }

    /// What a replay of newly assigned partitions needs to take the
    /// stored rows as settled: every lease's cut, and how far each
    /// partition's events are answered for.
    pub async fn resume_point(&mut self, lake: &Lake) -> Result<Resume> {
        let m = lake.latest().await?;
        self.refresh(lake, &m).await?;
        // The engine's list of stored files is made again after the replay.
        self.published = None;
        Ok(Resume {
            cuts: self.cuts.clone(),
            positions: m.stored_kafka,
        })
    }

    /// Brings the engine's list of stored files up to date with others'
    /// commits (a compaction), now and then; at once after a resume.
    pub async fn refresh_published(&mut self, engine: &mut AlertEngine, lake: &Lake) -> Result<()> {
        if self.published.is_some_and(|at| at.elapsed() < REFRESH) {
            return Ok(());
        }
        let m = lake.latest().await?;
        self.refresh(lake, &m).await?;
        engine.publish_stored(stored_files(&m));
        self.published = Some(Instant::now());
        Ok(())
    }

    /// Commits the engine's kept rows and the voiding of its voided
    /// leases' rows, then has the engine release them.
    pub async fn flush(
        &mut self,
        engine: &mut AlertEngine,
        lake: &Lake,
        given: &Positions,
        assigned: &HashSet<PartitionKey>,
    ) -> Result<()> {
        let kept = engine.kept();
        let voided = engine.voided();
        if kept.is_empty() && voided.is_empty() {
            return self.refresh_published(engine, lake).await;
        }
        let void: HashSet<&str> = voided.iter().map(|l| &**l).collect();
        for _ in 0..TRIES {
            let m = lake.latest().await?;
            self.refresh(lake, &m).await?;
            let rows: Vec<Settled> = kept
                .iter()
                .filter_map(|s| match self.cuts.get(&*s.lease_id) {
                    _ if void.contains(&*s.lease_id) => Some(s.clone()),
                    Some(&c) if c >= s.cut => None,
                    Some(&c) => Some(from_cut(s, c)),
                    None => Some(s.clone()),
                })
                .filter(|s| !s.grants.is_empty() || !s.violations.is_empty())
                .collect();
            let stored_void: HashSet<&str> = void
                .iter()
                .copied()
                .filter(|l| self.cuts.contains_key(*l))
                .collect();
            let (mut remove, mut add) = lake.rewrite_without(&m, &stored_void).await?;
            // Not while voiding: the rewrite above may have taken a
            // context file already.
            if stored_void.is_empty() && context_files_over(&m) >= CONTEXT_FILES {
                let cut_now: HashMap<&str, i64> =
                    rows.iter().map(|s| (&*s.lease_id, s.cut)).collect();
                let cut_of = |l: &str| cut_now.get(l).or_else(|| self.cuts.get(l)).copied();
                match lake.drop_superseded_context(&m, cut_of).await {
                    Ok((r, a)) => {
                        remove.extend(r);
                        add.extend(a);
                    }
                    Err(e) => {
                        lake.discard(&add).await;
                        return Err(e.into());
                    }
                }
            }
            let batches = stored_batches(&rows);
            let (timeline, violations) = (&batches.timeline, &batches.violations);
            let written = async {
                let mut files = lake.write(Table::LeaseTimeline, timeline).await?;
                files.extend(lake.write(Table::LeaseViolations, violations).await?);
                files.extend(lake.write(Table::LeaseContext, &batches.context).await?);
                Ok::<_, LakeError>(files)
            };
            match written.await {
                Ok(files) => add.extend(files),
                Err(e) => {
                    lake.discard(&add).await;
                    return Err(e.into());
                }
            }
            let next = if add.is_empty() && remove.is_empty() {
                m
            } else {
                let change = Change::Settle {
                    add: add.clone(),
                    remove: remove.clone(),
                    kafka: given
                        .iter()
                        // Only what this process still reads: a partition
                        // given up is another's to answer for.
                        .filter(|(p, _)| !p.0.is_empty() && assigned.contains(*p))
                        .map(|(p, next)| KafkaRange {
                            topic: p.0.to_string(),
                            partition: p.1,
                            start: next,
                            end: next,
                        })
                        .collect(),
                };
                match lake.commit(&m, &change).await {
                    Ok(next) => next,
                    Err(LakeError::Conflict { reason, .. }) => {
                        debug!(%reason, "the stored audit tables changed meanwhile; deciding again");
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            for l in &stored_void {
                self.cuts.remove(*l);
            }
            for s in &rows {
                self.cuts.insert(s.lease_id.to_string(), s.cut);
            }
            self.read.retain(|p| !remove.contains(p));
            self.read.extend(add.iter().map(|f| f.path.clone()));
            if timeline.num_rows() + violations.num_rows() > 0 || !stored_void.is_empty() {
                info!(
                    grants = timeline.num_rows(),
                    violations = violations.num_rows(),
                    voided = stored_void.len(),
                    "stored the audit's settled rows in the lake"
                );
            }
            engine.release_kept(stored_files(&next));
            self.published = Some(Instant::now());
            return Ok(());
        }
        Err(LakeError::Conflict {
            version: 0,
            reason: "the stored audit tables kept changing under the writer".into(),
        }
        .into())
    }
}
