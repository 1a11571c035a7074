//! Event time across input partitions: the watermark of the live engine.
//!
//! Protocol:
//! - Each input partition (a Kafka topic-partition; file input is one
//!   partition) keeps the newest event time read from it. Within one
//!   partition events come in the order they were produced, so a partition
//!   whose newest event is at `t` will not, but for producer clock skew
//!   covered by the lateness, bring anything older.
//! - The watermark is the minimum over the partitions of their newest
//!   event time, minus the lateness. A partition read from slowly, or not
//!   yet read at all, holds it back: a backlog read at any speed, in any
//!   interleaving of partitions, moves it exactly as a real-time run does.
//! - A partition that is caught up (it had nothing more to read the last
//!   time ingest looked) and has brought no event for the idle timeout
//!   stops holding the watermark back, as Flink's and Kafka Streams'
//!   idleness does: a quiet partition must not stop every alert.
//! - Only when every partition is idle may the wall clock move the
//!   watermark (to now minus the lateness): then nothing is waiting to be
//!   read, and time passes without events. The wall clock never moves it
//!   past data that is still waiting.
//! - With no partition assigned, the watermark does not move: until ingest
//!   says what it reads, nothing is known about what is waiting.
//!
//! [`EventClock::watermark`] is a pure function of what it was told and
//! the time given; the tests below pin the rules.

use std::collections::BTreeMap;
use std::time::Duration;

pub use leaseline_ingest::PartitionKey;

#[derive(Debug, Clone)]
struct Partition {
    newest: Option<i64>,
    caught_up: bool,
    /// Wall time of the last event read from it, or of its assignment.
    last_event_at: i64,
}

/// See the module docs. Times in microseconds.
#[derive(Debug, Clone)]
pub struct EventClock {
    lateness: i64,
    idle: i64,
    parts: BTreeMap<PartitionKey, Partition>,
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl EventClock {
    pub fn new(lateness: Duration, idle_timeout: Duration) -> EventClock {
        EventClock {
            lateness: micros(lateness),
            idle: micros(idle_timeout),
            parts: BTreeMap::new(),
        }
    }

    /// The partition is now read by this process.
    pub fn assigned(&mut self, p: PartitionKey, now: i64) {
        self.parts.entry(p).or_insert(Partition {
            newest: None,
            caught_up: false,
            last_event_at: now,
        });
    }

    /// The partition is no longer read here: it holds nothing back.
    pub fn revoked(&mut self, p: &PartitionKey) {
        self.parts.remove(p);
    }

    /// An event of time `ts` was read from `p` (assigning it if need be).
    pub fn event(&mut self, p: PartitionKey, ts: i64, now: i64) {
        let part = self.parts.entry(p).or_insert(Partition {
            newest: None,
            caught_up: false,
            last_event_at: now,
        });
        part.newest = Some(part.newest.map_or(ts, |n| n.max(ts)));
        part.caught_up = false;
        part.last_event_at = now;
    }

    /// Ingest found nothing more to read in `p` for now.
    pub fn caught_up(&mut self, p: &PartitionKey) {
        if let Some(part) = self.parts.get_mut(p) {
            part.caught_up = true;
        }
    }

    /// Partitions read here.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    fn idle(&self, p: &Partition, now: i64) -> bool {
        p.caught_up && now.saturating_sub(p.last_event_at) >= self.idle
    }

    /// The watermark at wall time `now`, or None while it cannot move.
    pub fn watermark(&self, now: i64) -> Option<i64> {
        if self.parts.is_empty() {
            return None;
        }
        let mut held: Option<i64> = None;
        let mut all_idle = true;
        for p in self.parts.values() {
            if self.idle(p, now) {
                continue;
            }
            all_idle = false;
            // A partition not idle with nothing read yet holds everything.
            let newest = p.newest?;
            held = Some(held.map_or(newest, |h| h.min(newest)));
        }
        if all_idle {
            let newest = self.parts.values().filter_map(|p| p.newest).max();
            return Some(newest.unwrap_or(now).max(now).saturating_sub(self.lateness));
        }
        held.map(|h| h.saturating_sub(self.lateness))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const S: i64 = 1_000_000;

    fn key(p: i32) -> PartitionKey {
        (Arc::from("t"), p)
    }

    fn clock() -> EventClock {
        EventClock::new(Duration::from_secs(30), Duration::from_secs(10))
    }

    #[test]
    fn the_slowest_partition_holds_the_watermark() {
        let mut c = clock();
        let now = 1_000_000 * S;
        c.assigned(key(0), now);
        c.assigned(key(1), now);
        c.event(key(0), 500 * S, now);
        // Partition 1 has not brought anything: no movement at all.
        assert_eq!(c.watermark(now), None);
        c.event(key(1), 100 * S, now);
        assert_eq!(c.watermark(now), Some(70 * S));
        c.event(key(1), 900 * S, now);
        assert_eq!(c.watermark(now), Some(470 * S));
    }

    #[test]
    fn the_wall_clock_never_passes_data_still_waiting() {
        let mut c = clock();
        let now = 1_000_000 * S;
        c.assigned(key(0), now);
        c.event(key(0), 100 * S, now);
        // Hours later by the wall clock, a backlog is still being read: the
        // watermark follows the events, not the clock.
        let later = now + 3600 * S;
        assert_eq!(c.watermark(later), Some(70 * S));
    }

    #[test]
    fn a_caught_up_quiet_partition_stops_holding_after_the_idle_timeout() {
        let mut c = clock();
        let now = 1_000_000 * S;
        c.assigned(key(0), now);
        c.assigned(key(1), now);
        c.event(key(0), 500 * S, now);
        c.event(key(1), 100 * S, now);
        c.caught_up(&key(1));
        assert_eq!(c.watermark(now + 9 * S), Some(70 * S));
        assert_eq!(c.watermark(now + 10 * S), Some(470 * S));
        // An event makes it count again.
        c.event(key(1), 200 * S, now + 11 * S);
        assert_eq!(c.watermark(now + 11 * S), Some(170 * S));
        // Not caught up (data waiting): never idle, however long.
        assert_eq!(c.watermark(now + 3600 * S), Some(170 * S));
    }

    #[test]
    fn when_every_partition_is_idle_the_wall_clock_moves_it() {
        let mut c = clock();
        let now = 1_000_000 * S;
        c.assigned(key(0), now);
        c.event(key(0), now - S, now);
        c.caught_up(&key(0));
        assert_eq!(c.watermark(now + 5 * S), Some(now - S - 30 * S));
        assert_eq!(c.watermark(now + 60 * S), Some(now + 30 * S));
        // A new partition holds time until it brings an event or, empty
        // and caught up, idles like any other.
        c.assigned(key(1), now + 60 * S);
        c.caught_up(&key(1));
        assert_eq!(c.watermark(now + 65 * S), None);
        assert_eq!(c.watermark(now + 70 * S), Some(now + 40 * S));
    }

    #[test]
    fn nothing_assigned_nothing_moves_and_revoked_partitions_let_go() {
        let mut c = clock();
        assert_eq!(c.watermark(1_000_000 * S), None);
        c.event(key(0), 500 * S, 0);
        c.event(key(1), 100 * S, 0);
        c.revoked(&key(1));
        assert_eq!(c.watermark(0), Some(470 * S));
        assert_eq!(c.partitions(), 1);
    }
}
