//! The contract's keys, looked up by both parsers: a key's first two bytes
//! pick the one contract key it can be, from a table built at compile time
//! (the build fails if two keys ever share a slot), and one compare decides.
//!
//! The fast path compares in place, closing quote included, in three
//! masked words with no branch on the name ([`in_window`]); keys are most
//! of an event's strings, and a search of candidates cost a mispredicted
//! branch or two per key. Keys whose end is already known (the serde walk's,
//! and the fast path's near a message's end) go through [`lookup`].

use super::Field;

/// Bytes [`in_window`] reads from a key's first byte on.
pub(super) const WINDOW: usize = 24;

/// The contract field a key's bytes, with its closing quote and whatever
/// follows, start with, and the key's length; `None` for any other key.
#[inline(always)]
pub(super) fn in_window(window: &[u8; WINDOW]) -> Option<(Field, usize)> {
    let key = KEYS[key_slot(window[0], window[1])].as_ref()?;
    if key.matches(window) {
        Some((key.field, usize::from(key.len)))
    } else {
        None
    }
}

/// The contract field named exactly `key`, if any.
#[inline]
pub(super) fn lookup(key: &[u8]) -> Option<Field> {
    let (&first, &second) = (key.first()?, key.get(1)?);
    let entry = KEYS[key_slot(first, second)].as_ref()?;
    same_bytes(key, entry.field.as_str().as_bytes()).then_some(entry.field)
}

/// A contract key as the little-endian words of its name and closing
/// quote, zero-padded to 24 bytes, and masks that keep those bytes only.
/// The quote is compared with the name, not loaded at the name's length
/// afterwards: that load waited on the table's length, and the key check
/// was the scanner's hottest spot.
struct KeyWords {
    field: Field,
    len: u8,
    words: [u64; 3],
    masks: [u64; 3],
}

impl KeyWords {
    /// Whether `window`, from a key's first byte on, starts with this name
    /// and its closing quote.
    #[inline(always)]
    fn matches(&self, window: &[u8; WINDOW]) -> bool {
        let mut diff = 0;
        for (i, chunk) in window.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            diff |= (word ^ self.words[i]) & self.masks[i];
        }
        diff == 0
    }
}

/// The slot of a key by its first two bytes. No two contract keys share
/// one (checked when [`KEYS`] is built, at compile time).
#[inline(always)]
const fn key_slot(first: u8, second: u8) -> usize {
    (first as usize + second as usize * 7) % 64
}

/// The contract keys by [`key_slot`].
static KEYS: [Option<KeyWords>; 64] = {
    let mut table = [const { None }; 64];
    let mut i = 0;
    while i < Field::ALL.len() {
        let field = Field::ALL[i];
        let name = Field::NAMES[field as usize].as_bytes();
        assert!(
            name.len() >= 2 && name.len() < WINDOW,
            "contract keys have 2 to 23 bytes"
        );
        let mut words = [0u64; 3];
        let mut masks = [0u64; 3];
        let mut j = 0;
        while j <= name.len() {
            let byte = if j < name.len() { name[j] } else { b'"' };
            words[j / 8] |= (byte as u64) << (8 * (j % 8));
            masks[j / 8] |= 0xff << (8 * (j % 8));
            j += 1;
        }
        let slot = key_slot(name[0], name[1]);
        assert!(table[slot].is_none(), "two contract keys share a slot");
        table[slot] = Some(KeyWords {
            field,
            len: name.len() as u8,
            words,
            masks,
        });
        i += 1;
    }
    table
};

/// Slice equality without a call into `memcmp`, which costs more than the
/// compare itself for names this short: two overlapping word compares (of
/// 8, 4 or 2 bytes) cover any length up to twice the word, and a loop of
/// words the rest. A byte loop cost a mispredicted exit per key.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn w8(s: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"))
    }
    fn w4(s: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"))
    }
    fn w2(s: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(s[at..at + 2].try_into().expect("2 bytes"))
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1 => a[0] == b[0],
        2..=3 => w2(a, 0) == w2(b, 0) && w2(a, n - 2) == w2(b, n - 2),
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        _ => {
            let mut at = 0;
            while at + 8 < n {
                if w8(a, at) != w8(b, at) {
                    return false;
                }
                at += 8;
            }
            w8(a, n - 8) == w8(b, n - 8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{lookup, same_bytes};
    use crate::decode::Field;

    #[test]
    fn lookup_finds_every_contract_key_and_nothing_else() {
        for f in Field::ALL {
            assert_eq!(lookup(f.as_str().as_bytes()), Some(f));
        }
        for odd in ["", "t", "tz", "Ts", "kinds", "ttl_m", "ttl_ms_", "é"] {
            assert_eq!(lookup(odd.as_bytes()), None, "{odd:?}");
        }
    }

    #[test]
    fn same_bytes_is_slice_equality() {
        // Every length up to past two words, and a difference at each byte.
        for n in 0..40usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "{n}");
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!same_bytes(&a, &b), "length {n}, byte {at}");
            }
        }
    }
}
