//! The `event_id`s already in the lake, for de-duplication.
//!
//! Ids are kept as 128-bit xxh3 hashes: 16 bytes an id whatever its length,
//! and a collision chance (about n²/2¹²⁹) that stays negligible for any lake
//! this process can hold in memory.
//!
//! An ingester holds the ids of the lake's recent days only ([`RecentIds`],
//! [`RESIDENT_DAYS`]); a day's set can still reach tens of millions of
//! ids, so its layout is the ingester's memory: a hash table alone costs 17 bytes a slot
//! at up to twice the slots it needs, and briefly both the old and the new
//! table while it doubles (about 430 MiB at 10 million ids). Most ids
//! therefore sit in a sorted vector, 16 bytes each, which grows in place,
//! and only the ids added since it was last extended sit in a small hash
//! table. Hashes are uniform, so the vector is searched by interpolation:
//! a few probes, not the two dozen of a binary search.

use hashbrown::HashSet;
use leaseline_schema::Origin;
use xxhash_rust::xxh3::xxh3_128;

/// The hash table is folded into the vector when it holds this share of
/// the vector's ids (or [`MIN_FOLD`]): each fold moves the whole vector,
/// so folding in proportion keeps the moves a constant number per id.
const FOLD_SHARE: usize = 8;
const MIN_FOLD: usize = 65_536;

/// Interpolation probes before a search falls back to bisection (a guard
/// should the hashes ever cluster).
const MAX_INTERPOLATIONS: usize = 8;

#[derive(Debug, Default)]
pub struct EventIdSet {
    /// Sorted, distinct.
    sorted: Vec<u128>,
    /// Ids added since the last fold; none of them is in `sorted`.
    recent: HashSet<u128>,
    /// Ids of `sorted` removed since the last fold (rare: rows dropped
    /// when another writer committed their partition first).
    removed: HashSet<u128>,
}

/// The identity of a line of an imported file, for keeping its reject
/// once: the file's path and the line number. The key of an event id can
/// never equal it, and the two live in different sets anyway.
pub fn line_key(path: &str, line: u64) -> u128 {
    let mut bytes = Vec::with_capacity(path.len() + 9);
    bytes.extend_from_slice(path.as_bytes());
    bytes.push(0xff); // never in UTF-8: the path ends here
    bytes.extend_from_slice(&line.to_le_bytes());
    xxh3_128(&bytes)
}

/// The identity of a reject read from Kafka, for keeping it once whichever
/// consumer group reads its message again: topic, partition and offset,
/// in the space of [`line_key`] under a name no file path can have (NUL).
pub fn kafka_key(topic: &str, partition: i32, offset: i64) -> u128 {
    line_key(&format!("\0kafka\0{topic}\0{partition}"), offset as u64)
}

/// The identity of one record of a Kafka message that holds several (see
/// [`Origin::KafkaRecord`]).
pub fn kafka_record_key(topic: &str, partition: i32, offset: i64, record: u64) -> u128 {
    line_key(&format!("\0kafka\0{topic}\0{partition}\0{offset}"), record)
}

/// The identity of a reject for keeping it once, from where it came;
/// [`Origins::key`] gives the same from the stored columns.
pub fn origin_key(origin: &Origin<'_>) -> u128 {
    match *origin {
        Origin::File { path, line } => line_key(path, line),
        Origin::Kafka {
            topic,
            partition,
            offset,
        } => kafka_key(topic, partition, offset),
        Origin::KafkaRecord {
            topic,
            partition,
            offset,
            record,
        } => kafka_record_key(topic, partition, offset, u64::from(record)),
    }
}

/// The origin columns of a batch of events or rejects, read row by row.
pub struct Origins<'a> {
    topic: &'a arrow::array::StringArray,
    partition: &'a arrow::array::Int32Array,
    offset: &'a arrow::array::Int64Array,
    path: &'a arrow::array::StringArray,
    line: &'a arrow::array::Int64Array,
}

impl<'a> Origins<'a> {
    /// The origin columns of `batch`, which must have them (every table
    /// with an origin does).
    pub fn of(batch: &'a arrow::array::RecordBatch) -> Self {
        use arrow::array::AsArray;
        use arrow::datatypes::{Int32Type, Int64Type};
        let col = |name: &str| batch.column_by_name(name).expect("an origin column");
        Origins {
            topic: col("kafka_topic").as_string::<i32>(),
            partition: col("kafka_partition").as_primitive::<Int32Type>(),
            offset: col("kafka_offset").as_primitive::<Int64Type>(),
            path: col("file_path").as_string::<i32>(),
            line: col("file_line").as_primitive::<Int64Type>(),
        }
    }

    /// Topic, partition and offset of row `i`, if it came from Kafka.
    pub fn kafka(&self, i: usize) -> Option<(&'a str, i32, i64)> {
        use arrow::array::Array;
        (self.topic.is_valid(i) && self.partition.is_valid(i) && self.offset.is_valid(i)).then(
            || {
                (
                    self.topic.value(i),
                    self.partition.value(i),
                    self.offset.value(i),
                )
            },
        )
    }

    /// The identity of row `i` for keeping a reject once: its
    /// [`line_key`] if it came from a file, its [`kafka_key`] if from Kafka.
    pub fn key(&self, i: usize) -> Option<u128> {
        use arrow::array::Array;
        let line = self.line.is_valid(i).then(|| self.line.value(i) as u64);
        if self.path.is_valid(i) {
            return line.map(|l| line_key(self.path.value(i), l));
        }
        self.kafka(i).map(|(t, p, o)| match line {
            Some(record) => kafka_record_key(t, p, o, record),
            None => kafka_key(t, p, o),
        })
    }
}

impl EventIdSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn key(event_id: &str) -> u128 {
        xxh3_128(event_id.as_bytes())
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.contains_key(Self::key(event_id))
    }

    fn contains_key(&self, key: u128) -> bool {
        self.recent.contains(&key) || (self.in_sorted(key) && !self.removed.contains(&key))
    }

    /// Adds an id; false if it was already there.
    pub fn insert(&mut self, event_id: &str) -> bool {
        self.insert_key(Self::key(event_id))
    }

    fn insert_key(&mut self, key: u128) -> bool {
        if self.in_sorted(key) {
            // Present unless removed; then it comes back.
            return self.removed.remove(&key);
        }
        if !self.recent.insert(key) {
            return false;
        }
        if self.recent.len() >= MIN_FOLD.max(self.sorted.len() / FOLD_SHARE) {
            self.fold();
        }
        true
    }

    pub fn remove(&mut self, event_id: &str) {
        let key = Self::key(event_id);
        if !self.recent.remove(&key) && self.in_sorted(key) {
            self.removed.insert(key);
        }
    }

    /// Adds every id of `other`.
    pub fn merge(&mut self, other: &EventIdSet) {
        let removed = &other.removed;
        let others = other.recent.iter().chain(
            other
                .sorted
                .iter()
                .filter(|k| removed.is_empty() || !removed.contains(*k)),
        );
        for &key in others {
            self.insert_key(key);
        }
    }

    pub fn len(&self) -> usize {
        self.sorted.len() + self.recent.len() - self.removed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves the recent ids into the sorted vector: sorted among
    /// themselves, then merged from the back, in place, into the vector
    /// grown by their number (a large vector grows by remapping its pages,
    /// not by copying them).
    fn fold(&mut self) {
        if !self.removed.is_empty() {
            let removed = std::mem::take(&mut self.removed);
            self.sorted.retain(|k| !removed.contains(k));
        }
        let mut add: Vec<u128> = self.recent.drain().collect();
        self.recent = HashSet::new();
        add.sort_unstable();
        let n = self.sorted.len();
        self.sorted.reserve_exact(add.len());
        self.sorted.resize(n + add.len(), 0);
        let (mut i, mut j, mut to) = (n, add.len(), n + add.len());
        while j > 0 {
            to -= 1;
            if i > 0 && self.sorted[i - 1] > add[j - 1] {
                self.sorted[to] = self.sorted[i - 1];
                i -= 1;
            } else {
                self.sorted[to] = add[j - 1];
                j -= 1;
            }
        }
    }

    /// Interpolation search of `sorted` on the keys' top 64 bits.
    fn in_sorted(&self, key: u128) -> bool {
        let v = &self.sorted;
        let (mut lo, mut hi) = (0usize, v.len());
        let top = |k: u128| (k >> 64) as u64;
        for _ in 0..MAX_INTERPOLATIONS {
            if lo >= hi || key < v[lo] || key > v[hi - 1] {
                return false;
            }
            let (a, b) = (top(v[lo]), top(v[hi - 1]));
            let span = (hi - 1 - lo) as u128;
            let at = if b == a {
                lo
            } else {
                lo + ((u128::from(top(key) - a) * span) / u128::from(b - a)) as usize
            };
            match v[at].cmp(&key) {
                std::cmp::Ordering::Equal => return true,
                std::cmp::Ordering::Less => lo = at + 1,
                std::cmp::Ordering::Greater => hi = at,
            }
        }
        v[lo..hi].binary_search(&key).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000_000;

    #[test]
    fn a_stored_reject_has_the_key_of_its_origin() {
        let origins = [
            Origin::File {
                path: "a.ndjson",
                line: 3,
            },
            Origin::Kafka {
                topic: "t",
                partition: 1,
                offset: 7,
            },
            Origin::KafkaRecord {
                topic: "t",
                partition: 1,
                offset: 7,
                record: 1,
            },
            Origin::KafkaRecord {
                topic: "t",
                partition: 1,
                offset: 7,
                record: 2,
            },
            Origin::KafkaRecord {
                topic: "t",
                partition: 1,
                offset: 8,
                record: 1,
            },
        ];
        let mut b = leaseline_schema::RejectBatchBuilder::new();
        let err = leaseline_schema::decode(b"{").unwrap_err();
        for o in &origins {
            b.append(b"{", &err, o, 0);
        }
        let batch = b.finish();
        let stored = Origins::of(&batch);
        let keys: Vec<u128> = origins.iter().map(origin_key).collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(stored.key(i), Some(*k), "{:?}", origins[i]);
        }
        let distinct: std::collections::HashSet<u128> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), origins.len());
    }

    #[test]
    fn days_are_utc_days_also_before_1970() {
        assert_eq!(day_of(0), 0);
        assert_eq!(day_of(DAY - 1), 0);
        assert_eq!(day_of(DAY), 1);
        assert_eq!(day_of(-1), -1);
    }

    #[test]
    fn the_window_is_the_newest_day_and_the_two_before_once_committed() {
        let mut ids = RecentIds::new();
        assert_eq!(ids.insert(20_000, "a"), Seen::New);
        assert_eq!(ids.insert(20_000, "a"), Seen::Duplicate);
        // Before anything was evicted every day is in memory, whatever
        // its age.
        assert_eq!(ids.insert(19_000, "old"), Seen::New);
        assert_eq!(ids.insert(20_005, "b"), Seen::New);
        // Nothing leaves memory until the caller says the buffer is
        // committed.
        assert_eq!(ids.insert(19_000, "old"), Seen::Duplicate);
        ids.evict();
        assert_eq!(ids.cutoff(), Some(20_003));
        assert_eq!(ids.len(), 1);
        assert_eq!(ids.insert(20_000, "a"), Seen::Unknown);
        assert_eq!(ids.insert(20_003, "c"), Seen::New);
        // One id is one id whichever resident day it comes under.
        assert_eq!(ids.insert(20_004, "c"), Seen::Duplicate);
        // The window never moves back.
        ids.evict();
        assert_eq!(ids.cutoff(), Some(20_003));
    }

    #[test]
    fn a_far_future_timestamp_does_not_evict_today() {
        let today = day_of(chrono::Utc::now().timestamp_micros());
        let mut ids = RecentIds::starting_at(Some(today));
        assert_eq!(ids.insert(today, "now"), Seen::New);
        assert_eq!(ids.insert(today + 365 * 30, "skewed"), Seen::New);
        ids.evict();
        assert_eq!(ids.cutoff(), Some(today + 1 - RESIDENT_DAYS));
        assert_eq!(ids.insert(today, "now"), Seen::Duplicate);
    }

    #[test]
    fn a_writer_opening_on_a_lake_leaves_out_the_old_days() {
        let mut ids = RecentIds::starting_at(Some(20_010));
        assert!(!ids.is_resident(20_007));
        assert!(ids.is_resident(20_008));
        ids.add(20_007, "x");
        assert_eq!(ids.len(), 0);
        assert_eq!(ids.insert(20_007, "x"), Seen::Unknown);
        let mut all = RecentIds::new();
        all.add(20_007, "x");
        all.add(20_009, "y");
        ids.merge(&all);
        assert_eq!(ids.len(), 1);
        assert!(ids.contains("y") && !ids.contains("x"));
    }

    #[test]
    fn insert_reports_duplicates() {
        let mut s = EventIdSet::new();
        assert!(s.insert("c-0001"));
        assert!(!s.insert("c-0001"));
        assert!(s.insert("c-0002"));
        assert!(s.contains("c-0002"));
        assert_eq!(s.len(), 2);
    }

    /// Enough ids for several folds: every id stays found, duplicates are
    /// refused wherever the first copy sits, removal works on both parts.
    #[test]
    fn ids_survive_folds_and_removals() {
        let n = 5 * MIN_FOLD + 10;
        let id = |i: usize| format!("ev-{i}");
        let mut s = EventIdSet::new();
        for i in 0..n {
            assert!(s.insert(&id(i)), "{i} is new");
        }
        assert!(s.sorted.len() >= 4 * MIN_FOLD, "folded");
        assert!(s.sorted.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s.len(), n);
        for i in (0..n).step_by(97) {
            assert!(s.contains(&id(i)));
            assert!(!s.insert(&id(i)));
        }
        for i in n..n + 1000 {
            assert!(!s.contains(&id(i)));
        }
        // One removed from the sorted part, one from the recent part.
        let (old, new) = (id(3), id(n - 1));
        assert!(s.recent.contains(&EventIdSet::key(&new)));
        s.remove(&old);
        s.remove(&new);
        assert!(!s.contains(&old) && !s.contains(&new));
        assert_eq!(s.len(), n - 2);
        assert!(s.insert(&old) && s.insert(&new));
        assert_eq!(s.len(), n);
        s.remove(&old);

        let mut other = EventIdSet::new();
        for i in n - 10..n + 10 {
            other.insert(&id(i));
        }
        s.merge(&other);
        assert_eq!(s.len(), n + 10 - 1);
        assert!(s.contains(&id(n + 9)));
        // A fold drops what was removed.
        for i in n + 10..n + 10 + MIN_FOLD.max(n / FOLD_SHARE) {
            s.insert(&id(i));
        }
        assert!(s.removed.is_empty());
        assert!(!s.contains(&old));
        assert!(s.sorted.windows(2).all(|w| w[0] < w[1]));
    }
}

/// Days, counted back from the newest, whose `event_id`s an ingester keeps
/// in memory: that day and the [`RESIDENT_DAYS`] before it.
///
/// A duplicate carries its original's `ts`, so it belongs to the same
/// `date` partition. Kafka redelivery, a producer's retry and an emitter
/// replaying its spool all bring duplicates within minutes or hours of the
/// original; three days cover those and a weekend-long outage of an
/// emitter with memory to spare (about 16 bytes an id; a fleet of 1,000
/// leases renewing every few seconds is some tens of millions of ids a
/// day). An event of an older day is checked against that day's files
/// when its batch is committed ([`crate::Lake::find_event_ids`]): exact
/// too, and costly only for the rare event that late.
pub const RESIDENT_DAYS: i32 = 2;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// The `date` partition (days since 1970-01-01, UTC) of a timestamp.
pub fn day_of(ts_us: i64) -> i32 {
    ts_us.div_euclid(DAY_US) as i32
}

/// The `event_id`s of the lake's recent days, by day.
///
/// Invariant: every id the lake holds for a day at or after
/// [`RecentIds::cutoff`] is in memory (the writer loads those days' files
/// and adds what it commits); ids of earlier days are not, and a lookup of
/// such a day is [`Seen::Unknown`]. Ids of one day are found whichever
/// resident day they are looked up under, so a duplicate whose `ts`
/// differs from its original is still caught while both are resident.
#[derive(Debug, Default)]
pub struct RecentIds {
    days: std::collections::BTreeMap<i32, EventIdSet>,
    /// None: nothing has been evicted, every day is resident.
    cutoff: Option<i32>,
}

/// What [`RecentIds`] knows of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    New,
    Duplicate,
    /// Its day is no longer in memory: the lake must be asked.
    Unknown,
}

/// The newest day a window may start from: a far-future timestamp (a
/// skewed clock) must not evict every real day, so the newest day counts
/// for at most tomorrow, by this machine's clock.
fn clamp_newest(day: i32) -> i32 {
    day.min(day_of(chrono::Utc::now().timestamp_micros()) + 1)
}

impl RecentIds {
    /// A set where every day is resident (nothing loaded yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// The set of a writer opening on a lake whose newest event file is of
    /// `newest_day`: the days before the window are not in memory.
    pub fn starting_at(newest_day: Option<i32>) -> Self {
        RecentIds {
            days: Default::default(),
            cutoff: newest_day.map(|d| clamp_newest(d) - RESIDENT_DAYS),
        }
    }

    /// The first day in memory, if days before it were left out.
    pub fn cutoff(&self) -> Option<i32> {
        self.cutoff
    }

    pub fn is_resident(&self, day: i32) -> bool {
        self.cutoff.is_none_or(|c| day >= c)
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.holds(EventIdSet::key(event_id))
    }

    fn holds(&self, key: u128) -> bool {
        self.days.values().any(|s| s.contains_key(key))
    }

    /// Records an id of `day`; what was known of it before.
    pub fn insert(&mut self, day: i32, event_id: &str) -> Seen {
        if !self.is_resident(day) {
            return Seen::Unknown;
        }
        let key = EventIdSet::key(event_id);
        if self.holds(key) {
            return Seen::Duplicate;
        }
        self.days.entry(day).or_default().insert_key(key);
        Seen::New
    }

    /// Adds an id the lake holds for `day`, if the day is resident.
    pub fn add(&mut self, day: i32, event_id: &str) {
        if self.is_resident(day) {
            self.days
                .entry(day)
                .or_default()
                .insert_key(EventIdSet::key(event_id));
        }
    }

    pub fn remove(&mut self, event_id: &str) {
        for s in self.days.values_mut() {
            s.remove(event_id);
        }
    }

    /// Adds the resident days' ids of `other`.
    pub fn merge(&mut self, other: &RecentIds) {
        for (day, ids) in &other.days {
            if self.is_resident(*day) {
                self.days.entry(*day).or_default().merge(ids);
            }
        }
    }

    /// Drops the days that fell out of the window ending at the newest
    /// day held. Called once what was inserted is committed: a day evicted
    /// while its ids were only in a writer's buffer would let a duplicate
    /// of them through.
    pub fn evict(&mut self) {
        let Some(newest) = self.days.keys().next_back().copied() else {
            return;
        };
        let start = clamp_newest(newest) - RESIDENT_DAYS;
        if self.cutoff.is_some_and(|c| c >= start) {
            return;
        }
        self.cutoff = Some(start);
        self.days = self.days.split_off(&start);
    }

    /// Ids in memory.
    pub fn len(&self) -> usize {
        self.days.values().map(EventIdSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Days in memory.
    pub fn resident_days(&self) -> usize {
        self.days.len()
    }
}
