//! Typed configuration of the ingest pipeline. Durations and sizes are
//! types with units in their names; unknown keys are an error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

/// When buffered messages are written to the lake: whichever limit is
/// reached first.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlushPolicy {
    /// Flush once this many messages (events, duplicates and rejects) are
    /// buffered.
    pub max_rows: usize,
    /// Flush once the buffered messages' raw bytes reach this size.
    pub max_bytes: ByteSize,
    /// Flush at most this long after the first buffered message arrived,
    /// so the lake is never further behind than this. It is also the
    /// longest an alert waits for the commit of the event that raises it:
    /// the alert engine sees only what the lake holds.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// When the input has gone quiet (a short poll brought nothing), flush
    /// once the first buffered message is this old. A trickle of events
    /// then reaches the lake, and the alert engine, within about this
    /// long, while a steady stream or a backlog flushes at the limits
    /// above, in bigger files. At or above `flush_interval` it does
    /// nothing.
    #[serde(with = "humantime_serde")]
    pub idle_flush: Duration,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy {
            max_rows: 200_000,
            max_bytes: ByteSize::mib(64),
            flush_interval: Duration::from_millis(500),
            idle_flush: Duration::from_millis(100),
        }
    }
}

/// Background merging of small files and deletion of replaced ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// Run compaction in `leaseline ingest` / `serve`.
    pub enabled: bool,
    /// How often to look for small files.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Size merged files aim for; files of half this size or more are left alone.
    pub target_file_bytes: ByteSize,
    /// How long a replaced file stays on storage for readers still
    /// scanning it, and how old an uncommitted file must be before vacuum
    /// deletes it.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How long `lease_events` and `lease_rejects` keep a day: a `date`
    /// partition is removed once all of it is older than this. Default
    /// forever.
    pub keep_events: Keep,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            enabled: true,
            interval: Duration::from_secs(60),
            target_file_bytes: ByteSize::mib(128),
            retention: Duration::from_secs(3600),
            keep_events: Keep::Forever,
        }
    }
}

/// How long to keep something: `"forever"` or a duration (`"90d"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Forever,
    For(Duration),
}

impl Keep {
    /// The first UTC day to keep at `now`, if any day is to go: a day goes
    /// once all of it is older than the duration.
    pub fn first_day_kept(&self, now: chrono::DateTime<chrono::Utc>) -> Option<chrono::NaiveDate> {
        match self {
            Keep::Forever => None,
            Keep::For(d) => {
                let d = chrono::Duration::from_std(*d).ok()?;
                Some(now.checked_sub_signed(d)?.date_naive())
            }
        }
    }
}

impl std::str::FromStr for Keep {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        if s.trim() == "forever" {
            return Ok(Keep::Forever);
        }
        match humantime_serde::re::humantime::parse_duration(s) {
            Ok(d) if d.is_zero() => Err(format!(
                "{s:?} would keep nothing; give a duration such as \"90d\", or \"forever\""
            )),
            Ok(d) => Ok(Keep::For(d)),
            Err(e) => Err(format!(
                "{s:?} is neither \"forever\" nor a duration such as \"90d\": {e}"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The Kafka source.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Consumer group; ingesters of one group split the partitions.
    pub group_id: String,
    /// Extra librdkafka properties passed through as they are (TLS, SASL,
    /// timeouts), e.g. `"security.protocol" = "SASL_SSL"`.
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties whose value is the first line of a file, for
    /// secrets that should sit in neither the configuration nor the
    /// environment, e.g. `"sasl.password" = "/run/secrets/kafka"`. Read
    /// when the consumer is created.
    pub property_files: BTreeMap<String, PathBuf>,
    /// What a message holds: one contract event as JSON (`json`), or an
    /// OpenTelemetry logs export as the Collector's Kafka exporter writes
    /// it (`otlp_proto`, `otlp_json`), each log record an event; see
    /// [`crate::otlp`].
    pub encoding: crate::otlp::Encoding,
    /// How far ahead in event time one partition may be read of the
    /// slowest partition still being read; a partition further ahead is
    /// paused until the others catch up ([`crate::align`]). This bounds
    /// what the alert engine holds past its watermark while a backlog is
    /// read. Zero (the default) reads every partition as fast as it comes:
    /// resuming a paused partition fetches from inside a record batch,
    /// which a broker that answers with the next batch (tansu 0.6) turns
    /// into lost messages.
    #[serde(with = "humantime_serde")]
    pub max_drift: std::time::Duration,
}

/// Whether a librdkafka property holds a secret: its value is shown
/// nowhere (`Debug`, logs, errors).
pub fn is_secret_property(key: &str) -> bool {
    key.contains("password")
        || key.contains("secret")
        || matches!(key, "ssl.key.pem" | "sasl.oauthbearer.config")
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let v = if is_secret_property(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topics", &self.topics)
            .field("group_id", &self.group_id)
            .field("properties", &properties)
            .field("property_files", &self.property_files)
            .field("encoding", &self.encoding)
            .field("max_drift", &self.max_drift)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            topics: vec!["lease-events".into()],
            group_id: "leaseline".into(),
            properties: BTreeMap::new(),
            property_files: BTreeMap::new(),
            encoding: crate::otlp::Encoding::Json,
            max_drift: Duration::ZERO,
        }
    }
}
