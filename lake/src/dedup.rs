//! The set of `event_id`s already in the lake.
//!
//! Ids are kept as 128-bit xxh3 hashes: 16 bytes an id whatever its length,
//! and a collision chance (about n²/2¹²⁹) that stays negligible for any lake
//! this process can hold in memory.

use hashbrown::HashSet;
use xxhash_rust::xxh3::xxh3_128;

#[derive(Debug, Default)]
pub struct EventIdSet {
    ids: HashSet<u128>,
}

impl EventIdSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn key(event_id: &str) -> u128 {
        xxh3_128(event_id.as_bytes())
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.ids.contains(&Self::key(event_id))
    }

    /// Adds an id; false if it was already there.
    pub fn insert(&mut self, event_id: &str) -> bool {
        self.ids.insert(Self::key(event_id))
    }

    pub fn remove(&mut self, event_id: &str) {
        self.ids.remove(&Self::key(event_id));
    }

    /// Adds every id of `other`.
    pub fn merge(&mut self, other: &EventIdSet) {
        self.ids.extend(other.ids.iter().copied());
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_reports_duplicates() {
        let mut s = EventIdSet::new();
        assert!(s.insert("c-0001"));
        assert!(!s.insert("c-0001"));
        assert!(s.insert("c-0002"));
        assert!(s.contains("c-0002"));
        assert_eq!(s.len(), 2);
    }
}
