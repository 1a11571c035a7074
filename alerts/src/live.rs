//! The engine in a running service: events in from ingest, alerts out to
//! the console, the receivers and the history table, time moved by the wall
//! clock as well as by the events.

use std::time::{Duration, Instant};

use leaseline_lake::Lake;
use leaseline_schema::LeaseEvent;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{error, info, warn};

use crate::alert::{Alert, AlertState};
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

/// Runs until `events` closes (ingest stopped): pushes events, advances the
/// watermark on every batch and every 100 ms, logs and delivers changes,
/// re-sends firing alerts every resend interval, writes the history every
/// few seconds. On the way out it writes the last history rows and gives
/// receivers a few seconds to take what is queued.
pub async fn run(
    mut engine: AlertEngine,
    mut events: UnboundedReceiver<LeaseEvent<'static>>,
    notifier: Notifier,
    lake: Lake,
) {
    let mut history = AlertHistory::new();
    let resend = engine.config().resend_interval;
    let mut last_resend = Instant::now();
    let mut last_flush = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    while open {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => {
                    engine.push(&ev);
                    // Take what else is waiting, so a burst costs one
                    // evaluation, not one per event.
                    for _ in 0..65_536 {
                        match events.try_recv() {
                            Ok(ev) => { engine.push(&ev); }
                            Err(_) => break,
                        }
                    }
                }
                None => open = false,
            },
            _ = tick.tick() => {}
        }
        engine.advance(engine.live_watermark(now_us()));
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
