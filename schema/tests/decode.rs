//! Behaviour of the strict decoder against `docs/event-contract.md`.
//!
//! Every example line of the contract decodes to the right values, every
//! [`RejectReason`] variant is produced by at least one input, and the Arrow
//! builders turn events and rejects into batches with the right rows.

use std::borrow::Cow;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType, UInt64Type};
use leaseline_schema::{
    decode, decode_str, DecodeError, EventBatchBuilder, Field, Kind, LeaseEvent, Origin,
    RejectBatchBuilder, RejectReason, Source, EVENTS_SCHEMA, MAX_ID_BYTES, REJECTS_SCHEMA,
};

/// `2026-09-14T10:00:00Z` in microseconds since the Unix epoch.
const T0_US: i64 = 1_789_380_000 * 1_000_000;

/// The contract's example lines, verbatim.
const EXAMPLES: [&str; 6] = [
    r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"backend":"etcd","event_id":"c-0001"}"#,
    r#"{"ts":"2026-09-14T10:00:03.300Z","kind":"renewed","source":"holder","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"latency_ms":4.2,"mono_ms":3300.0,"keepalive_sent_mono_ms":3295.8}"#,
    r#"{"ts":"2026-09-14T10:00:13.300Z","kind":"expired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33}"#,
    r#"{"ts":"2026-09-14T10:00:13.500Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34,"ttl_ms":10000}"#,
    r#"{"ts":"2026-09-14T10:00:14.000Z","kind":"write_accepted","source":"resource","lease_id":"orders/order-123","holder_id":"worker-2","fencing_token":34}"#,
    r#"{"ts":"2026-09-14T10:00:18.000Z","kind":"stale_write_rejected","source":"resource","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"max_token":34}"#,
];

fn ok(line: &str) -> LeaseEvent<'static> {
    match decode(line.as_bytes()) {
        Ok(e) => e.into_owned(),
        Err(e) => panic!("expected {line} to decode, got {e}"),
    }
}

fn err(bytes: &[u8]) -> DecodeError {
    match decode(bytes) {
        Ok(e) => panic!(
            "expected {:?} to be refused, got {e:?}",
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => e,
    }
}

/// The stable reason code of a refused line.
fn code(line: &str) -> String {
    err(line.as_bytes()).reason.to_string()
}

/// A valid event of `kind` with every field the kind requires, then `extra`
/// (a JSON fragment starting with a comma, or empty).
fn line(kind: &str, extra: &str) -> String {
    format!(
        r#"{{"ts":"2026-09-14T10:00:00Z","kind":"{kind}","source":"holder","lease_id":"l","holder_id":"h","fencing_token":7,"ttl_ms":1000{extra}}}"#
    )
}

/// `line` with `field` left out.
fn without(kind: &str, field: &str) -> String {
    let mut v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&line(kind, "")).unwrap();
    assert!(v.remove(field).is_some(), "{field} is in the base line");
    serde_json::Value::Object(v).to_string()
}

/// `line` with `field` set to the JSON text `value`.
fn with(kind: &str, field: &str, value: &str) -> String {
    let mut v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&line(kind, "")).unwrap();
    v.remove(field);
    let mut s = serde_json::Value::Object(v).to_string();
    s.pop();
    format!(r#"{s},"{field}":{value}}}"#)
}

fn attr<'a>(e: &'a LeaseEvent<'_>, key: &str) -> Option<&'a str> {
    e.attrs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_ref())
}

// ---------------------------------------------------------------------------
// The contract's examples.

#[test]
fn example_1_coordinator_acquired() {
    let e = ok(EXAMPLES[0]);
    assert_eq!(e.ts_us, T0_US);
    assert_eq!(e.kind, Kind::Acquired);
    assert_eq!(e.source, Source::Coordinator);
    assert_eq!(e.lease_id, "orders/order-123");
    assert_eq!(e.holder_id.as_deref(), Some("worker-1"));
    assert_eq!(e.fencing_token, Some(33));
    assert_eq!(e.ttl_ms, Some(10_000));
    assert_eq!(e.backend.as_deref(), Some("etcd"));
    assert_eq!(e.event_id.as_deref(), Some("c-0001"));
    assert_eq!(e.latency_ms, None);
    assert_eq!(e.reason, None);
    assert_eq!(e.max_token, None);
    assert_eq!(e.mono_ms, None);
    assert_eq!(e.keepalive_sent_mono_ms, None);
    assert_eq!(e.deadline_mono_ms, None);
    assert_eq!(e.trace_id, None);
    assert_eq!(e.span_id, None);
    assert!(e.attrs.is_empty());
    assert_eq!(e.attrs_json(), None);
}

#[test]
fn example_2_holder_renewed() {
    let e = ok(EXAMPLES[1]);
    assert_eq!(e.ts_us, T0_US + 3_300_000);
    assert_eq!(e.kind, Kind::Renewed);
    assert_eq!(e.source, Source::Holder);
    assert_eq!(e.lease_id, "orders/order-123");
    assert_eq!(e.holder_id.as_deref(), Some("worker-1"));
    assert_eq!(e.fencing_token, Some(33));
    assert_eq!(e.ttl_ms, Some(10_000));
    assert_eq!(e.latency_ms, Some(4.2));
    assert_eq!(e.mono_ms, Some(3300.0));
    assert_eq!(e.keepalive_sent_mono_ms, Some(3295.8));
    assert_eq!(e.event_id, None);
    assert_eq!(e.backend, None);
    assert!(e.attrs.is_empty());
}

#[test]
fn example_3_coordinator_expired() {
    let e = ok(EXAMPLES[2]);
    assert_eq!(e.ts_us, T0_US + 13_300_000);
    assert_eq!(e.kind, Kind::Expired);
    assert_eq!(e.source, Source::Coordinator);
    assert_eq!(e.holder_id.as_deref(), Some("worker-1"));
    assert_eq!(e.fencing_token, Some(33));
    assert_eq!(e.ttl_ms, None);
}

#[test]
fn example_4_second_grant() {
    let e = ok(EXAMPLES[3]);
    assert_eq!(e.ts_us, T0_US + 13_500_000);
    assert_eq!(e.kind, Kind::Acquired);
    assert_eq!(e.holder_id.as_deref(), Some("worker-2"));
    assert_eq!(e.fencing_token, Some(34));
    assert_eq!(e.ttl_ms, Some(10_000));
}

#[test]
fn example_5_write_accepted() {
    let e = ok(EXAMPLES[4]);
    assert_eq!(e.ts_us, T0_US + 14_000_000);
    assert_eq!(e.kind, Kind::WriteAccepted);
    assert_eq!(e.source, Source::Resource);
    assert_eq!(e.holder_id.as_deref(), Some("worker-2"));
    assert_eq!(e.fencing_token, Some(34));
    assert_eq!(e.max_token, None);
}

#[test]
fn example_6_stale_write_rejected() {
    let e = ok(EXAMPLES[5]);
    assert_eq!(e.ts_us, T0_US + 18_000_000);
    assert_eq!(e.kind, Kind::StaleWriteRejected);
    assert_eq!(e.source, Source::Resource);
    assert_eq!(e.holder_id.as_deref(), Some("worker-1"));
    assert_eq!(e.fencing_token, Some(33));
    assert_eq!(e.max_token, Some(34));
}

#[test]
fn examples_borrow_their_strings() {
    // No escapes: the strings point into the input.
    let e = decode(EXAMPLES[0].as_bytes()).unwrap();
    assert!(matches!(e.lease_id, Cow::Borrowed(_)));
    assert!(matches!(e.holder_id, Some(Cow::Borrowed(_))));
    assert!(matches!(e.event_id, Some(Cow::Borrowed(_))));
}

#[test]
fn decode_str_agrees_with_decode() {
    for l in EXAMPLES {
        assert_eq!(decode_str(l).unwrap(), decode(l.as_bytes()).unwrap());
    }
    assert_eq!(decode_str("[]").unwrap_err(), decode(b"[]").unwrap_err());
}

// ---------------------------------------------------------------------------
// Every kind and source, and the kind-dependent presence rules.

#[test]
fn every_kind_and_source_decodes() {
    for kind in Kind::ALL {
        for source in Source::ALL {
            let l = line(kind.as_str(), "").replace(
                r#""source":"holder""#,
                &format!(r#""source":"{}""#, source.as_str()),
            );
            let e = ok(&l);
            assert_eq!(e.kind, kind);
            assert_eq!(e.source, source);
        }
    }
}

#[test]
fn ts_kind_source_lease_id_are_required_on_every_kind() {
    for kind in Kind::ALL {
        for f in ["ts", "kind", "source", "lease_id"] {
            assert_eq!(
                code(&without(kind.as_str(), f)),
                format!("missing_field:{f}"),
                "{kind} without {f}"
            );
        }
    }
}

#[test]
fn holder_id_required_except_on_resource_kinds() {
    for kind in Kind::ALL {
        let l = without(kind.as_str(), "holder_id");
        if matches!(kind, Kind::WriteAccepted | Kind::StaleWriteRejected) {
            assert_eq!(ok(&l).holder_id, None, "{kind}");
        } else {
            assert_eq!(code(&l), "missing_field:holder_id", "{kind}");
        }
    }
}

#[test]
fn fencing_token_required_on_the_contract_kinds() {
    let required = [
        Kind::Acquired,
        Kind::Renewed,
        Kind::Released,
        Kind::Expired,
        Kind::Revoked,
        Kind::Fenced,
        Kind::WriteAccepted,
        Kind::StaleWriteRejected,
    ];
    for kind in Kind::ALL {
        let l = without(kind.as_str(), "fencing_token");
        if required.contains(&kind) {
            assert_eq!(code(&l), "missing_field:fencing_token", "{kind}");
        } else {
            assert_eq!(ok(&l).fencing_token, None, "{kind}");
        }
    }
}

#[test]
fn ttl_ms_required_only_on_acquired() {
    for kind in Kind::ALL {
        let l = without(kind.as_str(), "ttl_ms");
        if kind == Kind::Acquired {
            assert_eq!(code(&l), "missing_field:ttl_ms");
        } else {
            assert_eq!(ok(&l).ttl_ms, None, "{kind}");
        }
    }
}

#[test]
fn null_on_a_required_field_is_missing() {
    assert_eq!(
        code(&with("acquired", "lease_id", "null")),
        "missing_field:lease_id"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", "null")),
        "missing_field:fencing_token"
    );
    assert_eq!(code(&with("acquired", "ts", "null")), "missing_field:ts");
}

#[test]
fn null_on_an_optional_field_is_absent() {
    for f in [
        "event_id",
        "backend",
        "latency_ms",
        "reason",
        "max_token",
        "mono_ms",
        "keepalive_sent_mono_ms",
        "deadline_mono_ms",
        "trace_id",
        "span_id",
        "attrs",
    ] {
        let e = ok(&line("renewed", &format!(r#","{f}":null"#)));
        assert_eq!(e.event_id, None);
        assert_eq!(e.backend, None);
        assert_eq!(e.latency_ms, None);
        assert_eq!(e.reason, None);
        assert_eq!(e.max_token, None);
        assert_eq!(e.mono_ms, None);
        assert_eq!(e.keepalive_sent_mono_ms, None);
        assert_eq!(e.deadline_mono_ms, None);
        assert_eq!(e.trace_id, None);
        assert_eq!(e.span_id, None);
        assert!(e.attrs.is_empty(), "{f}: {:?}", e.attrs);
    }
    // Kind-optional fields too.
    let e = ok(&with("write_accepted", "holder_id", "null"));
    assert_eq!(e.holder_id, None);
    let e = ok(&with("renewed", "ttl_ms", "null"));
    assert_eq!(e.ttl_ms, None);
    let e = ok(&with("acquire_requested", "fencing_token", "null"));
    assert_eq!(e.fencing_token, None);
    // An unknown field that is null is not kept either.
    let e = ok(&line("renewed", r#","region":null"#));
    assert!(e.attrs.is_empty());
}

// ---------------------------------------------------------------------------
// Optional fields with their values.

#[test]
fn all_optional_fields_decode() {
    let e = ok(&line(
        "renew_failed",
        r#","event_id":"e-1","backend":"redis","latency_ms":12,"reason":"timeout","max_token":18446744073709551615,"mono_ms":0,"keepalive_sent_mono_ms":1.5,"deadline_mono_ms":99.25,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","attrs":{"region":"eu-west-1","pod":"p-0"}"#,
    ));
    assert_eq!(e.kind, Kind::RenewFailed);
    assert_eq!(e.event_id.as_deref(), Some("e-1"));
    assert_eq!(e.backend.as_deref(), Some("redis"));
    assert_eq!(e.latency_ms, Some(12.0));
    assert_eq!(e.reason.as_deref(), Some("timeout"));
    assert_eq!(e.max_token, Some(u64::MAX));
    assert_eq!(e.mono_ms, Some(0.0));
    assert_eq!(e.keepalive_sent_mono_ms, Some(1.5));
    assert_eq!(e.deadline_mono_ms, Some(99.25));
    assert_eq!(
        e.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(e.span_id.as_deref(), Some("00f067aa0ba902b7"));
    // Sorted by key.
    assert_eq!(
        e.attrs,
        vec![
            (Cow::from("pod"), Cow::from("p-0")),
            (Cow::from("region"), Cow::from("eu-west-1")),
        ]
    );
    assert_eq!(
        e.attrs_json().as_deref(),
        Some(r#"{"pod":"p-0","region":"eu-west-1"}"#)
    );
}

#[test]
fn backend_is_any_string() {
    let e = ok(&line("acquired", r#","backend":"my-own-lock-service""#));
    assert_eq!(e.backend.as_deref(), Some("my-own-lock-service"));
}

#[test]
fn fencing_token_spans_the_u64_range() {
    assert_eq!(
        ok(&with("acquired", "fencing_token", "0")).fencing_token,
        Some(0)
    );
    assert_eq!(
        ok(&with("acquired", "fencing_token", "18446744073709551615")).fencing_token,
        Some(u64::MAX)
    );
    // Above i64::MAX still fits.
    assert_eq!(
        ok(&with("acquired", "fencing_token", "9223372036854775808")).fencing_token,
        Some(1 << 63)
    );
}

#[test]
fn ttl_ms_one_is_the_smallest_valid() {
    assert_eq!(ok(&with("acquired", "ttl_ms", "1")).ttl_ms, Some(1));
    assert_eq!(
        ok(&with("acquired", "ttl_ms", "3155760000000")).ttl_ms,
        Some(3_155_760_000_000)
    );
}

#[test]
fn ids_at_the_limits_are_valid() {
    let one = ok(&with("acquired", "lease_id", r#""x""#));
    assert_eq!(one.lease_id, "x");
    let max = "a".repeat(MAX_ID_BYTES);
    let e = ok(&with("acquired", "lease_id", &format!("{max:?}")));
    assert_eq!(e.lease_id.len(), 1024);
    let e = ok(&with("acquired", "holder_id", &format!("{max:?}")));
    assert_eq!(e.holder_id.unwrap().len(), 1024);
    // The limit is in bytes of the decoded string: 512 two-byte characters.
    let wide = "é".repeat(512);
    assert_eq!(wide.len(), 1024);
    assert_eq!(
        ok(&with("acquired", "lease_id", &format!("{wide:?}"))).lease_id,
        wide
    );
}

#[test]
fn escaped_strings_are_unescaped() {
    let e = ok(&with("acquired", "lease_id", r#""orders\/a\u00e9\n\"q\"""#));
    assert_eq!(e.lease_id, "orders/a\u{e9}\n\"q\"");
    // An escaped key names the same field.
    let e = ok(
        r#"{"ts":0,"kind":"acquire_requested","source":"holder","lease\u005fid":"l","holder_id":"h"}"#,
    );
    assert_eq!(e.lease_id, "l");
}

#[test]
fn whitespace_around_and_inside_is_fine() {
    let e = ok(" \t{ \"ts\" : 0 ,\n \"kind\":\"drain_started\", \"source\":\"holder\",\r\n\"lease_id\":\"l\",\"holder_id\":\"h\",\"deadline_mono_ms\":5 } \n");
    assert_eq!(e.kind, Kind::DrainStarted);
    assert_eq!(e.deadline_mono_ms, Some(5.0));
}

#[test]
fn field_order_does_not_matter() {
    let e = ok(
        r#"{"fencing_token":33,"holder_id":"worker-1","lease_id":"orders/order-123","source":"coordinator","kind":"expired","ts":"2026-09-14T10:00:13.300Z"}"#,
    );
    assert_eq!(e, ok(EXAMPLES[2]));
}

// ---------------------------------------------------------------------------
// Timestamps.

#[test]
fn ts_rfc3339_with_offset_is_converted_to_utc() {
    let e = ok(&with("acquired", "ts", r#""2026-09-14T12:00:00+02:00""#));
    assert_eq!(e.ts_us, T0_US);
    let e = ok(&with("acquired", "ts", r#""2026-09-14T05:30:00-04:30""#));
    assert_eq!(e.ts_us, T0_US);
    let e = ok(&with("acquired", "ts", r#""2026-09-14T10:00:00+00:00""#));
    assert_eq!(e.ts_us, T0_US);
}

#[test]
fn ts_keeps_microseconds_and_truncates_below() {
    let e = ok(&with(
        "acquired",
        "ts",
        r#""2026-09-14T12:00:00.123456+02:00""#,
    ));
    assert_eq!(e.ts_us, T0_US + 123_456);
    let e = ok(&with(
        "acquired",
        "ts",
        r#""2026-09-14T12:00:00.123456789+02:00""#,
    ));
    assert_eq!(e.ts_us, T0_US + 123_456);
    let e = ok(&with("acquired", "ts", r#""2026-09-14T10:00:00.5Z""#));
    assert_eq!(e.ts_us, T0_US + 500_000);
    let e = ok(&with("acquired", "ts", r#""2026-09-14T10:00:00.000001Z""#));
    assert_eq!(e.ts_us, T0_US + 1);
}

#[test]
fn ts_before_the_epoch_is_fine() {
    let e = ok(&with("acquired", "ts", r#""1969-12-31T23:59:59.999999Z""#));
    assert_eq!(e.ts_us, -1);
}

#[test]
fn ts_as_epoch_milliseconds() {
    let e = ok(&with("acquired", "ts", "1789380000123"));
    assert_eq!(e.ts_us, T0_US + 123_000);
    assert_eq!(ok(&with("acquired", "ts", "0")).ts_us, 0);
    assert_eq!(ok(&with("acquired", "ts", "-1000")).ts_us, -1_000_000);
}

#[test]
fn ts_errors() {
    for bad in [
        r#""2026-09-14T10:00:00""#,     // no offset
        r#""2026-09-14T10:00:00.000""#, // no offset, fraction
        r#""2026-09-14""#,              // date only
        r#""2026-09-14T25:00:00Z""#,    // hour out of range
        r#""2026-02-30T10:00:00Z""#,    // no such day
        r#""yesterday""#,               // not a time
        r#""""#,                        // empty
        r#""1789380000000""#,           // epoch ms as a string
        "1789380000000.5",              // float epoch ms
        "1.78938e12",                   // exponent: a float
        "1789380000000.0",              // float with zero fraction
        "18446744073709551615",         // u64::MAX ms overflows microseconds
        "-9223372036854775808",         // i64::MIN ms overflows microseconds
    ] {
        assert_eq!(
            code(&with("acquired", "ts", bad)),
            "bad_timestamp",
            "ts {bad}"
        );
    }
}

#[test]
fn ts_of_a_non_time_type_is_wrong_type() {
    for bad in ["true", "{}", "[1]"] {
        assert_eq!(
            code(&with("acquired", "ts", bad)),
            "wrong_type:ts",
            "ts {bad}"
        );
    }
}

// ---------------------------------------------------------------------------
// Types and ranges.

#[test]
fn fencing_token_range_and_type() {
    assert_eq!(
        code(&with("acquired", "fencing_token", "-1")),
        "out_of_range:fencing_token"
    );
    // 2^64: one past u64::MAX.
    assert_eq!(
        code(&with("acquired", "fencing_token", "18446744073709551616")),
        "out_of_range:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", "-9223372036854775809")),
        "out_of_range:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", r#""33""#)),
        "wrong_type:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", "33.5")),
        "wrong_type:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", "true")),
        "wrong_type:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", "[33]")),
        "wrong_type:fencing_token"
    );
    assert_eq!(
        code(&with("acquired", "fencing_token", r#"{"v":33}"#)),
        "wrong_type:fencing_token"
    );
}

#[test]
fn max_token_range_and_type() {
    assert_eq!(
        code(&with("stale_write_rejected", "max_token", "-34")),
        "out_of_range:max_token"
    );
    assert_eq!(
        code(&with(
            "stale_write_rejected",
            "max_token",
            "18446744073709551616"
        )),
        "out_of_range:max_token"
    );
    assert_eq!(
        code(&with("stale_write_rejected", "max_token", r#""34""#)),
        "wrong_type:max_token"
    );
}

#[test]
fn ttl_ms_range_and_type() {
    assert_eq!(
        code(&with("acquired", "ttl_ms", "0")),
        "out_of_range:ttl_ms"
    );
    assert_eq!(
        code(&with("acquired", "ttl_ms", "-5")),
        "out_of_range:ttl_ms"
    );
    // Above i64::MAX does not fit the column.
    assert_eq!(
        code(&with("acquired", "ttl_ms", "9223372036854775808")),
        "out_of_range:ttl_ms"
    );
    assert_eq!(
        code(&with("acquired", "ttl_ms", "1.5")),
        "wrong_type:ttl_ms"
    );
    assert_eq!(
        code(&with("acquired", "ttl_ms", r#""1000""#)),
        "wrong_type:ttl_ms"
    );
    // Range applies where the field is optional too.
    assert_eq!(code(&with("renewed", "ttl_ms", "0")), "out_of_range:ttl_ms");
}

#[test]
fn values_the_audit_cannot_add_to_a_time_are_out_of_range() {
    use leaseline_schema::{MAX_DURATION_MS, MAX_TS_US, MIN_TS_US};
    // 100 years is the longest TTL; one more millisecond is refused.
    let max = MAX_DURATION_MS.to_string();
    let past = (MAX_DURATION_MS + 1).to_string();
    assert_eq!(
        ok(&with("acquired", "ttl_ms", &max)).ttl_ms,
        Some(MAX_DURATION_MS as i64)
    );
    let e = err(with("acquired", "ttl_ms", "9223372036854775807").as_bytes());
    assert_eq!(e.reason.to_string(), "out_of_range:ttl_ms");
    assert_eq!(
        e.message,
        "ttl_ms 9223372036854775807 is too large: at most 3155760000000 ms (100 years)"
    );
    assert_eq!(
        code(&with("acquired", "ttl_ms", &past)),
        "out_of_range:ttl_ms"
    );
    for field in [
        "latency_ms",
        "mono_ms",
        "keepalive_sent_mono_ms",
        "deadline_mono_ms",
    ] {
        assert_eq!(
            ok(&with("renewed", field, &max)).ts_us,
            1_789_380_000_000_000
        );
        assert_eq!(
            code(&with("renewed", field, "1e300")),
            format!("out_of_range:{field}")
        );
    }
    // Times: the years RFC 3339 writes, 0001 to 9999, as text or epoch ms.
    assert_eq!(
        ok(&with("renewed", "ts", r#""0001-01-01T00:00:00Z""#)).ts_us,
        MIN_TS_US
    );
    assert_eq!(
        ok(&with("renewed", "ts", r#""9999-12-31T23:59:59.999999Z""#)).ts_us,
        MAX_TS_US
    );
    assert_eq!(
        code(&with("renewed", "ts", r#""0000-12-31T23:59:59Z""#)),
        "out_of_range:ts"
    );
    assert_eq!(
        code(&with("renewed", "ts", "253402300800000")),
        "out_of_range:ts"
    );
    assert_eq!(
        code(&with("renewed", "ts", "-62135596800001")),
        "out_of_range:ts"
    );
}

#[test]
fn ids_empty_or_too_long_are_out_of_range() {
    assert_eq!(
        code(&with("acquired", "lease_id", r#""""#)),
        "out_of_range:lease_id"
    );
    assert_eq!(
        code(&with("acquired", "holder_id", r#""""#)),
        "out_of_range:holder_id"
    );
    let long = "a".repeat(MAX_ID_BYTES + 1);
    assert_eq!(
        code(&with("acquired", "lease_id", &format!("{long:?}"))),
        "out_of_range:lease_id"
    );
    assert_eq!(
        code(&with("acquired", "holder_id", &format!("{long:?}"))),
        "out_of_range:holder_id"
    );
    // Optional holder_id is still checked when present.
    assert_eq!(
        code(&with("write_accepted", "holder_id", r#""""#)),
        "out_of_range:holder_id"
    );
    // 1025 bytes in 513 two-byte characters, and the same via escapes.
    let wide = "é".repeat(513);
    assert_eq!(
        code(&with("acquired", "lease_id", &format!("{wide:?}"))),
        "out_of_range:lease_id"
    );
    let escaped = format!("\"{}\"", r"\u00e9".repeat(513));
    assert_eq!(
        code(&with("acquired", "lease_id", &escaped)),
        "out_of_range:lease_id"
    );
}

#[test]
fn string_fields_of_the_wrong_type() {
    for f in [
        "kind",
        "source",
        "lease_id",
        "holder_id",
        "event_id",
        "backend",
        "reason",
        "trace_id",
        "span_id",
    ] {
        for v in ["1", "true", "[]", "{}", "1.5"] {
            assert_eq!(
                code(&with("acquired", f, v)),
                format!("wrong_type:{f}"),
                "{f}: {v}"
            );
        }
    }
}

#[test]
fn non_negative_numbers() {
    for f in [
        "latency_ms",
        "mono_ms",
        "keepalive_sent_mono_ms",
        "deadline_mono_ms",
    ] {
        assert_eq!(code(&with("renewed", f, "-1")), format!("out_of_range:{f}"));
        assert_eq!(
            code(&with("renewed", f, "-0.5")),
            format!("out_of_range:{f}")
        );
        assert_eq!(
            code(&with("renewed", f, r#""1""#)),
            format!("wrong_type:{f}")
        );
        assert_eq!(
            code(&with("renewed", f, "false")),
            format!("wrong_type:{f}")
        );
        let e = ok(&with("renewed", f, "0"));
        let e2 = ok(&with("renewed", f, "1e3"));
        let get = |e: &LeaseEvent<'_>| match f {
            "latency_ms" => e.latency_ms,
            "mono_ms" => e.mono_ms,
            "keepalive_sent_mono_ms" => e.keepalive_sent_mono_ms,
            _ => e.deadline_mono_ms,
        };
        assert_eq!(get(&e), Some(0.0));
        assert_eq!(get(&e2), Some(1000.0));
    }
}

#[test]
fn trace_and_span_ids_must_be_lowercase_hex() {
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let span = "00f067aa0ba902b7";
    assert_eq!(
        code(&line(
            "acquired",
            &format!(r#","trace_id":"{}""#, trace.to_uppercase())
        )),
        "bad_format:trace_id"
    );
    assert_eq!(
        code(&line(
            "acquired",
            &format!(r#","trace_id":"{}""#, &trace[1..])
        )),
        "bad_format:trace_id"
    );
    assert_eq!(
        code(&line("acquired", &format!(r#","trace_id":"{trace}0""#))),
        "bad_format:trace_id"
    );
    assert_eq!(
        code(&line(
            "acquired",
            r#","trace_id":"4bf92f3577b34da6a3ce929d0e0e473g""#
        )),
        "bad_format:trace_id"
    );
    assert_eq!(
        code(&line("acquired", r#","trace_id":"""#)),
        "bad_format:trace_id"
    );
    assert_eq!(
        code(&line(
            "acquired",
            &format!(r#","span_id":"{}""#, span.to_uppercase())
        )),
        "bad_format:span_id"
    );
    assert_eq!(
        code(&line("acquired", &format!(r#","span_id":"{trace}""#))),
        "bad_format:span_id"
    );
    let e = ok(&line(
        "acquired",
        &format!(r#","trace_id":"{trace}","span_id":"{span}""#),
    ));
    assert_eq!(e.trace_id.as_deref(), Some(trace));
    assert_eq!(e.span_id.as_deref(), Some(span));
}

#[test]
fn unknown_kind_and_source() {
    assert_eq!(
        code(&with("acquired", "kind", r#""grabbed""#)),
        "unknown_kind"
    );
    assert_eq!(
        code(&with("acquired", "kind", r#""Acquired""#)),
        "unknown_kind"
    );
    assert_eq!(code(&with("acquired", "kind", r#""""#)), "unknown_kind");
    assert_eq!(
        code(&with("acquired", "source", r#""client""#)),
        "unknown_source"
    );
    assert_eq!(
        code(&with("acquired", "source", r#""Holder""#)),
        "unknown_source"
    );
}

#[test]
fn duplicate_contract_fields() {
    assert_eq!(
        code(&line("acquired", r#","ts":"2026-09-14T10:00:00Z""#)),
        "duplicate_field:ts"
    );
    assert_eq!(
        code(&line("acquired", r#","fencing_token":7"#)),
        "duplicate_field:fencing_token"
    );
    assert_eq!(
        code(&line("acquired", r#","attrs":{},"attrs":{}"#)),
        "duplicate_field:attrs"
    );
    // A null counts as an appearance.
    assert_eq!(
        code(&line("acquired", r#","event_id":null,"event_id":"e""#)),
        "duplicate_field:event_id"
    );
    // A duplicate outranks a type error elsewhere.
    assert_eq!(
        code(&line("acquired", r#","mono_ms":"x","ts":0"#)),
        "duplicate_field:ts"
    );
}

// ---------------------------------------------------------------------------
// Whole-message problems.

#[test]
fn invalid_utf8() {
    let mut bytes = EXAMPLES[0].as_bytes().to_vec();
    let at = EXAMPLES[0].find("worker-1").unwrap();
    bytes[at] = 0xff;
    assert_eq!(err(&bytes).reason, RejectReason::InvalidUtf8);
    assert_eq!(err(&[0xc3]).reason, RejectReason::InvalidUtf8);
    // UTF-8 is checked before JSON.
    assert_eq!(err(b"\xfe{").reason, RejectReason::InvalidUtf8);
    assert_eq!(err(&[0xc3]).reason.to_string(), "invalid_utf8");
}

#[test]
fn invalid_json() {
    for bad in [
        "",
        " ",
        "{",
        "{\"ts\":",
        "{\"ts\":0,}",
        "{'ts':0}",
        "{ts:0}",
        "nul",
        "{\"ts\":0} x",
        "{\"ts\":0}{\"ts\":0}",
        "{\"x\":01}",
        "{\"x\":\"\u{1}\"}",
    ] {
        assert_eq!(
            err(bad.as_bytes()).reason,
            RejectReason::InvalidJson,
            "{bad:?}"
        );
    }
    // Trailing garbage after a complete, valid event.
    assert_eq!(code(&format!("{} garbage", EXAMPLES[0])), "invalid_json");
    assert_eq!(code(&format!("{},", EXAMPLES[0])), "invalid_json");
}

#[test]
fn syntax_outranks_meaning() {
    // A wrong-typed field followed by broken JSON is invalid JSON, not a type error.
    assert_eq!(
        code(r#"{"ts":0,"kind":"acquired","fencing_token":"33","lease_id":"#),
        "invalid_json"
    );
    assert_eq!(
        code(r#"{"fencing_token":-1,"ttl_ms":0,"kind":"nope","ts":1.5 , ]"#),
        "invalid_json"
    );
    // ... and a duplicate followed by broken JSON too.
    assert_eq!(code(r#"{"ts":0,"ts":0,"#), "invalid_json");
    // Broken JSON inside attrs or an unknown field.
    assert_eq!(
        code(&line("acquired", r#","attrs":{"a":}"#)),
        "invalid_json"
    );
    assert_eq!(
        code(&line("acquired", r#","extra":[1,,2]"#)),
        "invalid_json"
    );
}

#[test]
fn not_an_object() {
    for bad in [
        "[]",
        "[1,2,{\"ts\":0}]",
        "null",
        "true",
        "42",
        "-1.5",
        "\"event\"",
    ] {
        assert_eq!(code(bad), "not_an_object", "{bad}");
    }
    // An array holding a valid event is still not an event.
    assert_eq!(code(&format!("[{}]", EXAMPLES[0])), "not_an_object");
}

#[test]
fn empty_object_misses_ts_first() {
    assert_eq!(code("{}"), "missing_field:ts");
}

#[test]
fn deep_nesting_is_judged_not_a_crash() {
    // Deeply nested but well-formed JSON is valid JSON: judged by its shape.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(code(&deep(100_000)), "not_an_object");
    assert_eq!(
        code(&line(
            "acquired",
            &format!(r#","mono_ms":{}"#, deep(100_000))
        )),
        "wrong_type:mono_ms"
    );
    assert_eq!(
        code(&line(
            "acquired",
            &format!(r#","attrs":{{"a":{}}}"#, deep(100_000))
        )),
        "wrong_type:attrs"
    );
    // In an unknown field it is kept as its JSON text.
    let e = ok(&line("acquired", &format!(r#","x":{}"#, deep(10_000))));
    assert_eq!(attr(&e, "x"), Some(deep(10_000).as_str()));
    // Unclosed, it is invalid JSON.
    assert_eq!(code(&"[".repeat(100_000)), "invalid_json");
    assert_eq!(code(&"{\"a\":".repeat(100_000)), "invalid_json");
}

#[test]
fn numbers_beyond_f64() {
    // serde_json refuses a number beyond f64 in a field it parses ...
    assert_eq!(
        code(&line("renewed", r#","latency_ms":1e400"#)),
        "invalid_json"
    );
    // ... but an unknown field keeps its text without parsing it.
    let e = ok(&line("renewed", r#","x":1e400"#));
    assert_eq!(attr(&e, "x"), Some("1e400"));
}

// ---------------------------------------------------------------------------
// Unknown fields and attrs.

#[test]
fn unknown_string_fields_land_in_attrs() {
    let e = ok(&line("acquired", r#","region":"eu-west-1","pod":"api-7""#));
    assert_eq!(attr(&e, "region"), Some("eu-west-1"));
    assert_eq!(attr(&e, "pod"), Some("api-7"));
    assert_eq!(e.attrs.len(), 2);
    // Unescaped like any string.
    let e = ok(&line("acquired", r#","note":"a\"b\u00e9""#));
    assert_eq!(attr(&e, "note"), Some("a\"b\u{e9}"));
}

#[test]
fn unknown_non_string_fields_kept_as_json_text() {
    let e = ok(&line(
        "acquired",
        r#","retries":3,"ok":true,"ratio":0.5,"tags":["a","b"],"meta":{"k":1}"#,
    ));
    assert_eq!(attr(&e, "retries"), Some("3"));
    assert_eq!(attr(&e, "ok"), Some("true"));
    assert_eq!(attr(&e, "ratio"), Some("0.5"));
    assert_eq!(attr(&e, "tags"), Some(r#"["a","b"]"#));
    assert_eq!(attr(&e, "meta"), Some(r#"{"k":1}"#));
    let keys: Vec<&str> = e.attrs.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(keys, ["meta", "ok", "ratio", "retries", "tags"]);
}

#[test]
fn explicit_attrs_win_on_key_collision() {
    let e = ok(&line(
        "acquired",
        r#","region":"top-level","attrs":{"region":"explicit","pod":"p"},"zone":"z""#,
    ));
    assert_eq!(attr(&e, "region"), Some("explicit"));
    assert_eq!(attr(&e, "pod"), Some("p"));
    assert_eq!(attr(&e, "zone"), Some("z"));
    assert_eq!(e.attrs.len(), 3);
    // Whichever comes first in the object.
    let e = ok(&line(
        "acquired",
        r#","attrs":{"region":"explicit"},"region":"top-level""#,
    ));
    assert_eq!(attr(&e, "region"), Some("explicit"));
    assert_eq!(e.attrs.len(), 1);
}

#[test]
fn repeated_attrs_keys_last_one_wins() {
    let e = ok(&line("acquired", r#","attrs":{"k":"1","k":"2"}"#));
    assert_eq!(e.attrs, vec![(Cow::from("k"), Cow::from("2"))]);
}

#[test]
fn repeated_unknown_fields_last_one_wins() {
    let e = ok(&line("acquired", r#","k":"1","k":"2""#));
    assert_eq!(e.attrs, vec![(Cow::from("k"), Cow::from("2"))]);
}

#[test]
fn attrs_with_a_non_string_value_is_wrong_type() {
    for bad in [
        r#"{"a":1}"#,
        r#"{"a":"x","b":true}"#,
        r#"{"a":null}"#,
        r#"{"a":{"b":"c"}}"#,
        r#"{"a":["b"]}"#,
    ] {
        assert_eq!(
            code(&line("acquired", &format!(r#","attrs":{bad}"#))),
            "wrong_type:attrs",
            "{bad}"
        );
    }
}

#[test]
fn attrs_that_is_not_an_object_is_wrong_type() {
    for bad in [r#""a=b""#, "1", "-1", "1.5", "true", r#"["a"]"#] {
        assert_eq!(
            code(&line("acquired", &format!(r#","attrs":{bad}"#))),
            "wrong_type:attrs",
            "{bad}"
        );
    }
}

#[test]
fn empty_attrs_is_no_attrs() {
    let e = ok(&line("acquired", r#","attrs":{}"#));
    assert!(e.attrs.is_empty());
    assert_eq!(e.attrs_json(), None);
}

// ---------------------------------------------------------------------------
// Reasons: every variant is reachable, and the codes are stable.

#[test]
fn every_reject_reason_variant_is_produced() {
    let cases: Vec<(String, RejectReason)> = vec![
        ("\u{0}".into(), RejectReason::InvalidJson),
        ("[]".into(), RejectReason::NotAnObject),
        (
            without("acquired", "lease_id"),
            RejectReason::MissingField(Field::LeaseId),
        ),
        (
            with("acquired", "fencing_token", r#""33""#),
            RejectReason::WrongType(Field::FencingToken),
        ),
        (
            with("acquired", "fencing_token", "-1"),
            RejectReason::OutOfRange(Field::FencingToken),
        ),
        (
            line("acquired", r#","trace_id":"ABC""#),
            RejectReason::BadFormat(Field::TraceId),
        ),
        (
            line("acquired", r#","ts":0"#),
            RejectReason::DuplicateField(Field::Ts),
        ),
        (
            with("acquired", "kind", r#""x""#),
            RejectReason::UnknownKind,
        ),
        (
            with("acquired", "source", r#""x""#),
            RejectReason::UnknownSource,
        ),
        (with("acquired", "ts", r#""x""#), RejectReason::BadTimestamp),
    ];
    for (input, want) in &cases {
        assert_eq!(err(input.as_bytes()).reason, *want, "{input}");
    }
    assert_eq!(err(b"\xff").reason, RejectReason::InvalidUtf8);
    // Exhaustive: adding a variant breaks this match until a case is added above.
    for (_, r) in &cases {
        match r {
            RejectReason::InvalidUtf8
            | RejectReason::InvalidJson
            | RejectReason::NotAnObject
            | RejectReason::MissingField(_)
            | RejectReason::WrongType(_)
            | RejectReason::OutOfRange(_)
            | RejectReason::BadFormat(_)
            | RejectReason::DuplicateField(_)
            | RejectReason::UnknownKind
            | RejectReason::UnknownSource
            | RejectReason::BadTimestamp => {}
            // Never the decoder's: a body read as OTLP that is not OTLP
            // (leaseline-ingest's otlp tests).
            RejectReason::InvalidOtlp => unreachable!(),
        }
    }
}

#[test]
fn reason_codes_are_stable() {
    let codes = [
        (RejectReason::InvalidUtf8, "invalid_utf8"),
        (RejectReason::InvalidJson, "invalid_json"),
        (RejectReason::NotAnObject, "not_an_object"),
        (
            RejectReason::MissingField(Field::LeaseId),
            "missing_field:lease_id",
        ),
        (
            RejectReason::WrongType(Field::FencingToken),
            "wrong_type:fencing_token",
        ),
        (
            RejectReason::OutOfRange(Field::FencingToken),
            "out_of_range:fencing_token",
        ),
        (
            RejectReason::BadFormat(Field::TraceId),
            "bad_format:trace_id",
        ),
        (
            RejectReason::DuplicateField(Field::Ts),
            "duplicate_field:ts",
        ),
        (RejectReason::UnknownKind, "unknown_kind"),
        (RejectReason::UnknownSource, "unknown_source"),
        (RejectReason::BadTimestamp, "bad_timestamp"),
        (RejectReason::InvalidOtlp, "invalid_otlp"),
        (RejectReason::WrongType(Field::Attrs), "wrong_type:attrs"),
        (
            RejectReason::MissingField(Field::KeepaliveSentMonoMs),
            "missing_field:keepalive_sent_mono_ms",
        ),
    ];
    for (r, s) in codes {
        assert_eq!(r.to_string(), s);
    }
}

#[test]
fn errors_carry_a_human_message() {
    let e = err(with("acquired", "fencing_token", r#""33""#).as_bytes());
    assert!(e.message.contains("fencing_token"), "{}", e.message);
    assert!(
        e.to_string().starts_with("wrong_type:fencing_token: "),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// Arrow.

#[test]
fn event_batch_builder_rows_and_values() {
    let mut b = EventBatchBuilder::new();
    assert!(b.is_empty());
    let kafka = Origin::Kafka {
        topic: "lease-events",
        partition: 3,
        offset: 42,
    };
    let file = Origin::File {
        path: "samples/a.ndjson",
        line: 7,
    };
    for (i, l) in EXAMPLES.iter().enumerate() {
        let e = decode(l.as_bytes()).unwrap();
        let origin = if i % 2 == 0 { kafka } else { file };
        b.append(&e, &origin, 1_000 + i as i64);
    }
    let with_attrs = line(
        "renew_failed",
        r#","reason":"timeout","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","deadline_mono_ms":7.5,"attrs":{"pod":"p"},"retries":2"#,
    );
    b.append(&decode(with_attrs.as_bytes()).unwrap(), &file, 2_000);
    assert_eq!(b.len(), 7);

    let batch = b.finish();
    assert!(b.is_empty(), "finish leaves the builder empty");
    assert_eq!(batch.schema(), *EVENTS_SCHEMA);
    assert_eq!(batch.num_rows(), 7);

    let col = |name: &str| batch.column_by_name(name).unwrap().clone();
    let ts = col("ts");
    let ts = ts.as_primitive::<TimestampMicrosecondType>();
    assert_eq!(ts.value(0), T0_US);
    assert_eq!(ts.value(5), T0_US + 18_000_000);
    assert_eq!(ts.timezone(), Some("UTC"));

    let kind = col("kind");
    let kind = kind.as_string::<i32>();
    let kinds: Vec<&str> = kind.iter().map(|k| k.unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "acquired",
            "renewed",
            "expired",
            "acquired",
            "write_accepted",
            "stale_write_rejected",
            "renew_failed"
        ]
    );
    let source = col("source");
    assert_eq!(source.as_string::<i32>().value(4), "resource");
    assert_eq!(
        col("lease_id").as_string::<i32>().value(0),
        "orders/order-123"
    );
    assert_eq!(col("holder_id").as_string::<i32>().value(3), "worker-2");

    let token = col("fencing_token");
    let token = token.as_primitive::<UInt64Type>();
    assert_eq!(token.value(0), 33);
    assert_eq!(token.value(3), 34);
    assert_eq!(token.null_count(), 0);

    let ttl = col("ttl_ms");
    let ttl = ttl.as_primitive::<Int64Type>();
    assert_eq!(ttl.value(0), 10_000);
    assert!(ttl.is_null(2), "expired has no ttl_ms");

    let event_id = col("event_id");
    let event_id = event_id.as_string::<i32>();
    assert_eq!(event_id.value(0), "c-0001");
    assert!(event_id.is_null(1));
    assert_eq!(col("backend").as_string::<i32>().value(0), "etcd");

    let latency = col("latency_ms");
    let latency = latency.as_primitive::<Float64Type>();
    assert!(latency.is_null(0));
    assert_eq!(latency.value(1), 4.2);
    assert_eq!(
        col("mono_ms").as_primitive::<Float64Type>().value(1),
        3300.0
    );
    assert_eq!(
        col("keepalive_sent_mono_ms")
            .as_primitive::<Float64Type>()
            .value(1),
        3295.8
    );
    assert_eq!(
        col("deadline_mono_ms")
            .as_primitive::<Float64Type>()
            .value(6),
        7.5
    );

    let max_token = col("max_token");
    let max_token = max_token.as_primitive::<UInt64Type>();
    assert_eq!(max_token.null_count(), 6);
    assert_eq!(max_token.value(5), 34);

    assert_eq!(col("reason").as_string::<i32>().value(6), "timeout");
    assert_eq!(
        col("trace_id").as_string::<i32>().value(6),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(
        col("span_id").as_string::<i32>().value(6),
        "00f067aa0ba902b7"
    );

    let attrs = col("attrs");
    let attrs = attrs.as_string::<i32>();
    assert_eq!(attrs.null_count(), 6);
    assert_eq!(attrs.value(6), r#"{"pod":"p","retries":"2"}"#);

    // Origin columns.
    let topic = col("kafka_topic");
    let topic = topic.as_string::<i32>();
    assert_eq!(topic.value(0), "lease-events");
    assert!(topic.is_null(1));
    assert_eq!(
        col("kafka_partition").as_primitive::<Int32Type>().value(2),
        3
    );
    assert_eq!(col("kafka_offset").as_primitive::<Int64Type>().value(4), 42);
    let path = col("file_path");
    let path = path.as_string::<i32>();
    assert!(path.is_null(0));
    assert_eq!(path.value(1), "samples/a.ndjson");
    assert_eq!(col("file_line").as_primitive::<Int64Type>().value(1), 7);
    assert!(col("kafka_partition").is_null(1));
    let ingested = col("ingested_at");
    let ingested = ingested.as_primitive::<TimestampMicrosecondType>();
    assert_eq!(ingested.value(3), 1_003);
    assert_eq!(ingested.value(6), 2_000);
    assert_eq!(ingested.timezone(), Some("UTC"));

    // The builder is reusable after finish.
    b.append(&decode(EXAMPLES[2].as_bytes()).unwrap(), &kafka, 0);
    let again = b.finish();
    assert_eq!(again.num_rows(), 1);
    assert_eq!(
        again
            .column_by_name("kind")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "expired"
    );
    assert_eq!(b.finish().num_rows(), 0);
}

#[test]
fn reject_batch_builder_rows_and_values() {
    let inputs: [&[u8]; 4] = [
        b"\xff\xfe",
        b"{\"ts\":",
        b"[1]",
        br#"{"ts":0,"kind":"acquired","source":"holder","lease_id":"","holder_id":"h","fencing_token":1,"ttl_ms":1}"#,
    ];
    let origin = Origin::File {
        path: "bad.ndjson",
        line: 1,
    };
    let mut b = RejectBatchBuilder::new();
    assert!(b.is_empty());
    for (i, raw) in inputs.iter().enumerate() {
        let e = decode(raw).unwrap_err();
        let origin = if i == 3 {
            Origin::Kafka {
                topic: "t",
                partition: 0,
                offset: 9,
            }
        } else {
            origin
        };
        b.append(raw, &e, &origin, 5);
    }
    assert_eq!(b.len(), 4);
    let batch = b.finish();
    assert!(b.is_empty());
    assert_eq!(batch.schema(), *REJECTS_SCHEMA);
    assert_eq!(batch.num_rows(), 4);

    let raw = batch
        .column_by_name("raw")
        .unwrap()
        .as_binary::<i32>()
        .clone();
    for (i, input) in inputs.iter().enumerate() {
        assert_eq!(raw.value(i), *input, "kept byte for byte");
    }
    let reason = batch
        .column_by_name("reason")
        .unwrap()
        .as_string::<i32>()
        .clone();
    let reasons: Vec<&str> = reason.iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        reasons,
        [
            "invalid_utf8",
            "invalid_json",
            "not_an_object",
            "out_of_range:lease_id"
        ]
    );
    let message = batch
        .column_by_name("message")
        .unwrap()
        .as_string::<i32>()
        .clone();
    assert!(message.value(3).contains("lease_id"));
    assert_eq!(message.null_count(), 0);
    let path = batch
        .column_by_name("file_path")
        .unwrap()
        .as_string::<i32>()
        .clone();
    assert_eq!(path.value(0), "bad.ndjson");
    assert!(path.is_null(3));
    assert_eq!(
        batch
            .column_by_name("kafka_offset")
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(3),
        9
    );
    assert_eq!(b.finish().num_rows(), 0);
}

#[test]
fn attrs_json_escapes_and_matches_a_json_map() {
    let mut e = ok(&line(
        "acquired",
        r#","attrs":{"q\"k":"line\nbreak","é":"\u0001","a":"x/\u007f"},"z\\":"tab\t""#,
    ));
    let want = |attrs: &[(Cow<'_, str>, Cow<'_, str>)]| {
        let map: serde_json::Map<String, serde_json::Value> = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        serde_json::Value::Object(map).to_string()
    };
    assert_eq!(e.attrs_json().unwrap(), want(&e.attrs));
    // A hand-made event with unsorted, repeated keys: sorted, last one wins.
    e.attrs = vec![
        ("b".into(), "1".into()),
        ("a".into(), "2".into()),
        ("b".into(), "3".into()),
    ];
    assert_eq!(e.attrs_json().as_deref(), Some(r#"{"a":"2","b":"3"}"#));
}
