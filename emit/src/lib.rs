//! Lease events from the process that holds a lease, or the resource that
//! checks its fencing tokens, in the wire contract of
//! `docs/event-contract.md` (v1.1).
//!
//! An [`Emitter`] stamps each event with what a holder must not get wrong
//! by hand:
//! - `ts` from the wall clock, and `mono_ms` from one monotonic clock shared
//!   by the whole process ([`mono_ms`]), so that `keepalive_sent_mono_ms`
//!   and `deadline_mono_ms`, which the caller takes from the same clock
//!   ([`mono_ms_at`]), can be compared with it (the late-fence rule does);
//! - an `event_id` fixed when the event is built (the process's run id and a
//!   sequence number), so every retry of the message carries the same id
//!   and leaseline keeps it once;
//! - the Kafka key: the `lease_id`, as the contract asks.
//!
//! Every event is checked against the contract before it is sent (by the
//! decoder leaseline ingests with), so a holder finds a missing token in its
//! own tests, not in `lease_rejects`.
//!
//! Sending never blocks the lease loop: [`Emitter::send`] hands the message
//! to a [`Sink`] that queues it within a bound ([`KafkaSink`]: librdkafka's
//! own queue, `queue.buffering.max.messages`). When the queue is full the
//! event is dropped, counted ([`Emitter::dropped`]) and reported to the
//! caller: an audit gap is better than a renewal that misses its deadline
//! while waiting for a broker. [`OtlpSink`] sends the same events as
//! OpenTelemetry log records over OTLP/HTTP instead ([`otlp`]), to a
//! Collector or to `leaseline serve --otlp-logs`, with the same bound.
//!
//! ```
//! use leaseline_emit::{Emitter, Kind, MemorySink, Source};
//!
//! let sink = MemorySink::default();
//! let emitter = Emitter::new(Source::Holder, sink.clone()).holder_id("worker-1").backend("etcd");
//! let sent_at = leaseline_emit::mono_ms();
//! emitter
//!     .event(Kind::Renewed, "orders/order-7")
//!     .fencing_token(42)
//!     .ttl_ms(10_000)
//!     .keepalive_sent_mono_ms(sent_at)
//!     .send()
//!     .unwrap();
//! let (key, payload) = sink.take().remove(0);
//! assert_eq!(key, "orders/order-7");
//! let ev = leaseline_schema::decode(&payload).unwrap();
//! assert_eq!(ev.fencing_token, Some(42));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::{Map, Value};

pub use leaseline_schema::{Kind, Source};

pub mod otlp;
pub use otlp::{OtlpConfig, OtlpSink};

/// Why an event was not sent.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The event breaks the contract (a missing token, an id too long...):
    /// the decoder's reject code, as `lease_rejects` would have said.
    #[error("event breaks the contract: {0}")]
    Invalid(String),
    /// The sink's queue is full; the event was dropped and counted.
    #[error("the emitter's queue is full: event dropped")]
    Full,
    /// The sink refused the message for another reason.
    #[error("sending failed: {0}")]
    Sink(String),
}

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The process's monotonic clock in milliseconds, the clock of `mono_ms`,
/// `keepalive_sent_mono_ms` and `deadline_mono_ms`.
pub fn mono_ms() -> f64 {
    mono_ms_at(Instant::now())
}

/// `at` on the clock of [`mono_ms`]: take an `Instant` when a keepalive is
/// sent, and report it with the renewal once it succeeds. Instants before
/// the clock's origin (the first call in the process) read 0.
pub fn mono_ms_at(at: Instant) -> f64 {
    at.saturating_duration_since(origin()).as_secs_f64() * 1000.0
}

/// `ts` as every emitted event writes it: RFC 3339 in UTC, to the
/// microsecond leaseline keeps.
fn ts_string(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Where built messages go: `offer` must not block.
pub trait Sink: Send + Sync {
    /// Queues one message, key and payload; [`EmitError::Full`] when the
    /// bound is reached.
    fn offer(&self, key: &str, payload: &[u8]) -> Result<(), EmitError>;
    /// Waits up to `timeout` for queued messages to be delivered.
    fn flush(&self, _timeout: Duration) -> Result<(), EmitError> {
        Ok(())
    }
}

/// A sink shared with the code that built the emitter, which may then
/// flush or inspect it itself.
impl<S: Sink + ?Sized> Sink for Arc<S> {
    fn offer(&self, key: &str, payload: &[u8]) -> Result<(), EmitError> {
        (**self).offer(key, payload)
    }
    fn flush(&self, timeout: Duration) -> Result<(), EmitError> {
        (**self).flush(timeout)
    }
}

/// Kafka, through librdkafka's producer and its background thread.
pub struct KafkaSink {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl KafkaSink {
    /// A producer with `config` (at least `bootstrap.servers`) writing to
    /// `topic`, with at most `capacity` messages waiting for the broker.
    /// Idempotence is turned on unless `config` says otherwise, so the
    /// client's own retries do not duplicate messages.
    pub fn new(
        mut config: ClientConfig,
        topic: &str,
        capacity: usize,
    ) -> Result<KafkaSink, EmitError> {
        config.set("queue.buffering.max.messages", capacity.max(1).to_string());
        if config.get("enable.idempotence").is_none() {
            config.set("enable.idempotence", "true");
        }
        let producer = config
            .create()
            .map_err(|e: KafkaError| EmitError::Sink(e.to_string()))?;
        Ok(KafkaSink {
            producer,
            topic: topic.to_string(),
        })
    }
}

impl Sink for KafkaSink {
    fn offer(&self, key: &str, payload: &[u8]) -> Result<(), EmitError> {
        let record = BaseRecord::to(&self.topic).key(key).payload(payload);
        self.producer.send(record).map_err(|(e, _)| match e {
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => EmitError::Full,
            e => EmitError::Sink(e.to_string()),
        })
    }

    fn flush(&self, timeout: Duration) -> Result<(), EmitError> {
        self.producer
            .flush(timeout)
            .map_err(|e| EmitError::Sink(e.to_string()))
    }
}

/// Messages kept by a [`MemorySink`]: key and payload.
type Kept = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Keeps messages in memory, for tests of code that emits.
#[derive(Clone, Default)]
pub struct MemorySink {
    messages: Kept,
    capacity: Option<usize>,
}

impl MemorySink {
    /// A sink that refuses messages past `capacity` until they are taken.
    pub fn bounded(capacity: usize) -> MemorySink {
        MemorySink {
            capacity: Some(capacity),
            ..MemorySink::default()
        }
    }

    /// The messages offered so far, oldest first; the sink is empty after.
    pub fn take(&self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut *self.messages.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Sink for MemorySink {
    fn offer(&self, key: &str, payload: &[u8]) -> Result<(), EmitError> {
        let mut m = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        if self.capacity.is_some_and(|c| m.len() >= c) {
            return Err(EmitError::Full);
        }
        m.push((key.to_string(), payload.to_vec()));
        Ok(())
    }
}

struct Inner {
    source: Source,
    holder_id: Option<String>,
    backend: Option<String>,
    /// Unique to this emitter: the prefix of its event ids.
    run: String,
    seq: AtomicU64,
    sent: AtomicU64,
    dropped: AtomicU64,
    sink: Box<dyn Sink>,
}

/// Builds and sends the events of one holder process or resource. Cheap
/// to clone; clones share the sink, the counters and the id sequence.
#[derive(Clone)]
pub struct Emitter(Arc<Inner>);

impl Emitter {
    pub fn new(source: Source, sink: impl Sink + 'static) -> Emitter {
        Emitter(Arc::new(Inner {
            source,
            holder_id: None,
            backend: None,
            run: uuid::Uuid::new_v4().simple().to_string(),
            seq: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            sink: Box::new(sink),
        }))
    }

    fn with(self, f: impl FnOnce(&mut Inner)) -> Emitter {
        let mut inner = Arc::try_unwrap(self.0)
            .unwrap_or_else(|_| panic!("configure an Emitter before cloning it"));
        f(&mut inner);
        Emitter(Arc::new(inner))
    }

    /// The `holder_id` of every event (for a holder: this process).
    pub fn holder_id(self, id: &str) -> Emitter {
        self.with(|i| i.holder_id = Some(id.to_string()))
    }

    /// The `backend` of every event (`etcd`, `redis`, ...).
    pub fn backend(self, backend: &str) -> Emitter {
        self.with(|i| i.backend = Some(backend.to_string()))
    }

    /// A new event of `kind` about `lease_id`, stamped now.
    pub fn event(&self, kind: Kind, lease_id: &str) -> Event<'_> {
        let i = &self.0;
        let seq = i.seq.fetch_add(1, Ordering::Relaxed);
        let mut f = Map::new();
        f.insert("ts".into(), ts_string(chrono::Utc::now()).into());
        f.insert("kind".into(), kind.as_str().into());
        f.insert("source".into(), i.source.as_str().into());
        f.insert("lease_id".into(), lease_id.into());
        f.insert("event_id".into(), format!("{}-{seq}", i.run).into());
        if let Some(h) = &i.holder_id {
            f.insert("holder_id".into(), h.as_str().into());
        }
        if let Some(b) = &i.backend {
            f.insert("backend".into(), b.as_str().into());
        }
        if i.source == Source::Holder {
            f.insert("mono_ms".into(), mono_ms().into());
        }
        Event {
            emitter: self,
            lease_id: lease_id.to_string(),
            fields: f,
        }
    }

    /// Events handed to the sink.
    pub fn sent(&self) -> u64 {
        self.0.sent.load(Ordering::Relaxed)
    }

    /// Events dropped because the sink's queue was full.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for queued events to reach the broker: call it
    /// before the process exits.
    pub fn flush(&self, timeout: Duration) -> Result<(), EmitError> {
        self.0.sink.flush(timeout)
    }
}

/// One event being built; [`Event::send`] or [`Event::build`] ends it.
pub struct Event<'a> {
    emitter: &'a Emitter,
    lease_id: String,
    fields: Map<String, Value>,
}

impl Event<'_> {
    fn set(mut self, k: &str, v: impl Into<Value>) -> Self {
        self.fields.insert(k.into(), v.into());
        self
    }

    /// When the transition happened, in Unix milliseconds, for an emitter
    /// that reports it after the fact (a coordinator adapter reading the
    /// service's own clock) rather than as it happens.
    pub fn ts_ms(self, ms: i64) -> Self {
        match chrono::DateTime::from_timestamp_millis(ms) {
            Some(at) => self.set("ts", ts_string(at)),
            // Out of chrono's range, and so of the contract's: the check in
            // `build` refuses it as `bad_timestamp`.
            None => self.set("ts", ms),
        }
    }
    /// An `event_id` derived from the transition itself instead of the
    /// emitter's sequence, so that an emitter which reports the same
    /// transition again after a restart sends the same id.
    pub fn event_id(self, id: &str) -> Self {
        self.set("event_id", id)
    }
    pub fn fencing_token(self, token: u64) -> Self {
        self.set("fencing_token", token)
    }
    pub fn ttl_ms(self, ttl: u64) -> Self {
        self.set("ttl_ms", ttl)
    }
    pub fn latency_ms(self, ms: f64) -> Self {
        self.set("latency_ms", ms)
    }
    pub fn reason(self, reason: &str) -> Self {
        self.set("reason", reason)
    }
    /// On `stale_write_rejected`: the highest token the resource had seen.
    pub fn max_token(self, token: u64) -> Self {
        self.set("max_token", token)
    }
    /// When the keepalive that succeeded was sent, from [`mono_ms`] or
    /// [`mono_ms_at`].
    pub fn keepalive_sent_mono_ms(self, ms: f64) -> Self {
        self.set("keepalive_sent_mono_ms", ms)
    }
    /// On `drain_started` and `fenced`: the fence deadline, on the clock of
    /// [`mono_ms`].
    pub fn deadline_mono_ms(self, ms: f64) -> Self {
        self.set("deadline_mono_ms", ms)
    }
    /// The holder this event is about, when it is not the emitter's own (a
    /// resource reporting a write names the writer).
    pub fn holder_id(self, id: &str) -> Self {
        self.set("holder_id", id)
    }
    /// OpenTelemetry ids of the work the lease protects.
    pub fn trace(self, trace_id: &str, span_id: &str) -> Self {
        self.set("trace_id", trace_id).set("span_id", span_id)
    }
    pub fn attr(mut self, key: &str, value: &str) -> Self {
        let attrs = self
            .fields
            .entry("attrs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = attrs {
            m.insert(key.into(), value.into());
        }
        self
    }

    /// The Kafka key and the JSON payload, checked against the contract.
    pub fn build(self) -> Result<(String, Vec<u8>), EmitError> {
        let payload = serde_json::to_vec(&self.fields).expect("a JSON map serializes");
        leaseline_schema::decode(&payload).map_err(|e| EmitError::Invalid(e.reason.to_string()))?;
        Ok((self.lease_id, payload))
    }

    /// Builds the event and queues it without blocking. On
    /// [`EmitError::Full`] the event is dropped and counted.
    pub fn send(self) -> Result<(), EmitError> {
        let inner = &self.emitter.0;
        let (key, payload) = self.build()?;
        match inner.sink.offer(&key, &payload) {
            Ok(()) => {
                inner.sent.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                if matches!(e, EmitError::Full) {
                    inner.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_the_contract_fields_a_holder_must_not_get_wrong() {
        let sink = MemorySink::default();
        let e = Emitter::new(Source::Holder, sink.clone())
            .holder_id("w-1")
            .backend("etcd");
        let sent = mono_ms();
        e.event(Kind::Acquired, "L")
            .fencing_token(7)
            .ttl_ms(9000)
            .keepalive_sent_mono_ms(sent)
            .send()
            .unwrap();
        e.event(Kind::Fenced, "L")
            .fencing_token(7)
            .deadline_mono_ms(sent + 8000.0)
            .send()
            .unwrap();
        let msgs = sink.take();
        assert_eq!(msgs.len(), 2);
        let evs: Vec<_> = msgs
            .iter()
            .map(|(k, p)| {
                assert_eq!(k, "L");
                leaseline_schema::decode(p).unwrap().into_owned()
            })
            .collect();
        assert_eq!(evs[0].kind, Kind::Acquired);
        assert_eq!(evs[0].holder_id.as_deref(), Some("w-1"));
        assert_eq!(evs[0].backend.as_deref(), Some("etcd"));
        assert_eq!(evs[0].ttl_ms, Some(9000));
        // One monotonic clock: the event happened after its keepalive went.
        assert!(evs[0].mono_ms.unwrap() >= evs[0].keepalive_sent_mono_ms.unwrap());
        assert_eq!(evs[1].deadline_mono_ms, Some(sent + 8000.0));
        // Ids differ between events and share the emitter's run prefix.
        let (a, b) = (
            evs[0].event_id.as_deref().unwrap(),
            evs[1].event_id.as_deref().unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.rsplit_once('-').unwrap().0, b.rsplit_once('-').unwrap().0);
    }

    #[test]
    fn a_reported_transition_keeps_its_own_time_and_id() {
        let e = Emitter::new(Source::Coordinator, MemorySink::default()).backend("redis");
        let build = || {
            e.event(Kind::Expired, "L")
                .holder_id("w-1")
                .fencing_token(3)
                .ts_ms(1_789_380_003_015)
                .event_id("redis/0/L/3/end")
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        // Built twice, sent twice: the same event.
        assert_eq!(a, b);
        let ev = leaseline_schema::decode(&a.1).unwrap().into_owned();
        assert_eq!(ev.event_id.as_deref(), Some("redis/0/L/3/end"));
        let v: Value = serde_json::from_slice(&a.1).unwrap();
        assert_eq!(v["ts"], "2026-09-14T10:00:03.015000Z");
        assert!(v.get("mono_ms").is_none());
    }

    #[test]
    fn an_event_that_breaks_the_contract_is_refused_before_sending() {
        let sink = MemorySink::default();
        let e = Emitter::new(Source::Holder, sink.clone()).holder_id("w-1");
        // `acquired` needs a fencing token.
        let err = e.event(Kind::Acquired, "L").send().unwrap_err();
        assert!(
            matches!(&err, EmitError::Invalid(r) if r == "missing_field:fencing_token"),
            "{err}"
        );
        assert!(sink.take().is_empty());
        assert_eq!(e.sent(), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let sink = MemorySink::bounded(2);
        let e = Emitter::new(Source::Resource, sink.clone());
        for _ in 0..5 {
            let _ = e
                .event(Kind::WriteAccepted, "L")
                .fencing_token(1)
                .holder_id("w-1")
                .send();
        }
        assert_eq!((e.sent(), e.dropped()), (2, 3));
        assert_eq!(sink.take().len(), 2);
    }
}
