//! The fast path: a scanner for the shape nearly every event has.
//!
//! It accepts a strict subset of JSON: one object whose keys and string
//! values have no escapes, whose numbers are non-negative, without an
//! exponent and with at most 19 integer digits or 15 significant digits in
//! all, whose `attrs` is `null` or an object of such strings, and whose
//! other values are `true`, `false` or `null`. Any other input, including
//! every syntax error, makes [`scan`] answer `None` and the caller parse it
//! again with serde, so this scanner never has to decide what is invalid,
//! only what is plainly valid. Within the subset it files exactly what the
//! serde walk files (the differential tests and the fuzz target check this).

use std::borrow::Cow;

use super::{Attrs, Field, RawEvent, Scalar};

/// Fills `raw` from `text` if all of `text` is in the subset; `None`
/// otherwise, with `raw` left half-filled for the caller to drop.
pub(super) fn scan<'a>(text: &'a str, raw: &mut RawEvent<'a>) -> Option<()> {
    let mut s = Scanner { text, at: 0 };
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if !s.eat_if(b'}') {
        loop {
            let key = s.string()?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            match Field::from_key(key) {
                Some(Field::Attrs) => raw.put_attrs(s.attrs()?),
                Some(field) => raw.put(field, s.scalar()?.0),
                None => {
                    let start = s.at;
                    s.scalar()?;
                    raw.put_unknown(Cow::Borrowed(key), &text[start..s.at]);
                }
            }
            s.ws();
            if s.eat_if(b'}') {
                break;
            }
            s.eat(b',')?;
            s.ws();
        }
    }
    s.ws();
    (s.at == text.len()).then_some(())
}

/// Exact powers of ten: a significand below 2^53 divided by one of these is
/// the correctly rounded decimal, and the very division serde_json makes.
const POW10: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat_if(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.at += usize::from(hit);
        hit
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.eat_if(c).then_some(())
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.at + word.len();
        (self.text.as_bytes().get(self.at..end)? == word.as_bytes()).then(|| self.at = end)
    }

    /// A string without escapes; its text between the quotes.
    fn string(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        let mut i = start;
        // Eight bytes at a time up to the first that ends the string or
        // cannot be in one here: `"`, `\` or a control character.
        while let Some(chunk) = bytes.get(i..i + 8) {
            let hits = specials(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
            if hits != 0 {
                i += (hits.trailing_zeros() / 8) as usize;
                return self.string_end(start, i);
            }
            i += 8;
        }
        while let Some(&c) = bytes.get(i) {
            if c == b'"' || c == b'\\' || c < 0x20 {
                break;
            }
            i += 1;
        }
        self.string_end(start, i)
    }

    /// Ends a string whose first special byte is at `i`: a closing quote,
    /// or an escape or raw control character, which the serde walk
    /// unescapes or refuses.
    fn string_end(&mut self, start: usize, i: usize) -> Option<&'a str> {
        if self.text.as_bytes().get(i) != Some(&b'"') {
            return None;
        }
        self.at = i + 1;
        Some(&self.text[start..i])
    }

    /// A non-negative number within the limits above.
    fn number(&mut self) -> Option<Scalar<'a>> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut n: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            // 19 digits always fit a u64; 20 might not.
            if self.at - start == 19 {
                return None;
            }
            n = n * 10 + u64::from(d - b'0');
            self.at += 1;
        }
        let int_digits = self.at - start;
        // JSON has no leading zeros.
        if int_digits == 0 || (int_digits > 1 && bytes[start] == b'0') {
            return None;
        }
        match self.peek() {
            Some(b'.') => {
                self.at += 1;
                let frac_start = self.at;
                while let Some(d @ b'0'..=b'9') = self.peek() {
                    // Fifteen digits stay below 2^53, exact as an f64.
                    if int_digits + (self.at - frac_start) == 15 {
                        return None;
                    }
                    n = n * 10 + u64::from(d - b'0');
                    self.at += 1;
                }
                let frac_digits = self.at - frac_start;
                if frac_digits == 0 || matches!(self.peek(), Some(b'e' | b'E')) {
                    return None;
                }
                Some(Scalar::F64(n as f64 / POW10[frac_digits]))
            }
            Some(b'e' | b'E') => None,
            _ => Some(Scalar::U64(n)),
        }
    }

    /// Any value the subset has but an object or an array, and whether it
    /// was a string.
    fn scalar(&mut self) -> Option<(Scalar<'a>, bool)> {
        Some(match self.peek()? {
            b'"' => (Scalar::Str(Cow::Borrowed(self.string()?)), true),
            b'0'..=b'9' => (self.number()?, false),
            b't' => {
                self.literal("true")?;
                (Scalar::Bool, false)
            }
            b'f' => {
                self.literal("false")?;
                (Scalar::Bool, false)
            }
            b'n' => {
                self.literal("null")?;
                (Scalar::Null, false)
            }
            _ => return None,
        })
    }

    /// `attrs`: `null` or an object of strings. Anything else, wrong or not,
    /// is the serde walk's to judge.
    fn attrs(&mut self) -> Option<Attrs<'a>> {
        if self.peek()? == b'n' {
            self.literal("null")?;
            return Some(Attrs::Null);
        }
        self.eat(b'{')?;
        self.ws();
        let mut out = Vec::new();
        if self.eat_if(b'}') {
            return Some(Attrs::Map(out));
        }
        loop {
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let value = self.string()?;
            out.push((Cow::Borrowed(key), Cow::Borrowed(value)));
            self.ws();
            if self.eat_if(b'}') {
                return Some(Attrs::Map(out));
            }
            self.eat(b',')?;
            self.ws();
        }
    }
}

/// The high bit of each of the eight (little-endian) bytes that is `"`, `\`
/// or below 0x20, by the "some byte is below n" bit trick. A lane above a
/// hit may be marked falsely (the borrow runs on), never one below the
/// first hit, so the lowest mark is always the first special byte.
fn specials(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH;
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    below(w, 0x20) | below(quote, 1) | below(backslash, 1)
}

#[cfg(test)]
mod tests {
    use super::specials;

    fn first_special(b: [u8; 8]) -> Option<usize> {
        let hits = specials(u64::from_le_bytes(b));
        (hits != 0).then(|| (hits.trailing_zeros() / 8) as usize)
    }

    #[test]
    fn specials_marks_the_first_special_byte_in_every_lane() {
        assert_eq!(first_special(*b"abcdefgh"), None);
        assert_eq!(
            first_special([0xc3, 0xa9, 0x7f, 0xff, b' ', b'!', b'#', b'[']),
            None
        );
        for lane in 0..8 {
            for special in (0u8..0x20).chain([b'"', b'\\']) {
                // Specials after it must not move the first.
                let mut b = *b"abcdefgh";
                b[lane] = special;
                for later in b.iter_mut().skip(lane + 1) {
                    *later = [0u8, b'"', b'\\', 0x1f][lane % 4];
                }
                assert_eq!(first_special(b), Some(lane), "{special:#x} in lane {lane}");
            }
        }
        for fine in (0x20u8..=0xff).filter(|c| *c != b'"' && *c != b'\\') {
            assert_eq!(first_special([fine; 8]), None, "{fine:#x}");
        }
    }
}
