//! The typed lease transition event.

use std::borrow::Cow;
use std::fmt;

/// What happened: the `kind` field of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    AcquireRequested,
    Acquired,
    AcquireFailed,
    Renewed,
    RenewFailed,
    DrainStarted,
    Fenced,
    Released,
    Expired,
    Revoked,
    WriteAccepted,
    StaleWriteRejected,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::AcquireRequested,
        Kind::Acquired,
        Kind::AcquireFailed,
        Kind::Renewed,
        Kind::RenewFailed,
        Kind::DrainStarted,
        Kind::Fenced,
        Kind::Released,
        Kind::Expired,
        Kind::Revoked,
        Kind::WriteAccepted,
        Kind::StaleWriteRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AcquireRequested => "acquire_requested",
            Kind::Acquired => "acquired",
            Kind::AcquireFailed => "acquire_failed",
            Kind::Renewed => "renewed",
            Kind::RenewFailed => "renew_failed",
            Kind::DrainStarted => "drain_started",
            Kind::Fenced => "fenced",
            Kind::Released => "released",
            Kind::Expired => "expired",
            Kind::Revoked => "revoked",
            Kind::WriteAccepted => "write_accepted",
            Kind::StaleWriteRejected => "stale_write_rejected",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        // A match rather than a search of ALL: one length dispatch instead of
        // up to twelve compares per event. `kind_parse_inverts_as_str` keeps
        // the two in step.
        Some(match s {
            "acquire_requested" => Kind::AcquireRequested,
            "acquired" => Kind::Acquired,
            "acquire_failed" => Kind::AcquireFailed,
            "renewed" => Kind::Renewed,
            "renew_failed" => Kind::RenewFailed,
            "drain_started" => Kind::DrainStarted,
            "fenced" => Kind::Fenced,
            "released" => Kind::Released,
            "expired" => Kind::Expired,
            "revoked" => Kind::Revoked,
            "write_accepted" => Kind::WriteAccepted,
            "stale_write_rejected" => Kind::StaleWriteRejected,
            _ => return None,
        })
    }

    /// Kinds on which the contract requires `fencing_token`.
    pub fn requires_fencing_token(self) -> bool {
        matches!(
            self,
            Kind::Acquired
                | Kind::Renewed
                | Kind::Released
                | Kind::Expired
                | Kind::Revoked
                | Kind::Fenced
                | Kind::WriteAccepted
                | Kind::StaleWriteRejected
        )
    }

    /// Resource-side kinds, where `holder_id` is optional.
    pub fn holder_optional(self) -> bool {
        matches!(self, Kind::WriteAccepted | Kind::StaleWriteRejected)
    }

    /// Kinds that end a grant.
    pub fn is_end(self) -> bool {
        matches!(self, Kind::Released | Kind::Expired | Kind::Revoked)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who observed the transition: the `source` field of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Coordinator,
    Holder,
    Resource,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Coordinator, Source::Holder, Source::Resource];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Coordinator => "coordinator",
            Source::Holder => "holder",
            Source::Resource => "resource",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One valid lease transition event.
///
/// Strings borrow from the decoded input where JSON escaping allows it, so
/// decoding straight into Arrow allocates little; [`LeaseEvent::into_owned`]
/// detaches an event from its input.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseEvent<'a> {
    /// Emitter wall-clock time, microseconds since the Unix epoch, UTC.
    pub ts_us: i64,
    pub kind: Kind,
    pub source: Source,
    pub lease_id: Cow<'a, str>,
    pub holder_id: Option<Cow<'a, str>>,
    pub fencing_token: Option<u64>,
    pub ttl_ms: Option<i64>,
    pub event_id: Option<Cow<'a, str>>,
    pub backend: Option<Cow<'a, str>>,
    pub latency_ms: Option<f64>,
    pub reason: Option<Cow<'a, str>>,
    pub max_token: Option<u64>,
    pub mono_ms: Option<f64>,
    pub keepalive_sent_mono_ms: Option<f64>,
    pub deadline_mono_ms: Option<f64>,
    pub trace_id: Option<Cow<'a, str>>,
    pub span_id: Option<Cow<'a, str>>,
    /// `attrs` plus unknown top-level fields, sorted by key, keys unique.
    pub attrs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

fn own(c: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(c.into_owned())
}

impl LeaseEvent<'_> {
    pub fn into_owned(self) -> LeaseEvent<'static> {
        LeaseEvent {
            ts_us: self.ts_us,
            kind: self.kind,
            source: self.source,
            lease_id: own(self.lease_id),
            holder_id: self.holder_id.map(own),
            fencing_token: self.fencing_token,
            ttl_ms: self.ttl_ms,
            event_id: self.event_id.map(own),
            backend: self.backend.map(own),
            latency_ms: self.latency_ms,
            reason: self.reason.map(own),
            max_token: self.max_token,
            mono_ms: self.mono_ms,
            keepalive_sent_mono_ms: self.keepalive_sent_mono_ms,
            deadline_mono_ms: self.deadline_mono_ms,
            trace_id: self.trace_id.map(own),
            span_id: self.span_id.map(own),
            attrs: self
                .attrs
                .into_iter()
                .map(|(k, v)| (own(k), own(v)))
                .collect(),
        }
    }

    /// `attrs` as a compact JSON object, or `None` when there are none.
    pub fn attrs_json(&self) -> Option<String> {
        if self.attrs.is_empty() {
            return None;
        }
        let mut out = String::new();
        self.write_attrs_json(&mut out);
        Some(out)
    }

    /// Appends [`LeaseEvent::attrs_json`] to `out` (nothing when there are
    /// no attrs), for writers that reuse one buffer.
    pub fn write_attrs_json(&self, out: &mut String) {
        if self.attrs.is_empty() {
            return;
        }
        // Decoded events hold attrs sorted by key with unique keys, so the
        // object can be written straight out, in the same order and with the
        // same escaping as the map below (which sorts, and keeps the last of
        // a repeated key) produces for any other event.
        if self.attrs.windows(2).all(|w| w[0].0 < w[1].0) {
            out.push('{');
            for (i, (k, v)) in self.attrs.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, k);
                out.push(':');
                write_json_string(out, v);
            }
            out.push('}');
            return;
        }
        let map: serde_json::Map<String, serde_json::Value> = self
            .attrs
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        out.push_str(&serde_json::Value::Object(map).to_string());
    }
}

/// `s` as a JSON string, escaped exactly as serde_json escapes it. Nearly
/// every attr needs no escape (serde_json escapes only `"`, `\` and control
/// characters), and then it is copied as it is.
fn write_json_string(out: &mut String, s: &str) {
    // A fold rather than `all`: without the early exit it vectorises.
    let plain = !s.bytes().fold(false, |odd, b| {
        odd | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(s).to_string());
    }
}

/// Where a message came from, kept with every event and every reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin<'a> {
    Kafka {
        topic: &'a str,
        partition: i32,
        offset: i64,
    },
    File {
        path: &'a str,
        /// 1-based line number.
        line: u64,
    },
    /// One of several records in a Kafka message (an OTLP export holds a
    /// batch of log records): stored like `Kafka`, with the 1-based record
    /// number in the `file_line` column.
    KafkaRecord {
        topic: &'a str,
        partition: i32,
        offset: i64,
        record: u32,
    },
}

impl<'a> Origin<'a> {
    /// Topic, partition and offset of a message read from Kafka.
    pub fn kafka_position(&self) -> Option<(&'a str, i32, i64)> {
        match *self {
            Origin::Kafka {
                topic,
                partition,
                offset,
            }
            | Origin::KafkaRecord {
                topic,
                partition,
                offset,
                ..
            } => Some((topic, partition, offset)),
            Origin::File { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Kind, Source};

    #[test]
    fn kind_parse_inverts_as_str() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        for s in Source::ALL {
            assert_eq!(Source::parse(s.as_str()), Some(s));
        }
        for odd in ["", "Acquired", "acquired ", "lease", "acquire"] {
            assert_eq!(Kind::parse(odd), None, "{odd:?}");
        }
    }
}
