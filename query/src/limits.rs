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
    /// 503, SQLSTATE 53300). Unset, as long as [`Self::timeout`]; see
    /// [`Self::queue_wait`].
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub queue_timeout: Option<Duration>,
    /// Whether the query threads are idle-class (Linux `SCHED_IDLE`):
    /// they run only on the time the rest of the process leaves; see
    /// [`crate::executor`]. Default true.
    pub sched_idle: bool,
    /// The scheduling priority of the query threads, as a nice value from
    /// 0 (the process's own) to 19 (the lowest): how they share the cores
    /// with a busy ingest when `sched_idle` is false. Default 10.
    pub nice: i32,
}

impl QueryLimits {
    /// How long a query may wait in line: `queue_timeout`, or the query
    /// timeout when that is unset.
    ///
    /// The line is first come, first served, and every running query
    /// ends within `timeout`, answered or stopped. So a query with at
    /// most `max_concurrent` others ahead of it gets a place within one
    /// `timeout`: with no more clients than twice the places, no query is
    /// refused that the service would have run, and the longest a client
    /// waits for an answer or an error is twice the timeout. A shorter
    /// wait refuses queries that were next in line whenever the places
    /// are held by slow ones (a dashboard's full-history aggregates);
    /// those clients retry at once and add load instead of waiting.
    pub fn queue_wait(&self) -> Duration {
        self.queue_timeout.unwrap_or(self.timeout)
    }
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits {
            max_memory_bytes: ByteSize::gib(1),
            memory_pool_bytes: ByteSize::gib(2),
            timeout: Duration::from_secs(30),
            max_concurrent: 8,
            queue_timeout: None,
            sched_idle: true,
            nice: crate::executor::DEFAULT_NICE,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::QueryLimits;
    use crate::{QueryEngine, QueryError};

    fn engine(limits: QueryLimits) -> (tempfile::TempDir, QueryEngine) {
        let dir = tempfile::tempdir().unwrap();
        let lake = leaseline_lake::Lake::open(dir.path().to_str().unwrap()).unwrap();
        (dir, QueryEngine::new(lake).with_limits(limits))
    }

    // The clock is paused: it moves only when every task waits on a timer,
    // to the next one due, so the waits below are exact and instant.
    #[tokio::test(start_paused = true)]
    async fn unset_a_query_waits_in_line_as_long_as_a_query_may_run() {
        let (_dir, engine) = engine(QueryLimits {
            max_concurrent: 1,
            timeout: Duration::from_secs(30),
            ..QueryLimits::default()
        });
        assert_eq!(engine.limits().queue_wait(), Duration::from_secs(30));

        // Next in line behind a query that runs for 20 s: it gets the place.
        let running = engine.admit().await.unwrap();
        let next = tokio::spawn({
            let engine = engine.clone();
            async move { engine.admit().await.map(drop) }
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            !next.is_finished(),
            "refused while the query ahead still ran"
        );
        drop(running);
        next.await.unwrap().unwrap();

        // Behind one that holds its place past the timeout: refused then.
        let _running = engine.admit().await.unwrap();
        let start = Instant::now();
        match engine.admit().await {
            Err(QueryError::Busy { running, waited }) => {
                assert_eq!((running, waited), (1, Duration::from_secs(30)));
                assert_eq!(start.elapsed(), Duration::from_secs(30));
            }
            other => panic!("expected busy, got {:?}", other.map(drop)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_configured_wait_is_kept() {
        let (_dir, engine) = engine(QueryLimits {
            max_concurrent: 1,
            queue_timeout: Some(Duration::from_secs(2)),
            ..QueryLimits::default()
        });
        let _running = engine.admit().await.unwrap();
        let start = Instant::now();
        assert!(matches!(
            engine.admit().await,
            Err(QueryError::Busy { waited, .. }) if waited == Duration::from_secs(2)
        ));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
