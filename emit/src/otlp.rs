//! Events as OpenTelemetry log records over OTLP/HTTP, for holders whose
//! telemetry already goes to a Collector or straight to `leaseline serve
//! --otlp-logs` (`POST /v1/logs`).
//!
//! The record is the inverse of leaseline's own reading of one
//! (`docs/event-contract.md`, "From OpenTelemetry"): each contract field
//! is the attribute [`leaseline_schema::Field::otlp_attribute`] names
//! (`lease.id`, `lease.kind`, `lease.fencing_token`, ...), `ts` is the
//! record's time, `trace_id` and `span_id` its trace context, and `attrs`
//! its other attributes. `lease.event_id` is always set (the emitter fixed
//! it when it built the event), so an export the sink retries, or one a
//! Collector retries downstream, is still one event in the lake.
//!
//! # Not blocking the lease loop
//!
//! [`OtlpSink::offer`] puts the message on a bounded queue and returns; a
//! thread of the sink's own batches what is queued (up to
//! [`OtlpConfig::max_batch`] records, or what arrived within
//! [`OtlpConfig::linger`]) and posts it as protobuf. When the queue is
//! full, `offer` answers [`EmitError::Full`] and the emitter drops and
//! counts the event, as with Kafka.
//!
//! # Where OTLP leaves a choice
//!
//! - **Retries.** What the OTLP/HTTP specification calls retryable (429,
//!   502, 503, 504, and no answer at all) is posted again after an
//!   exponential backoff (100 ms doubling to 5 s, with jitter), without a
//!   limit: the queue's bound already caps what waits, and an event the
//!   sink accepted is not given up while the server may come back. A
//!   `Retry-After` in seconds is honoured when it asks for longer.
//! - **Refusals.** Any other answer is final: the batch's records are
//!   counted as refused ([`OtlpSink::refused`]) and not sent again. So are
//!   the records a `200` reports in its partial success (leaseline keeps
//!   those in `lease_rejects`, with the reason).
//! - **Flushing.** [`Sink::flush`] waits until every message offered
//!   before it was answered for (delivered or refused); a server that is
//!   away makes it time out.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBuilder};
use leaseline_schema::Field;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde_json::{Map, Value};

use crate::{EmitError, Sink};

/// How an [`OtlpSink`] sends.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The logs endpoint: a base such as `http://127.0.0.1:4318`, to which
    /// `/v1/logs` is added, or a URL that already ends in `/v1/logs`.
    pub endpoint: String,
    /// Messages that may wait for the server; past it `offer` is `Full`.
    pub capacity: usize,
    /// Records per export at most.
    pub max_batch: usize,
    /// How long the first message of a batch waits for company.
    pub linger: Duration,
    /// Extra request headers, e.g. `Authorization: Bearer ...` for a
    /// leaseline that requires a token with the `ingest` scope.
    pub headers: Vec<(String, String)>,
    /// The resource's `service.name`, if any (leaseline keeps it in
    /// `attrs`).
    pub service_name: Option<String>,
    /// How long one request may take.
    pub request_timeout: Duration,
}

impl OtlpConfig {
    pub fn new(endpoint: &str) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.to_string(),
            capacity: 10_000,
            max_batch: 512,
            linger: Duration::from_millis(50),
            headers: Vec::new(),
            service_name: None,
            request_timeout: Duration::from_secs(10),
        }
    }

    fn url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        if base.ends_with("/v1/logs") {
            base.to_string()
        } else {
            format!("{base}/v1/logs")
        }
    }
}

/// What the sending thread has answered for, shared with `flush`.
#[derive(Default)]
struct Progress {
    offered: u64,
    answered: u64,
    delivered: u64,
    refused: u64,
    last_refusal: Option<String>,
}

struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// OTLP/HTTP logs, posted by a thread of the sink's own.
pub struct OtlpSink {
    queue: SyncSender<Vec<u8>>,
    shared: Arc<Shared>,
}

impl OtlpSink {
    /// A sink posting to `endpoint` (see [`OtlpConfig::endpoint`]) with at
    /// most `capacity` messages waiting.
    pub fn new(endpoint: &str, capacity: usize) -> Result<OtlpSink, EmitError> {
        OtlpSink::with_config(OtlpConfig {
            capacity,
            ..OtlpConfig::new(endpoint)
        })
    }

    pub fn with_config(config: OtlpConfig) -> Result<OtlpSink, EmitError> {
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &config.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| EmitError::Sink(format!("header {k:?}: {e}")))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|e| EmitError::Sink(format!("header {k:?}: {e}")))?;
            headers.insert(name, value);
        }
        let url = reqwest::Url::parse(&config.url())
            .map_err(|e| EmitError::Sink(format!("endpoint {:?}: {e}", config.endpoint)))?;
        let (queue, rx) = std::sync::mpsc::sync_channel(config.capacity.max(1));
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        });
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("leaseline-otlp".into())
            .spawn(move || {
                // The blocking client runs a runtime of its own: it is
                // built here, off any runtime the holder itself runs.
                let client = reqwest::blocking::Client::builder()
                    .timeout(config.request_timeout)
                    .default_headers(headers)
                    .build();
                match client {
                    Ok(client) => send_loop(&client, url, &config, &rx, &thread_shared),
                    Err(e) => refuse_all(&rx, &thread_shared, &format!("HTTP client: {e}")),
                }
            })
            .map_err(|e| EmitError::Sink(format!("starting the OTLP thread: {e}")))?;
        Ok(OtlpSink { queue, shared })
    }

    /// Records the server took (a partial success's refusals excluded).
    pub fn delivered(&self) -> u64 {
        self.shared.lock().delivered
    }

    /// Records the server refused for good, or that could not be made
    /// into a record.
    pub fn refused(&self) -> u64 {
        self.shared.lock().refused
    }
}

impl Sink for OtlpSink {
    fn offer(&self, _key: &str, payload: &[u8]) -> Result<(), EmitError> {
        // Counted before it is queued, so that the thread never answers
        // for a message `flush` has not seen offered.
        self.shared.lock().offered += 1;
        match self.queue.try_send(payload.to_vec()) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.lock().offered -= 1;
                Err(match e {
                    TrySendError::Full(_) => EmitError::Full,
                    TrySendError::Disconnected(_) => {
                        EmitError::Sink("the OTLP thread has stopped".into())
                    }
                })
            }
        }
    }

    fn flush(&self, timeout: Duration) -> Result<(), EmitError> {
        let deadline = Instant::now() + timeout;
        let mut p = self.shared.lock();
        let target = p.offered;
        while p.answered < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EmitError::Sink(format!(
                    "{} events not answered for by the OTLP endpoint within {timeout:?}",
                    target - p.answered
                )));
            }
            p = self
                .shared
                .changed
                .wait_timeout(p, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }
}

fn send_loop(
    client: &reqwest::blocking::Client,
    url: reqwest::Url,
    config: &OtlpConfig,
    rx: &Receiver<Vec<u8>>,
    shared: &Shared,
) {
    let resource = Resource {
        attributes: config
            .service_name
            .iter()
            .map(|s| attribute("service.name", string(s)))
            .collect(),
        ..Resource::default()
    };
    // Every message offered is answered for, so the loop ends only when
    // the sink is gone and its queue drained.
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let until = Instant::now() + config.linger;
        while batch.len() < config.max_batch.max(1) {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(m) => batch.push(m),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        let observed = now_nanos();
        let mut records = Vec::with_capacity(batch.len());
        let mut unconvertible = 0;
        for payload in &batch {
            match log_record(payload, observed) {
                Ok(r) => records.push(r),
                Err(_) => unconvertible += 1,
            }
        }
        let (delivered, refused, why) = if records.is_empty() {
            (0, 0, None)
        } else {
            export(client, &url, &resource, records)
        };
        let mut p = shared.lock();
        p.answered += batch.len() as u64;
        p.delivered += delivered;
        p.refused += refused + unconvertible;
        if why.is_some() {
            p.last_refusal = why;
        }
        drop(p);
        shared.changed.notify_all();
    }
}

/// Posts one export until it is answered for good: `(delivered, refused,
/// why refused)`.
fn export(
    client: &reqwest::blocking::Client,
    url: &reqwest::Url,
    resource: &Resource,
    records: Vec<LogRecord>,
) -> (u64, u64, Option<String>) {
    let n = records.len() as u64;
    let body = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource.clone()),
            scope_logs: vec![ScopeLogs {
                log_records: records,
                ..ScopeLogs::default()
            }],
            ..ResourceLogs::default()
        }],
    }
    .encode_to_vec();
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        let sent = client
            .post(url.clone())
            .header("content-type", "application/x-protobuf")
            .body(body.clone())
            .send();
        let mut wait = delays.next().unwrap_or(Duration::from_secs(5));
        match sent {
            Ok(resp) if resp.status().is_success() => {
                let rejected = resp
                    .bytes()
                    .ok()
                    .and_then(|b| ExportLogsServiceResponse::decode(b.as_ref()).ok())
                    .and_then(|r| r.partial_success)
                    .map(|p| (p.rejected_log_records.max(0) as u64, p.error_message));
                return match rejected {
                    Some((r, why)) if r > 0 => (n.saturating_sub(r), r.min(n), Some(why)),
                    _ => (n, 0, None),
                };
            }
            Ok(resp) if retryable(resp.status().as_u16()) => {
                let asked = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                if let Some(asked) = asked {
                    wait = wait.max(asked.min(Duration::from_secs(60)));
                }
            }
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().unwrap_or_default();
                return (0, n, Some(format!("{status}: {text}")));
            }
            // No answer: the server is away, or the connection broke.
            Err(_) => {}
        }
        std::thread::sleep(wait);
    }
}

/// The OTLP/HTTP specification's retryable answers.
fn retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

fn refuse_all(rx: &Receiver<Vec<u8>>, shared: &Shared, why: &str) {
    while rx.recv().is_ok() {
        let mut p = shared.lock();
        p.answered += 1;
        p.refused += 1;
        p.last_refusal = Some(why.to_string());
        drop(p);
        shared.changed.notify_all();
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn string(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.to_string())),
    }
}

fn attribute(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(value),
        ..KeyValue::default()
    }
}

/// One contract event (its JSON) as a log record observed at `observed`
/// (Unix nanoseconds). Errs on a payload that is not a JSON object with a
/// readable `ts`, which a built event always is.
pub fn log_record(payload: &[u8], observed: u64) -> Result<LogRecord, String> {
    let event: Map<String, Value> =
        serde_json::from_slice(payload).map_err(|e| format!("not a JSON object: {e}"))?;
    let mut record = LogRecord {
        observed_time_unix_nano: observed,
        ..LogRecord::default()
    };
    for (key, value) in &event {
        match (key.as_str(), value) {
            ("ts", Value::String(s)) => {
                record.time_unix_nano = chrono::DateTime::parse_from_rfc3339(s)
                    .ok()
                    .and_then(|t| t.timestamp_nanos_opt())
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| format!("ts {s:?} is not an RFC 3339 time after 1970"))?;
            }
            ("ts", Value::Number(n)) => {
                record.time_unix_nano = n
                    .as_u64()
                    .and_then(|ms| ms.checked_mul(1_000_000))
                    .ok_or_else(|| format!("ts {n} is not epoch milliseconds"))?;
            }
            ("ts", _) => return Err("ts is neither a string nor a number".into()),
            ("trace_id", Value::String(s)) if s.len() == 32 => match unhex(s) {
                Some(b) => record.trace_id = b,
                None => record
                    .attributes
                    .push(attribute("lease.trace_id", string(s))),
            },
            ("span_id", Value::String(s)) if s.len() == 16 => match unhex(s) {
                Some(b) => record.span_id = b,
                None => record
                    .attributes
                    .push(attribute("lease.span_id", string(s))),
            },
            ("attrs", Value::Object(attrs)) => {
                for (k, v) in attrs {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    record.attributes.push(attribute(k, string(&text)));
                }
            }
            (_, Value::Null) => {}
            (key, value) => {
                let name = Field::ALL
                    .into_iter()
                    .find(|f| f.as_str() == key)
                    .and_then(Field::otlp_attribute)
                    .unwrap_or(key);
                record.attributes.push(attribute(name, any(value)));
            }
        }
    }
    Ok(record)
}

/// A JSON value with its type kept, as leaseline reads it back: integers
/// as ints, except above what an OTLP int holds (a token past 2^63 − 1),
/// which go as their decimal digits.
fn any(value: &Value) -> AnyValue {
    let v = match value {
        Value::Bool(b) => any_value::Value::BoolValue(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => any_value::Value::IntValue(i),
            (None, Some(u), _) => any_value::Value::StringValue(u.to_string()),
            (_, _, Some(f)) => any_value::Value::DoubleValue(f),
            _ => any_value::Value::StringValue(n.to_string()),
        },
        Value::String(s) => any_value::Value::StringValue(s.clone()),
        other => any_value::Value::StringValue(other.to_string()),
    };
    AnyValue { value: Some(v) }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Emitter, Kind, MemorySink, Source};

    fn roundtrip(payload: &[u8]) -> leaseline_schema::LeaseEvent<'static> {
        let record = log_record(payload, 1).unwrap();
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![record],
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        };
        let json = leaseline_ingest::otlp::translate(&request).remove(0);
        leaseline_schema::decode(&json).unwrap().into_owned()
    }

    #[test]
    fn a_record_reads_back_as_the_event_it_was_built_from() {
        let sink = MemorySink::default();
        let e = Emitter::new(Source::Holder, sink.clone())
            .holder_id("w-1")
            .backend("etcd");
        let sent = crate::mono_ms();
        e.event(Kind::Renewed, "orders/o-1")
            .fencing_token(u64::MAX)
            .ttl_ms(9000)
            .latency_ms(1.5)
            .keepalive_sent_mono_ms(sent)
            .trace("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
            .attr("zone", "eu-1")
            .send()
            .unwrap();
        let (_, payload) = sink.take().remove(0);
        let original = leaseline_schema::decode(&payload).unwrap().into_owned();
        assert_eq!(roundtrip(&payload), original);
        // The token past an OTLP int travels as digits.
        let record = log_record(&payload, 1).unwrap();
        let token = record
            .attributes
            .iter()
            .find(|kv| kv.key == "lease.fencing_token")
            .unwrap();
        assert_eq!(
            token.value.as_ref().unwrap().value,
            Some(any_value::Value::StringValue(u64::MAX.to_string()))
        );
        assert_eq!(record.trace_id.len(), 16);
    }

    /// A one-connection-at-a-time HTTP server answering each request with
    /// the next status of `statuses`, then 200; counts the requests.
    fn server(statuses: Vec<u16>) -> (String, Arc<Mutex<Vec<usize>>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = bodies.clone();
        std::thread::spawn(move || {
            let mut statuses = statuses.into_iter();
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then the body its content-length announces.
                let body_len = loop {
                    let n = s.read(&mut chunk).unwrap_or(0);
                    if n == 0 {
                        break None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        while buf.len() < end + 4 + len {
                            let n = s.read(&mut chunk).unwrap_or(0);
                            if n == 0 {
                                break;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                        break Some(len);
                    }
                };
                let Some(len) = body_len else { continue };
                let body = &buf[buf.len() - len..];
                let req = ExportLogsServiceRequest::decode(body).unwrap();
                let n = req.resource_logs[0].scope_logs[0].log_records.len();
                seen.lock().unwrap().push(n);
                let status = statuses.next().unwrap_or(200);
                let _ = write!(
                    s,
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        (url, bodies)
    }

    fn send(e: &Emitter, n: usize) {
        for i in 0..n {
            e.event(Kind::WriteAccepted, "L")
                .holder_id("w-1")
                .fencing_token(i as u64 + 1)
                .send()
                .unwrap();
        }
    }

    #[test]
    fn retryable_answers_are_retried_and_others_are_final() {
        let (url, bodies) = server(vec![503, 429]);
        let sink = Arc::new(OtlpSink::new(&url, 100).unwrap());
        let e = Emitter::new(Source::Resource, sink.clone());
        send(&e, 3);
        sink.flush(Duration::from_secs(30)).unwrap();
        // Two refusals to retry, then the same records once more.
        assert_eq!(*bodies.lock().unwrap(), vec![3, 3, 3]);
        assert_eq!((sink.delivered(), sink.refused()), (3, 0));

        let (url, bodies) = server(vec![400]);
        let sink = Arc::new(OtlpSink::new(&url, 100).unwrap());
        let e = Emitter::new(Source::Resource, sink.clone());
        send(&e, 2);
        sink.flush(Duration::from_secs(30)).unwrap();
        assert_eq!(*bodies.lock().unwrap(), vec![2]);
        assert_eq!((sink.delivered(), sink.refused()), (0, 2));
    }

    #[test]
    fn a_server_away_fills_the_bound_and_flush_says_so() {
        // Bound to a port, never accepting: requests wait and time out.
        let idle = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", idle.local_addr().unwrap());
        let sink = Arc::new(
            OtlpSink::with_config(OtlpConfig {
                capacity: 2,
                max_batch: 1,
                linger: Duration::ZERO,
                request_timeout: Duration::from_secs(30),
                ..OtlpConfig::new(&url)
            })
            .unwrap(),
        );
        let e = Emitter::new(Source::Resource, sink.clone());
        // One in flight, two queued: the rest are dropped, never waited on.
        let started = Instant::now();
        for i in 0..10 {
            let _ = e
                .event(Kind::WriteAccepted, "L")
                .holder_id("w-1")
                .fencing_token(i + 1)
                .send();
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(e.dropped() >= 7, "{} dropped", e.dropped());
        assert!(e.sent() <= 3);
        let err = sink.flush(Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("not answered"), "{err}");
    }
}
