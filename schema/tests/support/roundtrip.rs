//! Invariants of a decoded event, shared by `tests/fuzz_regressions.rs` and
//! the cargo-fuzz target (`fuzz/fuzz_targets/decode.rs`, which includes this
//! file by path). Every check panics on failure, which is what both want.

#![allow(dead_code)]

use std::borrow::Cow;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType, UInt64Type};
use leaseline_schema::{
    decode, decode_str_by_serde, decode_str_fast_only, DecodeError, EventBatchBuilder, Kind,
    LeaseEvent, Origin, RejectBatchBuilder, Source, EVENTS_SCHEMA, MAX_ID_BYTES, REJECTS_SCHEMA,
};

const ORIGIN: Origin<'static> = Origin::File {
    path: "fuzz",
    line: 1,
};

/// Decodes `data` and checks everything that must hold of the outcome:
/// a valid event obeys the contract, survives Arrow and a JSON re-encoding;
/// a refusal lands in a reject batch byte for byte.
pub fn check(data: &[u8]) {
    check_fast_path(data);
    match decode(data) {
        Ok(e) => {
            check_contract(&e);
            check_arrow_roundtrip(&e);
            check_json_roundtrip(&e);
            // Deterministic, and detaching from the input changes nothing.
            assert_eq!(decode(data).unwrap(), e);
            assert_eq!(e.clone().into_owned(), e);
        }
        Err(err) => {
            check_reject(data, &err);
            assert_eq!(decode(data).unwrap_err(), err);
        }
    }
}

/// The fast path answers exactly as the serde walk does wherever it answers
/// at all, and `decode` is the serde walk's answer either way.
pub fn check_fast_path(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let by_serde = decode_str_by_serde(text);
    if let Some(fast) = decode_str_fast_only(text) {
        assert_eq!(
            fast, by_serde,
            "fast path and serde walk differ on {text:?}"
        );
    }
    assert_eq!(
        decode(data),
        by_serde,
        "decode and serde walk differ on {text:?}"
    );
}

/// The contract's validity rules, restated over the typed event.
pub fn check_contract(e: &LeaseEvent<'_>) {
    assert!(!e.lease_id.is_empty() && e.lease_id.len() <= MAX_ID_BYTES);
    if let Some(h) = &e.holder_id {
        assert!(!h.is_empty() && h.len() <= MAX_ID_BYTES);
    } else {
        assert!(matches!(
            e.kind,
            Kind::WriteAccepted | Kind::StaleWriteRejected
        ));
    }
    if e.kind.requires_fencing_token() {
        assert!(e.fencing_token.is_some());
    }
    if e.kind == Kind::Acquired {
        assert!(e.ttl_ms.is_some());
    }
    if let Some(t) = e.ttl_ms {
        assert!(t > 0);
    }
    for v in [
        e.latency_ms,
        e.mono_ms,
        e.keepalive_sent_mono_ms,
        e.deadline_mono_ms,
    ]
    .into_iter()
    .flatten()
    {
        assert!(v.is_finite() && v >= 0.0, "{v}");
    }
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if let Some(t) = &e.trace_id {
        assert!(hex(t, 32), "{t:?}");
    }
    if let Some(s) = &e.span_id {
        assert!(hex(s, 16), "{s:?}");
    }
    // attrs: sorted by key, keys unique.
    for w in e.attrs.windows(2) {
        assert!(w[0].0 < w[1].0, "attrs not sorted/unique: {:?}", e.attrs);
    }
    assert!(chrono::DateTime::from_timestamp_micros(e.ts_us).is_some());
}

/// Appends the event to an [`EventBatchBuilder`] and reads every column back.
pub fn check_arrow_roundtrip(e: &LeaseEvent<'_>) {
    let mut b = EventBatchBuilder::new();
    b.append(e, &ORIGIN, 1);
    assert_eq!(b.len(), 1);
    let batch = b.finish();
    assert!(b.is_empty());
    assert_eq!(batch.schema(), *EVENTS_SCHEMA);
    assert_eq!(batch.num_rows(), 1);
    assert_eq!(read_back(&batch, 0), *e);
}

/// Row `i` of a `lease_events` batch as an event.
pub fn read_back(batch: &RecordBatch, i: usize) -> LeaseEvent<'static> {
    let col = |name: &str| {
        batch
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"))
            .clone()
    };
    let string = |name: &str| -> Option<Cow<'static, str>> {
        let c = col(name);
        let c = c.as_string::<i32>();
        c.is_valid(i).then(|| Cow::Owned(c.value(i).to_owned()))
    };
    let u64 = |name: &str| {
        let c = col(name);
        let c = c.as_primitive::<UInt64Type>();
        c.is_valid(i).then(|| c.value(i))
    };
    let f64 = |name: &str| {
        let c = col(name);
        let c = c.as_primitive::<Float64Type>();
        c.is_valid(i).then(|| c.value(i))
    };
    let ts = col("ts");
    let ttl = col("ttl_ms");
    let ttl = ttl.as_primitive::<Int64Type>();
    let kind = string("kind").expect("kind is not null");
    let source = string("source").expect("source is not null");
    let attrs = match string("attrs") {
        None => Vec::new(),
        Some(json) => {
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&json).expect("attrs column is a JSON object");
            assert!(!map.is_empty(), "empty attrs are stored as null");
            map.into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => (k.into(), s.into()),
                    other => panic!("attrs value {other} is not a string"),
                })
                .collect()
        }
    };
    LeaseEvent {
        ts_us: ts.as_primitive::<TimestampMicrosecondType>().value(i),
        kind: Kind::parse(&kind).expect("kind column holds a contract kind"),
        source: Source::parse(&source).expect("a contract source"),
        lease_id: string("lease_id").expect("lease_id is not null"),
        holder_id: string("holder_id"),
        fencing_token: u64("fencing_token"),
        ttl_ms: ttl.is_valid(i).then(|| ttl.value(i)),
        event_id: string("event_id"),
        backend: string("backend"),
        latency_ms: f64("latency_ms"),
        reason: string("reason"),
        max_token: u64("max_token"),
        mono_ms: f64("mono_ms"),
        keepalive_sent_mono_ms: f64("keepalive_sent_mono_ms"),
        deadline_mono_ms: f64("deadline_mono_ms"),
        trace_id: string("trace_id"),
        span_id: string("span_id"),
        attrs,
    }
}

/// Re-encodes a valid event as contract JSON and decodes it again: the
/// result must be the same event (numbers up to serde_json's float parsing,
/// which may be off by one ulp without its `float_roundtrip` feature).
pub fn check_json_roundtrip(e: &LeaseEvent<'_>) {
    use serde_json::{json, Map, Value};
    let mut o = Map::new();
    let ts = if e.ts_us % 1000 == 0 {
        json!(e.ts_us / 1000)
    } else {
        let t = chrono::DateTime::from_timestamp_micros(e.ts_us).unwrap();
        json!(t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
    };
    o.insert("ts".into(), ts);
    o.insert("kind".into(), json!(e.kind.as_str()));
    o.insert("source".into(), json!(e.source.as_str()));
    o.insert("lease_id".into(), json!(e.lease_id));
    let mut opt = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    };
    opt("holder_id", e.holder_id.as_ref().map(|v| json!(v)));
    opt("fencing_token", e.fencing_token.map(|v| json!(v)));
    opt("ttl_ms", e.ttl_ms.map(|v| json!(v)));
    opt("event_id", e.event_id.as_ref().map(|v| json!(v)));
    opt("backend", e.backend.as_ref().map(|v| json!(v)));
    opt("latency_ms", e.latency_ms.map(|v| json!(v)));
    opt("reason", e.reason.as_ref().map(|v| json!(v)));
    opt("max_token", e.max_token.map(|v| json!(v)));
    opt("mono_ms", e.mono_ms.map(|v| json!(v)));
    opt(
        "keepalive_sent_mono_ms",
        e.keepalive_sent_mono_ms.map(|v| json!(v)),
    );
    opt("deadline_mono_ms", e.deadline_mono_ms.map(|v| json!(v)));
    opt("trace_id", e.trace_id.as_ref().map(|v| json!(v)));
    opt("span_id", e.span_id.as_ref().map(|v| json!(v)));
    if !e.attrs.is_empty() {
        let attrs: Map<String, Value> = e
            .attrs
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        o.insert("attrs".into(), Value::Object(attrs));
    }
    let text = Value::Object(o).to_string();
    let again = match decode(text.as_bytes()) {
        Ok(a) => a,
        Err(err) => panic!("re-encoded event {text} was refused: {err}"),
    };
    let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => a == b || (a - b).abs() <= a.abs().max(b.abs()) * 4.0 * f64::EPSILON,
        (a, b) => a == b,
    };
    let mut x = again.clone();
    for (mine, theirs) in [
        (&mut x.latency_ms, e.latency_ms),
        (&mut x.mono_ms, e.mono_ms),
        (&mut x.keepalive_sent_mono_ms, e.keepalive_sent_mono_ms),
        (&mut x.deadline_mono_ms, e.deadline_mono_ms),
    ] {
        assert!(close(*mine, theirs), "{mine:?} vs {theirs:?} in {text}");
        *mine = theirs;
    }
    assert_eq!(x, *e, "re-encoded as {text}");
}

/// A refusal appended to a [`RejectBatchBuilder`] keeps the bytes and the code.
pub fn check_reject(data: &[u8], err: &DecodeError) {
    assert!(!err.message.is_empty());
    let mut b = RejectBatchBuilder::new();
    b.append(data, err, &ORIGIN, 1);
    let batch = b.finish();
    assert_eq!(batch.schema(), *REJECTS_SCHEMA);
    assert_eq!(batch.num_rows(), 1);
    let raw = batch
        .column_by_name("raw")
        .unwrap()
        .as_binary::<i32>()
        .clone();
    assert_eq!(raw.value(0), data);
    let reason = batch
        .column_by_name("reason")
        .unwrap()
        .as_string::<i32>()
        .clone();
    assert_eq!(reason.value(0), err.reason.to_string());
}
