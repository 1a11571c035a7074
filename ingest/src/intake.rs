//! Requests that carry events into a running ingest loop: OTLP/HTTP log
//! exports (`POST /v1/logs` on `leaseline serve`).
//!
//! The protocol:
//! - A request's records are translated ([`crate::otlp`]) and pushed into
//!   the loop's writer in one hold of its lock, so no flush splits them.
//!   Each keeps its origin: the file path `otlp-http/<hash of the body>`
//!   and the record's number from 1 as its line; a body that is not OTLP
//!   is one `invalid_otlp` reject at line 0.
//! - The request then waits for the end of the first flush after its push,
//!   which holds its rows: committed, the answer is success; failed, the
//!   rows are gone and the answer tells the client to retry
//!   ([`IntakeError::NotCommitted`]).
//! - A retry is the same body: the same `event_id`s (given, or derived from
//!   each record) and the same reject origins, so the lake keeps everything
//!   once, however often a client retries, even after a success it did not
//!   hear of.
//! - The loop's own input (Kafka, or none: [`run`]) flushes as its
//!   [`FlushPolicy`] says; a request adds at most that policy's idle flush
//!   or flush interval to its wait.
//!
//! Requests come in on the HTTP runtime; their pushes run on blocking
//! threads, since the writer's lock is held across a flush.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;

use leaseline_lake::Lake;
use leaseline_schema::{DecodeError, Origin};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::FlushPolicy;
use crate::error::Result;
use crate::hooks::{InputPartition, Notice};
use crate::otlp::{self, Encoding};
use crate::pipeline::{self, lock, Polled, SharedWriter, Source, Step};
use crate::writer::{Flushed, LakeWriter, Pushed, WriterStats};

/// What one request added.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Records that are now events in the lake.
    pub events: u64,
    /// Records the lake already held (a retry).
    pub duplicates: u64,
    /// Records refused, with their number (from 1) and why; kept in
    /// `lease_rejects`.
    pub rejected: Vec<(u32, DecodeError)>,
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// No ingest loop runs yet (or any more).
    #[error("ingest is not running")]
    NotRunning,
    /// The body is not OTLP logs; it is kept in `lease_rejects`.
    #[error("{0}")]
    Invalid(DecodeError),
    /// The flush that held the request's rows failed, or none came in
    /// time: nothing is lost by sending the request again.
    #[error("not committed: {0}")]
    NotCommitted(&'static str),
}

struct Attached {
    /// Weak: once the loop ends, its writer goes, and with it the flushes
    /// a request waits for, so no request waits on a loop that is gone.
    writer: Weak<Mutex<LakeWriter>>,
    flushed: watch::Receiver<Flushed>,
}

/// A handle on a running ingest loop for requests; see the module docs.
/// Cloned into every request; attached once its loop's writer is open.
#[derive(Clone)]
pub struct Intake {
    attached: Arc<OnceLock<Attached>>,
    commit_timeout: Duration,
    /// Wakes a loop that has no input of its own ([`run`]); unheard, and
    /// harmless, when the loop reads Kafka.
    wake: SyncSender<()>,
    woken: Arc<Mutex<Option<Receiver<()>>>>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("attached", &self.attached.get().is_some())
            .finish()
    }
}

/// The path under which a request's rows keep their origin.
pub fn request_path(body: &[u8]) -> String {
    format!("otlp-http/{:032x}", xxhash_rust::xxh3::xxh3_128(body))
}

impl Intake {
    /// A handle whose requests wait at most `commit_timeout` for their
    /// commit (then [`IntakeError::NotCommitted`]).
    pub fn new(commit_timeout: Duration) -> Intake {
        let (wake, woken) = sync_channel(1);
        Intake {
            attached: Arc::default(),
            commit_timeout,
            wake,
            woken: Arc::new(Mutex::new(Some(woken))),
        }
    }

    /// Gives the handle its loop's writer; once only (a second loop keeps
    /// the first's). The request input is one input partition, always
    /// caught up: a request waits for nothing that is not already pushed.
    pub(crate) fn attach(&self, writer: &SharedWriter) {
        let flushed = {
            let mut w = lock(writer);
            w.signal(Notice::Assigned(InputPartition::FILE));
            w.signal(Notice::CaughtUp(InputPartition::FILE));
            w.flushes()
        };
        let _ = self.attached.set(Attached {
            writer: Arc::downgrade(writer),
            flushed,
        });
    }

    pub fn is_running(&self) -> bool {
        self.attached
            .get()
            .is_some_and(|a| a.writer.strong_count() > 0)
    }

    /// Pushes one OTLP logs export and waits for its commit.
    pub async fn logs(
        &self,
        body: Bytes,
        encoding: Encoding,
    ) -> std::result::Result<Accepted, IntakeError> {
        let a = self.attached.get().ok_or(IntakeError::NotRunning)?;
        let writer = a.writer.upgrade().ok_or(IntakeError::NotRunning)?;
        let mut flushed = a.flushed.clone();
        let (outcome, epoch) = tokio::task::spawn_blocking(move || {
            let path = request_path(&body);
            let parsed = otlp::records(&body, encoding);
            let mut w = lock(&writer);
            let outcome = match parsed {
                Ok(records) => Ok(push_all(&mut w, &path, &records)),
                Err(err) => {
                    w.push_refused(
                        &body,
                        &err,
                        Origin::File {
                            path: &path,
                            line: 0,
                        },
                    );
                    Err(err)
                }
            };
            w.signal(Notice::CaughtUp(InputPartition::FILE));
            (outcome, w.flushes().borrow().epoch)
        })
        .await
        .map_err(|_| IntakeError::NotRunning)?;
        let _ = self.wake.try_send(());
        let committed = async {
            flushed
                .wait_for(|f| f.epoch > epoch)
                .await
                .map(|f| f.ok)
                .unwrap_or(false)
        };
        let ok = tokio::time::timeout(self.commit_timeout, committed)
            .await
            .map_err(|_| {
                IntakeError::NotCommitted("no commit in time; the rows may still be committed")
            })?;
        if !ok {
            return Err(IntakeError::NotCommitted(
                "the flush holding them failed, or ingest stopped",
            ));
        }
        outcome.map_err(IntakeError::Invalid)
    }
}

fn push_all(w: &mut LakeWriter, path: &str, records: &[Vec<u8>]) -> Accepted {
    let mut acc = Accepted::default();
    for (i, record) in records.iter().enumerate() {
        let line = i as u64 + 1;
        match w.push(record, Origin::File { path, line }) {
            Pushed::Event => acc.events += 1,
            Pushed::Duplicate => acc.duplicates += 1,
            Pushed::Reject => {
                let err = leaseline_schema::decode(record)
                    .expect_err("a record the writer refused does not decode");
                acc.rejected
                    .push((u32::try_from(line).unwrap_or(u32::MAX), err));
            }
        }
    }
    acc
}

/// Runs an ingest loop whose only input is the requests of
/// `hooks.intake` (which must be set), until `stop` is cancelled.
pub async fn run(
    lake: Lake,
    policy: FlushPolicy,
    stop: CancellationToken,
    hooks: crate::IngestHooks,
) -> Result<WriterStats> {
    let woken = hooks
        .intake
        .as_ref()
        .and_then(|i| i.woken.lock().unwrap_or_else(|p| p.into_inner()).take())
        .ok_or_else(|| crate::IngestError::Aborted("no intake to run, or run twice".into()))?;
    let writer = pipeline::open_writer(lake, hooks).await?;
    pipeline::run(Requests { woken }, writer, policy, stop).await
}

/// The loop's input when requests are all there is: it waits for a push.
struct Requests {
    woken: Receiver<()>,
}

impl Source for Requests {
    fn poll(&mut self, timeout: Duration, _take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step {
        let _ = self.woken.recv_timeout(timeout);
        Step::More
    }

    fn flush_failed(
        &mut self,
        w: &mut LakeWriter,
        error: crate::IngestError,
        h: &tokio::runtime::Handle,
    ) -> Result<()> {
        // The requests in the buffer were told; start again from the lake.
        tracing::error!(error = %error, "flush of requests failed; their clients will retry");
        if let Err(e) = h.block_on(w.reset()) {
            tracing::error!(error = %e, "could not reload the lake; will try again");
        }
        Ok(())
    }
}
