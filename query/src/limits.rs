//! Per-query limits, from the `[query]` table of the configuration file.

use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// What one query may use. A query over either limit fails with a
/// resource error (HTTP 503, a PostgreSQL error on the wire) and leaves
/// other queries alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryLimits {
    /// Memory one query may hold at once (sorts, joins, aggregations, and
    /// values built by functions such as `repeat` or `range`), e.g.
    /// `"1GiB"`. Nothing spills to disk. Default 1 GiB.
    pub max_memory_bytes: ByteSize,
    /// Memory every query of the process together may hold at once, every
    /// surface included; see [`crate::memory`]. Default 2 GiB.
    pub memory_pool_bytes: ByteSize,
    /// How long a query may run, planning included (`"30s"`). Default 30 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Queries that may run at once in one process; the rest wait in line.
    /// Default 8.
    pub max_concurrent: usize,
    /// How long a query waits in line before it is refused as busy (HTTP
    /// 503, SQLSTATE 53300). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// The scheduling priority of the query threads, as a nice value from
    /// 0 (the process's own) to 19 (the lowest); see [`crate::executor`].
    /// Default 10.
    pub nice: i32,
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits {
            max_memory_bytes: ByteSize::gib(1),
            memory_pool_bytes: ByteSize::gib(2),
            timeout: Duration::from_secs(30),
            max_concurrent: 8,
            queue_timeout: Duration::from_secs(10),
            nice: crate::executor::DEFAULT_NICE,
        }
    }
}
