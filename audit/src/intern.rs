//! String interning for the strings derived rows carry.
//!
//! Events repeat the same few holder ids, backends and lease ids millions of
//! times; storing a `u32` per event instead of a `String` keeps a push free of
//! allocation once a string has been seen, and hands out `Arc<str>` so the
//! derived rows clone cheaply.
//!
//! Symbol numbers depend on arrival order, so they are handles only: nothing
//! that decides an audit result may order by them (see `record::canonical_cmp`).

use std::sync::Arc;

use hashbrown::DefaultHashBuilder;

use crate::strtab::StrTable;
pub(crate) use crate::strtab::{Sym, NONE};

#[derive(Default, Clone)]
pub(crate) struct Interner {
    table: StrTable,
    strings: Vec<Arc<str>>,
}

impl Interner {
    /// The hash of `s`, after asking for the memory its lookup will read.
    #[inline]
    pub fn prepare(&self, s: &str) -> u64 {
        let hash = self.table.hash(s);
        self.table.prefetch(hash);
        hash
    }

    pub fn find(&self, s: &str) -> Option<Sym> {
        self.table.find(s)
    }

    /// The symbol of `s` (whose [`Interner::prepare`] gave `hash`), and
    /// whether it was new.
    #[inline]
    pub fn intern_hashed(&mut self, s: &str, hash: u64) -> (Sym, bool) {
        let (sym, new) = self.table.intern_hashed(s, hash);
        if new {
            self.strings.push(Arc::from(s));
        }
        (sym, new)
    }

    /// The symbol of `s`, keeping this very `Arc` if it is new (a
    /// compaction moving strings to a new interner).
    pub fn adopt(&mut self, s: &Arc<str>) -> Sym {
        let (sym, new) = self.table.intern_hashed(s, self.table.hash(s));
        if new {
            self.strings.push(s.clone());
        }
        sym
    }

    /// Symbols given out.
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn intern_opt(&mut self, s: Option<&str>) -> Sym {
        s.map_or(NONE, |s| self.intern_hashed(s, self.table.hash(s)).0)
    }

    pub fn get(&self, sym: Sym) -> &Arc<str> {
        &self.strings[sym as usize]
    }

    pub fn get_opt(&self, sym: Sym) -> Option<&Arc<str>> {
        (sym != NONE).then(|| self.get(sym))
    }

    pub fn hasher(&self) -> &DefaultHashBuilder {
        self.table.hasher()
    }
}
