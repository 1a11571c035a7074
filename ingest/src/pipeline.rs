//! The one ingest loop. Every source (the Kafka consumer, NDJSON files,
//! the simulator) feeds it through [`Source`]; it alone decides when rows
//! are published to queries, when they are flushed, and what follows a
//! commit.
//!
//! The loop, on a blocking thread of its own:
//! 1. poll the source for what it has (at most [`POLL_TIMEOUT`]); each
//!    message is decoded and buffered by the [`LakeWriter`], Kafka messages
//!    the lake already holds are skipped;
//! 2. every [`PUBLISH_INTERVAL`], make the buffer visible to queries in the
//!    process;
//! 3. when the [`FlushPolicy`] says so, or when the source has gone quiet
//!    (a poll of [`IDLE_POLL`] brought nothing) and the buffer is
//!    [`FlushPolicy::idle_flush`] old, flush: the rows and the Kafka ranges
//!    they cover go to the lake in one commit; only then do committed
//!    events reach the process's consumers ([`crate::fanout`]), and the
//!    source hears of it ([`Source::committed`]: Kafka commits offsets to
//!    its group);
//! 4. on a cancelled token or the source's end, flush what is left and let
//!    the source finish ([`Source::finish`]: Kafka leaves its group).
//!
//! The writer is shared with the source ([`SharedWriter`]) because
//! librdkafka's rebalance callback runs inside `poll` and must flush before
//! a partition is given up. The lock is never held while the source waits.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leaseline_lake::Lake;
use leaseline_schema::{DecodeError, Origin};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::config::FlushPolicy;
use crate::error::{IngestError, Result};
use crate::hooks::{IngestHooks, InputPartition, Notice};
use crate::writer::{FlushReport, LakeWriter, WriterStats};

/// The longest a source waits for input before the loop looks at its
/// timers (publish, flush interval) and the stop token.
pub const POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// How long a poll waits while rows are buffered: a poll this long that
/// brings nothing means the input has gone quiet.
pub const IDLE_POLL: Duration = Duration::from_millis(20);

/// How often buffered rows are published to readers in this process
/// (`leaseline serve --ingest`): well inside the one second in which an
/// event must be visible to SQL.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);

/// The writer, shared by the loop and the source's callbacks.
pub type SharedWriter = Arc<Mutex<LakeWriter>>;

/// Locks the writer; a panic elsewhere while holding it leaves nothing
/// half-done that a later flush cannot handle (the buffer is only appended).
pub fn lock(w: &SharedWriter) -> MutexGuard<'_, LakeWriter> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a source hands the loop.
#[derive(Debug, Clone, Copy)]
pub enum Polled<'a> {
    /// One message (an NDJSON line or a Kafka payload) and its origin.
    Message(&'a [u8], Origin<'a>),
    /// A message refused before it could be decoded (a Kafka message that
    /// should be OTLP and is not), kept as a reject.
    Refused(&'a [u8], &'a DecodeError, Origin<'a>),
    /// Everything the partition holds has been read.
    CaughtUp(InputPartition<'a>),
}

/// Whether a source may have more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    More,
    /// The input is exhausted (the end of the files).
    End,
}

/// A source of messages.
pub trait Source: Send {
    /// Hands what has arrived to `take`, waiting at most `timeout` for the
    /// first of it. `take` answers false once a flush is due: the source
    /// then returns and hands the rest on the next poll, so that a flush
    /// policy's row and byte limits hold however much a source has at once.
    fn poll(&mut self, timeout: Duration, take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step;

    /// A flush committed `report` (possibly nothing).
    fn committed(&mut self, _w: &LakeWriter, _report: &FlushReport) {}

    /// A flush failed: nothing of the buffer was committed and it is gone.
    /// `Ok` goes on (the source has set itself to read again from the
    /// lake's state); `Err` stops the loop. By default it stops.
    fn flush_failed(&mut self, _w: &mut LakeWriter, error: IngestError, _h: &Handle) -> Result<()> {
        Err(error)
    }

    /// Everything is flushed and the loop ends; an error here is the
    /// loop's answer.
    fn finish(&mut self, _w: &LakeWriter) -> Result<()> {
        Ok(())
    }
}

/// Opens a writer on the lake's newest version with a run's attachments:
/// buffered rows published to `hooks.pending`, committed events to
/// `hooks.fanout`, requests of `hooks.intake` pushed into it.
pub async fn open_writer(lake: Lake, hooks: IngestHooks) -> Result<SharedWriter> {
    let mut w = LakeWriter::open(lake).await?;
    if let Some(p) = hooks.pending {
        w.publish_to(p);
    }
    w.attach(hooks.fanout, hooks.metrics);
    let w = Arc::new(Mutex::new(w));
    if let Some(intake) = hooks.intake {
        intake.attach(&w);
    }
    Ok(w)
}

/// Runs `source` into `writer` until `stop` is cancelled or the source
/// ends, then flushes the rest. Returns the writer's totals.
pub async fn run<S: Source + 'static>(
    source: S,
    writer: SharedWriter,
    policy: FlushPolicy,
    stop: CancellationToken,
) -> Result<WriterStats> {
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut source = source;
        drive(&mut source, &writer, &policy, &stop, &handle)
    })
    .await
    .map_err(|e| IngestError::Aborted(format!("ingest thread: {e}")))?
}

fn drive(
    source: &mut dyn Source,
    writer: &SharedWriter,
    policy: &FlushPolicy,
    stop: &CancellationToken,
    handle: &Handle,
) -> Result<WriterStats> {
    let mut last_publish = Instant::now();
    while !stop.is_cancelled() {
        let timeout = if lock(writer).is_buffering() {
            IDLE_POLL
        } else {
            POLL_TIMEOUT
        };
        let mut quiet = true;
        let step = source.poll(timeout, &mut |polled| {
            let mut w = lock(writer);
            let (payload, refused, origin) = match polled {
                Polled::Message(payload, origin) => (payload, None, origin),
                Polled::Refused(payload, err, origin) => (payload, Some(err), origin),
                Polled::CaughtUp(p) => {
                    w.signal(Notice::CaughtUp(p));
                    return !w.should_flush(policy);
                }
            };
            quiet = false;
            let committed = origin
                .kafka_position()
                .is_some_and(|(t, p, o)| w.already_committed(t, p, o));
            if !committed {
                match refused {
                    None => w.push(payload, origin),
                    Some(err) => w.push_refused(payload, err, origin),
                };
            }
            !w.should_flush(policy)
        });
        let mut w = lock(writer);
        if last_publish.elapsed() >= PUBLISH_INTERVAL {
            w.publish();
            last_publish = Instant::now();
        }
        handle.block_on(w.send_notices());
        if step == Step::End {
            break;
        }
        if w.should_flush(policy) || (quiet && w.idle_flush_due(policy)) {
            match handle.block_on(w.flush()) {
                Ok(report) => source.committed(&w, &report),
                Err(e) => source.flush_failed(&mut w, e, handle)?,
            }
        }
    }
    let mut w = lock(writer);
    match handle.block_on(w.flush()) {
        Ok(report) => source.committed(&w, &report),
        Err(e) => {
            return Err(IngestError::Aborted(format!(
                "final flush failed, nothing of the buffer was committed: {e}"
            )))
        }
    }
    source.finish(&w)?;
    Ok(w.stats())
}
