//! OpenTelemetry log records as lease events: the OTLP logs data model,
//! in protobuf or in OTLP/JSON, turned into the contract's JSON so that
//! the one decoder judges every event, whatever way it came in.
//!
//! Where it applies: `POST /v1/logs` on `leaseline serve` (OTLP/HTTP), and
//! Kafka topics written by the OpenTelemetry Collector's Kafka exporter
//! with `encoding: otlp_proto` or `otlp_json` (one `ExportLogsServiceRequest`
//! per message, [`Encoding`]).
//!
//! # The mapping ([`translate`])
//!
//! One log record is one event. Its fields come from:
//! - **`ts`**: the record's `time_unix_nano`, or its `observed_time_unix_nano`
//!   when the first is 0 (the data model's rule); neither: `missing_field:ts`.
//! - **Attributes named `lease.<field>`** for every contract field, with one
//!   exception: `lease_id` is `lease.id`. So `lease.kind`, `lease.source`,
//!   `lease.holder_id`, `lease.fencing_token`, `lease.ttl_ms`, ...
//!   Attributes of the record's resource with those names are defaults for
//!   every record under it (a holder sets `lease.holder_id` and
//!   `lease.source` once); the record's own attribute wins.
//! - **`trace_id`, `span_id`**: the record's trace context, as lowercase
//!   hex; absent when empty or all zeros.
//! - **`attrs`**: every other attribute of the record, kept as the
//!   contract keeps unknown fields (a string as it is, any other value as
//!   its JSON text), the resource's `service.name` and a string body
//!   (`body`). Other resource attributes (SDK names and versions) are not
//!   kept: they would repeat on every row.
//!
//! Values keep their OTLP type: a string attribute is a JSON string, an
//! int a JSON integer, a double a JSON number, a bool a bool, bytes a hex
//! string, arrays and maps JSON arrays and objects; the decoder then
//! refuses a wrong type with the contract's reason (`wrong_type:ttl_ms` for
//! a string TTL). One exception: OTLP integers are signed 64-bit, so a
//! token above 2^63 − 1 cannot be an int attribute, and `lease.fencing_token`
//! and `lease.max_token` also take a string of decimal digits.
//!
//! # Decisions where the contract is silent
//!
//! - **`event_id`**: `lease.event_id` when the producer set it. Otherwise
//!   `otlp-` and a 128-bit hash of the record and its resource (their
//!   protobuf encoding), so that an exporter's retry of a batch, which sends
//!   the same records again, is one event in the lake, whichever encoding
//!   it came in. Two records emitted separately differ at least in their
//!   observed time, so they stay two events.
//! - **A body that is not OTLP** (neither encoding parses, or the wrong
//!   one) is refused whole as `invalid_otlp`, kept byte for byte in
//!   `lease_rejects`; nothing in it is guessed at.
//! - **A record that is not a valid event** is refused by the decoder with
//!   its usual reason; `lease_rejects.raw` holds the translated JSON, which
//!   shows what each attribute became and can be replayed with `import`
//!   once fixed.

use std::fmt;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde_json::{Map, Number, Value};

use leaseline_schema::DecodeError;

/// How a Kafka message or an HTTP body encodes what it carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// One contract event as JSON (the contract's own transport).
    #[default]
    Json,
    /// An OTLP `ExportLogsServiceRequest` in protobuf.
    OtlpProto,
    /// An OTLP `ExportLogsServiceRequest` in OTLP/JSON.
    OtlpJson,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::OtlpProto => "otlp_proto",
            Encoding::OtlpJson => "otlp_json",
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Encoding::Json),
            "otlp_proto" => Ok(Encoding::OtlpProto),
            "otlp_json" => Ok(Encoding::OtlpJson),
            _ => Err(format!(
                "unknown encoding {s:?}: json, otlp_proto or otlp_json"
            )),
        }
    }
}

/// Parses an OTLP logs export in `encoding` (one of the OTLP ones).
pub fn parse(bytes: &[u8], encoding: Encoding) -> Result<ExportLogsServiceRequest, DecodeError> {
    match encoding {
        Encoding::OtlpProto => ExportLogsServiceRequest::decode(bytes).map_err(|e| {
            DecodeError::invalid_otlp(format!("not an OTLP logs export in protobuf: {e}"))
        }),
        Encoding::OtlpJson => serde_json::from_slice(bytes).map_err(|e| {
            DecodeError::invalid_otlp(format!("not an OTLP logs export in OTLP/JSON: {e}"))
        }),
        Encoding::Json => Err(DecodeError::invalid_otlp(
            "the contract's JSON encoding carries no OTLP export",
        )),
    }
}

/// The contract JSON of every log record of `request`, in order.
pub fn translate(request: &ExportLogsServiceRequest) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for rl in &request.resource_logs {
        let resource = rl.resource.as_ref();
        let defaults: Vec<&KeyValue> = resource
            .map(|r| {
                r.attributes
                    .iter()
                    .filter(|kv| field_of(&kv.key).is_some())
                    .collect()
            })
            .unwrap_or_default();
        let service = resource.and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
        });
        for sl in &rl.scope_logs {
            for record in &sl.log_records {
                out.push(record_json(record, resource, &defaults, service));
            }
        }
    }
    out
}

/// Parses and translates in one step; the records of a body that is not
/// OTLP are one `invalid_otlp` refusal.
pub fn records(bytes: &[u8], encoding: Encoding) -> Result<Vec<Vec<u8>>, DecodeError> {
    Ok(translate(&parse(bytes, encoding)?))
}

/// The body of an OTLP/HTTP export's answer (status 200) in `encoding`:
/// empty when every record was taken, else a partial success that counts
/// the refused records and says why.
pub fn export_response(rejected: usize, message: &str, encoding: Encoding) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::logs::v1::{
        ExportLogsPartialSuccess, ExportLogsServiceResponse,
    };
    let response = ExportLogsServiceResponse {
        partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: i64::try_from(rejected).unwrap_or(i64::MAX),
            error_message: message.to_string(),
        }),
    };
    match encoding {
        Encoding::OtlpProto => response.encode_to_vec(),
        _ => serde_json::to_vec(&response).expect("a response serialises"),
    }
}

/// `google.rpc.Status`, the body OTLP/HTTP gives every refusal.
#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// The body of an OTLP/HTTP refusal (a 4xx or 5xx status) in `encoding`;
/// `code` is the gRPC code (3 invalid argument, 14 unavailable).
pub fn status_body(code: i32, message: &str, encoding: Encoding) -> Vec<u8> {
    let status = Status {
        code,
        message: message.to_string(),
    };
    match encoding {
        Encoding::OtlpProto => status.encode_to_vec(),
        _ => serde_json::to_vec(&status).expect("a status serialises"),
    }
}

/// The contract field an attribute name carries, if any.
fn field_of(key: &str) -> Option<&'static str> {
    leaseline_schema::Field::of_otlp_attribute(key).map(|f| f.as_str())
}

fn record_json(
    record: &LogRecord,
    resource: Option<&Resource>,
    defaults: &[&KeyValue],
    service: Option<&AnyValue>,
) -> Vec<u8> {
    let mut ev = Map::new();
    let nanos = match record.time_unix_nano {
        0 => record.observed_time_unix_nano,
        t => t,
    };
    if nanos != 0 {
        ev.insert("ts".into(), timestamp(nanos));
    }
    let mut attrs = Map::new();
    if let Some(v) = service {
        attrs.insert("service.name".into(), attr_text(v));
    }
    for kv in defaults.iter().copied().chain(&record.attributes) {
        let Some(v) = kv.value.as_ref() else { continue };
        match field_of(&kv.key) {
            Some(field) => {
                ev.insert(field.to_string(), field_value(field, v));
            }
            None => {
                attrs.insert(kv.key.clone(), attr_text(v));
            }
        }
    }
    if let Some(any_value::Value::StringValue(body)) =
        record.body.as_ref().and_then(|b| b.value.as_ref())
    {
        if !body.is_empty() {
            attrs.insert("body".into(), Value::String(body.clone()));
        }
    }
    if let Some(id) = trace_hex(&record.trace_id) {
        ev.insert("trace_id".into(), Value::String(id));
    }
    if let Some(id) = trace_hex(&record.span_id) {
        ev.insert("span_id".into(), Value::String(id));
    }
    if !ev.contains_key("event_id") {
        ev.insert(
            "event_id".into(),
            Value::String(derived_id(record, resource)),
        );
    }
    if !attrs.is_empty() {
        ev.insert("attrs".into(), Value::Object(attrs));
    }
    serde_json::to_vec(&Value::Object(ev)).expect("a JSON value serialises")
}

/// RFC 3339 to the nanosecond; past what a signed 64-bit count of
/// nanoseconds holds (the year 2262), epoch milliseconds, which the decoder
/// checks against the contract's range.
fn timestamp(nanos: u64) -> Value {
    match i64::try_from(nanos) {
        Ok(n) => Value::String(
            chrono::DateTime::from_timestamp_nanos(n)
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        ),
        Err(_) => Value::Number(Number::from(nanos / 1_000_000)),
    }
}

fn trace_hex(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty() && bytes.iter().any(|b| *b != 0)).then(|| hex(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn derived_id(record: &LogRecord, resource: Option<&Resource>) -> String {
    let mut bytes = record.encode_to_vec();
    if let Some(r) = resource {
        r.encode(&mut bytes).expect("a Vec grows as needed");
    }
    format!("otlp-{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
}

/// An attribute as the JSON value of a contract field.
fn field_value(field: &str, v: &AnyValue) -> Value {
    match &v.value {
        Some(any_value::Value::StringValue(s))
            if matches!(field, "fencing_token" | "max_token")
                && !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            // Parsed by serde_json as the integer literal it spells; one
            // too large for 64 bits becomes a float and is refused.
            serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
        }
        _ => json_of(v),
    }
}

fn json_of(v: &AnyValue) -> Value {
    use any_value::Value as V;
    match &v.value {
        None => Value::Null,
        Some(V::StringValue(s)) => Value::String(s.clone()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => Value::Number((*i).into()),
        // NaN and the infinities have no JSON number: their text, which
        // the decoder refuses as a wrong type.
        Some(V::DoubleValue(d)) => Number::from_f64(*d)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(d.to_string())),
        Some(V::BytesValue(b)) => Value::String(hex(b)),
        // An index into a string table that log exports do not carry: not
        // a value of any contract type, so the decoder refuses it.
        Some(V::StringValueStrindex(i)) => serde_json::json!({ "string_value_strindex": i }),
        Some(V::ArrayValue(a)) => Value::Array(a.values.iter().map(json_of).collect()),
        Some(V::KvlistValue(kv)) => Value::Object(
            kv.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        kv.value.as_ref().map(json_of).unwrap_or(Value::Null),
                    )
                })
                .collect(),
        ),
    }
}

/// An attribute as an `attrs` value: the contract keeps a string as it is
/// and anything else as its JSON text.
fn attr_text(v: &AnyValue) -> Value {
    match json_of(v) {
        s @ Value::String(_) => s,
        other => Value::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, InstrumentationScope};
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};

    fn s(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    fn i(k: &str, v: i64) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(v)),
            }),
            ..Default::default()
        }
    }

    fn request(resource: Vec<KeyValue>, records: Vec<LogRecord>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    attributes: resource,
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "locks".into(),
                        ..Default::default()
                    }),
                    log_records: records,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    fn acquired() -> LogRecord {
        LogRecord {
            time_unix_nano: 1_757_844_000_123_456_789,
            observed_time_unix_nano: 1_757_844_000_200_000_000,
            attributes: vec![
                s("lease.kind", "acquired"),
                s("lease.id", "orders/7"),
                i("lease.fencing_token", 42),
                i("lease.ttl_ms", 10_000),
                s("zone", "eu-1"),
                i("retries", 3),
            ],
            trace_id: (1..=16).collect(),
            span_id: vec![0; 8],
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue("got the lock".into())),
            }),
            ..Default::default()
        }
    }

    fn one(req: &ExportLogsServiceRequest) -> Value {
        let out = translate(req);
        assert_eq!(out.len(), 1);
        serde_json::from_slice(&out[0]).unwrap()
    }

    #[test]
    fn a_record_becomes_the_contract_event_it_describes() {
        let req = request(
            vec![
                s("service.name", "billing"),
                s("lease.source", "holder"),
                s("lease.holder_id", "pod-1"),
                s("telemetry.sdk.name", "opentelemetry"),
            ],
            vec![acquired()],
        );
        let ev = one(&req);
        let id = ev["event_id"].as_str().unwrap().to_string();
        assert!(id.starts_with("otlp-") && id.len() == 5 + 32, "{id}");
        assert_eq!(
            ev,
            serde_json::json!({
                "ts": "2025-09-14T10:00:00.123456789Z",
                "kind": "acquired",
                "source": "holder",
                "lease_id": "orders/7",
                "holder_id": "pod-1",
                "fencing_token": 42,
                "ttl_ms": 10000,
                "trace_id": "0102030405060708090a0b0c0d0e0f10",
                "event_id": id,
                "attrs": {"service.name": "billing", "zone": "eu-1", "retries": "3", "body": "got the lock"},
            })
        );
        let translated = translate(&req);
        let decoded = leaseline_schema::decode(&translated[0]).unwrap();
        assert_eq!(decoded.fencing_token, Some(42));
        assert_eq!(decoded.ts_us, 1_757_844_000_123_456);
        assert_eq!(decoded.span_id, None);
    }

    #[test]
    fn the_record_overrides_its_resource_and_an_event_id_given_is_kept() {
        let mut r = acquired();
        r.attributes.push(s("lease.source", "coordinator"));
        r.attributes.push(s("lease.holder_id", "pod-2"));
        r.attributes.push(s("lease.event_id", "e-1"));
        let ev = one(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "pod-1")],
            vec![r],
        ));
        assert_eq!(ev["source"], "coordinator");
        assert_eq!(ev["holder_id"], "pod-2");
        assert_eq!(ev["event_id"], "e-1");
    }

    #[test]
    fn a_retry_has_the_same_id_in_either_encoding_and_another_emit_does_not() {
        let req = request(vec![s("lease.holder_id", "pod-1")], vec![acquired()]);
        let proto = records(&req.encode_to_vec(), Encoding::OtlpProto).unwrap();
        let json = records(&serde_json::to_vec(&req).unwrap(), Encoding::OtlpJson).unwrap();
        assert_eq!(proto, json);
        assert_eq!(proto, translate(&req));
        let mut later = acquired();
        later.observed_time_unix_nano += 1;
        let other = translate(&request(vec![s("lease.holder_id", "pod-1")], vec![later]));
        let id = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap()["event_id"].clone();
        assert_ne!(id(&proto[0]), id(&other[0]));
    }

    #[test]
    fn wrong_values_are_refused_by_the_decoder_with_the_contract_reason() {
        let mut r = acquired();
        r.attributes.retain(|kv| kv.key != "lease.ttl_ms");
        r.attributes.push(s("lease.ttl_ms", "10s"));
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        let err = leaseline_schema::decode(&out[0]).unwrap_err();
        assert_eq!(err.reason.to_string(), "wrong_type:ttl_ms");

        let mut r = acquired();
        r.attributes.retain(|kv| kv.key != "lease.id");
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        let err = leaseline_schema::decode(&out[0]).unwrap_err();
        assert_eq!(err.reason.to_string(), "missing_field:lease_id");

        let mut r = acquired();
        r.time_unix_nano = 0;
        r.observed_time_unix_nano = 0;
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        let err = leaseline_schema::decode(&out[0]).unwrap_err();
        assert_eq!(err.reason.to_string(), "missing_field:ts");

        let mut r = acquired();
        r.attributes.push(KeyValue {
            key: "lease.backend".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values: vec![] })),
            }),
            ..Default::default()
        });
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        let err = leaseline_schema::decode(&out[0]).unwrap_err();
        assert_eq!(err.reason.to_string(), "wrong_type:backend");
    }

    #[test]
    fn tokens_past_signed_64_bits_come_as_digit_strings() {
        let mut r = acquired();
        r.attributes.retain(|kv| kv.key != "lease.fencing_token");
        r.attributes
            .push(s("lease.fencing_token", "18446744073709551615"));
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        assert_eq!(
            leaseline_schema::decode(&out[0]).unwrap().fencing_token,
            Some(u64::MAX)
        );
        let mut r = acquired();
        r.attributes.retain(|kv| kv.key != "lease.fencing_token");
        r.attributes
            .push(s("lease.fencing_token", "18446744073709551616"));
        let out = translate(&request(
            vec![s("lease.source", "holder"), s("lease.holder_id", "p")],
            vec![r],
        ));
        assert!(leaseline_schema::decode(&out[0]).is_err());
    }

    #[test]
    fn a_body_that_is_not_otlp_is_refused_whole() {
        for (bytes, enc) in [
            (&b"{\"kind\":\"acquired\"}"[..], Encoding::OtlpProto),
            (&b"\x0a\x05hello"[..], Encoding::OtlpJson),
            (&b"not json"[..], Encoding::OtlpJson),
        ] {
            let err = records(bytes, enc).unwrap_err();
            assert_eq!(err.reason.to_string(), "invalid_otlp", "{enc}");
        }
    }

    #[test]
    fn otlp_json_as_the_collector_writes_it() {
        // The OTLP/JSON mapping: camelCase names, hex trace context,
        // 64-bit integers as strings.
        let body = br#"{"resourceLogs":[{"resource":{"attributes":[
            {"key":"service.name","value":{"stringValue":"etcd-locks"}}]},
          "scopeLogs":[{"scope":{"name":"x"},"logRecords":[{
            "timeUnixNano":"1757844000000000000",
            "traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
            "attributes":[
              {"key":"lease.kind","value":{"stringValue":"released"}},
              {"key":"lease.source","value":{"stringValue":"coordinator"}},
              {"key":"lease.id","value":{"stringValue":"jobs/1"}},
              {"key":"lease.holder_id","value":{"stringValue":"w-3"}},
              {"key":"lease.fencing_token","value":{"intValue":"9"}}]}]}]}]}"#;
        let out = records(body, Encoding::OtlpJson).unwrap();
        let ev = leaseline_schema::decode(&out[0]).unwrap();
        assert_eq!(ev.kind, leaseline_schema::Kind::Released);
        assert_eq!(ev.fencing_token, Some(9));
        assert_eq!(
            ev.trace_id.as_deref(),
            Some("5b8efff798038103d269b633813fc60c")
        );
        assert_eq!(ev.span_id.as_deref(), Some("eee19b7ec3c1b174"));
        assert_eq!(ev.ts_us, 1_757_844_000_000_000);
    }
}
