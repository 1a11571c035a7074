//! The engine in a running service: events in from ingest once the lake
//! has committed them (`leaseline_ingest::fanout`), alerts out to the
//! console, the receivers and the history table, time moved by the events
//! of every input partition, and by the wall clock only when no partition
//! has anything waiting (see [`crate::clock`]). Each assigned Kafka
//! partition's history is first rebuilt from the lake
//! ([`crate::rebuild`]), so a restart loses no pending alert and records
//! none twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaseline_ingest::{Committed, CommittedReceiver};
use leaseline_lake::Lake;
use leaseline_schema::LeaseEvent;
use tracing::{error, info, warn};

use crate::alert::{Alert, AlertState};
use crate::clock::{EventClock, PartitionKey};
use crate::engine::AlertEngine;
use crate::history::{AlertHistory, Recorded};
use crate::notify::Notifier;
use crate::rebuild::{PartitionHistory, Positions};
use crate::settling::Settling;
use crate::stored::Resume;

const TICK: Duration = Duration::from_millis(100);
const HISTORY_FLUSH: Duration = Duration::from_secs(5);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Logs one state change the way an operator reads it on a console.
pub fn log_change(a: &Alert) {
    let labels = a.labels();
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    match a.state {
        AlertState::Firing => {
            warn!(alert = %labels.join(","), description = %a.description, "ALERT FIRING: {}", a.summary)
        }
        AlertState::Resolved => info!(alert = %labels.join(","), "alert resolved: {}", a.summary),
        AlertState::Pending => info!(alert = %labels.join(","), "alert pending: {}", a.summary),
    }
}

/// Which input partition each lease's events come from, and which
/// partitions this process reads.
///
/// A lease's alerts come from the process that reads its partition: after
/// a rebalance, the new owner rebuilds the lease from the lake and alerts
/// for it, and the old one, whose engine still holds the lease, stays
/// quiet about it. This needs producers to key by `lease_id`, as the
/// contract asks; those that do not are told once per lease. Their alerts
/// are still right in one process (the watermark waits for the slowest
/// partition), but wait longer.
#[derive(Default)]
struct Keying {
    partition_of: HashMap<Arc<str>, PartitionKey>,
    warned: HashSet<Arc<str>>,
    assigned: HashSet<PartitionKey>,
}

impl Keying {
    fn assigned(&mut self, p: &PartitionKey) {
        self.assigned.insert(p.clone());
    }

    fn revoked(&mut self, p: &PartitionKey) {
        self.assigned.remove(p);
    }

    /// Whether this process speaks for the alert: alerts about the fleet,
    /// and those of leases read from files or from a partition it reads.
    fn owns(&self, a: &Alert) -> bool {
        let Some(lease) = a.key.lease_id.as_deref() else {
            return true;
        };
        match self.partition_of.get(lease) {
            Some(p) => p.0.is_empty() || self.assigned.contains(p),
            None => true,
        }
    }

    fn see(&mut self, lease: &str, p: &PartitionKey, engine: &AlertEngine) {
        match self.partition_of.get(lease) {
            None => {
                self.partition_of.insert(Arc::from(lease), p.clone());
            }
            Some(first) if first == p || self.warned.contains(lease) => {}
            Some(first) => {
                warn!(
                    lease_id = lease,
                    first_topic = %first.0,
                    first_partition = first.1,
                    topic = %p.0,
                    partition = p.1,
                    "events of one lease came from two input partitions: the producer does not key messages by lease_id (the contract asks it to); alerts are right but wait for the slowest partition"
                );
                self.warned.insert(Arc::from(lease));
                engine.count_lease_on_several_partitions();
            }
        }
    }
}

/// Runs until `events` closes (ingest stopped): pushes events, advances the
/// watermark on every committed batch and every 100 ms, logs and delivers changes,
/// re-sends firing alerts every resend interval, writes the history every
/// few seconds. On the way out it writes the last history rows and gives
/// receivers a few seconds to take what is queued.
///
/// With `settling`, the engine's audit holds only a window of event time
/// as events (see [`crate::settling`]); a snapshot is marked as covered
/// only once the leases a batch made stale are audited again.
pub async fn run(
    mut engine: AlertEngine,
    mut events: CommittedReceiver,
    notifier: Notifier,
    lake: Lake,
    mut settling: Option<Settling>,
) {
    let mut clock = EventClock::new(
        engine.config().lateness,
        engine.config().partition_idle_timeout,
    );
    let mut keying = Keying::default();
    let mut positions = Positions::default();
    let mut recorded = Recorded::default();
    let mut history = AlertHistory::new();
    let resend = engine.config().resend_interval;
    let mut last_resend = Instant::now();
    let mut last_flush = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    let mut from_kafka = false;
    // The newest snapshot the engine holds every event of (of the
    // partitions it reads), not marked yet.
    let mut unmarked: Option<(u64, u64)> = None;
    while open {
        // Partitions were given up in this round: their next owner reads
        // lease_alerts, so this round's rows are written before ingest
        // hears that the round is handled.
        let mut revoked = false;
        tokio::select! {
            batch = events.recv() => match batch {
                // One evaluation per committed batch, not one per event.
                Some(batch) => {
                    from_kafka |= batch
                        .iter()
                        .any(|c| partition_of(c).is_some_and(|p| !p.0.is_empty()));
                    revoked |= batch.iter().any(|c| matches!(c, Committed::Revoked(_)));
                    let assigned = batch.iter().any(|c| matches!(c, Committed::Assigned(p) if !p.0.is_empty()));
                    let lake_history = if assigned {
                        rebuild_sources(&lake, &mut recorded).await
                    } else {
                        None
                    };
                    let resume = match settling.as_mut() {
                        Some(s) if lake_history.is_some() => s.resume_point(&lake).await,
                        _ => None,
                    };
                    let now = now_us();
                    let mut ctx = Take {
                        engine: &mut engine,
                        clock: &mut clock,
                        keying: &mut keying,
                        positions: &mut positions,
                        lake_history: lake_history.as_ref(),
                        resume: resume.as_ref(),
                        now,
                        unmarked: &mut unmarked,
                    };
                    for input in batch {
                        ctx.take(input);
                    }
                }
                None => open = false,
            },
            _ = tick.tick() => {}
        }
        // Without a watermark (nothing assigned, or a partition not read
        // yet), time stands; violations found meanwhile stay pending.
        engine.advance(clock.watermark(now_us()).unwrap_or(i64::MIN));
        // Settled behind the watermark just moved, also between batches;
        // file input has no offsets to tell what the engine was given from
        // what the lake holds, so it keeps every event.
        let answers = match settling.as_mut() {
            Some(s) if from_kafka => {
                s.step_live(&mut engine, &lake, &positions, &keying.assigned)
                    .await
            }
            _ => true,
        };
        if answers {
            if let Some((version, lake_rows)) = unmarked.take() {
                engine.mark(version, lake_rows);
            }
        }
        if !open && !from_kafka {
            // File input (the demo's simulator) has ended, stopped or not:
            // nothing more can arrive late, so the lateness window closes,
            // as at the end of `check FILE`. Kafka input goes on after a
            // restart, which rebuilds the pending alerts instead.
            engine.finish_replay();
        }
        let mut changes = engine.take_changes();
        // A rebuilt engine raises its history's alerts again; those recorded
        // before are not news.
        changes.retain(|a| !recorded.contains(a, !notifier.is_empty()) && keying.owns(a));
        if !changes.is_empty() {
            for a in &changes {
                log_change(a);
            }
            notifier.send(&changes, now_us());
            history.record(&changes, now_us(), !notifier.is_empty());
        }
        if last_resend.elapsed() >= resend {
            let firing: Vec<Alert> = engine
                .active()
                .into_iter()
                .filter(|a| a.state == AlertState::Firing && keying.owns(a))
                .collect();
            notifier.send(&firing, now_us());
            last_resend = Instant::now();
        }
        if !history.is_empty() && (last_flush.elapsed() >= HISTORY_FLUSH || !open || revoked) {
            if let Err(e) = history.flush(&lake).await {
                error!(error = %e, "could not write the alert history; will retry");
            }
            last_flush = Instant::now();
        }
        events.handled();
    }
    if let Err(e) = history.flush(&lake).await {
        error!(error = %e, rows = history.len(), "could not write the last alert history rows");
    }
    notifier.shutdown(DRAIN_TIMEOUT).await;
    info!("alert engine stopped");
}

/// What the lake gives an assignment: the partitions' history and what
/// `lease_alerts` holds (added to `recorded`). On error the engine goes on
/// with what it has: alerts from live events still work.
async fn rebuild_sources(lake: &Lake, recorded: &mut Recorded) -> Option<PartitionHistory> {
    match Recorded::load(lake).await {
        Ok(r) => recorded.extend(r),
        Err(e) => {
            error!(error = %e, "could not read lease_alerts; alerts recorded before may be recorded again")
        }
    }
    match PartitionHistory::load(lake).await {
        Ok(h) => Some(h),
        Err(e) => {
            error!(error = %e, "could not read the assigned partitions' history from the lake; alerts pending before a restart may be missed");
            None
        }
    }
}

fn partition_of(c: &Committed) -> Option<&PartitionKey> {
    match c {
        Committed::Event(_, p, _)
        | Committed::Assigned(p)
        | Committed::Revoked(p)
        | Committed::CaughtUp(p) => Some(p),
        Committed::Commit { .. } => None,
    }
}

/// One committed batch going into the engine.
struct Take<'a> {
    engine: &'a mut AlertEngine,
    clock: &'a mut EventClock,
    keying: &'a mut Keying,
    positions: &'a mut Positions,
    lake_history: Option<&'a PartitionHistory>,
    /// Where the stored audit rows of the partitions replayed end.
    resume: Option<&'a Resume>,
    now: i64,
    unmarked: &'a mut Option<(u64, u64)>,
}

impl Take<'_> {
    fn take(&mut self, input: Committed) {
        match input {
            Committed::Event(ev, p, offset) => {
                if self.positions.take(&p, offset) {
                    self.event(&ev, &p);
                }
            }
            Committed::Assigned(p) => {
                self.keying.assigned(&p);
                self.clock.assigned(p.clone(), self.now);
                if let Some(h) = self.lake_history {
                    let (engine, clock, keying, now) = (
                        &mut *self.engine,
                        &mut *self.clock,
                        &mut *self.keying,
                        self.now,
                    );
                    // The events the stored rows answer for, then each lease
                    // replayed settled where its stored rows end, then the
                    // rest, any of which may make a lease stale as it did
                    // live (see crate::stored).
                    let until = self.resume.and_then(|r| r.position(&p));
                    let mut leases: HashSet<String> = HashSet::new();
                    let first = h.replay_until(&p, self.positions, until, |ev| {
                        if until.is_some() && !leases.contains(&*ev.lease_id) {
                            leases.insert(ev.lease_id.to_string());
                        }
                        give(engine, clock, keying, now, ev, &p)
                    });
                    if let Some(r) = self.resume.filter(|_| until.is_some()) {
                        let resumed = engine.resume(
                            leases
                                .iter()
                                .filter_map(|l| r.cuts.get(l).map(|&c| (l.as_str(), c))),
                        );
                        if resumed > 0 {
                            info!(topic = %p.0, partition = p.1, leases = resumed, "took the lake's stored audit rows of the replayed leases as settled");
                        }
                    }
                    let n = first.and_then(|a| {
                        h.replay(&p, self.positions, |ev| {
                            give(engine, clock, keying, now, ev, &p)
                        })
                        .map(|b| a + b)
                    });
                    match n {
                        Ok(n) if n > 0 => {
                            info!(topic = %p.0, partition = p.1, events = n, "rebuilt the partition's history from the lake")
                        }
                        Ok(_) => {}
                        Err(e) => {
                            error!(topic = %p.0, partition = p.1, error = %e, "could not rebuild the partition's history")
                        }
                    }
                    self.covers(h.version, h.rows());
                }
            }
            Committed::Revoked(p) => {
                self.keying.revoked(&p);
                self.clock.revoked(&p);
            }
            Committed::CaughtUp(p) => self.clock.caught_up(&p),
            Committed::Commit { version, lake_rows } => self.covers(version, lake_rows),
        }
    }

    /// The engine holds every event of `version` it will hold; marked
    /// once the batch is taken (see [`run`]).
    fn covers(&mut self, version: u64, lake_rows: u64) {
        if self.unmarked.is_none_or(|(v, _)| version >= v) {
            *self.unmarked = Some((version, lake_rows));
        }
    }

    fn event(&mut self, ev: &LeaseEvent<'_>, p: &PartitionKey) {
        give(self.engine, self.clock, self.keying, self.now, ev, p);
    }
}

/// One event of `p` into the engine, whether read live or from the lake.
fn give(
    engine: &mut AlertEngine,
    clock: &mut EventClock,
    keying: &mut Keying,
    now: i64,
    ev: &LeaseEvent<'_>,
    p: &PartitionKey,
) {
    keying.see(&ev.lease_id, p, engine);
    clock.event(p.clone(), ev.ts_us, now);
    engine.push(ev);
}

/// Runs stored history through a fresh engine and returns every state
/// change it would have made, as a replay by event time: all events first,
/// then the watermark moved to the newest event time minus the lateness.
pub fn replay<'a>(
    mut engine: AlertEngine,
    events: impl IntoIterator<Item = &'a LeaseEvent<'a>>,
) -> (Vec<Alert>, AlertEngine) {
    for ev in events {
        engine.push(ev);
    }
    engine.finish_replay();
    (engine.take_changes(), engine)
}
