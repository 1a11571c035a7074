//! A set of strings numbered in arrival order, built for lookups that miss
//! cache: every push looks up its lease id, holder id and event id in one.
//!
//! An open-addressing table of 8-byte slots (the top 32 bits of the
//! string's hash and its symbol), probed linearly: a lookup usually touches
//! one cache line and reads a string only when the hash bits match. Callers
//! hash first and [`StrTable::prefetch`] the slot, do other work, then
//! [`StrTable::intern_hashed`], so the slot's memory access overlaps that
//! work. A slot's home is the top bits of its hash, so the table is ordered
//! by hash and doubling it rewrites it front to back. The strings live back
//! to back in one arena, written sequentially.

use std::hash::BuildHasher;

use hashbrown::DefaultHashBuilder;

use crate::prefetch::prefetch;

/// A symbol: an index into a [`StrTable`], or [`NONE`].
pub(crate) type Sym = u32;

/// The absent symbol, so that optional strings take four bytes.
pub(crate) const NONE: Sym = u32::MAX;

const EMPTY: u64 = u64::MAX;

#[derive(Clone)]
pub(crate) struct StrTable {
    slots: Vec<u64>,
    /// log2 of `slots.len()`.
    bits: u32,
    arena: String,
    /// End offset of each symbol's string in `arena`.
    ends: Vec<usize>,
    /// Symbols below this are in `slots`; those above were appended
    /// unindexed and are indexed before the next lookup.
    indexed: usize,
    hasher: DefaultHashBuilder,
}

impl Default for StrTable {
    fn default() -> Self {
        const BITS: u32 = 6;
        StrTable {
            slots: vec![EMPTY; 1 << BITS],
            bits: BITS,
            arena: String::new(),
            ends: Vec::new(),
            indexed: 0,
            hasher: DefaultHashBuilder::default(),
        }
    }
}

/// The slot a 32-bit hash tag calls home in a table of `2^bits` slots.
#[inline]
fn home(tag: u64, bits: u32) -> usize {
    (tag >> (32 - bits)) as usize
}

impl StrTable {
    /// Symbols given out.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, sym: Sym) -> &str {
        let i = sym as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.arena[start..self.ends[i]]
    }

    pub fn get_opt(&self, sym: Sym) -> Option<&str> {
        (sym != NONE).then(|| self.get(sym))
    }

    pub fn hasher(&self) -> &DefaultHashBuilder {
        &self.hasher
    }

    #[inline]
    pub fn hash(&self, s: &str) -> u64 {
        self.hasher.hash_one(s)
    }

    /// Asks for the slot a lookup of `hash` starts at.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.slots[home(hash >> 32, self.bits)]);
    }

    /// `hash`'s slot position and symbol if `s` is in the table, else the
    /// empty slot where it would go.
    #[inline]
    fn probe(&self, s: &str, hash: u64) -> Result<Sym, usize> {
        let tag = hash >> 32;
        let mask = self.slots.len() - 1;
        let mut i = home(tag, self.bits);
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return Err(i);
            }
            if slot >> 32 == tag && self.get(slot as Sym) == s {
                return Ok(slot as Sym);
            }
            i = (i + 1) & mask;
        }
    }

    /// Only strings interned with [`StrTable::intern_hashed`] are found
    /// until [`StrTable::index_appended`] runs.
    pub fn find(&self, s: &str) -> Option<Sym> {
        self.probe(s, self.hash(s)).ok()
    }

    fn next_sym(&self) -> Sym {
        Sym::try_from(self.ends.len())
            .ok()
            .filter(|&s| s != NONE)
            .expect("more than 4 billion distinct strings")
    }

    /// The symbol of `s` (whose hash is `hash`), and whether it is new.
    #[inline]
    pub fn intern_hashed(&mut self, s: &str, hash: u64) -> (Sym, bool) {
        self.index_appended();
        if (self.ends.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let empty = match self.probe(s, hash) {
            Ok(sym) => return (sym, false),
            Err(i) => i,
        };
        let sym = self.next_sym();
        self.slots[empty] = ((hash >> 32) << 32) | u64::from(sym);
        self.arena.push_str(s);
        self.ends.push(self.arena.len());
        self.indexed = self.ends.len();
        (sym, true)
    }

    /// Makes room for `n` more strings of about `bytes_each` bytes.
    pub fn reserve(&mut self, n: usize, bytes_each: usize) {
        self.ends.reserve(n);
        self.arena.reserve(n.saturating_mul(bytes_each));
    }

    /// The mean length of the strings held, if any.
    pub fn mean_len(&self) -> Option<usize> {
        (!self.ends.is_empty()).then(|| self.arena.len() / self.ends.len())
    }

    /// Adds `s` as a new symbol without looking it up or indexing it: the
    /// caller knows it is not in the table. Appending is sequential; the
    /// random-access index is built only if a lookup ever needs it.
    #[inline]
    pub fn append_unindexed(&mut self, s: &str) -> Sym {
        let sym = self.next_sym();
        self.arena.push_str(s);
        self.ends.push(self.arena.len());
        sym
    }

    /// Indexes the strings appended unindexed, so lookups find them. A
    /// string that was appended twice is found as its first symbol.
    pub fn index_appended(&mut self) {
        while self.indexed < self.ends.len() {
            if (self.indexed + 1) * 2 > self.slots.len() {
                self.grow();
            }
            let sym = self.indexed as Sym;
            let hash = self.hash(self.get(sym));
            if let Err(empty) = self.probe(self.get(sym), hash) {
                self.slots[empty] = ((hash >> 32) << 32) | u64::from(sym);
            }
            self.indexed += 1;
        }
    }

    #[cold]
    fn grow(&mut self) {
        let bits = self.bits + 1;
        assert!(bits <= 32, "string table full");
        let mut slots = vec![EMPTY; 1 << bits];
        let mask = slots.len() - 1;
        // Old slots come in (nearly) ascending home order, so the new homes
        // ascend too: the writes sweep the new table once.
        for &slot in &self.slots {
            if slot == EMPTY {
                continue;
            }
            let mut i = home(slot >> 32, bits);
            while slots[i] != EMPTY {
                i = (i + 1) & mask;
            }
            slots[i] = slot;
        }
        self.slots = slots;
        self.bits = bits;
    }
}
