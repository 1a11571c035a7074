//! Times and numbers as alert texts show them.

use chrono::{DateTime, SecondsFormat, Utc};

/// RFC 3339 UTC with milliseconds: `2026-09-14T10:00:13.300Z`.
pub fn fmt_ts(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{us} µs"))
}

pub fn fmt_ms(ms: f64) -> String {
    format!("{ms:.1} ms")
}
