//! Where a message's quotes are, found in the same pass that rules out
//! escapes and control characters.
//!
//! The fast path needs both facts: with no backslash anywhere, a string
//! ends at the next quote, so once the quotes are known a string's end is a
//! bit scan instead of a `memchr` call per string (a call, a dispatch
//! through a function pointer and a size switch, for strings a few dozen
//! bytes long). The bitmap covers the first [`COVERED`] bytes, several
//! times a typical event (the decode bench's average is 278 bytes); past
//! them the scanner falls back to `memchr`.

/// Bytes of a message the bitmap covers.
pub(super) const COVERED: usize = 1024;
const WORDS: usize = COVERED / 64;

/// Filler for the tail of a partial block: neither a quote, nor a
/// backslash, nor a control character.
const FILLER: u8 = b' ';

/// One bit per byte of the first [`COVERED`] bytes, set where the byte is a
/// quote; least significant bit first.
pub(super) struct Quotes {
    words: [u64; WORDS],
}

impl Quotes {
    /// The quotes of `bytes`, or `None` if any byte is a backslash or a
    /// control character (below 0x20).
    #[inline]
    pub(super) fn find(bytes: &[u8]) -> Option<Quotes> {
        let mut words = [0u64; WORDS];
        // Gathered over the whole message and judged once: escapes are
        // rare, and a branch per block would cost more than it saves.
        let mut odd = 0;
        let covered = &bytes[..bytes.len().min(COVERED)];
        let mut blocks = covered.chunks_exact(64);
        for (word, block) in words.iter_mut().zip(&mut blocks) {
            let (quotes, block_odd) = block_masks(block.try_into().expect("64 bytes"));
            *word = quotes;
            odd |= block_odd;
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            let mut block = [FILLER; 64];
            block[..rest.len()].copy_from_slice(rest);
            let (quotes, block_odd) = block_masks(&block);
            words[covered.len() / 64] = quotes;
            odd |= block_odd;
        }
        if odd != 0 || bytes.get(COVERED..).is_some_and(has_escape_or_control) {
            return None;
        }
        Some(Quotes { words })
    }

    /// The position of the first quote at or after `from`, if any.
    #[inline(always)]
    pub(super) fn next(&self, bytes: &[u8], from: usize) -> Option<usize> {
        let mut w = from / 64;
        if w < WORDS {
            let mut bits = self.words[w] & (!0u64 << (from % 64));
            loop {
                if bits != 0 {
                    return Some(w * 64 + bits.trailing_zeros() as usize);
                }
                w += 1;
                if w == WORDS {
                    break;
                }
                bits = self.words[w];
            }
        }
        let from = from.max(COVERED);
        memchr::memchr(b'"', bytes.get(from..)?).map(|i| from + i)
    }
}

/// The quote bits of a 64-byte block, and whether it holds a backslash or a
/// control character.
#[inline(always)]
fn block_masks(block: &[u8; 64]) -> (u64, u32) {
    let mut quotes = 0u64;
    let mut odd = 0u32;
    for (i, chunk) in block.chunks_exact(16).enumerate() {
        let (q, o) = chunk_masks(chunk.try_into().expect("16 bytes"));
        quotes |= u64::from(q) << (16 * i);
        odd |= o;
    }
    (quotes, odd)
}

/// Whether any byte is a backslash or a control character: for a
/// message's bytes past the bitmap.
fn has_escape_or_control(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(16);
    let mut odd = 0;
    for chunk in &mut chunks {
        odd |= chunk_masks(chunk.try_into().expect("16 bytes")).1;
    }
    let mut tail = [FILLER; 16];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    (odd | chunk_masks(&tail).1) != 0
}

/// SSE2, which every x86-64 processor has: `safe_arch` gives its compares
/// and `pmovmskb` without `unsafe` here. LLVM does not find `pmovmskb` in
/// the portable loop below (it came to 9,183 instructions per event).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn sse2_chunk_masks(chunk: &[u8; 16]) -> (u32, u32) {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, min_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let v = load_unaligned_m128i(chunk);
    let quote = cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'"' as i8));
    let backslash = cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'\\' as i8));
    // Unsigned `c <= 0x1f`: the minimum with 0x1f is `c` itself.
    let control = cmp_eq_mask_i8_m128i(min_u8_m128i(v, set_splat_i8_m128i(0x1f)), v);
    (
        move_mask_i8_m128i(quote) as u32,
        move_mask_i8_m128i(bitor_m128i(backslash, control)) as u32,
    )
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
use sse2_chunk_masks as chunk_masks;

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
use portable_chunk_masks as chunk_masks;

/// The quote bits of 16 bytes, and non-zero where one of them is a
/// backslash or a control character. Compiled everywhere so that the test
/// holds the SSE2 version to it.
#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "sse2", not(test)),
    allow(dead_code)
)]
#[inline(always)]
fn portable_chunk_masks(chunk: &[u8; 16]) -> (u32, u32) {
    let mut quote = 0u32;
    let mut odd = 0u32;
    for (i, &c) in chunk.iter().enumerate() {
        quote |= u32::from(c == b'"') << i;
        odd |= u32::from(c < 0x20 || c == b'\\');
    }
    (quote, odd)
}

#[cfg(test)]
mod tests {
    use super::{portable_chunk_masks, Quotes, COVERED};

    /// The SSE2 masks are the portable loop's: every byte value in every
    /// lane, among neighbours of every class.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    #[test]
    fn sse2_masks_match_the_portable_loop() {
        for lane in 0..16 {
            for byte in 0..=255u8 {
                for around in [b'a', b'"', b'\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff] {
                    let mut chunk = [around; 16];
                    chunk[lane] = byte;
                    let (quote, odd) = super::sse2_chunk_masks(&chunk);
                    let (want_quote, want_odd) = portable_chunk_masks(&chunk);
                    assert_eq!(quote, want_quote, "{chunk:?}");
                    assert_eq!(odd != 0, want_odd != 0, "{chunk:?}");
                }
            }
        }
    }

    /// Every quote is found, at every offset and across block, word and
    /// bitmap edges, as `memchr` would find it.
    #[test]
    fn finds_what_memchr_finds() {
        for len in [
            0,
            1,
            15,
            16,
            17,
            63,
            64,
            65,
            100,
            200,
            250,
            COVERED - 1,
            COVERED,
            COVERED + 1,
            3000,
        ] {
            for step in [1, 7, 63, 64, 65, 700] {
                let mut text = vec![b'a'; len];
                let mut at = step / 2;
                while at < len {
                    text[at] = b'"';
                    at += step;
                }
                let q = Quotes::find(&text).expect("no escapes");
                for from in 0..=len + 1 {
                    let want = text
                        .get(from..)
                        .and_then(|t| memchr::memchr(b'"', t))
                        .map(|i| from + i);
                    assert_eq!(
                        q.next(&text, from),
                        want,
                        "len {len} step {step} from {from}"
                    );
                }
            }
        }
    }

    /// A backslash or a control character anywhere, in the bitmap's part
    /// or past it, refuses the message; DEL and non-ASCII bytes do not.
    #[test]
    fn escapes_and_control_characters_anywhere_are_refused() {
        for len in [1, 16, 64, 100, COVERED, COVERED + 40] {
            for at in [0, len / 2, len - 1] {
                let refused = [b'\\', 0x00, 0x09, 0x0a, 0x1f].map(|b| (b, true));
                let fine = [b' ', 0x7f, 0x80, 0xc3, 0xff].map(|b| (b, false));
                for (byte, refuse) in refused.into_iter().chain(fine) {
                    let mut text = vec![b'x'; len];
                    text[at] = byte;
                    assert_eq!(
                        Quotes::find(&text).is_none(),
                        refuse,
                        "len {len} at {at} byte {byte:#x}"
                    );
                }
            }
        }
    }
}
