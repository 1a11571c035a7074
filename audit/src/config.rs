//! The audit's tolerances.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Tolerances of the audit, read from the `[audit]` table of the
/// configuration file. Durations are humantime strings (`50ms`, `1s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// How much later than its safe deadline (last keepalive send time +
    /// TTL - 1 s, on its monotonic clock) a holder may fence before it is a
    /// `late_fence`. Default 50 ms.
    #[serde(with = "humantime_serde")]
    pub late_fence_tolerance: Duration,
    /// How far two different clocks may disagree; comparisons across clocks
    /// only report what exceeds it. Default 250 ms.
    #[serde(with = "humantime_serde")]
    pub clock_skew_tolerance: Duration,
    /// How much event time, behind the newest event, the audit that SQL
    /// reads (`sql`, `serve` without `--ingest`, `check --lake`) keeps as
    /// events while it reads a lake: older grants it keeps as rows, which
    /// cost far less than their events. `0s` keeps every event. Default
    /// 10 min.
    #[serde(with = "humantime_serde")]
    pub event_window: Duration,
    /// At most this many events held by a long-running audit
    /// (`serve --ingest`, `import`, SQL reading a lake): while its window
    /// holds more, the window narrows (see `audit/src/window.rs`). `0`
    /// sets no bound.
    /// Default 4,000,000.
    pub max_events_held: usize,
    /// Whether SQL answers `lease_timeline` and `lease_violations` from
    /// the rows `serve --ingest` stored in the lake, auditing only what
    /// has not settled, when those rows answer for the snapshot read.
    /// `false` audits every event of `lease_events`: slower, and
    /// independent of the stored rows. Default true.
    pub read_stored: bool,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            late_fence_tolerance: Duration::from_millis(50),
            clock_skew_tolerance: Duration::from_millis(250),
            event_window: Duration::from_secs(600),
            max_events_held: 4_000_000,
            read_stored: true,
        }
    }
}

/// The tolerances in the units the engine compares in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tolerances {
    pub skew_us: i64,
    pub late_fence_ms: f64,
}

impl From<&AuditConfig> for Tolerances {
    fn from(c: &AuditConfig) -> Self {
        Tolerances {
            // A tolerance beyond i64 microseconds (292k years) means "never".
            skew_us: i64::try_from(c.clock_skew_tolerance.as_micros()).unwrap_or(i64::MAX / 4),
            late_fence_ms: c.late_fence_tolerance.as_micros() as f64 / 1000.0,
        }
    }
}
