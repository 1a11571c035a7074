//! The `event_id`s already in the lake, for de-duplication.
//!
//! Ids are kept as 128-bit xxh3 hashes: 16 bytes an id whatever its length,
//! and a collision chance (about n²/2¹²⁹) that stays negligible for any lake
//! this process can hold in memory.
//!
//! An ingester holds the ids of the lake's newest minutes of event time
//! only, within a budget of ids ([`RecentIds`], [`RESIDENT_IDS`]); that can
//! still be millions of ids, so their layout is the ingester's memory: a hash table alone costs 17 bytes a slot
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
    fn minutes_are_utc_minutes_also_before_1970() {
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(SLOT_US - 1), 0);
        assert_eq!(slot_of(SLOT_US), 1);
        assert_eq!(slot_of(-1), -1);
    }

    #[test]
    fn the_window_is_three_days_of_minutes_once_committed() {
        let mut ids = RecentIds::new();
        let t = 29_000_000;
        assert_eq!(ids.insert(t, "a"), Seen::New);
        assert_eq!(ids.insert(t, "a"), Seen::Duplicate);
        // Before anything was evicted every minute is in memory, whatever
        // its age.
        assert_eq!(ids.insert(t - 100_000, "old"), Seen::New);
        assert_eq!(ids.insert(t + 5 * 24 * 60, "b"), Seen::New);
        // Nothing leaves memory until the caller says the buffer is
        // committed.
        assert_eq!(ids.insert(t - 100_000, "old"), Seen::Duplicate);
        ids.evict();
        let start = t + 5 * 24 * 60 + 1 - MAX_RESIDENT_SLOTS;
        assert_eq!(ids.cutoff(), Some(start));
        assert_eq!(ids.len(), 1);
        assert_eq!(ids.insert(t, "a"), Seen::Unknown);
        assert_eq!(ids.insert(start, "c"), Seen::New);
        // A duplicate stamped in the next minute is still caught.
        assert_eq!(ids.insert(start + 1, "c"), Seen::Duplicate);
        // The window never moves back.
        ids.evict();
        assert_eq!(ids.cutoff(), Some(start));
    }

    #[test]
    fn over_the_budget_the_oldest_minutes_leave_first() {
        let mut ids = RecentIds::new().with_budget(10);
        let t = 29_000_000;
        for m in 0..5 {
            for i in 0..4 {
                assert_eq!(ids.insert(t + m, &format!("{m}-{i}")), Seen::New);
            }
        }
        ids.evict();
        // 20 ids held: minutes go, oldest first, until at most 10 are.
        assert_eq!(ids.cutoff(), Some(t + 3));
        assert_eq!((ids.len(), ids.resident_slots()), (8, 2));
        assert_eq!(ids.insert(t + 2, "2-0"), Seen::Unknown);
        assert_eq!(ids.insert(t + 3, "3-0"), Seen::Duplicate);
        // The newest two minutes stay, however many their ids.
        for i in 0..50 {
            ids.insert(t + 6, &format!("6-{i}"));
        }
        ids.evict();
        assert_eq!(ids.cutoff(), Some(t + 5));
        assert_eq!(ids.len(), 50);
    }

    #[test]
    fn a_far_future_timestamp_does_not_evict_now() {
        let now = slot_of(chrono::Utc::now().timestamp_micros());
        let mut ids = RecentIds::starting_at(Some(now));
        assert_eq!(ids.insert(now, "now"), Seen::New);
        assert_eq!(ids.insert(now + 60 * 24 * 365 * 30, "skewed"), Seen::New);
        ids.evict();
        assert_eq!(ids.cutoff(), Some(now + 24 * 60 + 1 - MAX_RESIDENT_SLOTS));
        assert_eq!(ids.insert(now, "now"), Seen::Duplicate);
    }

    #[test]
    fn a_writer_opening_on_a_lake_leaves_out_the_old_minutes() {
        let newest = 29_000_000;
        let first = newest + 1 - MAX_RESIDENT_SLOTS;
        let mut ids = RecentIds::starting_at(Some(newest));
        assert!(!ids.is_resident(first - 1));
        assert!(ids.is_resident(first));
        ids.add(first - 1, "x");
        assert_eq!(ids.len(), 0);
        assert_eq!(ids.insert(first - 1, "x"), Seen::Unknown);
        let mut all = RecentIds::new();
        all.add(first - 1, "x");
        all.add(first + 1, "y");
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

/// The unit of residency: the `event_id`s of one minute of event time
/// ([`slot_of`]) are in memory together or not at all.
pub const SLOT_US: i64 = 60_000_000;

/// The most ids an ingester keeps in memory (16 bytes each in the sorted
/// vector, 128 MiB): once over it, the oldest minutes leave memory.
///
/// A duplicate carries its original's `ts`. Kafka redelivery and a
/// producer's retry bring duplicates within seconds or minutes of the
/// original; an emitter replaying its spool after an outage brings them
/// hours or days later. Keeping ids by event time, the newest first, within
/// a budget of ids rather than of time makes memory independent of the
/// fleet's rate and of the lake's age: a fleet of 1,000 leases (some
/// hundreds of events a second) keeps its whole [`MAX_RESIDENT_SLOTS`];
/// one of 20,000 leases at 29,000 events a second keeps its last five
/// minutes. An event of a minute no longer in memory is checked against
/// the files that span that minute when its batch is committed
/// ([`crate::Lake::find_event_ids`], through their `event_id` bloom
/// filters): exact too, and costly only for what arrives that late.
pub const RESIDENT_IDS: usize = 8 << 20;

/// The most minutes kept, however few their ids (three days): a lake
/// opened after a pause loads no older ids than this.
pub const MAX_RESIDENT_SLOTS: i32 = 3 * 24 * 60;

/// Minutes kept however many their ids: the newest and the one before, so
/// that the budget never evicts the minute being written.
const MIN_RESIDENT_SLOTS: i32 = 2;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// The `date` partition (days since 1970-01-01, UTC) of a timestamp.
pub fn day_of(ts_us: i64) -> i32 {
    ts_us.div_euclid(DAY_US) as i32
}

/// The minute (since 1970-01-01, UTC) of a timestamp: the slot its id is
/// kept under.
pub fn slot_of(ts_us: i64) -> i32 {
    ts_us
        .div_euclid(SLOT_US)
        .clamp(i32::MIN as i64, i32::MAX as i64) as i32
}

/// The `event_id`s of the lake's newest minutes of event time, by minute.
///
/// Invariant: every id the lake holds for a minute at or after
/// [`RecentIds::cutoff`] is in memory (the writer loads those minutes' ids
/// from the files and adds what it commits); ids of earlier minutes are
/// not, and a lookup of such a minute is [`Seen::Unknown`]. An id is
/// looked up in its own minute and the two beside it, so a duplicate
/// re-stamped within a minute of its original is still caught.
#[derive(Debug)]
pub struct RecentIds {
    slots: std::collections::BTreeMap<i32, EventIdSet>,
    /// None: nothing has been evicted, every minute is resident.
    cutoff: Option<i32>,
    /// [`RESIDENT_IDS`], smaller in tests.
    budget: usize,
}

impl Default for RecentIds {
    fn default() -> Self {
        RecentIds {
            slots: Default::default(),
            cutoff: None,
            budget: RESIDENT_IDS,
        }
    }
}

/// What [`RecentIds`] knows of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    New,
    Duplicate,
    /// Its minute is no longer in memory: the lake must be asked.
    Unknown,
}

/// The newest minute a window may end at: a far-future timestamp (a skewed
/// clock) must not evict every real minute, so the newest counts for at
/// most a day ahead of this machine's clock.
fn clamp_newest(slot: i32) -> i32 {
    slot.min(slot_of(chrono::Utc::now().timestamp_micros()).saturating_add(24 * 60))
}

impl RecentIds {
    /// A set where every minute is resident (nothing loaded yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// The set of a writer opening on a lake whose newest event is of
    /// minute `newest`: minutes more than [`MAX_RESIDENT_SLOTS`] older are
    /// not in memory.
    pub fn starting_at(newest: Option<i32>) -> Self {
        RecentIds {
            cutoff: newest.map(|d| clamp_newest(d) + 1 - MAX_RESIDENT_SLOTS),
            ..Self::default()
        }
    }

    /// The same with a budget of `ids` rather than [`RESIDENT_IDS`].
    pub fn with_budget(mut self, ids: usize) -> Self {
        self.budget = ids;
        self
    }

    /// The first minute in memory, if minutes before it were left out.
    pub fn cutoff(&self) -> Option<i32> {
        self.cutoff
    }

    pub fn is_resident(&self, slot: i32) -> bool {
        self.cutoff.is_none_or(|c| slot >= c)
    }

    /// Whether `event_id` is in memory under any minute (for the ids of
    /// another writer's few new files).
    pub fn contains(&self, event_id: &str) -> bool {
        let key = EventIdSet::key(event_id);
        self.slots.values().any(|s| s.contains_key(key))
    }

    fn holds(&self, slot: i32, key: u128) -> bool {
        self.slots
            .range(slot.saturating_sub(1)..=slot.saturating_add(1))
            .any(|(_, s)| s.contains_key(key))
    }

    /// Records an id of minute `slot`; what was known of it before.
    pub fn insert(&mut self, slot: i32, event_id: &str) -> Seen {
        if !self.is_resident(slot) {
            return Seen::Unknown;
        }
        let key = EventIdSet::key(event_id);
        if self.holds(slot, key) {
            return Seen::Duplicate;
        }
        self.slots.entry(slot).or_default().insert_key(key);
        Seen::New
    }

    /// Adds an id the lake holds for minute `slot`, if it is resident.
    pub fn add(&mut self, slot: i32, event_id: &str) {
        if self.is_resident(slot) {
            self.slots
                .entry(slot)
                .or_default()
                .insert_key(EventIdSet::key(event_id));
        }
    }

    pub fn remove(&mut self, event_id: &str) {
        for s in self.slots.values_mut() {
            s.remove(event_id);
        }
    }

    /// Adds the resident minutes' ids of `other`.
    pub fn merge(&mut self, other: &RecentIds) {
        for (slot, ids) in &other.slots {
            if self.is_resident(*slot) {
                self.slots.entry(*slot).or_default().merge(ids);
            }
        }
    }

    /// Drops the minutes older than [`MAX_RESIDENT_SLOTS`] before the
    /// newest held, then the oldest while more than [`RESIDENT_IDS`] ids
    /// are held. Called once what was inserted is committed: a minute
    /// evicted while its ids were only in a writer's buffer would let a
    /// duplicate of them through. The window never moves back.
    pub fn evict(&mut self) {
        let Some(newest) = self.slots.keys().next_back().copied() else {
            return;
        };
        let newest = clamp_newest(newest);
        let mut start = newest + 1 - MAX_RESIDENT_SLOTS;
        let mut held = self.len();
        for (&slot, ids) in &self.slots {
            if slot < start {
                held -= ids.len();
                continue;
            }
            if held <= self.budget || newest - slot < MIN_RESIDENT_SLOTS {
                break;
            }
            held -= ids.len();
            start = slot + 1;
        }
        if self.cutoff.is_some_and(|c| c >= start) {
            return;
        }
        self.cutoff = Some(start);
        self.slots = self.slots.split_off(&start);
    }

    /// Ids in memory.
    pub fn len(&self) -> usize {
        self.slots.values().map(EventIdSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Minutes in memory.
    pub fn resident_slots(&self) -> usize {
        self.slots.len()
    }
}
