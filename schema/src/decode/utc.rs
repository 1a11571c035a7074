//! The common timestamp shape, `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, read
//! without chrono's general RFC 3339 parser (which handles offsets, case and
//! leap seconds, and costs about as much as scanning the rest of the event).
//! Anything else, and any field out of range, is left to chrono, so this
//! can only agree with it (a test compares the two on a sweep of inputs).

/// Microseconds since the epoch of a UTC RFC 3339 timestamp in the common
/// shape; `None` when `s` is not in that shape or not plainly valid.
pub(super) fn micros(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        b[range].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let punct = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if punct.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Second 60 is a leap second, which chrono folds in its own way.
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let frac = &b[19..b.len() - 1];
    let micros_of_second = match frac {
        [] => 0,
        // One to nine digits: chrono reads nanoseconds and drops the rest.
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            let mut n = 0u32;
            for (i, &c) in digits.iter().enumerate() {
                if !c.is_ascii_digit() {
                    return None;
                }
                if i < 6 {
                    n = n * 10 + u32::from(c - b'0');
                }
            }
            n * 10u32.pow(6u32.saturating_sub(digits.len() as u32))
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    Some(secs * 1_000_000 + i64::from(micros_of_second))
}

fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::micros;

    fn chrono_micros(s: &str) -> Option<i64> {
        chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.timestamp_micros())
    }

    /// Every answer the fast reader gives is chrono's; it declines only
    /// where it must or the input is off the common shape.
    #[test]
    fn agrees_with_chrono_on_a_sweep() {
        let years = [
            "0000", "0001", "1899", "1900", "1969", "1970", "1999", "2000", "2024", "2100", "2400",
            "9999",
        ];
        let fracs = [
            "",
            ".",
            ".5",
            ".05",
            ".123",
            ".123456",
            ".1234567",
            ".999999999",
            ".1234567890",
            ".12a",
            ".-1",
        ];
        let mut taken = 0;
        let mut total = 0;
        for y in years {
            for m in 0..=13u32 {
                for d in [0u32, 1, 15, 28, 29, 30, 31, 32] {
                    for (h, mi, s) in [
                        (0u32, 0u32, 0u32),
                        (23, 59, 59),
                        (24, 0, 0),
                        (12, 60, 0),
                        (12, 0, 60),
                        (12, 0, 61),
                    ] {
                        for f in fracs {
                            for end in ["Z", "z", "+00:00", "+01:30", ""] {
                                let t = format!("{y}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}{f}{end}");
                                total += 1;
                                if let Some(v) = micros(&t) {
                                    taken += 1;
                                    assert_eq!(Some(v), chrono_micros(&t), "{t}");
                                } else if end == "Z"
                                    && f.len() <= 10
                                    && !f.contains(['a', '-'])
                                    && f != "."
                                {
                                    // In shape: declined only when invalid or a leap second.
                                    assert!(chrono_micros(&t).is_none() || s == 60, "declined {t}");
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(taken > total / 50, "took {taken} of {total}");
        for odd in [
            "2026-09-14 10:00:00Z",
            "2026-09-14t10:00:00Z",
            "+2026-09-14T10:00:00Z",
            "2026-9-14T10:00:00Z",
            "２０２６-09-14T10:00:00Z",
            "2026-09-14T10:00:00ZZ",
        ] {
            assert_eq!(micros(odd), None, "{odd}");
        }
    }
}
