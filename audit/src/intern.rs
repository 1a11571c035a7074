//! String interning.
//!
//! Events repeat the same few holder ids, backends and lease ids millions of
//! times; storing a `u32` per event instead of a `String` keeps a push free of
//! allocation once a string has been seen, and hands out `Arc<str>` so the
//! derived rows clone cheaply. Lookups compare against a copy of the strings
//! kept back to back in one arena, so the strings a push compares with stay
//! in cache instead of being scattered over the heap.
//!
//! Symbol numbers depend on arrival order, so they are handles only: nothing
//! that decides an audit result may order by them (see `record::canonical_cmp`).

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};

/// A symbol: an index into an [`Interner`], or [`NONE`].
pub(crate) type Sym = u32;

/// The absent symbol, so that optional strings take four bytes.
pub(crate) const NONE: Sym = u32::MAX;

#[derive(Default)]
pub(crate) struct Interner {
    table: HashTable<Sym>,
    arena: String,
    /// End offset of each symbol's string in `arena`.
    ends: Vec<usize>,
    strings: Vec<Arc<str>>,
    hasher: DefaultHashBuilder,
}

fn text<'a>(arena: &'a str, ends: &[usize], sym: Sym) -> &'a str {
    let i = sym as usize;
    let start = if i == 0 { 0 } else { ends[i - 1] };
    &arena[start..ends[i]]
}

impl Interner {
    pub fn find(&self, s: &str) -> Option<Sym> {
        let hash = self.hasher.hash_one(s);
        self.table
            .find(hash, |&sym| text(&self.arena, &self.ends, sym) == s)
            .copied()
    }

    /// The symbol of `s`, and whether it was new.
    pub fn intern(&mut self, s: &str) -> (Sym, bool) {
        let hash = self.hasher.hash_one(s);
        let (arena, ends) = (&self.arena, &self.ends);
        if let Some(&sym) = self.table.find(hash, |&sym| text(arena, ends, sym) == s) {
            return (sym, false);
        }
        let sym = Sym::try_from(self.strings.len())
            .ok()
            .filter(|&s| s != NONE)
            .expect("more than 4 billion distinct strings");
        self.strings.push(Arc::from(s));
        self.arena.push_str(s);
        self.ends.push(self.arena.len());
        let (arena, ends, hasher) = (&self.arena, &self.ends, &self.hasher);
        self.table
            .insert_unique(hash, sym, |&k| hasher.hash_one(text(arena, ends, k)));
        (sym, true)
    }

    pub fn intern_opt(&mut self, s: Option<&str>) -> Sym {
        s.map_or(NONE, |s| self.intern(s).0)
    }

    pub fn get(&self, sym: Sym) -> &Arc<str> {
        &self.strings[sym as usize]
    }

    pub fn get_opt(&self, sym: Sym) -> Option<&Arc<str>> {
        (sym != NONE).then(|| self.get(sym))
    }

    pub fn hasher(&self) -> &DefaultHashBuilder {
        &self.hasher
    }
}
