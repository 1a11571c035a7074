//! The decoder's fast path (a scanner for plain flat objects) against the
//! serde walk it shortcuts: on every input the fast path accepts, both give
//! the same event or the same refusal, and `decode` gives the serde walk's
//! answer on every input. The inputs are realistic events plus every
//! single-byte deletion, replacement and insertion of them, which covers
//! each boundary the scanner decides on (escapes, control characters,
//! number shapes, literals, nesting, truncation, trailing bytes).

mod support;

use leaseline_schema::{decode_str_by_serde, decode_str_fast_only};
use support::roundtrip::check_fast_path;

/// Events in the shapes producers send, with the edges of the fast path's
/// subset: numbers at its digit limits, unknown fields of every type,
/// attrs, repeated keys, whitespace.
const SEEDS: &[&str] = &[
    r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-100123","holder_id":"worker-3-5f0c1a","fencing_token":1234567,"ttl_ms":10000,"backend":"etcd","event_id":"9f3ab2c1-17","latency_ms":12.5,"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331"}"#,
    r#"{"ts":"2026-09-14T10:00:01.250Z","kind":"renewed","source":"holder","lease_id":"l","holder_id":"h","fencing_token":9223372036854775807,"ttl_ms":1,"mono_ms":1000007.25,"keepalive_sent_mono_ms":0.5,"latency_ms":0}"#,
    r#"{"ts":"2026-09-14T10:00:01.250+02:00","kind":"renewed","source":"holder","lease_id":"l","holder_id":"h","fencing_token":7,"ttl_ms":1}"#,
    r#"{"ts":1789380000123,"kind":"write_accepted","source":"resource","lease_id":"orders/7","fencing_token":0,"attrs":{"table":"orders","region":"eu-west-1"},"pod":"api-7","retries":3,"ok":true,"gone":null,"ratio":0.25}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"stale_write_rejected","source":"resource","lease_id":"x","holder_id":"h","fencing_token":7,"max_token":9,"reason":"stale"}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"renew_failed","source":"holder","lease_id":"x","holder_id":"h","reason":"timeout","latency_ms":123456789012.345,"deadline_mono_ms":99999999999999.9}"#,
    r#" { "ts" : "2026-09-14T10:00:00Z" , "kind" : "released" , "source" : "holder" , "lease_id" : "x" , "holder_id" : "h" , "fencing_token" : 3 , "attrs" : { } } "#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"expired","source":"coordinator","lease_id":"x","holder_id":"h","fencing_token":3,"fencing_token":4,"attrs":null,"x":"1","x":"2"}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"fenced","source":"holder","lease_id":"ü/ключ/鍵","holder_id":"h","fencing_token":3,"note":"naïve"}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"revoked","source":"coordinator","lease_id":"x","holder_id":"h","fencing_token":1234567890123456789,"ttl_ms":9223372036854775807,"latency_ms":1.23456789012345}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"revoked","source":"coordinator","lease_id":"x","holder_id":"h","fencing_token":1,"ttl_ms":9999999999999999999}"#,
    r#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"x","holder_id":"h","fencing_token":5,"ttl_ms":10,"extra":{"nested":[1,2]},"list":[]}"#,
    r#"{}"#,
];

/// Bytes that sit on the scanner's decisions.
const PROBES: &[u8] = b"\"\\{}[]:, \t\n\r0159-+.eEntfu\x01\x1f\x7fa";

fn mutations(seed: &str) -> Vec<Vec<u8>> {
    let b = seed.as_bytes();
    let mut out = Vec::new();
    for i in 0..=b.len() {
        for &p in PROBES {
            let mut ins = b.to_vec();
            ins.insert(i, p);
            out.push(ins);
            if i < b.len() {
                let mut rep = b.to_vec();
                rep[i] = p;
                out.push(rep);
            }
        }
        if i < b.len() {
            let mut del = b.to_vec();
            del.remove(i);
            out.push(del);
            // Every prefix: truncated messages.
            out.push(b[..i].to_vec());
        }
    }
    out
}

/// Seeds the fast path leaves to the serde walk, by a mark in their text:
/// outside its subset, or refused by a field's own check (which the serde
/// walk words).
const DECLINED: &[(&str, &str)] = &[
    ("nested", "an object in an unknown field"),
    ("+02:00", "a timestamp with an offset"),
    (r#""fencing_token":4"#, "a contract field given twice"),
    ("9999999999999999999", "ttl_ms past i64"),
];

#[test]
fn the_fast_path_takes_the_plain_seeds() {
    // Otherwise the comparisons below would hold trivially.
    for seed in SEEDS {
        let plain = !DECLINED.iter().any(|(mark, _)| seed.contains(mark));
        assert_eq!(
            decode_str_fast_only(seed).is_some(),
            plain,
            "fast path on {seed}"
        );
    }
}

#[test]
fn fast_path_and_serde_walk_agree_on_every_mutation() {
    let mut taken = 0usize;
    let mut total = 0usize;
    for seed in SEEDS {
        for m in mutations(seed) {
            check_fast_path(&m);
            total += 1;
            if let Ok(text) = std::str::from_utf8(&m) {
                taken += usize::from(decode_str_fast_only(text).is_some());
            }
        }
    }
    // Most single-byte changes inside string values stay in the subset, so
    // a good share of the comparisons really went through both paths.
    assert!(taken * 4 > total, "fast path took {taken} of {total}");
}

#[test]
fn numbers_at_the_fast_paths_limits_match_the_serde_walk() {
    let numbers = [
        "0",
        "7",
        "10",
        "1234567890123456789",  // 19 digits: fast
        "12345678901234567890", // 20 digits: serde
        "18446744073709551615",
        "18446744073709551616",
        "0.1",
        "0.30000000000000004",
        "123456789012345", // 15 digits in all
        "12345678901234.5",
        "1234567890123.45",
        "123456789012345.6", // 16 digits: serde
        "9007199254740993.0",
        "1.000000000000001",
        "2.5e3",
        "2E-3",
        "-0",
        "-1",
        "-0.0",
        "00",
        "01",
        "1.",
        ".5",
        "1.5.",
        "0.000000000000001",
        // Found by the fuzzer: 19 integer digits, then a fraction, overflowed.
        "1234567890123456789.5",
        "5555555555555555555.55555555555555555555",
        "99999999999999999999.9",
    ];
    for n in numbers {
        for field in [
            "fencing_token",
            "latency_ms",
            "mono_ms",
            "ttl_ms",
            "unknown",
        ] {
            let line = format!(
                r#"{{"ts":"2026-09-14T10:00:00Z","kind":"write_accepted","source":"resource","lease_id":"x","fencing_token":1,"{field}":{n}}}"#
            )
            .replacen(r#""fencing_token":1,"fencing_token""#, r#""fencing_token""#, 1);
            check_fast_path(line.as_bytes());
            let _ = decode_str_by_serde(&line);
        }
    }
}

/// Messages longer than the fast path's quote bitmap (the first 1,024
/// bytes): strings that end just before, on and just after its edge, and
/// escapes or control characters only past it, are read as the serde walk
/// reads them.
#[test]
fn messages_past_the_quote_bitmap_match_the_serde_walk() {
    let head = r#"{"ts":"2026-09-14T10:00:00Z","kind":"renewed","source":"holder","lease_id":"x","holder_id":"h","fencing_token":3,"pad":""#;
    let mut taken = 0;
    for pad in 1024 - head.len() - 40..1024 - head.len() + 40 {
        let filler = "p".repeat(pad);
        for tail in [
            r#"","note":"after the edge"}"#,
            r#"","note":"esc\"aped"}"#,
            r#"","note":"esc\u0041ped"}"#,
            "\",\"note\":\"ctl\u{1}\"}",
            r#"","lease_id":"again"}"#,
        ] {
            let text = format!("{head}{filler}{tail}");
            check_fast_path(text.as_bytes());
            taken += usize::from(decode_str_fast_only(&text).is_some());
        }
        // An id over 1,024 bytes, refused the same way by both.
        let long_id = format!(
            r#"{{"ts":1,"kind":"renewed","source":"holder","lease_id":"{filler}{filler}","holder_id":"h","fencing_token":3}}"#
        );
        check_fast_path(long_id.as_bytes());
    }
    // The plain tails went through the fast path, not around it.
    assert!(taken >= 80, "fast path took {taken}");
}
