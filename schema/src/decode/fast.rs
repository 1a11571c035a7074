//! The fast path: a scanner for the shape nearly every event has.
//!
//! It accepts a strict subset of JSON: one object, with no backslash and no
//! control character anywhere (so no escapes, and no whitespace but spaces),
//! whose numbers are non-negative, without an exponent and with at most 19
//! integer digits or 15 significant digits in all, whose `attrs` is `null`
//! or an object of strings, and whose other values are strings, `true`,
//! `false` or `null`. Any other input, including every syntax error, makes
//! [`scan`] answer `None` and the caller parse it again with serde, and so
//! does a contract field that its own check would refuse: this scanner never
//! has to word a refusal, only decide what is plainly valid. What it keeps
//! is exactly what the serde walk's checks keep (the differential tests in
//! `schema/tests/fast_path.rs` and the fuzz target check this on every
//! input).

use std::borrow::Cow;

use super::quotes::Quotes;
use super::{epoch_ms_micros, is_lower_hex, keys, put_unknown, utc};
use super::{Checked, Field, Scalar, MAX_ID_BYTES};
use crate::event::{Kind, Source};

/// Fills `out` from `text` if all of `text` is in the subset and every
/// contract field in it is plainly valid on its own; `None` otherwise, with
/// `out` left half-filled for the caller to drop.
///
/// Each contract field is read as the type it must have and checked as
/// [`super::RawEvent::validate`] checks it; a field that would be refused
/// (wrong type, out of range, bad format, given twice) or a timestamp in a
/// shape other than the common UTC one is the serde walk's, which words
/// the refusal. So this path answers only where the checks between fields
/// ([`Checked::finish`], shared with the serde walk) decide.
pub(super) fn scan<'a>(text: &'a str, out: &mut Checked<'a>) -> Option<()> {
    // One vectorised pass up front rules out escapes and control characters
    // anywhere, so that a string's end is simply the next quote, and notes
    // where the quotes are. Compact producers send neither; whitespace other
    // than spaces (pretty-printed JSON) goes the serde way with them.
    let mut s = Scanner::new(text)?;
    s.ws();
    s.eat(b'{')?;
    s.ws();
    // The contract fields met so far, one bit each.
    let mut seen = 0u32;
    if !s.eat_if(b'}') {
        // Spaces are skipped where a byte is looked at anyway (a key's
        // quote, a value's first byte, the separators), not by a separate
        // look before every token: compact JSON has none.
        loop {
            let key = s.key()?;
            s.eat_spaced(b':').then_some(())?;
            match key {
                Ok(field) => {
                    let bit = 1u32 << field as u32;
                    if seen & bit != 0 {
                        return None;
                    }
                    seen |= bit;
                    s.field(field, out)?;
                }
                Err(key) => {
                    // The value's own text, as serde's `RawValue` gives it.
                    s.ws();
                    let start = s.at;
                    s.scalar()?;
                    put_unknown(&mut out.extra, Cow::Borrowed(key), &text[start..s.at]);
                }
            }
            if s.eat_spaced(b'}') {
                break;
            }
            s.eat_spaced(b',').then_some(())?;
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
    quotes: Quotes,
}

impl<'a> Scanner<'a> {
    /// A scanner at the start of `text`, or `None` if `text` holds a
    /// backslash or a control character.
    #[inline(always)]
    fn new(text: &'a str) -> Option<Self> {
        Some(Scanner {
            text,
            at: 0,
            quotes: Quotes::find(text.as_bytes())?,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Spaces: the only whitespace left after the check in [`scan`].
    fn ws(&mut self) {
        while self.peek() == Some(b' ') {
            self.at += 1;
        }
    }

    fn eat_if(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.at += usize::from(hit);
        hit
    }

    /// `c` after any spaces.
    #[inline(always)]
    fn eat_spaced(&mut self, c: u8) -> bool {
        match self.peek() {
            Some(x) if x == c => {
                self.at += 1;
                true
            }
            Some(b' ') => {
                self.ws();
                self.eat_if(c)
            }
            _ => false,
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.eat_if(c).then_some(())
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.at + word.len();
        (self.text.as_bytes().get(self.at..end)? == word.as_bytes()).then(|| self.at = end)
    }

    /// A key, after any spaces: the contract field it names, or else its
    /// text.
    #[inline(always)]
    fn key(&mut self) -> Option<Result<Field, &'a str>> {
        // Contract keys are matched in place (see `keys`); unknown keys, and
        // keys too near the message's end for that, take the quote bitmap to
        // their end.
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b'"') {
            self.ws();
            if bytes.get(self.at) != Some(&b'"') {
                return None;
            }
        }
        let after_quote = self.at + 1;
        if let Some(window) = bytes.get(after_quote..after_quote + keys::WINDOW) {
            if let Some((field, len)) = keys::in_window(window.try_into().expect("window")) {
                self.at = after_quote + len + 1;
                return Some(Ok(field));
            }
        }
        let end = self.quotes.next(bytes, after_quote)?;
        self.at = end + 1;
        if let Some(field) = keys::lookup(&bytes[after_quote..end]) {
            return Some(Ok(field));
        }
        Some(Err(self.slice(after_quote, end)))
    }

    /// The text between two quotes. `split_at` checks the two char
    /// boundaries inline, where indexing by a range called out of line.
    #[inline(always)]
    fn slice(&self, start: usize, end: usize) -> &'a str {
        self.text.split_at(end).0.split_at(start).1
    }

    /// A string; its text between the quotes. [`scan`] has made sure the
    /// text holds no escapes and no control characters.
    #[inline(always)]
    fn string(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        let end = self.quotes.next(bytes, start)?;
        self.at = end + 1;
        Some(self.slice(start, end))
    }

    /// A non-negative number within the limits above.
    #[inline(always)]
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
                    if int_digits + (self.at - frac_start) >= 15 {
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

    /// A contract field's value, after any spaces, read as the type the
    /// field must have and checked as the serde walk's `validate` checks
    /// it. `null` is an absent field there, and here.
    #[inline(always)]
    fn field(&mut self, field: Field, out: &mut Checked<'a>) -> Option<()> {
        if self.peek()? == b' ' {
            self.ws();
        }
        let first = self.peek()?;
        if first == b'n' {
            return self.literal("null");
        }
        match field {
            Field::Ts => {
                out.ts = Some(if first == b'"' {
                    utc::micros(self.string()?)?
                } else {
                    epoch_ms_micros(self.integer()?)?
                })
            }
            Field::Kind => out.kind = Some(Kind::parse(self.string()?)?),
            Field::Source => out.source = Some(Source::parse(self.string()?)?),
            Field::LeaseId => out.lease_id = Some(self.id()?),
            Field::HolderId => out.holder_id = Some(self.id()?),
            Field::FencingToken => out.fencing_token = Some(self.integer()?),
            Field::TtlMs => {
                out.ttl_ms = Some(i64::try_from(self.integer()?).ok().filter(|&t| t > 0)?)
            }
            Field::EventId => out.event_id = Some(Cow::Borrowed(self.string()?)),
            Field::Backend => out.backend = Some(Cow::Borrowed(self.string()?)),
            Field::LatencyMs => out.latency_ms = Some(self.float()?),
            Field::Reason => out.reason = Some(Cow::Borrowed(self.string()?)),
            Field::MaxToken => out.max_token = Some(self.integer()?),
            Field::MonoMs => out.mono_ms = Some(self.float()?),
            Field::KeepaliveSentMonoMs => out.keepalive_sent_mono_ms = Some(self.float()?),
            Field::DeadlineMonoMs => out.deadline_mono_ms = Some(self.float()?),
            Field::TraceId => out.trace_id = Some(self.hex(32)?),
            Field::SpanId => out.span_id = Some(self.hex(16)?),
            Field::Attrs => out.attrs = self.attrs()?,
        }
        Some(())
    }

    /// A `lease_id` or `holder_id`: a string of 1 to `MAX_ID_BYTES` bytes.
    #[inline(always)]
    fn id(&mut self) -> Option<Cow<'a, str>> {
        let s = self.string()?;
        (!s.is_empty() && s.len() <= MAX_ID_BYTES).then_some(Cow::Borrowed(s))
    }

    /// A string of exactly `digits` lowercase hex digits.
    #[inline(always)]
    fn hex(&mut self, digits: usize) -> Option<Cow<'a, str>> {
        let s = self.string()?;
        is_lower_hex(s, digits).then_some(Cow::Borrowed(s))
    }

    /// A number without a fraction. (The subset has no minus sign.)
    #[inline(always)]
    fn integer(&mut self) -> Option<u64> {
        match self.number()? {
            Scalar::U64(n) => Some(n),
            _ => None,
        }
    }

    /// Any number, as the f64 the serde walk makes of it. (The subset has no
    /// minus sign, so it is never negative.)
    #[inline(always)]
    fn float(&mut self) -> Option<f64> {
        match self.number()? {
            Scalar::U64(n) => Some(n as f64),
            Scalar::F64(v) => Some(v),
            _ => None,
        }
    }

    /// Any value the subset has but an object or an array, after any
    /// spaces.
    #[inline(always)]
    fn scalar(&mut self) -> Option<Scalar<'a>> {
        if self.peek()? == b' ' {
            self.ws();
        }
        Some(match self.peek()? {
            b'"' => Scalar::Str(Cow::Borrowed(self.string()?)),
            b'0'..=b'9' => self.number()?,
            b't' => {
                self.literal("true")?;
                Scalar::Bool
            }
            b'f' => {
                self.literal("false")?;
                Scalar::Bool
            }
            b'n' => {
                self.literal("null")?;
                Scalar::Null
            }
            _ => return None,
        })
    }

    /// `attrs` other than `null`: an object of strings. Anything else,
    /// wrong or not, is the serde walk's to judge.
    fn attrs(&mut self) -> Option<Vec<(Cow<'a, str>, Cow<'a, str>)>> {
        self.eat(b'{')?;
        self.ws();
        let mut out = Vec::new();
        if self.eat_if(b'}') {
            return Some(out);
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
                return Some(out);
            }
            self.eat(b',')?;
            self.ws();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{scan, Scanner};
    use crate::decode::{Checked, Field};

    #[test]
    fn every_contract_key_is_matched_in_place_and_nothing_else() {
        // Both compares: in words, with 24 bytes or more left from the key
        // on, and byte-wise near the message's end.
        for value in ["1", &"1".repeat(40)] {
            for f in Field::ALL {
                let text = format!("\"{f}\":{value}");
                let mut s = Scanner::new(&text).unwrap();
                assert_eq!(s.key(), Some(Ok(f)), "{text}");
                assert_eq!(s.at, f.as_str().len() + 2);
                let name = f.as_str();
                // A longer or shorter key that starts the same, or one that
                // differs in any one byte, is not the field.
                let mut odds = vec![format!("{f}x"), name[..name.len() - 1].to_string()];
                for at in 0..name.len() {
                    let mut b = name.as_bytes().to_vec();
                    b[at] ^= 0x20;
                    odds.push(String::from_utf8(b).unwrap());
                }
                for odd in odds {
                    let text = format!("\"{odd}\":{value}");
                    let mut s = Scanner::new(&text).unwrap();
                    assert_eq!(s.key(), Some(Err(odd.as_str())), "{text}");
                    assert_eq!(s.at, odd.len() + 2);
                }
            }
            for odd in ["", "tz", "Ts", "é", "ttl_ms_", "keepalive_sent_mono_msx"] {
                let text = format!("\"{odd}\":{value}");
                let Some(mut s) = Scanner::new(&text) else {
                    continue;
                };
                assert_eq!(s.key(), Some(Err(odd)), "{text}");
            }
        }
        // An unterminated key is the serde walk's.
        for odd in ["\"ts", "\"t", "ts"] {
            let mut s = Scanner::new(odd).unwrap();
            assert_eq!(s.key(), None, "{odd}");
        }
    }

    #[test]
    fn escapes_and_control_characters_anywhere_go_the_serde_way() {
        let plain = r#"{"lease_id":"a","pod":"b"}"#;
        assert!(scan(plain, &mut Checked::default()).is_some());
        for (at, odd) in [
            (14, "\\n"),
            (14, "\\\""),
            (21, "\\u0041"),
            (0, "\n"),
            (0, "\t"),
            (14, "\u{1}"),
            (26, "\r\n"),
        ] {
            let mut text = plain.to_string();
            text.insert_str(at, odd);
            assert!(scan(&text, &mut Checked::default()).is_none(), "{text:?}");
        }
    }
}
