//! The engine in a running service: events in from ingest once the lake
//! has committed them (`leaseline_ingest::fanout`), alerts out to the
//! console, the receivers and the history table, time moved by the events
//! of every input partition, and by the wall clock only when no partition
//! has anything waiting (see [`crate::clock`]).

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
use crate::history::AlertHistory;
use crate::notify::Notifier;

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

/// Which input partition each lease's events come from, to tell producers
/// that do not key by `lease_id`: correctness does not depend on it (the
/// watermark waits for the slowest partition), but their alerts wait.
#[derive(Default)]
struct Keying {
    partition_of: HashMap<Arc<str>, PartitionKey>,
    warned: HashSet<Arc<str>>,
}

impl Keying {
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
pub async fn run(
    mut engine: AlertEngine,
    mut events: CommittedReceiver,
    notifier: Notifier,
    lake: Lake,
) {
    let mut clock = EventClock::new(
        engine.config().lateness,
        engine.config().partition_idle_timeout,
    );
    let mut keying = Keying::default();
    let mut history = AlertHistory::new();
    let resend = engine.config().resend_interval;
    let mut last_resend = Instant::now();
    let mut last_flush = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    while open {
        tokio::select! {
            batch = events.recv() => match batch {
                // One evaluation per committed batch, not one per event.
                Some(batch) => {
                    let now = now_us();
                    for input in batch {
                        take(input, &mut engine, &mut clock, &mut keying, now);
                    }
                }
                None => open = false,
            },
            _ = tick.tick() => {}
        }
        // Without a watermark (nothing assigned, or a partition not read
        // yet), time stands; violations found meanwhile stay pending.
        engine.advance(clock.watermark(now_us()).unwrap_or(i64::MIN));
        let changes = engine.take_changes();
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
                .filter(|a| a.state == AlertState::Firing)
                .collect();
            notifier.send(&firing, now_us());
            last_resend = Instant::now();
        }
        if !history.is_empty() && (last_flush.elapsed() >= HISTORY_FLUSH || !open) {
            if let Err(e) = history.flush(&lake).await {
                error!(error = %e, "could not write the alert history; will retry");
            }
            last_flush = Instant::now();
        }
    }
    if let Err(e) = history.flush(&lake).await {
        error!(error = %e, rows = history.len(), "could not write the last alert history rows");
    }
    notifier.shutdown(DRAIN_TIMEOUT).await;
    info!("alert engine stopped");
}

fn take(
    input: Committed,
    engine: &mut AlertEngine,
    clock: &mut EventClock,
    keying: &mut Keying,
    now: i64,
) {
    match input {
        Committed::Event(ev, p) => {
            keying.see(&ev.lease_id, &p, engine);
            clock.event(p, ev.ts_us, now);
            engine.push(&ev);
        }
        Committed::Assigned(p) => clock.assigned(p, now),
        Committed::Revoked(p) => clock.revoked(&p),
        Committed::CaughtUp(p) => clock.caught_up(&p),
    }
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
