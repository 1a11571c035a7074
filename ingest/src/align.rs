//! Reading Kafka partitions in step by event time.
//!
//! The alert engine's watermark is the slowest partition's event time, and
//! the audit holds every event past it in memory. Reading a backlog,
//! librdkafka serves partitions unevenly: one partition minutes of event
//! time ahead of another keeps those minutes of the whole fleet in memory,
//! and the spread grows with the backlog. So ingest bounds the spread
//! itself, as Flink's watermark alignment does.
//!
//! Protocol:
//! - Each assigned partition keeps the newest event time read from it.
//! - The floor is the oldest of those newest times over the partitions
//!   that are being read: not paused and not caught up (everything the
//!   broker held was read). A caught-up partition has nothing to read, so
//!   it never holds the others back. A partition with nothing read yet
//!   counts as being at the oldest event time read from any partition:
//!   librdkafka may queue a whole backlog of one partition before the
//!   first message of another, and that one must not run ahead meanwhile.
//! - A partition more than `max_drift` ahead of the floor is paused (the
//!   consumer stops fetching it); a paused partition resumes once it is at
//!   most half of `max_drift` ahead, so that it is not paused and resumed
//!   on every message. With no floor (every other partition caught up or
//!   paused) every paused partition resumes.
//! - Resumes are decided first, against the floor of the partitions read
//!   until then; pauses after, against the floor with the resumed ones in
//!   it, so that a partition resumed behind the others is their floor at
//!   once.
//! - The partition that holds the floor is never paused, so reading always
//!   goes on: either the floor's partition brings events and the floor
//!   rises, or it catches up and stops holding the others.
//! - A partition sought back (a lost commit, a failed flush) forgets its
//!   event time: it is read again from older events.
//! - A partition whose messages never decode has no event time; it holds
//!   the others at the oldest event time until it is caught up.
//!
//! librdkafka fetches a resumed partition from the message after the last
//! one read, often inside a record batch. Kafka answers with that batch;
//! tansu 0.6 answers with the next one, and the rest of the batch is lost
//! (the Kafka source logs such a gap). So alignment is off unless
//! `kafka.max_drift` is set.
//!
//! [`Alignment::step`] decides from what it was told; the tests below pin
//! the rules.

use std::time::Duration;

/// What to do with a partition's fetching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Pause,
    Resume,
}

#[derive(Debug, Clone)]
struct Part {
    topic: String,
    partition: i32,
    newest: Option<i64>,
    caught_up: bool,
    paused: bool,
}

/// See the module docs. Times in microseconds.
#[derive(Debug, Clone)]
pub struct Alignment {
    max_drift: i64,
    /// In (topic, partition) order. A consumer reads few partitions, and a
    /// scan by `&str` allocates nothing on the path of every message.
    parts: Vec<Part>,
    /// The floor at the last step: an event further ahead than the drift
    /// asks for a step now rather than at the next periodic one. None
    /// (unknown) also asks for one: whatever may have lowered the floor
    /// since sets it so.
    floor: Option<i64>,
    /// The oldest event time read, where a partition with nothing read yet
    /// counts as being.
    oldest: Option<i64>,
}

impl Alignment {
    /// None when `max_drift` is zero: partitions are read as they come.
    pub fn new(max_drift: Duration) -> Option<Alignment> {
        let max_drift = i64::try_from(max_drift.as_micros()).unwrap_or(i64::MAX);
        (max_drift > 0).then(|| Alignment {
            max_drift,
            parts: Vec::new(),
            floor: None,
            oldest: None,
        })
    }

    /// The partition is now read here, from its committed position, not
    /// paused.
    pub fn assigned(&mut self, topic: &str, partition: i32) {
        let part = Part {
            topic: topic.to_string(),
            partition,
            newest: None,
            caught_up: false,
            paused: false,
        };
        match self
            .parts
            .binary_search_by(|p| (p.topic.as_str(), p.partition).cmp(&(topic, partition)))
        {
            Ok(i) => self.parts[i] = part,
            Err(i) => self.parts.insert(i, part),
        }
        self.floor = None;
    }

    /// The partition is no longer read here.
    pub fn revoked(&mut self, topic: &str, partition: i32) {
        self.parts
            .retain(|p| p.partition != partition || p.topic != topic);
        self.floor = None;
    }

    /// The partition was sought back: its event time is unknown again.
    pub fn rewound(&mut self, topic: &str, partition: i32) {
        if let Some(p) = self.part(topic, partition) {
            p.newest = None;
            p.caught_up = false;
        }
        self.floor = None;
    }

    /// Everything the broker held of the partition has been read.
    pub fn caught_up(&mut self, topic: &str, partition: i32) {
        if let Some(p) = self.part(topic, partition) {
            p.caught_up = true;
        }
    }

    /// An event of time `ts` was read from the partition. True if it went
    /// past the drift, so that a step should come now.
    pub fn event(&mut self, topic: &str, partition: i32, ts: i64) -> bool {
        let oldest = self.oldest;
        let Some(p) = self.part(topic, partition) else {
            return false;
        };
        p.newest = Some(p.newest.map_or(ts, |n| n.max(ts)));
        let was_caught_up = std::mem::take(&mut p.caught_up);
        let paused = p.paused;
        self.oldest = Some(oldest.map_or(ts, |o| o.min(ts)));
        if was_caught_up {
            // It counts again, possibly below the floor.
            self.floor = None;
        }
        !paused
            && self
                .floor
                .is_none_or(|f| ts > f.saturating_add(self.max_drift))
    }

    fn part(&mut self, topic: &str, partition: i32) -> Option<&mut Part> {
        self.parts
            .iter_mut()
            .find(|p| p.partition == partition && p.topic == topic)
    }

    /// Partitions paused now.
    pub fn paused(&self) -> usize {
        self.parts.iter().filter(|p| p.paused).count()
    }

    /// Decides which partitions to pause and resume, and takes them as
    /// done.
    pub fn step(&mut self) -> Vec<((String, i32), Change)> {
        // Resumes first: a partition paused while ahead may have fallen
        // behind the floor since, and then it is the floor the others are
        // paused against.
        let before = self.floor_now();
        let mut changes = Vec::new();
        for p in &mut self.parts {
            if !p.paused {
                continue;
            }
            let near = match (before, p.newest) {
                (Some(f), Some(n)) => n.saturating_sub(f) <= self.max_drift / 2,
                _ => true,
            };
            if near {
                p.paused = false;
                changes.push(((p.topic.clone(), p.partition), Change::Resume));
            }
        }
        let floor = self.floor_now();
        for p in &mut self.parts {
            let far = match (floor, p.newest) {
                (Some(f), Some(n)) => n.saturating_sub(f) > self.max_drift,
                _ => false,
            };
            if !p.paused && !p.caught_up && far {
                p.paused = true;
                changes.push(((p.topic.clone(), p.partition), Change::Pause));
            }
        }
        self.floor = self.floor_now();
        changes
    }

    /// The oldest newest time of the partitions being read.
    fn floor_now(&self) -> Option<i64> {
        self.parts
            .iter()
            .filter(|p| !p.paused && !p.caught_up)
            .filter_map(|p| p.newest.or(self.oldest))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn align() -> Alignment {
        Alignment::new(Duration::from_secs(30)).unwrap()
    }

    fn two() -> Alignment {
        let mut a = align();
        a.assigned("t", 0);
        a.assigned("t", 1);
        a
    }

    fn change(p: i32, c: Change) -> ((String, i32), Change) {
        (("t".to_string(), p), c)
    }

    #[test]
    fn zero_drift_turns_alignment_off() {
        assert!(Alignment::new(Duration::ZERO).is_none());
    }

    #[test]
    fn a_partition_ahead_by_more_than_the_drift_pauses_until_half_of_it() {
        let mut a = two();
        a.event("t", 0, 100 * S);
        a.event("t", 1, 100 * S);
        assert_eq!(a.step(), vec![]);
        // Exactly the drift ahead is allowed; past it pauses, and the
        // event says so before the next periodic step.
        assert!(!a.event("t", 0, 130 * S));
        assert!(!a.event("t", 1, 100 * S));
        assert_eq!(a.step(), vec![]);
        assert!(a.event("t", 0, 131 * S));
        assert_eq!(a.step(), vec![change(0, Change::Pause)]);
        assert_eq!(a.paused(), 1);
        // The slow partition catches up: still more than half the drift
        // behind, nothing changes.
        a.event("t", 1, 115 * S);
        assert_eq!(a.step(), vec![]);
        a.event("t", 1, 116 * S);
        assert_eq!(a.step(), vec![change(0, Change::Resume)]);
        assert_eq!(a.paused(), 0);
    }

    #[test]
    fn the_floor_partition_is_never_paused_and_a_caught_up_one_holds_nothing() {
        let mut a = two();
        a.event("t", 0, 500 * S);
        a.event("t", 1, 100 * S);
        assert_eq!(a.step(), vec![change(0, Change::Pause)]);
        // Partition 1 has read all there is: nothing holds partition 0.
        a.caught_up("t", 1);
        assert_eq!(a.step(), vec![change(0, Change::Resume)]);
        // A new event on partition 1 makes it count again.
        a.event("t", 1, 101 * S);
        assert_eq!(a.step(), vec![change(0, Change::Pause)]);
        // A caught-up partition far ahead is not paused: it reads nothing.
        let mut b = two();
        b.event("t", 0, 500 * S);
        b.caught_up("t", 0);
        b.event("t", 1, 100 * S);
        assert_eq!(b.step(), vec![]);
    }

    #[test]
    fn a_partition_not_read_yet_holds_the_others_at_the_oldest_event_read() {
        let mut a = two();
        // Nothing read anywhere: nothing to decide.
        assert_eq!(a.step(), vec![]);
        // With the floor unknown, an event asks for a step at once.
        assert!(a.event("t", 0, 100 * S));
        assert_eq!(a.step(), vec![]);
        assert!(!a.event("t", 0, 101 * S));
        // Partition 0 runs on while partition 1 has brought nothing.
        assert!(a.event("t", 0, 131 * S));
        assert_eq!(a.step(), vec![change(0, Change::Pause)]);
        // Its first event sets it where it is.
        a.event("t", 1, 120 * S);
        assert_eq!(a.step(), vec![change(0, Change::Resume)]);
        // Or, with nothing to read at all, it holds nothing.
        let mut b = two();
        b.event("t", 0, 100 * S);
        b.event("t", 0, 200 * S);
        assert_eq!(b.step(), vec![change(0, Change::Pause)]);
        b.caught_up("t", 1);
        assert_eq!(b.step(), vec![change(0, Change::Resume)]);
    }

    #[test]
    fn a_rewound_partition_forgets_its_event_time() {
        let mut a = two();
        a.event("t", 0, 100 * S);
        a.event("t", 1, 100 * S);
        a.event("t", 0, 140 * S);
        a.event("t", 1, 200 * S);
        // Partition 1 is ahead and paused...
        a.event("t", 0, 150 * S);
        assert_eq!(a.step(), vec![change(1, Change::Pause)]);
        // ...then sought back: it will read older events again, so it is
        // read from at once, and counts as being at the oldest time read.
        // Partition 0, 50 s past that, waits for it.
        a.rewound("t", 1);
        assert_eq!(
            a.step(),
            vec![change(1, Change::Resume), change(0, Change::Pause)]
        );
        a.event("t", 1, 130 * S);
        assert_eq!(a.step(), vec![]);
        a.event("t", 1, 135 * S);
        assert_eq!(a.step(), vec![change(0, Change::Resume)]);
    }

    #[test]
    fn a_partition_resumed_behind_the_others_is_their_floor_at_once() {
        let mut a = two();
        // Partition 1 runs ahead while partition 0 has brought nothing.
        a.event("t", 1, 100 * S);
        a.step();
        a.event("t", 1, 131 * S);
        assert_eq!(a.step(), vec![change(1, Change::Pause)]);
        // Partition 0 comes, and passes partition 1 before the next step.
        a.event("t", 0, 100 * S);
        assert_eq!(a.step(), vec![]);
        a.event("t", 0, 140 * S);
        assert_eq!(a.step(), vec![change(1, Change::Resume)]);
        // Partition 1, at 131 s, is the floor now: partition 0 may not go
        // past 161 s.
        assert!(!a.event("t", 0, 161 * S));
        assert!(a.event("t", 0, 162 * S));
        assert_eq!(a.step(), vec![change(0, Change::Pause)]);
    }

    #[test]
    fn with_many_partitions_only_the_slowest_read_one_sets_the_floor() {
        let mut a = align();
        for p in 0..4 {
            a.assigned("t", p);
        }
        a.event("t", 0, 100 * S);
        a.event("t", 1, 120 * S);
        a.event("t", 2, 140 * S);
        a.event("t", 3, 200 * S);
        assert_eq!(
            a.step(),
            vec![change(2, Change::Pause), change(3, Change::Pause)]
        );
        // Partition 0 catches up: partition 1 is now the floor, and
        // partitions 2 (20 s ahead) and 3 are still more than half the
        // drift ahead of it.
        a.caught_up("t", 0);
        assert_eq!(a.step(), vec![]);
        a.event("t", 1, 125 * S);
        assert_eq!(a.step(), vec![change(2, Change::Resume)]);
        // The floor's partition is revoked: partition 2 holds the floor.
        a.revoked("t", 1);
        assert_eq!(a.step(), vec![]);
        // Once every partition read is caught up, the paused one resumes.
        a.caught_up("t", 2);
        assert_eq!(a.step(), vec![change(3, Change::Resume)]);
        assert_eq!(a.paused(), 0);
    }
}
