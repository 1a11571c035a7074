//! A replay's audit kept to a window of event time, so that an import's
//! memory does not grow with the history it reads.
//!
//! The engine's auditor holds every event it is given until told to let
//! go. A replay (`leaseline import`) reads no SQL from it, so once the
//! newest event time has moved `after` past a grant, the grant is settled
//! ([`AlertEngine::settle`]) and its events are dropped; the alerts keep
//! what they need (the engine's own steps and pending violations).
//!
//! The protocol:
//! - after each commit the engine is given, once the newest event time has
//!   moved half of `after` since the last settle, the audit settles
//!   everything older than `after` before it ([`Settling::step`]);
//! - a lease given an event older than what its audit let go of is *stale*
//!   (see `audit/src/settle.rs`): it is not settled any more, and at the
//!   end of the replay ([`Settling::finish`]), once the engine has been
//!   given every commit, it is audited again from its whole history in the
//!   lake, read in passes over the lake's files that each hold a bounded
//!   share of its rows. A violation
//!   the late event makes or unmakes then comes out of the audit like any
//!   other, before the end of the input confirms the violations.
//!
//! Why at the end: the lake may already hold commits the engine has not
//!   been given yet (ingest runs ahead of the alert engine by a bounded
//!   queue), and a history read early would give the audit events whose
//!   rules have not run; when they came, the audit would take them for
//!   duplicates. Until then, a stale lease's answers are wrong, which a
//!   replay never reads: its violations are confirmed only at the end.
//!
//! Settling costs a pass over the events held, so it runs a bounded
//! number of times per span of event time rather than per commit; the
//! re-audits read the lake's files a few times, once per replay.

use std::collections::HashSet;
use std::time::Duration;

use leaseline_lake::{Lake, Table};
use leaseline_schema::EventColumns;
use tracing::info;

use crate::engine::AlertEngine;
use crate::error::Result;

/// About how many rows of the lake one pass of [`Settling::finish`] holds.
const REREAD_ROWS: u64 = 262_144;

/// When a replay's audit settles.
#[derive(Debug, Clone)]
pub struct Settling {
    after_us: i64,
    /// The next cutoff to settle at.
    next: i64,
    /// Leases re-audited from the lake, for the replay's report.
    pub reloads: u64,
}

impl Settling {
    /// Settles what is `after` older than the newest event; none for zero.
    pub fn new(after: Duration) -> Option<Settling> {
        let after_us = i64::try_from(after.as_micros()).unwrap_or(i64::MAX);
        (after_us > 0).then_some(Settling {
            after_us,
            next: i64::MIN,
            reloads: 0,
        })
    }

    /// Settles when due (see the module docs), after the engine was given
    /// a commit.
    pub fn step(&mut self, engine: &mut AlertEngine) {
        let Some(newest) = engine.max_ts() else {
            return;
        };
        let cutoff = newest.saturating_sub(self.after_us);
        if cutoff >= self.next {
            engine.settle(cutoff);
            self.next = cutoff.saturating_add((self.after_us / 2).max(1));
        }
    }

    /// Audits every stale lease again from `lake`, which must hold exactly
    /// the events the engine was given (the replay's input is done).
    pub async fn finish(&mut self, engine: &mut AlertEngine, lake: &Lake) -> Result<()> {
        let stale = engine.take_stale();
        if stale.is_empty() {
            return Ok(());
        }
        let m = lake.latest().await?;
        // Leases per pass over the lake, so that a pass holds about
        // REREAD_ROWS rows when the stale leases' histories are of average
        // size (an import out of time order can make every lease stale).
        let rows = m.rows_of(Table::LeaseEvents).max(1);
        let known = engine.leases_known().max(stale.len()) as u64;
        let per_pass = ((known * REREAD_ROWS / rows) as usize).clamp(1, stale.len());
        for group in stale.chunks(per_pass) {
            let wanted: HashSet<&str> = group.iter().map(|l| &**l).collect();
            let batches = lake.read_leases(&m, &wanted).await?;
            let cols: Vec<EventColumns> = batches
                .iter()
                .map(EventColumns::new)
                .collect::<std::result::Result<_, _>>()?;
            let mut by_lease = EventColumns::events_by_lease(&cols, &wanted)?;
            for lease in group {
                let events = by_lease.remove(&**lease).unwrap_or_default();
                info!(lease_id = %lease, events = events.len(), "an event older than what the audit let go of: the lease is audited again from the lake");
                engine.reload(lease, &events);
                self.reloads += 1;
            }
        }
        Ok(())
    }
}
