//! The set of `event_id`s seen, for de-duplication across the whole history.
//!
//! It is the one structure every push must probe at random, so it is laid
//! out for that: an open-addressing table of 8-byte slots (a 32-bit hash tag
//! and the id's symbol), probed linearly, so a lookup usually touches one
//! cache line and never follows a pointer unless the tag matches. The ids
//! themselves live back to back in one arena, written sequentially.

use std::hash::BuildHasher;

use hashbrown::DefaultHashBuilder;

use crate::intern::{Sym, NONE};

const EMPTY: u64 = u64::MAX;

#[derive(Default)]
pub(crate) struct EventIds {
    slots: Vec<u64>,
    /// Full hash per symbol, to refill the table when it grows without
    /// rereading the ids.
    hashes: Vec<u64>,
    arena: String,
    /// End offset of each id in `arena`.
    ends: Vec<usize>,
    hasher: DefaultHashBuilder,
}

impl EventIds {
    pub fn get(&self, sym: Sym) -> &str {
        let i = sym as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.arena[start..self.ends[i]]
    }

    pub fn get_opt(&self, sym: Sym) -> Option<&str> {
        (sym != NONE).then(|| self.get(sym))
    }

    /// The symbol of `id`, and whether it is new.
    pub fn intern(&mut self, id: &str) -> (Sym, bool) {
        if (self.ends.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let hash = self.hasher.hash_one(id);
        let tag = hash >> 32;
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                break;
            }
            if slot >> 32 == tag && self.get(slot as Sym) == id {
                return (slot as Sym, false);
            }
            i = (i + 1) & mask;
        }
        let sym = Sym::try_from(self.ends.len())
            .ok()
            .filter(|&s| s != NONE)
            .expect("more than 4 billion event ids");
        self.slots[i] = (tag << 32) | u64::from(sym);
        self.hashes.push(hash);
        self.arena.push_str(id);
        self.ends.push(self.arena.len());
        (sym, true)
    }

    fn grow(&mut self) {
        let capacity = (self.slots.len() * 2).max(1024);
        self.slots.clear();
        self.slots.resize(capacity, EMPTY);
        let mask = capacity - 1;
        for (sym, &hash) in self.hashes.iter().enumerate() {
            let mut i = hash as usize & mask;
            while self.slots[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = ((hash >> 32) << 32) | sym as u64;
        }
    }
}
