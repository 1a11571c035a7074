//! What leaves ingest for consumers in the same process (the alert
//! engine), and when: only once the lake has committed it.
//!
//! The protocol:
//! - An accepted event is queued with the input partition it was read
//!   from. The queue is sent, as one batch, right after the lake commit
//!   that holds its rows.
//! - A commit conflict that drops rows (another writer committed the
//!   partition, or the ids) drops their queued events too; a failed flush
//!   drops every queued event. The rows are read again from Kafka, so a
//!   consumer sees each committed event exactly once and never one the lake
//!   does not hold.
//! - A partition notice ([`Committed::Assigned`], `Revoked`, `CaughtUp`)
//!   keeps its place behind the events read before it: with nothing
//!   buffered it is sent at once, otherwise with the next commit. So
//!   "caught up" reaches a consumer only after everything it covers.
//! - A batch that follows a commit ends with [`Committed::Commit`], the
//!   manifest version it made: a consumer that has taken the batch holds
//!   every event this writer committed up to that version.
//! - The channel is bounded by items (events and notices), not batches:
//!   when the consumer falls that far behind, the send waits, and with it
//!   the writer, and with it consumption. Nothing is dropped. A bound in
//!   batches would hold a multiple of the flush size, which is configured
//!   apart (a million rows a flush, four batches queued: over a gigabyte
//!   of events). A batch larger than the bound waits until the consumer
//!   has taken every earlier one.
//! - Before a partition is given up, the writer waits (a bounded time) for
//!   the consumer to say it has handled everything sent so far
//!   ([`CommittedReceiver::handled`]), so that what the consumer writes
//!   about the partition (the alert history) is in the lake before the
//!   next owner reads it.

use std::sync::Arc;

use leaseline_schema::LeaseEvent;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::hooks::{InputPartition, Notice};

/// An input partition as consumers keep it: topic (shared by every event of
/// the partition; empty for file input) and partition.
pub type PartitionKey = (Arc<str>, i32);

/// One item of a committed batch.
// Events are nearly all of the traffic: boxing them to shrink the rare
// partition notices would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Committed {
    /// An event the lake now holds, the partition it was read from and its
    /// Kafka offset there (none for file input).
    Event(LeaseEvent<'static>, PartitionKey, Option<i64>),
    /// The partition is now read by this process.
    Assigned(PartitionKey),
    /// The partition is no longer read by this process.
    Revoked(PartitionKey),
    /// Everything the partition held when ingest last looked is committed.
    CaughtUp(PartitionKey),
    /// The lake commit of the events before it made this manifest
    /// version, whose `lease_events` then held `lake_rows` rows.
    Commit { version: u64, lake_rows: u64 },
}

/// A batch and its items' room in the channel, given back when the
/// consumer takes the batch.
type Sent = (Vec<Committed>, OwnedSemaphorePermit);

/// The receiving end: batches in commit order.
pub struct CommittedReceiver {
    rx: mpsc::UnboundedReceiver<Sent>,
    received: u64,
    handled: watch::Sender<u64>,
}

impl CommittedReceiver {
    /// The next batch; `None` once ingest has stopped.
    pub async fn recv(&mut self) -> Option<Vec<Committed>> {
        let (batch, _room) = self.rx.recv().await?;
        self.received += 1;
        Some(batch)
    }

    /// The next batch if one is waiting.
    pub fn try_recv(&mut self) -> Result<Vec<Committed>, mpsc::error::TryRecvError> {
        let (batch, _room) = self.rx.try_recv()?;
        self.received += 1;
        Ok(batch)
    }

    /// Everything received so far is handled, what it led to written: a
    /// writer waiting to give up a partition may go on.
    pub fn handled(&self) {
        self.handled.send_replace(self.received);
    }
}

/// The sending end, owned by the lake writer.
pub struct Fanout {
    tx: mpsc::UnboundedSender<Sent>,
    /// Items the consumer has not taken yet may use this many permits.
    room: Arc<Semaphore>,
    capacity: u32,
    queued: Vec<Committed>,
    topics: Vec<Arc<str>>,
    sent: u64,
    handled: watch::Receiver<u64>,
}

impl Fanout {
    /// A fan-out holding at most `capacity` items (events and notices, in
    /// committed batches) that the consumer has not taken yet.
    pub fn channel(capacity: usize) -> (Fanout, CommittedReceiver) {
        let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)) as u32;
        let (tx, rx) = mpsc::unbounded_channel();
        let (handled_tx, handled_rx) = watch::channel(0);
        (
            Fanout {
                tx,
                room: Arc::new(Semaphore::new(capacity as usize)),
                capacity,
                queued: Vec::new(),
                topics: Vec::new(),
                sent: 0,
                handled: handled_rx,
            },
            CommittedReceiver {
                rx,
                received: 0,
                handled: handled_tx,
            },
        )
    }

    fn key(&mut self, p: InputPartition<'_>) -> PartitionKey {
        let topic = match self.topics.iter().find(|t| &***t == p.topic) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = Arc::from(p.topic);
                self.topics.push(t.clone());
                t
            }
        };
        (topic, p.partition)
    }

    pub(crate) fn event(
        &mut self,
        ev: &LeaseEvent<'_>,
        from: InputPartition<'_>,
        offset: Option<i64>,
    ) {
        let key = self.key(from);
        self.queued
            .push(Committed::Event(ev.clone().into_owned(), key, offset));
    }

    /// Queues a partition notice behind the events read before it.
    pub(crate) fn notice(&mut self, notice: Notice<'_>) {
        let item = match notice {
            Notice::Assigned(p) => Committed::Assigned(self.key(p)),
            Notice::Revoked(p) => Committed::Revoked(self.key(p)),
            Notice::CaughtUp(p) => Committed::CaughtUp(self.key(p)),
        };
        // A source may say "caught up" on every poll; once queued is enough.
        if matches!(item, Committed::CaughtUp(_)) && self.queued.contains(&item) {
            return;
        }
        self.queued.push(item);
    }

    /// Closes the queue with the commit it is sent after.
    pub(crate) fn committed(&mut self, version: u64, lake_rows: u64) {
        self.queued.push(Committed::Commit { version, lake_rows });
    }

    /// Drops queued events the commit did not keep.
    pub(crate) fn retain_events(
        &mut self,
        mut keep: impl FnMut(&LeaseEvent<'_>, &PartitionKey) -> bool,
    ) {
        self.queued.retain(|c| match c {
            Committed::Event(ev, p, _) => keep(ev, p),
            _ => true,
        });
    }

    /// After a failed flush: the buffered events are gone (they will be
    /// read again); partition notices stay.
    pub(crate) fn drop_events(&mut self) {
        self.retain_events(|_, _| false);
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Sends what is queued, waiting while the consumer is a full channel
    /// behind. A consumer that has gone away loses nothing of the lake; its
    /// batches are dropped.
    pub(crate) async fn send(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.queued);
        let items = u32::try_from(batch.len())
            .unwrap_or(u32::MAX)
            .min(self.capacity);
        let room = tokio::select! {
            room = self.room.clone().acquire_many_owned(items) => room,
            // Nobody will give the room back.
            _ = self.tx.closed() => return,
        };
        let Ok(room) = room else { return };
        if self.tx.send((batch, room)).is_ok() {
            self.sent += 1;
        }
    }

    /// Sends what is queued and waits, at most `timeout`, until the
    /// consumer has handled every batch sent. Returns false on a time-out;
    /// a consumer that has gone away has nothing left to write.
    pub(crate) async fn sync(&mut self, timeout: std::time::Duration) -> bool {
        self.send().await;
        let sent = self.sent;
        tokio::time::timeout(timeout, self.handled.wait_for(|h| *h >= sent))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str) -> LeaseEvent<'static> {
        leaseline_schema::decode(
            format!(
                r#"{{"ts":"2026-01-01T00:00:00Z","kind":"acquired","source":"coordinator","lease_id":"l","holder_id":"h","fencing_token":1,"ttl_ms":1000,"backend":"etcd","event_id":"{id}"}}"#
            )
            .as_bytes(),
        )
        .unwrap()
        .into_owned()
    }

    const P0: InputPartition<'static> = InputPartition {
        topic: "t",
        partition: 0,
    };

    #[tokio::test]
    async fn a_notice_keeps_its_place_behind_the_events_before_it() {
        let (mut f, mut rx) = Fanout::channel(4);
        f.event(&ev("a"), P0, None);
        f.notice(Notice::CaughtUp(P0));
        f.notice(Notice::CaughtUp(P0));
        f.send().await;
        let batch = rx.recv().await.unwrap();
        assert_eq!(batch.len(), 2, "{batch:?}");
        assert!(
            matches!(&batch[0], Committed::Event(e, _, _) if e.event_id.as_deref() == Some("a"))
        );
        assert_eq!(batch[1], Committed::CaughtUp((Arc::from("t"), 0)));
    }

    #[tokio::test]
    async fn events_a_commit_dropped_never_reach_the_consumer() {
        let (mut f, mut rx) = Fanout::channel(4);
        f.event(&ev("a"), P0, None);
        f.event(&ev("b"), P0, None);
        f.notice(Notice::Assigned(P0));
        f.retain_events(|e, _| e.event_id.as_deref() != Some("a"));
        f.send().await;
        let batch = rx.recv().await.unwrap();
        assert_eq!(batch.len(), 2);
        assert!(
            matches!(&batch[0], Committed::Event(e, _, _) if e.event_id.as_deref() == Some("b"))
        );
        f.event(&ev("c"), P0, None);
        f.drop_events();
        assert!(f.is_empty());
    }

    #[tokio::test]
    async fn sync_waits_until_the_consumer_has_handled_what_was_sent() {
        let (mut f, mut rx) = Fanout::channel(4);
        f.event(&ev("a"), P0, Some(0));
        f.notice(Notice::Revoked(P0));
        let mut sync = Box::pin(f.sync(std::time::Duration::from_secs(30)));
        assert!(futures::poll!(sync.as_mut()).is_pending());
        let batch = rx.recv().await.unwrap();
        assert_eq!(batch.len(), 2);
        // Received is not handled.
        assert!(futures::poll!(sync.as_mut()).is_pending());
        rx.handled();
        assert!(sync.await);
        // Nobody handles: the wait ends at its time-out.
        f.event(&ev("b"), P0, Some(1));
        assert!(!f.sync(std::time::Duration::from_millis(50)).await);
        // A consumer gone has nothing to write.
        drop(rx);
        f.event(&ev("c"), P0, Some(2));
        assert!(f.sync(std::time::Duration::from_secs(30)).await);
    }

    #[tokio::test]
    async fn the_bound_is_in_items_not_batches() {
        let (mut f, mut rx) = Fanout::channel(3);
        let mut n = 0;
        let mut queue = |f: &mut Fanout, k: usize| {
            for _ in 0..k {
                f.event(&ev(&n.to_string()), P0, None);
                n += 1;
            }
        };
        queue(&mut f, 2);
        f.send().await;
        // 2 + 2 items are more than 3: the second batch waits for the
        // consumer to take the first.
        queue(&mut f, 2);
        let mut second = Box::pin(f.send());
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(rx.recv().await.unwrap().len(), 2);
        second.await;
        // One item more fits beside the two waiting.
        queue(&mut f, 1);
        f.send().await;
        // A batch larger than the bound waits until every earlier one is
        // taken, then goes whole.
        queue(&mut f, 5);
        let mut big = Box::pin(f.send());
        assert!(futures::poll!(big.as_mut()).is_pending());
        assert_eq!(rx.recv().await.unwrap().len(), 2);
        assert!(futures::poll!(big.as_mut()).is_pending());
        assert_eq!(rx.recv().await.unwrap().len(), 1);
        big.await;
        assert_eq!(rx.recv().await.unwrap().len(), 5);
    }

    #[tokio::test]
    async fn a_consumer_gone_never_makes_the_sender_wait() {
        let (mut f, rx) = Fanout::channel(1);
        f.event(&ev("a"), P0, None);
        f.send().await;
        f.event(&ev("b"), P0, None);
        let mut second = Box::pin(f.send());
        assert!(futures::poll!(second.as_mut()).is_pending());
        drop(rx);
        tokio::time::timeout(std::time::Duration::from_secs(30), second)
            .await
            .expect("the send still waits for room nobody will give back");
        f.event(&ev("c"), P0, None);
        f.send().await;
        assert!(f.is_empty());
    }
}
