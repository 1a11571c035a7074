//! One auditor for a process: its alert engine feeds it, its SQL reads it.
//!
//! `serve --ingest` gives its alert engine every event the lake commits.
//! The audit's SQL tables (`lease_timeline`, `lease_violations`,
//! `lease_holders`) answer from the same auditor whenever it holds exactly
//! the events of the snapshot a query reads, so the process keeps one copy
//! of the history rather than two.
//!
//! The protocol:
//! - The feeder only ever pushes committed events: events handed over
//!   after the lake committed them, and rows read back from the lake. So
//!   the auditor's events are a subset of any later snapshot's rows.
//! - After catching up with snapshot version `v` (the events of its own
//!   commit `v`, or a replay of the lake read at `v`), the feeder calls
//!   [`SharedAuditor::mark`]: the auditor then held `n` distinct events,
//!   all of them rows of `v`. Marks only move forward: after a replay read
//!   at `v`, a commit older than `v` proves nothing (the auditor may hold
//!   rows committed after it).
//! - A reader at snapshot `m` whose `lease_events` has `rows` rows asks
//!   [`SharedAuditor::covers`]: true when the newest mark at or below `m`
//!   counted `rows` events. A subset of equal size is the same set, and
//!   nothing but appends changes the row count (compaction keeps every row,
//!   one per `event_id`). Otherwise another writer committed rows since, or
//!   the lake holds rows this process never read (another ingester of the
//!   group, an import), and the reader audits the lake itself.
//! - A covering auditor may have moved on past `m` by the time it is read:
//!   the answer then also holds this process's later commits, never an
//!   event the lake does not hold.
//! - Each mark also records how many `lease_events` rows the lake held at
//!   its version. A mark whose count of events held equals it is *whole*:
//!   the auditor then held every event of that commit, whoever wrote them.
//!   A reader of a newer snapshot the feeder has not taken yet (ingest
//!   catching up commits faster than the audit takes them) may answer
//!   for the newest whole mark's version instead, [`SharedAuditor::newest_whole`],
//!   and says that it does.
//!
//! Reads take the lock for as long as they recompute and copy out the
//! tables, and the feeder waits meanwhile; what feeds it (ingest's bounded
//! fan-out) waits in turn, so nothing is dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::{AuditConfig, Auditor};

/// Marks kept: enough for the snapshots concurrent queries read, which
/// are at most a few commits old.
const MARKS: usize = 256;

/// A cloneable handle on one [`Auditor`]; see the module docs.
#[derive(Clone)]
pub struct SharedAuditor {
    inner: Arc<Inner>,
}

struct Inner {
    auditor: Mutex<Auditor>,
    /// Snapshot version → distinct events held once caught up with it,
    /// and the `lease_events` rows of that snapshot.
    marks: Mutex<BTreeMap<u64, (usize, u64)>>,
    /// Signalled on every mark.
    marked: Condvar,
}

impl std::fmt::Debug for SharedAuditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAuditor").finish_non_exhaustive()
    }
}

/// A poisoned lock means a push panicked half-way; the auditor's state is
/// still a set of whole events (each push either files an event or not),
/// so readers go on rather than cascade the panic.
fn relock<T>(r: std::sync::LockResult<MutexGuard<'_, T>>) -> MutexGuard<'_, T> {
    r.unwrap_or_else(|e| e.into_inner())
}

impl SharedAuditor {
    pub fn new(config: AuditConfig) -> SharedAuditor {
        SharedAuditor {
            inner: Arc::new(Inner {
                auditor: Mutex::new(Auditor::new(config)),
                marks: Mutex::new(BTreeMap::new()),
                marked: Condvar::new(),
            }),
        }
    }

    /// The auditor, locked.
    pub fn lock(&self) -> MutexGuard<'_, Auditor> {
        relock(self.inner.auditor.lock())
    }

    /// The feeder has caught up with snapshot `version`, whose
    /// `lease_events` has `lake_rows` rows. A mark older than the newest
    /// is ignored: the auditor may hold rows committed after it (a replay
    /// read a newer snapshot), so it would prove nothing.
    pub fn mark(&self, version: u64, lake_rows: u64) {
        let n = self.lock().len();
        let mut marks = relock(self.inner.marks.lock());
        if marks
            .last_key_value()
            .is_some_and(|(&last, _)| version < last)
        {
            return;
        }
        marks.insert(version, (n, lake_rows));
        while marks.len() > MARKS {
            marks.pop_first();
        }
        self.inner.marked.notify_all();
    }

    /// Waits, at most `timeout`, until the auditor covers snapshot
    /// `version` with `rows` rows ([`SharedAuditor::covers`]), or a mark
    /// at or above `version` shows that it does not (another writer's
    /// rows). Blocks the calling thread. Returns whether it covers.
    ///
    /// Coverage, not a mark's number, is waited for: the feeder marks the
    /// ingester's own snapshots, whose numbers trail the lake's while
    /// other tables are committed to (their sum counts those commits
    /// only once the ingester reloads), so a reader of the lake's newest
    /// snapshot may never see a mark at or above its number.
    pub fn wait_to_cover(&self, version: u64, rows: u64, timeout: Duration) -> bool {
        let marks = relock(self.inner.marks.lock());
        let waiting = |m: &mut BTreeMap<u64, (usize, u64)>| {
            !covered(m, version, rows) && m.last_key_value().is_none_or(|(&v, _)| v < version)
        };
        let (marks, _) = self
            .inner
            .marked
            .wait_timeout_while(marks, timeout, waiting)
            .unwrap_or_else(|e| e.into_inner());
        covered(&marks, version, rows)
    }

    /// Whether the auditor holds every event of snapshot `version`, whose
    /// `lease_events` has `rows` rows.
    pub fn covers(&self, version: u64, rows: u64) -> bool {
        covered(&relock(self.inner.marks.lock()), version, rows)
    }

    /// The newest snapshot version the auditor held every event of when
    /// marked (see the module docs), if it is at most `version`.
    pub fn newest_whole(&self, version: u64) -> Option<u64> {
        let marks = relock(self.inner.marks.lock());
        let (&v, &(n, rows)) = marks.range(..=version).next_back()?;
        (n as u64 == rows).then_some(v)
    }
}

/// [`SharedAuditor::covers`] on the marks.
fn covered(marks: &BTreeMap<u64, (usize, u64)>, version: u64, rows: u64) -> bool {
    marks
        .range(..=version)
        .next_back()
        .is_some_and(|(_, &(n, _))| n as u64 == rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaseline_schema::decode;

    fn push(a: &SharedAuditor, id: &str) {
        let line = format!(
            r#"{{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"h","fencing_token":1,"ttl_ms":1000,"event_id":"{id}"}}"#
        );
        a.lock().push(&decode(line.as_bytes()).unwrap());
    }

    #[test]
    fn a_mark_covers_its_snapshot_and_compactions_of_it_only_at_equal_size() {
        let a = SharedAuditor::new(AuditConfig::default());
        assert!(!a.covers(0, 0), "nothing marked: nothing is known");
        push(&a, "e1");
        push(&a, "e2");
        a.mark(3, 2);
        assert!(!a.covers(2, 2), "an older snapshot than any mark");
        assert!(a.covers(3, 2));
        // A compaction at version 4 keeps the rows: still covered.
        assert!(a.covers(4, 2));
        // Another writer's commit at version 5 added a row never pushed.
        assert!(!a.covers(5, 3));
        // Events pushed after the mark do not change what it proved.
        push(&a, "e3");
        assert!(a.covers(3, 2));
        a.mark(6, 3);
        assert!(a.covers(6, 3));
        assert!(!a.covers(6, 4));
        // A replay read at version 9 came in before the commit of version 8
        // was taken: the auditor may hold rows of version 9, so the older
        // commit proves nothing.
        push(&a, "e4");
        a.mark(9, 4);
        push(&a, "e5");
        a.mark(8, 3);
        assert!(!a.covers(8, 5));
        assert!(a.covers(8, 3), "still the mark of version 6");
        assert!(a.covers(9, 4));
    }

    #[test]
    fn a_reader_ahead_of_the_feeder_is_answered_for_the_newest_whole_mark() {
        let a = SharedAuditor::new(AuditConfig::default());
        push(&a, "e1");
        push(&a, "e2");
        a.mark(3, 2);
        // Ingest committed version 5 with a third row; the feeder has not
        // taken it yet.
        assert!(!a.covers(5, 3));
        assert_eq!(a.newest_whole(5), Some(3));
        assert_eq!(a.newest_whole(2), None, "nothing marked at or before 2");
        // Another writer's row was in the lake at version 7 and never
        // pushed: that mark is not whole, and neither is anything it
        // stands for until a whole mark comes.
        push(&a, "e3");
        a.mark(7, 4);
        assert_eq!(a.newest_whole(8), None);
        push(&a, "e4");
        a.mark(9, 4);
        assert_eq!(a.newest_whole(10), Some(9));
        assert_eq!(a.newest_whole(8), None);
    }

    #[test]
    fn a_reader_waits_for_the_feeder_to_take_a_commit() {
        let a = SharedAuditor::new(AuditConfig::default());
        a.mark(1, 0);
        assert!(a.wait_to_cover(1, 0, Duration::ZERO));
        assert!(!a.wait_to_cover(2, 1, Duration::from_millis(10)));
        let feeder = a.clone();
        let t = std::thread::spawn(move || {
            push(&feeder, "e1");
            feeder.mark(2, 1);
        });
        assert!(a.wait_to_cover(2, 1, Duration::from_secs(60)));
        t.join().unwrap();
        assert!(a.covers(2, 1));
    }

    #[test]
    fn a_reader_of_a_newer_number_than_the_ingesters_is_covered_by_its_rows() {
        // The lake's snapshot 10 (the ingester's commit, then another
        // table's) holds the rows of the ingester's own snapshot 9.
        let a = SharedAuditor::new(AuditConfig::default());
        push(&a, "e1");
        a.mark(8, 1);
        let feeder = a.clone();
        let t = std::thread::spawn(move || {
            push(&feeder, "e2");
            feeder.mark(9, 2);
        });
        let asked = std::time::Instant::now();
        assert!(a.wait_to_cover(10, 2, Duration::from_secs(60)));
        assert!(asked.elapsed() < Duration::from_secs(30), "not a timeout");
        t.join().unwrap();
        // A mark at or above the number that does not count the rows: the
        // lake holds rows the feeder never had; no wait.
        push(&a, "e3");
        a.mark(11, 3);
        assert!(!a.wait_to_cover(10, 4, Duration::from_secs(60)));
    }

    #[test]
    fn marks_are_bounded() {
        let a = SharedAuditor::new(AuditConfig::default());
        for v in 0..(MARKS as u64 + 10) {
            a.mark(v, 0);
        }
        assert!(!a.covers(5, 0), "the oldest marks are let go");
        assert!(a.covers(MARKS as u64 + 9, 0));
    }
}
