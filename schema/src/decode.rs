//! Strict JSON decoding of one event, by the contract's validity rules.
//!
//! The decoder walks the JSON object once with serde, borrowing strings from
//! the input. A semantic problem (a wrong type, a value out of range) is
//! remembered and the walk goes on, so that a message that is also broken
//! JSON further on is reported as `invalid_json`: syntax outranks meaning.
//!
//! Most events are flat objects of plain strings and numbers, so a
//! hand-rolled scanner ([`fast`]) reads those first, at about twice the
//! speed of the serde walk; anything it is not sure of (escapes, exponents,
//! nesting, a syntax error) goes through the serde walk from the start.
//! Both file what they read through the same `RawEvent` methods, and the
//! same validation judges it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::event::{Kind, LeaseEvent, Source};

mod fast;
mod keys;
mod quotes;
mod utc;

/// Maximum length in bytes of `lease_id` and `holder_id`.
pub const MAX_ID_BYTES: usize = 1024;

/// The contract's named fields. `Display` gives the wire name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Ts,
    Kind,
    Source,
    LeaseId,
    HolderId,
    FencingToken,
    TtlMs,
    EventId,
    Backend,
    LatencyMs,
    Reason,
    MaxToken,
    MonoMs,
    KeepaliveSentMonoMs,
    DeadlineMonoMs,
    TraceId,
    SpanId,
    Attrs,
}

impl Field {
    /// Every field, in declaration order.
    pub const ALL: [Field; 18] = [
        Field::Ts,
        Field::Kind,
        Field::Source,
        Field::LeaseId,
        Field::HolderId,
        Field::FencingToken,
        Field::TtlMs,
        Field::EventId,
        Field::Backend,
        Field::LatencyMs,
        Field::Reason,
        Field::MaxToken,
        Field::MonoMs,
        Field::KeepaliveSentMonoMs,
        Field::DeadlineMonoMs,
        Field::TraceId,
        Field::SpanId,
        Field::Attrs,
    ];

    /// The wire names, in declaration order (`Field::Ts as usize` is 0),
    /// `attrs` last.
    pub(crate) const NAMES: [&'static str; 18] = [
        "ts",
        "kind",
        "source",
        "lease_id",
        "holder_id",
        "fencing_token",
        "ttl_ms",
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
    ];

    pub fn as_str(self) -> &'static str {
        // An array rather than a match: a match compiles to a jump table,
        // and the key match in the fast path calls this for every key.
        Field::NAMES[self as usize]
    }

    fn from_key(key: &str) -> Option<Field> {
        keys::lookup(key.as_bytes())
    }

    /// The OpenTelemetry log attribute that carries this field
    /// (`docs/event-contract.md`, "From OpenTelemetry"): `lease.<field>`,
    /// except `lease.id` for `lease_id`, which reads better next to other
    /// attributes. `ts` is the record's time and `attrs` are its other
    /// attributes, so neither has one.
    pub fn otlp_attribute(self) -> Option<&'static str> {
        const ATTRIBUTES: [&str; 18] = [
            "",
            "lease.kind",
            "lease.source",
            "lease.id",
            "lease.holder_id",
            "lease.fencing_token",
            "lease.ttl_ms",
            "lease.event_id",
            "lease.backend",
            "lease.latency_ms",
            "lease.reason",
            "lease.max_token",
            "lease.mono_ms",
            "lease.keepalive_sent_mono_ms",
            "lease.deadline_mono_ms",
            "lease.trace_id",
            "lease.span_id",
            "",
        ];
        Some(ATTRIBUTES[self as usize]).filter(|a| !a.is_empty())
    }

    /// The field an OpenTelemetry attribute carries, if any (the inverse
    /// of [`Field::otlp_attribute`]).
    pub fn of_otlp_attribute(key: &str) -> Option<Field> {
        key.strip_prefix("lease.")?;
        Field::ALL
            .into_iter()
            .find(|f| f.otlp_attribute() == Some(key))
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a message was refused. `Display` gives the stable machine-readable
/// code stored in `lease_rejects.reason` (e.g. `missing_field:lease_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The bytes are not UTF-8.
    InvalidUtf8,
    /// The bytes are not one JSON value (syntax error, trailing data, empty).
    InvalidJson,
    /// Valid JSON, but not an object.
    NotAnObject,
    /// A required field is absent (or `null`).
    MissingField(Field),
    /// A field has the wrong JSON type.
    WrongType(Field),
    /// A field has the right type but a value outside its range
    /// (negative or too large a number, an empty or over-long id).
    OutOfRange(Field),
    /// A string field does not have the required format (trace and span ids).
    BadFormat(Field),
    /// A contract field appears twice in the object.
    DuplicateField(Field),
    /// `kind` is not one of the contract's kinds.
    UnknownKind,
    /// `source` is not `coordinator`, `holder` or `resource`.
    UnknownSource,
    /// `ts` is neither RFC 3339 with an offset nor integer epoch milliseconds.
    BadTimestamp,
    /// A message or request body that should hold OpenTelemetry logs (a
    /// Kafka topic read as `otlp_proto` or `otlp_json`, `POST /v1/logs`)
    /// does not parse as one; the events it may hold are not guessed at.
    InvalidOtlp,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::InvalidUtf8 => f.write_str("invalid_utf8"),
            RejectReason::InvalidJson => f.write_str("invalid_json"),
            RejectReason::NotAnObject => f.write_str("not_an_object"),
            RejectReason::MissingField(x) => write!(f, "missing_field:{x}"),
            RejectReason::WrongType(x) => write!(f, "wrong_type:{x}"),
            RejectReason::OutOfRange(x) => write!(f, "out_of_range:{x}"),
            RejectReason::BadFormat(x) => write!(f, "bad_format:{x}"),
            RejectReason::DuplicateField(x) => write!(f, "duplicate_field:{x}"),
            RejectReason::UnknownKind => f.write_str("unknown_kind"),
            RejectReason::UnknownSource => f.write_str("unknown_source"),
            RejectReason::BadTimestamp => f.write_str("bad_timestamp"),
            RejectReason::InvalidOtlp => f.write_str("invalid_otlp"),
        }
    }
}

/// A refused message: the stable reason and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct DecodeError {
    pub reason: RejectReason,
    pub message: String,
}

impl DecodeError {
    /// A body in an OTLP encoding that does not parse as OTLP logs.
    pub fn invalid_otlp(message: impl Into<String>) -> Self {
        DecodeError::new(RejectReason::InvalidOtlp, message)
    }

    fn new(reason: RejectReason, message: impl Into<String>) -> Self {
        DecodeError {
            reason,
            message: message.into(),
        }
    }
}

/// Decodes one message (a Kafka value or an NDJSON line, without its line
/// terminator) into a valid event, or says why it is not one.
pub fn decode(bytes: &[u8]) -> Result<LeaseEvent<'_>, DecodeError> {
    // simdutf8 checks valid text several times faster than std; std runs
    // only to explain a refusal.
    let text = match simdutf8::basic::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => {
            let e = std::str::from_utf8(bytes).expect_err("simdutf8 and std agree on UTF-8");
            return Err(DecodeError::new(
                RejectReason::InvalidUtf8,
                format!("message is not UTF-8: {e}"),
            ));
        }
    };
    decode_str(text)
}

/// [`decode`] for input already known to be UTF-8.
pub fn decode_str(text: &str) -> Result<LeaseEvent<'_>, DecodeError> {
    // Not `decode_str_fast_only(..).unwrap_or_else(..)`: the event would be
    // returned through an `Option` and copied once more, a measured 2 % of
    // the instructions of decode to Arrow.
    let mut checked = Checked::default();
    match fast::scan(text, &mut checked) {
        Some(()) => checked.finish(),
        None => decode_str_by_serde(text),
    }
}

/// What the fast path alone makes of `text`: `None` where it declines and
/// the serde walk would decide. Public for the tests and the fuzzer; not
/// for use elsewhere.
#[doc(hidden)]
pub fn decode_str_fast_only(text: &str) -> Option<Result<LeaseEvent<'_>, DecodeError>> {
    let mut checked = Checked::default();
    fast::scan(text, &mut checked)?;
    Some(checked.finish())
}

/// [`decode_str`] without the fast path: every input through the serde
/// walk. Public for the tests and the fuzzer that hold the two paths to
/// the same answers; not for use elsewhere.
#[doc(hidden)]
pub fn decode_str_by_serde(text: &str) -> Result<LeaseEvent<'_>, DecodeError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de.deserialize_any(TopVisitor).and_then(|top| {
        de.end()?;
        Ok(top)
    });
    match top {
        Err(e) => Err(DecodeError::new(
            RejectReason::InvalidJson,
            format!("not valid JSON: {e}"),
        )),
        Ok(Top::NotObject(what)) => Err(DecodeError::new(
            RejectReason::NotAnObject,
            format!("an event must be a JSON object, got {what}"),
        )),
        Ok(Top::Object(raw)) => raw.validate(),
    }
}

// ---------------------------------------------------------------------------
// First pass: collect the object's fields without judging more than types.

/// A JSON value as far as a scalar field cares about it.
enum Scalar<'de> {
    Str(Cow<'de, str>),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool,
    Null,
    Object,
    Array,
}

impl Scalar<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Scalar::Str(_) => "a string",
            Scalar::U64(_) | Scalar::I64(_) => "an integer",
            Scalar::F64(_) => "a number",
            Scalar::Bool => "a boolean",
            Scalar::Null => "null",
            Scalar::Object => "an object",
            Scalar::Array => "an array",
        }
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Bool)
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Scalar::I64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Scalar::F64(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Object)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Array)
    }
}

impl<'de> de::Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

/// A map key, borrowed when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The `attrs` object: string values only.
enum Attrs<'de> {
    Map(Vec<(Cow<'de, str>, Cow<'de, str>)>),
    /// Not an object, or an object with a non-string value.
    Invalid(String),
    Null,
}

struct AttrsVisitor;

impl<'de> Visitor<'de> for AttrsVisitor {
    type Value = Attrs<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of strings")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let mut bad = None;
        while let Some(Key(k)) = map.next_key()? {
            match map.next_value::<Scalar<'de>>()? {
                Scalar::Str(v) => out.push((k, v)),
                other => {
                    if bad.is_none() {
                        bad = Some(format!(
                            "attrs.{k} must be a string, got {}",
                            other.type_name()
                        ));
                    }
                }
            }
        }
        Ok(match bad {
            Some(m) => Attrs::Invalid(m),
            None => Attrs::Map(out),
        })
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Attrs::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Attrs::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Attrs::Invalid(
            "attrs must be an object, got a boolean".into(),
        ))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Attrs::Invalid(
            "attrs must be an object, got a number".into(),
        ))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Attrs::Invalid(
            "attrs must be an object, got a number".into(),
        ))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Attrs::Invalid(
            "attrs must be an object, got a number".into(),
        ))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Attrs::Invalid(
            "attrs must be an object, got a string".into(),
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Attrs::Invalid(
            "attrs must be an object, got an array".into(),
        ))
    }
}

struct AttrsSeed;

impl<'de> DeserializeSeed<'de> for AttrsSeed {
    type Value = Attrs<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(AttrsVisitor)
    }
}

#[derive(Default)]
struct RawEvent<'de> {
    fields: [Option<Scalar<'de>>; 17],
    attrs: Option<Attrs<'de>>,
    extra: Vec<(Cow<'de, str>, Cow<'de, str>)>,
    /// The first structural problem met: a duplicate contract field.
    first_error: Option<DecodeError>,
}

enum Top<'de> {
    Object(Box<RawEvent<'de>>),
    NotObject(&'static str),
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut raw = Box::<RawEvent>::default();
        while let Some(Key(key)) = map.next_key()? {
            match Field::from_key(&key) {
                Some(Field::Attrs) => raw.put_attrs(map.next_value_seed(AttrsSeed)?),
                Some(field) => raw.put(field, map.next_value::<Scalar<'de>>()?),
                None => {
                    let v: &'de RawValue = map.next_value()?;
                    put_unknown(&mut raw.extra, key, v.get());
                }
            }
        }
        Ok(Top::Object(raw))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::NotObject("an array"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Top::NotObject("a boolean"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Top::NotObject("a number"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Top::NotObject("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Top::NotObject("a number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Top::NotObject("a string"))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Top::NotObject("null"))
    }
}

// ---------------------------------------------------------------------------
// Second pass: judge the collected fields by the contract.

type Check<T> = Result<T, DecodeError>;

fn wrong_type(field: Field, want: &str, got: &Scalar<'_>) -> DecodeError {
    DecodeError::new(
        RejectReason::WrongType(field),
        format!("{field} must be {want}, got {}", got.type_name()),
    )
}

/// How both parsers (the serde walk and [`fast`]) file what they read, so
/// that the two can only differ in which inputs they accept.
impl<'de> RawEvent<'de> {
    /// A contract field other than `attrs`.
    #[inline]
    fn put(&mut self, field: Field, v: Scalar<'de>) {
        let slot = &mut self.fields[field as usize];
        if slot.is_some() {
            let msg = format!("{field} appears twice");
            self.note(RejectReason::DuplicateField(field), msg);
        } else {
            *slot = Some(v);
        }
    }

    fn put_attrs(&mut self, v: Attrs<'de>) {
        if self.attrs.is_some() {
            self.note(
                RejectReason::DuplicateField(Field::Attrs),
                "attrs appears twice",
            );
        }
        self.attrs = Some(v);
    }

    fn note(&mut self, reason: RejectReason, message: impl Into<String>) {
        if self.first_error.is_none() {
            self.first_error = Some(DecodeError::new(reason, message));
        }
    }

    /// A field's value, treating `null` as absent.
    #[inline(always)]
    fn present(v: Option<Scalar<'de>>) -> Option<Scalar<'de>> {
        // An absent field moves through: matched in one arm with `null`, it
        // was dropped there by an out-of-line call, once per absent field.
        match v {
            Some(Scalar::Null) => None,
            v => v,
        }
    }

    #[inline(always)]
    fn string(field: Field, v: Option<Scalar<'de>>) -> Check<Option<Cow<'de, str>>> {
        match Self::present(v) {
            None => Ok(None),
            Some(Scalar::Str(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(field, "a string", &other)),
        }
    }

    #[inline(always)]
    fn id(field: Field, v: Option<Scalar<'de>>) -> Check<Option<Cow<'de, str>>> {
        let v = Self::string(field, v)?;
        if let Some(s) = &v {
            if s.is_empty() {
                return Err(DecodeError::new(
                    RejectReason::OutOfRange(field),
                    format!("{field} must not be empty"),
                ));
            }
            if s.len() > MAX_ID_BYTES {
                return Err(DecodeError::new(
                    RejectReason::OutOfRange(field),
                    format!(
                        "{field} is {} bytes, at most {MAX_ID_BYTES} allowed",
                        s.len()
                    ),
                ));
            }
        }
        Ok(v)
    }

    #[inline(always)]
    fn u64(field: Field, v: Option<Scalar<'de>>) -> Check<Option<u64>> {
        match Self::present(v) {
            None => Ok(None),
            Some(Scalar::U64(v)) => Ok(Some(v)),
            Some(Scalar::I64(v)) => Err(DecodeError::new(
                RejectReason::OutOfRange(field),
                format!("{field} must be an unsigned 64-bit integer, got {v}"),
            )),
            Some(Scalar::F64(v)) if v.abs() >= 9.2e18 && v.fract() == 0.0 => Err(DecodeError::new(
                RejectReason::OutOfRange(field),
                format!("{field} must be an unsigned 64-bit integer, got {v}"),
            )),
            Some(other) => Err(wrong_type(field, "an unsigned integer", &other)),
        }
    }

    #[inline(always)]
    fn non_negative(field: Field, v: Option<Scalar<'de>>) -> Check<Option<f64>> {
        let v = match Self::present(v) {
            None => return Ok(None),
            Some(Scalar::U64(v)) => v as f64,
            Some(Scalar::I64(v)) => v as f64,
            Some(Scalar::F64(v)) => v,
            Some(other) => return Err(wrong_type(field, "a number", &other)),
        };
        if v < 0.0 {
            return Err(DecodeError::new(
                RejectReason::OutOfRange(field),
                format!("{field} must not be negative, got {v}"),
            ));
        }
        Ok(Some(v))
    }

    #[inline(always)]
    fn hex(field: Field, v: Option<Scalar<'de>>, digits: usize) -> Check<Option<Cow<'de, str>>> {
        let v = Self::string(field, v)?;
        if let Some(s) = &v {
            if !is_lower_hex(s, digits) {
                return Err(DecodeError::new(
                    RejectReason::BadFormat(field),
                    format!("{field} must be {digits} lowercase hex digits, got {s:?}"),
                ));
            }
        }
        Ok(v)
    }

    #[inline(always)]
    fn timestamp(v: Option<Scalar<'de>>) -> Check<Option<i64>> {
        let bad = |m: String| DecodeError::new(RejectReason::BadTimestamp, m);
        // Integer epoch milliseconds come signed or unsigned; one check and
        // one message for both.
        fn epoch_ms(ms: impl TryInto<i64> + std::fmt::Display + Copy) -> Check<Option<i64>> {
            epoch_ms_micros(ms).map(Some).ok_or_else(|| {
                DecodeError::new(
                    RejectReason::BadTimestamp,
                    format!("ts {ms} is out of range for epoch milliseconds"),
                )
            })
        }
        match Self::present(v) {
            None => Ok(None),
            Some(Scalar::Str(s)) => {
                if let Some(us) = utc::micros(&s) {
                    return Ok(Some(us));
                }
                let t = chrono::DateTime::parse_from_rfc3339(&s)
                    .map_err(|e| bad(format!("ts {s:?} is not RFC 3339 with an offset: {e}")))?;
                Ok(Some(t.timestamp_micros()))
            }
            Some(Scalar::U64(ms)) => epoch_ms(ms),
            Some(Scalar::I64(ms)) => epoch_ms(ms),
            Some(Scalar::F64(v)) => Err(bad(format!(
                "ts {v} is not an integer number of epoch milliseconds"
            ))),
            Some(other) => Err(wrong_type(
                Field::Ts,
                "an RFC 3339 string or integer epoch milliseconds",
                &other,
            )),
        }
    }

    /// Judges the fields read. By value: each field is moved out once,
    /// with nothing written back and no drop of the emptied slots; inlined,
    /// or the move would copy the whole `RawEvent` first.
    #[inline(always)]
    fn validate(self) -> Check<LeaseEvent<'de>> {
        let RawEvent {
            fields,
            attrs,
            extra,
            first_error,
        } = self;
        if let Some(e) = first_error {
            return Err(e);
        }
        // In `Field` order (the slots are indexed by `field as usize`).
        let [ts, kind, source, lease_id, holder_id, fencing_token, ttl_ms, event_id, backend, latency_ms, reason, max_token, mono_ms, keepalive_sent_mono_ms, deadline_mono_ms, trace_id, span_id] =
            fields;
        // Types and ranges first, in field order; then the kind-dependent
        // presence rules, which need a valid kind.
        let ts = Self::timestamp(ts)?;
        let kind = match Self::string(Field::Kind, kind)? {
            None => None,
            Some(k) => Some(Kind::parse(&k).ok_or_else(|| {
                DecodeError::new(RejectReason::UnknownKind, format!("unknown kind {k:?}"))
            })?),
        };
        let source = match Self::string(Field::Source, source)? {
            None => None,
            Some(s) => Some(Source::parse(&s).ok_or_else(|| {
                DecodeError::new(
                    RejectReason::UnknownSource,
                    format!("unknown source {s:?}; expected coordinator, holder or resource"),
                )
            })?),
        };
        let lease_id = Self::id(Field::LeaseId, lease_id)?;
        let holder_id = Self::id(Field::HolderId, holder_id)?;
        let fencing_token = Self::u64(Field::FencingToken, fencing_token)?;
        let ttl_ms = match Self::u64(Field::TtlMs, ttl_ms)? {
            None => None,
            Some(0) => {
                return Err(DecodeError::new(
                    RejectReason::OutOfRange(Field::TtlMs),
                    "ttl_ms must be positive, got 0",
                ))
            }
            Some(v) => Some(i64::try_from(v).map_err(|_| {
                DecodeError::new(
                    RejectReason::OutOfRange(Field::TtlMs),
                    format!("ttl_ms {v} is too large"),
                )
            })?),
        };
        let event_id = Self::string(Field::EventId, event_id)?;
        let backend = Self::string(Field::Backend, backend)?;
        let latency_ms = Self::non_negative(Field::LatencyMs, latency_ms)?;
        let reason = Self::string(Field::Reason, reason)?;
        let max_token = Self::u64(Field::MaxToken, max_token)?;
        let mono_ms = Self::non_negative(Field::MonoMs, mono_ms)?;
        let keepalive_sent_mono_ms =
            Self::non_negative(Field::KeepaliveSentMonoMs, keepalive_sent_mono_ms)?;
        let deadline_mono_ms = Self::non_negative(Field::DeadlineMonoMs, deadline_mono_ms)?;
        let trace_id = Self::hex(Field::TraceId, trace_id, 32)?;
        let span_id = Self::hex(Field::SpanId, span_id, 16)?;
        let attrs = match attrs {
            None | Some(Attrs::Null) => Vec::new(),
            Some(Attrs::Map(m)) => m,
            Some(Attrs::Invalid(m)) => {
                return Err(DecodeError::new(RejectReason::WrongType(Field::Attrs), m))
            }
        };
        Checked {
            ts,
            kind,
            source,
            lease_id,
            holder_id,
            fencing_token,
            ttl_ms,
            event_id,
            backend,
            latency_ms,
            reason,
            max_token,
            mono_ms,
            keepalive_sent_mono_ms,
            deadline_mono_ms,
            trace_id,
            span_id,
            attrs,
            extra,
        }
        .finish()
    }
}

/// The fields once each has passed its own checks (type, range, format),
/// before the checks between fields. Both parsers end here: the serde walk
/// through [`RawEvent::validate`], the fast path directly, so the rules
/// between fields and the handling of attrs exist once.
#[derive(Default)]
struct Checked<'de> {
    ts: Option<i64>,
    kind: Option<Kind>,
    source: Option<Source>,
    lease_id: Option<Cow<'de, str>>,
    holder_id: Option<Cow<'de, str>>,
    fencing_token: Option<u64>,
    ttl_ms: Option<i64>,
    event_id: Option<Cow<'de, str>>,
    backend: Option<Cow<'de, str>>,
    latency_ms: Option<f64>,
    reason: Option<Cow<'de, str>>,
    max_token: Option<u64>,
    mono_ms: Option<f64>,
    keepalive_sent_mono_ms: Option<f64>,
    deadline_mono_ms: Option<f64>,
    trace_id: Option<Cow<'de, str>>,
    span_id: Option<Cow<'de, str>>,
    /// The `attrs` object's pairs, as sent.
    attrs: Vec<Attr<'de>>,
    /// Unknown top-level fields, as sent.
    extra: Vec<Attr<'de>>,
}

impl<'de> Checked<'de> {
    /// The kind-dependent presence rules, then attrs merged with the
    /// unknown fields.
    #[inline(always)]
    fn finish(self) -> Check<LeaseEvent<'de>> {
        let missing = |f: Field| {
            DecodeError::new(
                RejectReason::MissingField(f),
                format!("required field {f} is missing"),
            )
        };
        let ts_us = self.ts.ok_or_else(|| missing(Field::Ts))?;
        let kind = self.kind.ok_or_else(|| missing(Field::Kind))?;
        let source = self.source.ok_or_else(|| missing(Field::Source))?;
        let lease_id = self.lease_id.ok_or_else(|| missing(Field::LeaseId))?;
        if self.holder_id.is_none() && !kind.holder_optional() {
            return Err(missing(Field::HolderId));
        }
        if self.fencing_token.is_none() && kind.requires_fencing_token() {
            return Err(missing(Field::FencingToken));
        }
        if self.ttl_ms.is_none() && kind == Kind::Acquired {
            return Err(missing(Field::TtlMs));
        }
        // The audit adds TTLs to times and compares clocks: every value
        // must stay far from where a timestamp overflows, or one event
        // would break the audit of the whole lake.
        if !(MIN_TS_US..=MAX_TS_US).contains(&ts_us) {
            return Err(DecodeError::new(
                RejectReason::OutOfRange(Field::Ts),
                format!("ts is {ts_us} µs from the epoch, outside years 0001 to 9999"),
            ));
        }
        if let Some(t) = self.ttl_ms.filter(|&t| t > MAX_DURATION_MS as i64) {
            return Err(too_long(Field::TtlMs, t));
        }
        for (field, v) in [
            (Field::LatencyMs, self.latency_ms),
            (Field::MonoMs, self.mono_ms),
            (Field::KeepaliveSentMonoMs, self.keepalive_sent_mono_ms),
            (Field::DeadlineMonoMs, self.deadline_mono_ms),
        ] {
            // Written so that NaN is refused too.
            if let Some(v) = v.filter(|v| {
                v.partial_cmp(&(MAX_DURATION_MS as f64))
                    .is_none_or(|o| o.is_gt())
            }) {
                return Err(too_long(field, v));
            }
        }

        // JSON objects may repeat a key; the last one wins as in most parsers,
        // in `attrs` and among unknown top-level fields alike. Explicit attrs
        // win over unknown top-level fields of the same name. Sort and merge
        // rather than search, so many unknown fields cost n log n, not n^2.
        let mut attrs = self.attrs;
        sort_last_wins(&mut attrs);
        let mut extra = self.extra;
        if !extra.is_empty() {
            sort_last_wins(&mut extra);
            attrs = if attrs.is_empty() {
                extra
            } else {
                merge_explicit_first(attrs, extra)
            };
        }

        Ok(LeaseEvent {
            ts_us,
            kind,
            source,
            lease_id,
            holder_id: self.holder_id,
            fencing_token: self.fencing_token,
            ttl_ms: self.ttl_ms,
            event_id: self.event_id,
            backend: self.backend,
            latency_ms: self.latency_ms,
            reason: self.reason,
            max_token: self.max_token,
            mono_ms: self.mono_ms,
            keepalive_sent_mono_ms: self.keepalive_sent_mono_ms,
            deadline_mono_ms: self.deadline_mono_ms,
            trace_id: self.trace_id,
            span_id: self.span_id,
            attrs,
        })
    }
}

/// The earliest and latest `ts`: the years RFC 3339 can write, 0001 to
/// 9999, in microseconds from the epoch.
pub const MIN_TS_US: i64 = -62_135_596_800_000_000;
pub const MAX_TS_US: i64 = 253_402_300_799_999_999;

/// The longest TTL, latency or monotonic clock reading, in milliseconds:
/// 100 years. Far past any real lease, and far from overflowing a
/// timestamp when added to one.
pub const MAX_DURATION_MS: u64 = 3_155_760_000_000;

#[cold]
fn too_long(field: Field, v: impl std::fmt::Display) -> DecodeError {
    DecodeError::new(
        RejectReason::OutOfRange(field),
        format!("{field} {v} is too large: at most {MAX_DURATION_MS} ms (100 years)"),
    )
}

/// Files an unknown top-level field, given its value's JSON text.
fn put_unknown<'de>(extra: &mut Vec<Attr<'de>>, key: Cow<'de, str>, text: &'de str) {
    // Unknown fields never make an event invalid. Strings go to attrs as
    // they are; other values keep their JSON text so nothing the producer
    // sent is lost.
    let value = if text.len() >= 2 && text.starts_with('"') && !text.as_bytes().contains(&b'\\') {
        // A string without escapes: its text between the quotes.
        Cow::Borrowed(&text[1..text.len() - 1])
    } else if text.starts_with('"') {
        match serde_json::from_str::<Cow<'de, str>>(text) {
            Ok(s) => s,
            Err(_) => Cow::Borrowed(text),
        }
    } else {
        Cow::Borrowed(text)
    };
    if text != "null" {
        extra.push((key, value));
    }
}

/// Epoch milliseconds (signed or not) as microseconds, if chrono can
/// represent them.
fn epoch_ms_micros(ms: impl TryInto<i64>) -> Option<i64> {
    ms.try_into()
        .ok()
        .and_then(|ms: i64| ms.checked_mul(1000))
        .filter(|us| chrono::DateTime::from_timestamp_micros(*us).is_some())
}

/// Exactly `digits` lowercase hex digits.
#[inline(always)]
fn is_lower_hex(s: &str, digits: usize) -> bool {
    // A fold rather than `all`: without the early exit it vectorises.
    s.len() == digits
        && s.bytes()
            .fold(true, |ok, b| ok & matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

type Attr<'de> = (Cow<'de, str>, Cow<'de, str>);

/// Sorts pairs by key and keeps the last value of a repeated key.
fn sort_last_wins(pairs: &mut Vec<Attr<'_>>) {
    if pairs.len() > 1 {
        // Stable: equal keys stay in input order.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        // `dedup_by` drops the later of two equal keys; hand its value to
        // the one kept first, so that the last value wins.
        pairs.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                std::mem::swap(&mut later.1, &mut kept.1);
                true
            } else {
                false
            }
        });
    }
}

/// Merges two key-sorted, key-unique lists; on a shared key `explicit` wins.
fn merge_explicit_first<'de>(explicit: Vec<Attr<'de>>, extra: Vec<Attr<'de>>) -> Vec<Attr<'de>> {
    let mut out = Vec::with_capacity(explicit.len() + extra.len());
    let mut a = explicit.into_iter().peekable();
    let mut b = extra.into_iter().peekable();
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => match x.0.cmp(&y.0) {
                std::cmp::Ordering::Less => true,
                std::cmp::Ordering::Greater => false,
                std::cmp::Ordering::Equal => {
                    b.next();
                    true
                }
            },
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_a { a.next() } else { b.next() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_attributes_name_every_field_but_ts_and_attrs() {
        for f in Field::ALL {
            match f.otlp_attribute() {
                Some(a) => {
                    assert_eq!(Field::of_otlp_attribute(a), Some(f));
                    let expected = match f {
                        Field::LeaseId => "lease.id".to_string(),
                        _ => format!("lease.{f}"),
                    };
                    assert_eq!(a, expected);
                }
                None => assert!(matches!(f, Field::Ts | Field::Attrs)),
            }
        }
        for odd in [
            "lease.lease_id",
            "lease.ts",
            "lease.attrs",
            "kind",
            "lease.",
        ] {
            assert_eq!(Field::of_otlp_attribute(odd), None, "{odd}");
        }
    }

    #[test]
    fn from_key_inverts_as_str() {
        for f in Field::ALL {
            assert_eq!(Field::from_key(f.as_str()), Some(f));
        }
        // Same length and first byte as a field, but not it.
        for odd in [
            "Ts",
            "",
            "tz",
            "kinds",
            "kine",
            "attrz",
            "source_",
            "sourcx",
            "ttl_mx",
            "backenx",
            "mono_mx",
            "lease_ix",
            "holder_ix",
            "max_tokex",
            "latency_mx",
            "fencing_tokex",
            "deadline_mono_mx",
            "keepalive_sent_mono_mx",
            "é",
        ] {
            assert_eq!(Field::from_key(odd), None, "{odd:?}");
        }
    }
}
