//! Coordinator adapters: watch a lock service and report what it does to
//! its locks as contract events (`docs/event-contract.md`, `source =
//! "coordinator"`): `acquired`, `renewed`, `released`, `expired`, and
//! `revoked` when the service itself drops a lock.
//!
//! One loop ([`run`]) serves every lock service through [`Backend`] and
//! [`Session`]; [`redis`] and [`etcd`] are the backends. The protocol:
//!
//! 1. connect, and subscribe to the service's change notifications
//!    *before* reading anything, so that no change falls between the read
//!    and the subscription;
//! 2. resync: read every lock and compare with what was last reported
//!    ([`state::Tracker`]): what changed while the watcher was away or
//!    disconnected is reported now, a lock simply still held is nothing;
//! 3. for each notification, read the lock again and report the difference
//!    ([`mapping`]); the notification only says how a lock ended, the read
//!    says what is there;
//! 4. resync again every `resync_interval`, since notifications may be lost
//!    (Redis pub/sub is at most once);
//!
//!    a service with an ordered history (etcd) also hands out a cursor
//!    ([`Session::cursor`]): it is saved with the locks, and the next
//!    connect replays the history from there instead of guessing from a
//!    scan how the locks changed meanwhile;
//! 5. every `checkpoint_interval`, once the sink holds everything reported
//!    durably ([`Sink::flush`]), save what was reported to the state file;
//! 6. when the service goes away, log it, count it ([`WatchStats`]), and
//!    start again at 1 after an exponential backoff (100 ms doubling to
//!    10 s, with jitter); on the stop token, flush and save, and return.
//!
//! A service whose locks lapse without anything being written (a lease
//! row whose `expires_at` passes: [`Backend::lapses_silently`]) notifies
//! nothing when a holder stops renewing, so the loop also keeps a timer on
//! the earliest deadline it reported: when it passes on the service's
//! clock (as last read, carried forward by the local monotonic clock), the
//! lock is read again, and a lock found lapsed is `expired` at its
//! deadline. A lock still held then (the two clocks drifted, or it was
//! renewed and the notification is on its way) sets the timer again from
//! that read's clock.
//!
//! Where the contract is silent:
//! - Event ids come from the transition ([`mapping`]), so a transition
//!   reported twice (a restart before the state file caught up, a resync
//!   racing a notification) is one event in the lake.
//! - `ts` is the service's clock where the backend can read it, so the
//!   coordinator's events are all on one clock, as the audit assumes.
//! - The contract requires a fencing token on every kind the watcher
//!   sends, so a lock whose token cannot be read is not reported: it is
//!   logged and counted as unreadable, like any key that is not a lock.
//! - A sink that is full holds the watcher back (it retries every 20 ms)
//!   instead of dropping: a watcher has no lease loop to protect, and a
//!   dropped transition would be lost for good.

pub mod etcd;
pub mod mapping;
pub mod postgres;
pub mod redis;
pub mod state;
pub mod zookeeper;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use leaseline_emit::{EmitError, Emitter, Sink, Source};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::mapping::{End, Held, Transition};
use crate::state::{Observation, Tracker};

/// What can go wrong while watching.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The lock service could not be reached or answered with an error:
    /// the watcher reconnects.
    #[error("{0}")]
    Backend(String),
    /// The sink refused events for good, or the state file could not be
    /// used: the watcher stops.
    #[error("{0}")]
    Fatal(String),
}

/// A change the service notified: which lock, and how it ended if the
/// notification says ([`End::Unknown`] otherwise: read it to know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub lease_id: String,
    pub end: End,
}

/// A lock service the watcher can connect to.
pub trait Backend: Send {
    type Session: Session;
    /// The contract's `backend` field: `redis`, `etcd`, ...
    fn name(&self) -> &'static str;
    /// What the event ids are scoped to: the service and the lock space
    /// within it.
    fn scope(&self) -> String;
    /// Where it connects, for logs (no credentials).
    fn describe(&self) -> String;
    /// Before each connect: what was reported so far, and where in the
    /// service's history that stands ([`Session::cursor`] as last saved),
    /// for a backend that resumes from there rather than from a scan.
    fn resume(&mut self, _cursor: Option<i64>, _reported: &BTreeMap<String, Held>) {}
    /// Connects and subscribes to changes (step 1).
    fn connect(&mut self) -> impl Future<Output = Result<Self::Session, WatchError>> + Send;
    /// Whether a lock can pass its deadline without the service notifying
    /// it: the loop then reads each lock again at its deadline.
    fn lapses_silently(&self) -> bool {
        false
    }
}

/// One connection to the lock service.
pub trait Session: Send {
    /// The next change notified. Cancel safe: nothing is lost when the
    /// future is dropped before it completes.
    fn next_change(&mut self) -> impl Future<Output = Result<Change, WatchError>> + Send;
    /// One lock as it is now, and now on the service's clock (Unix ms).
    fn read(
        &mut self,
        lease_id: &str,
    ) -> impl Future<Output = Result<(Observation, i64), WatchError>> + Send;
    /// Every lock, each with the time it was read, and the time the scan
    /// ended.
    fn scan(&mut self) -> impl Future<Output = Result<Scan, WatchError>> + Send;
    /// For a service with an ordered history (etcd's revisions): the
    /// position up to which every change has been handed out by the scan
    /// and [`Session::next_change`]. The loop saves it with the locks once
    /// their events are sent, and gives it back to [`Backend::resume`].
    fn cursor(&self) -> Option<i64> {
        None
    }
}

/// Every lock a scan found, with the service's time of each read, and
/// the time the scan ended: a lock it did not find was gone by then.
#[derive(Debug, Default)]
pub struct Scan {
    pub locks: BTreeMap<String, (Observation, i64)>,
    pub ended_ms: i64,
}

/// Counters of a watcher, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Events handed to the sink.
    pub events: AtomicU64,
    /// Times the service was lost and a reconnect scheduled.
    pub reconnects: AtomicU64,
    /// Keys found that are not readable locks (see [`Tracker::bad_seen`]),
    /// and events the contract refused.
    pub unreadable: AtomicU64,
    /// Notifications received.
    pub notifications: AtomicU64,
    /// Full scans done.
    pub resyncs: AtomicU64,
}

impl WatchStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// How a watcher runs.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// How often every lock is read again, for changes whose
    /// notification was lost.
    pub resync_interval: Duration,
    /// How often the state file is brought up to date.
    pub checkpoint_interval: Duration,
    /// Where what was reported is kept across restarts; without it, locks
    /// that ended while the watcher was stopped are never reported.
    pub state_file: Option<PathBuf>,
    /// The first and the longest wait before a reconnect.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            resync_interval: Duration::from_secs(30),
            checkpoint_interval: Duration::from_secs(1),
            state_file: None,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
        }
    }
}

/// How long a checkpoint or the final flush waits for the sink.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a checkpoint waits on the sink before saying so.
const SLOW_CHECKPOINT: Duration = Duration::from_secs(1);

/// How long a full sink is given before the event is offered again.
const FULL_RETRY: Duration = Duration::from_millis(20);

/// Watches `backend` until `stop` is cancelled, sending events to `sink`.
pub async fn run<B: Backend>(
    mut backend: B,
    sink: Arc<dyn Sink>,
    config: WatchConfig,
    stats: Arc<WatchStats>,
    stop: CancellationToken,
) -> Result<(), WatchError> {
    let scope = backend.scope();
    let mut tracker = match &config.state_file {
        Some(path) => match state::load(path) {
            Ok(Some(snap)) if snap.scope == scope => {
                info!(state_file = %path.display(), locks = snap.locks.len(), "resuming from the state file");
                Tracker::resume(snap)
            }
            Ok(Some(snap)) => {
                return Err(WatchError::Fatal(format!(
                    "the state file {} is of another lock space ({}), not {scope}",
                    path.display(),
                    snap.scope
                )))
            }
            Ok(None) => Tracker::new(&scope),
            Err(e) => {
                return Err(WatchError::Fatal(format!(
                    "reading the state file {}: {e}",
                    path.display()
                )))
            }
        },
        None => {
            warn!(
                "no state file: locks that end while the watcher is stopped will not be reported"
            );
            Tracker::new(&scope)
        }
    };
    let mut w = Watcher {
        emitter: Emitter::new(Source::Coordinator, sink.clone()).backend(backend.name()),
        sink,
        config,
        stats,
        stop,
        clock: None,
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(w.config.backoff_min)
        .with_max_delay(w.config.backoff_max)
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    let result = loop {
        let mut connected = false;
        match w.session(&mut backend, &mut tracker, &mut connected).await {
            Ok(()) => break Ok(()),
            Err(WatchError::Backend(e)) => {
                if connected {
                    delays = backoff.build();
                }
                let delay = delays.next().unwrap_or(w.config.backoff_max);
                WatchStats::add(&w.stats.reconnects, 1);
                warn!(
                    backend = backend.name(),
                    at = %backend.describe(),
                    error = %e,
                    retry_in = ?delay,
                    reconnects = WatchStats::get(&w.stats.reconnects),
                    "lost the lock service; reconnecting"
                );
                tokio::select! {
                    _ = w.stop.cancelled() => break Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => break Err(e),
        }
    };
    // What was reported reaches the sink and the state file even when the
    // service was away at the end.
    let saved = w.checkpoint(&mut tracker).await;
    result.and(saved)
}

struct Watcher {
    emitter: Emitter,
    sink: Arc<dyn Sink>,
    config: WatchConfig,
    stats: Arc<WatchStats>,
    stop: CancellationToken,
    /// The service's clock (Unix ms) at the last read, and when that was
    /// on the local monotonic clock.
    clock: Option<(tokio::time::Instant, i64)>,
}

/// The deadline timer of a service whose locks lapse silently.
#[derive(Debug, Default)]
struct Lapses {
    /// Locks read at their deadline and found unreadable, with that
    /// deadline: left to the next resync.
    unreadable: HashSet<(String, i64)>,
}

impl Lapses {
    fn pending<'a>(&'a self, tracker: &'a Tracker) -> impl Iterator<Item = (&'a String, i64)> {
        tracker
            .locks()
            .iter()
            .map(|(k, h)| (k, h.deadline_ms))
            .filter(|(k, d)| !self.unreadable.contains(&((*k).clone(), *d)))
    }

    /// When the earliest deadline passes, on the local clock.
    fn next(
        &self,
        tracker: &Tracker,
        clock: Option<(tokio::time::Instant, i64)>,
    ) -> Option<tokio::time::Instant> {
        let (at, service_ms) = clock?;
        let earliest = self.pending(tracker).map(|(_, d)| d).min()?;
        let wait = earliest.saturating_sub(service_ms).max(0) as u64;
        // A millisecond past it: a lock is held until its deadline.
        Some(at + Duration::from_millis(wait + 1))
    }

    /// The locks whose deadline has passed, with their deadlines.
    fn due(
        &self,
        tracker: &Tracker,
        clock: Option<(tokio::time::Instant, i64)>,
    ) -> Vec<(String, i64)> {
        let Some((at, service_ms)) = clock else {
            return Vec::new();
        };
        let now_ms = service_ms + at.elapsed().as_millis() as i64;
        self.pending(tracker)
            .filter(|(_, d)| *d <= now_ms)
            .map(|(k, d)| (k.clone(), d))
            .collect()
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Watcher {
    /// One connection, from connecting to losing it (an error) or the stop
    /// token (`Ok`). `connected` is set once the first resync is done.
    async fn session<B: Backend>(
        &mut self,
        backend: &mut B,
        tracker: &mut Tracker,
        connected: &mut bool,
    ) -> Result<(), WatchError> {
        backend.resume(tracker.cursor(), tracker.locks());
        let mut session = tokio::select! {
            _ = self.stop.cancelled() => return Ok(()),
            s = backend.connect() => s?,
        };
        self.resync(&mut session, tracker).await?;
        *connected = true;
        info!(backend = backend.name(), at = %backend.describe(), locks = tracker.locks().len(), "watching");
        let start = tokio::time::Instant::now();
        let mut resync = tokio::time::interval_at(
            start + self.config.resync_interval,
            self.config.resync_interval,
        );
        let mut checkpoint = tokio::time::interval_at(
            start + self.config.checkpoint_interval,
            self.config.checkpoint_interval,
        );
        for t in [&mut resync, &mut checkpoint] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let mut lapses = backend.lapses_silently().then(Lapses::default);
        loop {
            let lapse_at = lapses.as_ref().and_then(|l| l.next(tracker, self.clock));
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Ok(()),
                _ = resync.tick() => {
                    self.resync(&mut session, tracker).await?;
                    if let Some(l) = &mut lapses {
                        l.unreadable.clear();
                    }
                }
                _ = checkpoint.tick() => self.checkpoint(tracker).await?,
                change = session.next_change() => {
                    let change = change?;
                    WatchStats::add(&self.stats.notifications, 1);
                    let (seen, now_ms) = session.read(&change.lease_id).await?;
                    self.clock = Some((tokio::time::Instant::now(), now_ms));
                    let events = tracker.observe(&change.lease_id, seen, change.end, now_ms);
                    self.send(tracker, events).await?;
                    tracker.set_cursor(session.cursor());
                }
                _ = sleep_until(lapse_at), if lapse_at.is_some() => {
                    let Some(l) = &mut lapses else { continue };
                    let due = l.due(tracker, self.clock);
                    for (lease_id, deadline_ms) in due {
                        let (seen, now_ms) = session.read(&lease_id).await?;
                        self.clock = Some((tokio::time::Instant::now(), now_ms));
                        let events = tracker.observe(&lease_id, seen, End::Unknown, now_ms);
                        self.send(tracker, events).await?;
                        // Still there with the same deadline, which has
                        // passed: not readable as a lock (the tracker
                        // warned); not read again at every turn.
                        if tracker.locks().get(&lease_id).map(|h| h.deadline_ms) == Some(deadline_ms)
                            && deadline_ms <= now_ms
                        {
                            l.unreadable.insert((lease_id, deadline_ms));
                        }
                    }
                }
            }
        }
    }

    async fn resync<S: Session>(
        &mut self,
        session: &mut S,
        tracker: &mut Tracker,
    ) -> Result<(), WatchError> {
        let scan = session.scan().await?;
        self.clock = Some((tokio::time::Instant::now(), scan.ended_ms));
        WatchStats::add(&self.stats.resyncs, 1);
        let events = tracker.resync(scan.locks, scan.ended_ms);
        self.send(tracker, events).await?;
        tracker.set_cursor(session.cursor());
        Ok(())
    }

    async fn send(&mut self, tracker: &Tracker, events: Vec<Transition>) -> Result<(), WatchError> {
        let bad = tracker.bad_seen();
        let counted = &self.stats.unreadable;
        if bad > WatchStats::get(counted) {
            counted.store(bad, Ordering::Relaxed);
        }
        for t in events {
            let mut e = self
                .emitter
                .event(t.kind, &t.lease_id)
                .ts_ms(t.ts_ms)
                .event_id(&t.event_id)
                .holder_id(&t.holder)
                .fencing_token(t.token);
            if let Some(ttl) = t.ttl_ms {
                e = e.ttl_ms(ttl);
            }
            if let Some(r) = t.reason {
                e = e.reason(r);
            }
            let (key, payload) = match e.build() {
                Ok(m) => m,
                Err(err) => {
                    // A name or holder the contract cannot carry (over
                    // 1,024 bytes, say): nothing to send, but not silent.
                    WatchStats::add(counted, 1);
                    warn!(lease_id = %t.lease_id, kind = t.kind.as_str(), error = %err, "transition not reported: the event would break the contract");
                    continue;
                }
            };
            loop {
                match self.sink.offer(&key, &payload) {
                    Ok(()) => break,
                    Err(EmitError::Full) => tokio::select! {
                        // Not sent, and not saved in the state file: the
                        // next start reports it.
                        _ = self.stop.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(FULL_RETRY) => {}
                    },
                    Err(e) => {
                        return Err(WatchError::Fatal(format!("the sink refused an event: {e}")))
                    }
                }
            }
            WatchStats::add(&self.stats.events, 1);
        }
        Ok(())
    }

    /// Saves what was reported once the sink holds it durably.
    async fn checkpoint(&mut self, tracker: &mut Tracker) -> Result<(), WatchError> {
        if !tracker.is_dirty() {
            return Ok(());
        }
        let snapshot = tracker.snapshot();
        let sink = self.sink.clone();
        let path = self.config.state_file.clone();
        let mut saving = tokio::task::spawn_blocking(move || {
            sink.flush(FLUSH_TIMEOUT)
                .map_err(|e| format!("the sink did not confirm delivery: {e}"))?;
            match path {
                Some(p) => state::save(&p, &snapshot)
                    .map_err(|e| format!("writing the state file {}: {e}", p.display())),
                None => Ok(()),
            }
        });
        let done = match tokio::time::timeout(SLOW_CHECKPOINT, &mut saving).await {
            Ok(done) => done,
            Err(_) => {
                // Said once per checkpoint: changes wait meanwhile, and
                // their events' times will be when they are handled.
                warn!(
                    waited = ?SLOW_CHECKPOINT,
                    "the sink has not confirmed delivery yet: no change is handled until it does"
                );
                saving.await
            }
        }
        .map_err(|e| WatchError::Fatal(format!("checkpoint: {e}")))?;
        if let Err(e) = done {
            // Tried again at the next checkpoint; until then a restart
            // reports the difference again, under the same ids.
            tracker.mark_dirty();
            warn!(error = %e, "state not saved");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Held;

    fn tracker(locks: &[(&str, i64)]) -> Tracker {
        let mut t = Tracker::new("s");
        for (name, deadline_ms) in locks {
            let held = Held {
                holder: "w".into(),
                token: 1,
                value_hash: 1,
                deadline_ms: *deadline_ms,
            };
            t.observe(name, Observation::Held(held), End::Unknown, 0);
        }
        t
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_timer_wakes_just_after_the_earliest_deadline_on_the_service_clock() {
        let t = tracker(&[("a", 5_000), ("b", 3_000)]);
        let l = Lapses::default();
        assert_eq!(l.next(&t, None), None, "no clock read yet");
        let at = tokio::time::Instant::now();
        // The service's clock read 1 s ago said 1,000: b lapses 2 s after
        // that read.
        let clock = Some((at, 1_000));
        assert_eq!(l.next(&t, clock), Some(at + Duration::from_millis(2_001)));
        assert!(l.due(&t, clock).is_empty());
        tokio::time::advance(Duration::from_millis(2_001)).await;
        assert_eq!(l.due(&t, clock), vec![("b".to_string(), 3_000)]);
        tokio::time::advance(Duration::from_millis(2_000)).await;
        assert_eq!(l.due(&t, clock).len(), 2);
        // A deadline found past but still there (unreadable) is not due
        // again until the next resync.
        let mut l = l;
        l.unreadable.insert(("b".to_string(), 3_000));
        assert_eq!(l.next(&t, clock), Some(at + Duration::from_millis(4_001)));
        assert_eq!(l.due(&t, clock), vec![("a".to_string(), 5_000)]);
        // A deadline already past when read: due at once.
        let late = Some((tokio::time::Instant::now(), 9_000));
        assert_eq!(
            l.next(&t, late),
            Some(tokio::time::Instant::now() + Duration::from_millis(1))
        );
    }
}
