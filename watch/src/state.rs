//! What the watcher has reported, lock by lock, and the file that keeps it
//! across restarts.
//!
//! The [`Tracker`] holds the last [`Held`] reported for each lock and
//! turns each new observation into events ([`crate::mapping`]). It is
//! written to the state file only after the sink has taken everything
//! reported up to then durably (Kafka acknowledged it, the lake committed
//! it), so the file never claims more than was delivered. A watcher that
//! stops between the two reports the difference again on its next start,
//! under the same event ids, and the lake keeps one copy.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::mapping::{transitions, End, Held, Transition};

/// One lock as a read found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    Held(Held),
    Absent,
    /// Under the watched names but not a lock the watcher can read (a
    /// wrong type, a value without a holder, no token, no expiry): why.
    Bad(String),
}

/// The state file's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The event ids' scope the locks were seen in; a file of another
    /// scope (another database, another prefix) is not this watcher's.
    pub scope: String,
    pub locks: BTreeMap<String, Held>,
    /// Where in the service's history the locks were seen, for a service
    /// that can replay its history from there (etcd's revision, see
    /// [`crate::Session::cursor`]); absent for one that cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<i64>,
}

/// The locks as last reported.
#[derive(Debug, Default)]
pub struct Tracker {
    scope: String,
    locks: BTreeMap<String, Held>,
    cursor: Option<i64>,
    /// Locks currently unreadable: warned about once until they read
    /// again.
    bad: HashSet<String>,
    bad_seen: u64,
    dirty: bool,
}

impl Tracker {
    pub fn new(scope: &str) -> Tracker {
        Tracker {
            scope: scope.to_string(),
            ..Tracker::default()
        }
    }

    /// Starts from what a previous run reported (see [`Snapshot`]).
    pub fn resume(snapshot: Snapshot) -> Tracker {
        Tracker {
            scope: snapshot.scope,
            locks: snapshot.locks,
            cursor: snapshot.cursor,
            ..Tracker::default()
        }
    }

    pub fn scope(&self) -> &str {
        &self.scope
    }

    pub fn locks(&self) -> &BTreeMap<String, Held> {
        &self.locks
    }

    /// Where in the service's history [`Tracker::locks`] stand, if the
    /// service has one.
    pub fn cursor(&self) -> Option<i64> {
        self.cursor
    }

    /// The service's history was followed up to `cursor`: everything it
    /// holds is reported.
    pub fn set_cursor(&mut self, cursor: Option<i64>) {
        if cursor.is_some() && cursor != self.cursor {
            self.cursor = cursor;
            self.dirty = true;
        }
    }

    /// How many times a lock was found unreadable (each lock counted once
    /// per spell of being unreadable).
    pub fn bad_seen(&self) -> u64 {
        self.bad_seen
    }

    /// Whether anything changed since the last [`Tracker::snapshot`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A snapshot that did not reach the state file.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub fn snapshot(&mut self) -> Snapshot {
        self.dirty = false;
        Snapshot {
            scope: self.scope.clone(),
            locks: self.locks.clone(),
            cursor: self.cursor,
        }
    }

    /// One lock read at `now_ms` (the service's clock), after a
    /// notification that says how it ended if it did. An unreadable lock
    /// changes nothing: it is neither a release nor a new grant, and what
    /// was reported of it stands until it reads again.
    pub fn observe(
        &mut self,
        lease_id: &str,
        seen: Observation,
        end: End,
        now_ms: i64,
    ) -> Vec<Transition> {
        let now = match seen {
            Observation::Bad(why) => {
                if self.bad.insert(lease_id.to_string()) {
                    self.bad_seen += 1;
                    warn!(lease_id, reason = %why, "a key under the watched prefix is not a lock the watcher can read; ignored until it is");
                }
                return Vec::new();
            }
            Observation::Absent => None,
            Observation::Held(h) => Some(h),
        };
        self.bad.remove(lease_id);
        let before = self.locks.get(lease_id);
        let out = transitions(&self.scope, lease_id, before, now.as_ref(), end, now_ms);
        if before != now.as_ref() {
            self.dirty = true;
            match now {
                Some(h) => self.locks.insert(lease_id.to_string(), h),
                None => self.locks.remove(lease_id),
            };
        }
        out
    }

    /// A full scan: every lock it found, each with the time it was read,
    /// and every lock reported before that it did not find is gone by
    /// `now_ms`, when the scan ended.
    pub fn resync(
        &mut self,
        found: BTreeMap<String, (Observation, i64)>,
        now_ms: i64,
    ) -> Vec<Transition> {
        let gone: Vec<String> = self
            .locks
            .keys()
            .filter(|k| !found.contains_key(*k))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for k in gone {
            out.extend(self.observe(&k, Observation::Absent, End::Unknown, now_ms));
        }
        for (k, (seen, at_ms)) in found {
            out.extend(self.observe(&k, seen, End::Unknown, at_ms));
        }
        out
    }
}

/// Reads the state file; none yet is an empty state.
pub fn load(path: &Path) -> std::io::Result<Option<Snapshot>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces the state file atomically: a crash leaves the old file or the
/// new one, never half of one.
pub fn save(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(snapshot).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaseline_emit::Kind;

    fn held(holder: &str, token: u64, deadline: i64) -> Observation {
        Observation::Held(Held {
            holder: holder.into(),
            token,
            value_hash: token,
            deadline_ms: deadline,
        })
    }

    fn kinds(ts: &[Transition]) -> Vec<(&str, Kind)> {
        ts.iter().map(|t| (t.lease_id.as_str(), t.kind)).collect()
    }

    #[test]
    fn a_resync_reports_only_what_changed() {
        let mut t = Tracker::new("s");
        t.observe("a", held("w-1", 1, 10_000), End::Unknown, 0);
        t.observe("b", held("w-2", 5, 10_000), End::Unknown, 0);
        let found = BTreeMap::from([
            ("a".to_string(), (held("w-1", 1, 10_000), 1_000)),
            ("c".to_string(), (held("w-3", 9, 10_000), 1_500)),
        ]);
        let out = t.resync(found, 2_000);
        assert_eq!(
            kinds(&out),
            vec![("b", Kind::Released), ("c", Kind::Acquired)]
        );
        assert_eq!(t.locks().keys().collect::<Vec<_>>(), vec!["a", "c"]);
    }

    #[test]
    fn an_unreadable_key_is_counted_once_and_changes_nothing() {
        let mut t = Tracker::new("s");
        t.observe("a", held("w-1", 1, 10_000), End::Unknown, 0);
        t.snapshot();
        for _ in 0..3 {
            let out = t.observe("a", Observation::Bad("a hash".into()), End::Unknown, 1);
            assert!(out.is_empty());
        }
        assert_eq!(t.bad_seen(), 1);
        assert!(!t.is_dirty());
        // Readable again, and still the same grant: nothing to report.
        assert!(t
            .observe("a", held("w-1", 1, 10_000), End::Unknown, 2)
            .is_empty());
        t.observe("a", Observation::Bad("a hash".into()), End::Unknown, 3);
        assert_eq!(t.bad_seen(), 2);
    }

    #[test]
    fn the_state_file_round_trips_and_a_restart_reports_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(load(&path).unwrap(), None);
        let mut t = Tracker::new("s");
        t.observe("a", held("w-1", 1, 10_000), End::Unknown, 0);
        t.set_cursor(Some(41));
        save(&path, &t.snapshot()).unwrap();
        let mut again = Tracker::resume(load(&path).unwrap().unwrap());
        assert_eq!(again.scope(), "s");
        assert_eq!(again.cursor(), Some(41));
        let found = BTreeMap::from([("a".to_string(), (held("w-1", 1, 10_000), 900))]);
        assert!(again.resync(found, 1_000).is_empty());
    }
}
