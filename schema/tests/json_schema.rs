//! `docs/lease-event.schema.json` against the decoder: on a table of events
//! (every example line of `docs/event-contract.md`, every line of
//! `samples/lease-events.ndjson`, and valid and invalid events at each
//! rule's edges) a JSON Schema validator accepts exactly what
//! `leaseline_schema::decode` accepts, except for the few differences the
//! contract lists, each pinned here with the decoder's answer.
//!
//! The validator is the `jsonschema` package for Python, run once for the
//! whole table. Without `python3` or `jsonschema` the test fails and says
//! how to install them (`scripts/test.sh` does).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use leaseline_schema::decode;

const CONTRACT: &str = include_str!("../../docs/event-contract.md");
const SAMPLES: &str = include_str!("../../samples/lease-events.ndjson");

/// Reads the JSON lines from stdin, validates each against the schema given
/// as argv[1], prints one `[valid, first error]` pair per line as JSON.
const VALIDATOR: &str = r#"
import json, sys
try:
    import jsonschema
except ImportError:
    print("the Python package jsonschema is missing: python3 -m pip install jsonschema", file=sys.stderr)
    sys.exit(3)
schema = json.load(open(sys.argv[1], encoding="utf-8"))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
out = []
for line in json.load(sys.stdin):
    errors = sorted(validator.iter_errors(json.loads(line)), key=lambda e: list(e.path))
    out.append([not errors, errors[0].message if errors else ""])
json.dump(out, sys.stdout)
"#;

/// A valid event to vary: every field a kind can carry.
const BASE: &str = r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"orders/order-123","holder_id":"worker-1","fencing_token":33,"ttl_ms":10000,"event_id":"e-1","backend":"etcd","latency_ms":4.2,"reason":"r","max_token":34,"mono_ms":1.5,"keepalive_sent_mono_ms":1.0,"deadline_mono_ms":2.0,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","attrs":{"region":"eu"}}"#;

/// `BASE` with `field` set to the JSON text `value`, or removed when
/// `value` is `None`.
fn with(field: &str, value: Option<&str>) -> String {
    let mut obj: serde_json::Map<String, serde_json::Value> = serde_json::from_str(BASE).unwrap();
    match value {
        Some(v) => obj.insert(field.into(), serde_json::from_str(v).unwrap()),
        None => obj.remove(field),
    };
    serde_json::to_string(&obj).unwrap()
}

/// `BASE` with `field`'s value replaced by raw JSON text, for spellings
/// that a round trip through `serde_json::Value` would not keep (`33.0`,
/// `1e19`, `-0`).
fn with_raw(field: &str, text: &str) -> String {
    let base: serde_json::Map<String, serde_json::Value> = serde_json::from_str(BASE).unwrap();
    let old = serde_json::to_string(&base[field]).unwrap();
    let needle = format!("\"{field}\":{old}");
    assert!(BASE.contains(&needle), "{needle}");
    BASE.replacen(&needle, &format!("\"{field}\":{text}"), 1)
}

/// A minimal event of `kind`: the four fields every event needs, plus
/// `extra` (a JSON object's inner text, with a leading comma).
fn minimal(kind: &str, extra: &str) -> String {
    format!(r#"{{"ts":1789380000000,"kind":"{kind}","source":"holder","lease_id":"L"{extra}}}"#)
}

/// The decoder's verdict: `None` for a valid event, else the reason code.
fn verdict(line: &str) -> Option<String> {
    decode(line.as_bytes()).err().map(|e| e.reason.to_string())
}

/// Events at each rule's edges, with the decoder's exact verdict.
fn edge_cases() -> Vec<(String, Option<&'static str>)> {
    let s = |x: &str| x.to_string();
    let ascii = |n: usize| serde_json::to_string(&"a".repeat(n)).unwrap();
    let accented = |n: usize| serde_json::to_string(&"é".repeat(n)).unwrap();
    let ts = |t: &str| with("ts", Some(t));
    vec![
        (s(BASE), None),
        // Required everywhere.
        (with("ts", None), Some("missing_field:ts")),
        (with("kind", None), Some("missing_field:kind")),
        (with("source", None), Some("missing_field:source")),
        (with("lease_id", None), Some("missing_field:lease_id")),
        (
            with("lease_id", Some("null")),
            Some("missing_field:lease_id"),
        ),
        (s("{}"), Some("missing_field:ts")),
        (s("[]"), Some("not_an_object")),
        (s(r#""acquired""#), Some("not_an_object")),
        // Kinds and sources.
        (with("kind", Some(r#""teleported""#)), Some("unknown_kind")),
        (with("kind", Some(r#""Acquired""#)), Some("unknown_kind")),
        (with("kind", Some("5")), Some("wrong_type:kind")),
        (with("source", Some(r#""client""#)), Some("unknown_source")),
        // Per-kind requirements.
        (with("ttl_ms", None), Some("missing_field:ttl_ms")),
        (with("ttl_ms", Some("null")), Some("missing_field:ttl_ms")),
        (
            with("fencing_token", None),
            Some("missing_field:fencing_token"),
        ),
        (
            with("fencing_token", Some("null")),
            Some("missing_field:fencing_token"),
        ),
        (with("holder_id", None), Some("missing_field:holder_id")),
        (minimal("acquire_requested", r#","holder_id":"h""#), None),
        (
            minimal("acquire_requested", ""),
            Some("missing_field:holder_id"),
        ),
        (
            minimal(
                "acquire_failed",
                r#","holder_id":"h","reason":"contention""#,
            ),
            None,
        ),
        (
            minimal("renew_failed", r#","holder_id":"h","fencing_token":null"#),
            None,
        ),
        (
            minimal(
                "drain_started",
                r#","holder_id":"h","deadline_mono_ms":9.5"#,
            ),
            None,
        ),
        (
            minimal("renewed", r#","holder_id":"h","fencing_token":1"#),
            None,
        ),
        (
            minimal("renewed", r#","holder_id":"h""#),
            Some("missing_field:fencing_token"),
        ),
        (
            minimal("fenced", r#","holder_id":"h""#),
            Some("missing_field:fencing_token"),
        ),
        (
            minimal("released", r#","holder_id":"h","fencing_token":1"#),
            None,
        ),
        (
            minimal("expired", r#","holder_id":"h""#),
            Some("missing_field:fencing_token"),
        ),
        (
            minimal("revoked", r#","fencing_token":1"#),
            Some("missing_field:holder_id"),
        ),
        (minimal("write_accepted", r#","fencing_token":1"#), None),
        (
            minimal("write_accepted", r#","fencing_token":1,"holder_id":null"#),
            None,
        ),
        (
            minimal("write_accepted", ""),
            Some("missing_field:fencing_token"),
        ),
        (
            minimal(
                "stale_write_rejected",
                r#","fencing_token":1,"max_token":2"#,
            ),
            None,
        ),
        // Tokens: unsigned 64-bit integers.
        (with("fencing_token", Some("0")), None),
        (with("fencing_token", Some("18446744073709551615")), None),
        (
            with_raw("fencing_token", "18446744073709551616"),
            Some("out_of_range:fencing_token"),
        ),
        (
            with("fencing_token", Some("-1")),
            Some("out_of_range:fencing_token"),
        ),
        (
            with("fencing_token", Some("33.5")),
            Some("wrong_type:fencing_token"),
        ),
        (
            with("fencing_token", Some(r#""33""#)),
            Some("wrong_type:fencing_token"),
        ),
        (
            with("max_token", Some("-5")),
            Some("out_of_range:max_token"),
        ),
        (
            with_raw("max_token", "18446744073709551616"),
            Some("out_of_range:max_token"),
        ),
        // TTL: positive, within i64.
        (with("ttl_ms", Some("1")), None),
        (with("ttl_ms", Some("0")), Some("out_of_range:ttl_ms")),
        (with("ttl_ms", Some("-1")), Some("out_of_range:ttl_ms")),
        (with("ttl_ms", Some("3155760000000")), None),
        (
            with("ttl_ms", Some("3155760000001")),
            Some("out_of_range:ttl_ms"),
        ),
        (
            with("ttl_ms", Some("9223372036854775807")),
            Some("out_of_range:ttl_ms"),
        ),
        (with("latency_ms", Some("3155760000000")), None),
        (
            with("latency_ms", Some("3155760000000.5")),
            Some("out_of_range:latency_ms"),
        ),
        (with("mono_ms", Some("1e300")), Some("out_of_range:mono_ms")),
        (
            with("ttl_ms", Some("9223372036854775808")),
            Some("out_of_range:ttl_ms"),
        ),
        // Ids: 1 to 1,024 bytes.
        (
            with("lease_id", Some(r#""""#)),
            Some("out_of_range:lease_id"),
        ),
        (
            with("holder_id", Some(r#""""#)),
            Some("out_of_range:holder_id"),
        ),
        (with("lease_id", Some(&ascii(1024))), None),
        (
            with("lease_id", Some(&ascii(1025))),
            Some("out_of_range:lease_id"),
        ),
        (
            with("holder_id", Some(&ascii(1025))),
            Some("out_of_range:holder_id"),
        ),
        (with("lease_id", Some(&accented(512))), None),
        (
            with("lease_id", Some(&accented(1025))),
            Some("out_of_range:lease_id"),
        ),
        (with("lease_id", Some("7")), Some("wrong_type:lease_id")),
        // Plain strings.
        (with("event_id", Some(r#""""#)), None),
        (with("event_id", Some("1")), Some("wrong_type:event_id")),
        (with("backend", Some(r#""my-own-lock""#)), None),
        (with("reason", Some("true")), Some("wrong_type:reason")),
        // Non-negative numbers, any spelling.
        (with("latency_ms", Some("0")), None),
        (with_raw("latency_ms", "1.5e2"), None),
        (
            with("latency_ms", Some("-0.1")),
            Some("out_of_range:latency_ms"),
        ),
        (with("mono_ms", Some("-1")), Some("out_of_range:mono_ms")),
        (
            with("keepalive_sent_mono_ms", Some(r#""5""#)),
            Some("wrong_type:keepalive_sent_mono_ms"),
        ),
        (
            with("deadline_mono_ms", Some("-3")),
            Some("out_of_range:deadline_mono_ms"),
        ),
        // Trace context: lowercase hex of the exact length.
        (
            with("trace_id", Some(r#""4BF92F3577B34DA6A3CE929D0E0E4736""#)),
            Some("bad_format:trace_id"),
        ),
        (
            with("trace_id", Some(r#""4bf92f3577b34da6a3ce929d0e0e473""#)),
            Some("bad_format:trace_id"),
        ),
        (
            with("trace_id", Some(r#""4bf92f3577b34da6a3ce929d0e0e47366""#)),
            Some("bad_format:trace_id"),
        ),
        (
            with("trace_id", Some(r#""4bf92f3577b34da6a3ce929d0e0e473g""#)),
            Some("bad_format:trace_id"),
        ),
        (
            with("trace_id", Some("\"4bf92f3577b34da6a3ce929d0e0e4736\\n\"")),
            Some("bad_format:trace_id"),
        ),
        (
            with("span_id", Some(r#""00f067aa0ba902b""#)),
            Some("bad_format:span_id"),
        ),
        (
            with("span_id", Some("\"00f067aa0ba902b7\\n\"")),
            Some("bad_format:span_id"),
        ),
        (with("span_id", Some("16")), Some("wrong_type:span_id")),
        // attrs: an object of strings, or null.
        (with("attrs", Some("null")), None),
        (with("attrs", Some("{}")), None),
        (with("attrs", Some(r#"{"n":1}"#)), Some("wrong_type:attrs")),
        (with("attrs", Some(r#"["a"]"#)), Some("wrong_type:attrs")),
        (with("attrs", Some(r#""a=b""#)), Some("wrong_type:attrs")),
        // Unknown fields are kept, whatever their value.
        (with("zone", Some(r#""b""#)), None),
        (with("retries", Some("3")), None),
        (with("labels", Some(r#"{"a":[1,null]}"#)), None),
        (with("Lease_Id", Some("null")), None),
        // Timestamps as epoch milliseconds: integers in years 0001-9999.
        (ts("0"), None),
        (ts("-1"), None),
        (ts("-62135596800000"), None),
        (ts("-62135596800001"), Some("out_of_range:ts")),
        (ts("253402300799999"), None),
        (ts("253402300800000"), Some("out_of_range:ts")),
        (ts("-8334601228800001"), Some("bad_timestamp")),
        (ts("8210266876800000"), Some("bad_timestamp")),
        (ts("9223372036854775807"), Some("bad_timestamp")),
        (ts("1789380000000.5"), Some("bad_timestamp")),
        (ts("true"), Some("wrong_type:ts")),
        (ts("[1]"), Some("wrong_type:ts")),
        // Timestamps as RFC 3339 strings.
        (ts(r#""2026-09-14T10:00:00Z""#), None),
        (ts(r#""0001-01-01T00:00:00Z""#), None),
        (ts(r#""0000-06-01T00:00:00Z""#), Some("out_of_range:ts")),
        (ts(r#""2026-09-14T10:00:00.123456789123Z""#), None),
        (ts(r#""2026-09-14t10:00:00z""#), None),
        (ts(r#""2026-09-14 10:00:00+02:00""#), None),
        (ts(r#""2026-09-14T10:00:00-23:59""#), None),
        (ts("\"2026-09-14T10:00:00\u{2212}05:00\""), None),
        (ts(r#""2026-12-31T23:59:60Z""#), None),
        (ts(r#""2028-02-29T00:00:00Z""#), None),
        (ts(r#""2000-02-29T00:00:00Z""#), None),
        (ts(r#""0000-02-29T00:00:00Z""#), Some("out_of_range:ts")),
        (ts(r#""1900-02-29T00:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-02-29T00:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-04-31T00:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-13-01T00:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T24:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:60:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:61Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:00""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:00+02""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:00+24:00""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:00.Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14""#), Some("bad_timestamp")),
        (ts(r#"" 2026-09-14T10:00:00Z""#), Some("bad_timestamp")),
        (ts("\"2026-09-14T10:00:00Z\\n\""), Some("bad_timestamp")),
        (ts(r#""+2026-09-14T10:00:00Z""#), Some("bad_timestamp")),
        (ts(r#""2026-09-14T10:00:00Z[UTC]""#), Some("bad_timestamp")),
        (ts(r#""yesterday""#), Some("bad_timestamp")),
        (ts(r#""1789380000000""#), Some("bad_timestamp")),
    ]
}

/// Where the schema accepts and the decoder refuses, because JSON Schema
/// judges values, not their spelling or bytes (docs/event-contract.md, "The
/// JSON Schema"). Each with the decoder's exact refusal.
fn known_differences() -> Vec<(String, &'static str)> {
    let accented = serde_json::to_string(&"é".repeat(1024)).unwrap();
    vec![
        // 1,024 characters, 2,048 bytes.
        (with("lease_id", Some(&accented)), "out_of_range:lease_id"),
        (with("holder_id", Some(&accented)), "out_of_range:holder_id"),
        // Whole numbers not written as integer literals.
        (
            with_raw("fencing_token", "33.0"),
            "wrong_type:fencing_token",
        ),
        (
            with_raw("fencing_token", "3.3e1"),
            "wrong_type:fencing_token",
        ),
        (with_raw("fencing_token", "-0"), "wrong_type:fencing_token"),
        (
            with_raw("fencing_token", "1e19"),
            "out_of_range:fencing_token",
        ),
        (with_raw("ttl_ms", "10000.0"), "wrong_type:ttl_ms"),
        (with_raw("max_token", "34.0"), "wrong_type:max_token"),
        (with_raw("ts", "1789380000000.0"), "bad_timestamp"),
        // A contract field given twice.
        (
            BASE.replacen(
                r#""backend":"etcd""#,
                r#""backend":"etcd","backend":"redis""#,
                1,
            ),
            "duplicate_field:backend",
        ),
    ]
}

/// Below JSON, where no schema looks: the decoder's refusals the contract
/// lists under `invalid_json` and `invalid_utf8`.
#[test]
fn what_is_not_one_json_value_is_the_decoders_alone() {
    let bom = format!("\u{feff}{BASE}");
    let trailing = format!("{BASE} {{}}");
    let huge = with_raw("latency_ms", "1e400");
    let surrogate = with_raw("lease_id", r#""\ud800""#);
    for line in ["", "not json at all", &bom, &trailing, &huge, &surrogate] {
        assert_eq!(verdict(line).as_deref(), Some("invalid_json"), "{line}");
    }
    let err = decode(b"{\"ts\":\"\xff\"}").unwrap_err();
    assert_eq!(err.reason.to_string(), "invalid_utf8");
}

/// The lines of the ```json blocks of a Markdown document.
fn json_block_lines(doc: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_json = false;
    for line in doc.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            in_json = !in_json && info.trim() == "json";
        } else if in_json && !line.trim().is_empty() {
            lines.push(line.to_string());
        }
    }
    lines
}

/// The schema's verdict on each line, by one run of the validator.
fn schema_verdicts(lines: &[String]) -> Vec<(bool, String)> {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/lease-event.schema.json");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .arg("-c")
        .arg(VALIDATOR)
        .arg(&schema)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {python} ({e}): this test needs Python 3 with the jsonschema \
                 package (Debian: apt-get install python3 python3-pip; then \
                 python3 -m pip install jsonschema; scripts/test.sh installs both)"
            )
        });
    let input = serde_json::to_vec(lines).unwrap();
    // A validator that exits early (jsonschema missing) closes its stdin;
    // its exit status and stderr then say why, better than the broken pipe.
    let written = child.stdin.take().unwrap().write_all(&input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the JSON Schema validator failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    written.unwrap();
    let verdicts: Vec<(bool, String)> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdicts.len(), lines.len());
    verdicts
}

#[test]
fn the_json_schema_accepts_exactly_what_the_decoder_accepts() {
    let examples = json_block_lines(CONTRACT);
    assert_eq!(
        examples.len(),
        18,
        "the example lines of docs/event-contract.md"
    );
    for line in &examples {
        assert_eq!(verdict(line), None, "contract example refused: {line}");
    }

    let samples: Vec<String> = SAMPLES.lines().map(str::to_string).collect();
    let refused: Vec<_> = samples.iter().filter_map(|l| verdict(l)).collect();
    assert_eq!(samples.len(), 83);
    assert_eq!(
        refused,
        [
            "missing_field:fencing_token",
            "unknown_kind",
            "bad_timestamp",
            "invalid_json"
        ]
    );

    let edges = edge_cases();
    for (line, want) in &edges {
        assert_eq!(verdict(line).as_deref(), *want, "decoder on {line}");
    }
    let differences = known_differences();
    for (line, want) in &differences {
        assert_eq!(verdict(line).as_deref(), Some(*want), "decoder on {line}");
    }

    // Everything the validator can read: the schema judges parsed JSON, so
    // a line that is not JSON at all is the decoder's alone.
    let mut table: Vec<String> = examples;
    table.extend(
        samples
            .into_iter()
            .filter(|l| verdict(l).as_deref() != Some("invalid_json")),
    );
    table.extend(edges.into_iter().map(|(line, _)| line));
    let agreeing = table.len();
    table.extend(differences.iter().map(|(line, _)| line.clone()));
    let verdicts = schema_verdicts(&table);

    let mut disagreements = Vec::new();
    for (i, (line, (valid, error))) in table.iter().zip(&verdicts).enumerate() {
        let decoder = verdict(line);
        let expected_valid = if i < agreeing {
            decoder.is_none()
        } else {
            true
        };
        if *valid != expected_valid {
            disagreements.push(format!(
                "schema {} / decoder {}: {line}{}",
                if *valid { "accepts" } else { "refuses" },
                decoder.as_deref().unwrap_or("accepts"),
                if error.is_empty() {
                    String::new()
                } else {
                    format!(" (schema: {error})")
                },
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} lines judged otherwise than expected:\n{}",
        disagreements.len(),
        table.len(),
        disagreements.join("\n")
    );
}
