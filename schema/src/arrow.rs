//! Arrow schemas of the lake tables and builders that append decoded
//! events and rejects to them.

use std::sync::{Arc, LazyLock};

use arrow::array::{
    Array, ArrayRef, BinaryBuilder, Float64Builder, Int32Builder, Int64Builder, PrimitiveArray,
    PrimitiveBuilder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder, UInt64Builder,
};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::decode::DecodeError;
use crate::event::{LeaseEvent, Origin};

/// Bumped whenever a table's columns change; stored in each Parquet file's
/// key-value metadata under [`SCHEMA_VERSION_KEY`].
pub const SCHEMA_VERSION: u32 = 1;
pub const SCHEMA_VERSION_KEY: &str = "leaseline.schema_version";

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn origin_fields() -> Vec<Field> {
    vec![
        Field::new("kafka_topic", DataType::Utf8, true),
        Field::new("kafka_partition", DataType::Int32, true),
        Field::new("kafka_offset", DataType::Int64, true),
        Field::new("file_path", DataType::Utf8, true),
        Field::new("file_line", DataType::Int64, true),
        Field::new("ingested_at", ts_type(), false),
    ]
}

/// Columns of `lease_events`: every contract field, then the origin.
pub static EVENTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields = vec![
        Field::new("ts", ts_type(), false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("lease_id", DataType::Utf8, false),
        Field::new("holder_id", DataType::Utf8, true),
        Field::new("fencing_token", DataType::UInt64, true),
        Field::new("ttl_ms", DataType::Int64, true),
        Field::new("event_id", DataType::Utf8, true),
        Field::new("backend", DataType::Utf8, true),
        Field::new("latency_ms", DataType::Float64, true),
        Field::new("reason", DataType::Utf8, true),
        Field::new("max_token", DataType::UInt64, true),
        Field::new("mono_ms", DataType::Float64, true),
        Field::new("keepalive_sent_mono_ms", DataType::Float64, true),
        Field::new("deadline_mono_ms", DataType::Float64, true),
        Field::new("trace_id", DataType::Utf8, true),
        Field::new("span_id", DataType::Utf8, true),
        // A JSON object of strings: readable by every engine and wire protocol.
        Field::new("attrs", DataType::Utf8, true),
    ];
    fields.extend(origin_fields());
    Arc::new(Schema::new(fields))
});

/// Columns of `lease_rejects`: the raw message, why, and where it came from.
pub static REJECTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields = vec![
        Field::new("raw", DataType::Binary, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new("message", DataType::Utf8, false),
    ];
    fields.extend(origin_fields());
    Arc::new(Schema::new(fields))
});

/// Columns of `lease_alerts`: one row per alert state change (pending,
/// firing, resolved), written by the alert engine. `lease_id`, `holder_id`
/// and `backend` are null for alerts about the whole fleet; `kind` names the
/// violation kind of a safety alert and the scope (`lease`, `fleet`) of a
/// token-churn alert.
pub static ALERTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("alertname", DataType::Utf8, false),
        Field::new("lease_id", DataType::Utf8, true),
        Field::new("holder_id", DataType::Utf8, true),
        Field::new("backend", DataType::Utf8, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("severity", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("starts_at", ts_type(), false),
        Field::new("ends_at", ts_type(), true),
        Field::new("summary", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("recorded_at", ts_type(), false),
        Field::new("notified", DataType::Boolean, false),
    ]))
});

/// The most rows a finished builder keeps room for; a rare giant batch
/// must not pin its memory for good.
const MAX_KEPT_ROWS: usize = 65_536;

/// Arrow's `finish` leaves a builder with no capacity, so every batch
/// regrew each buffer from empty: about a fifth of decode-to-Arrow time.
/// These finish a column and leave the builder with room for a batch like
/// the one just taken.
fn take_strings(b: &mut StringBuilder) -> ArrayRef {
    let a = b.finish();
    let rows = a.len().min(MAX_KEPT_ROWS);
    let bytes = a.value_data().len() / a.len().max(1) * rows;
    *b = StringBuilder::with_capacity(rows, bytes);
    Arc::new(a)
}

fn take_values<T: ArrowPrimitiveType>(b: &mut PrimitiveBuilder<T>) -> PrimitiveArray<T> {
    let a = b.finish();
    *b = PrimitiveBuilder::with_capacity(a.len().min(MAX_KEPT_ROWS));
    a
}

#[derive(Default)]
struct OriginBuilder {
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    file: StringBuilder,
    line: Int64Builder,
    ingested_at: TimestampMicrosecondBuilder,
}

impl OriginBuilder {
    fn append(&mut self, origin: &Origin<'_>, ingested_at_us: i64) {
        match *origin {
            Origin::Kafka {
                topic,
                partition,
                offset,
            } => {
                self.topic.append_value(topic);
                self.partition.append_value(partition);
                self.offset.append_value(offset);
                self.file.append_null();
                self.line.append_null();
            }
            Origin::File { path, line } => {
                self.topic.append_null();
                self.partition.append_null();
                self.offset.append_null();
                self.file.append_value(path);
                self.line.append_value(line as i64);
            }
        }
        self.ingested_at.append_value(ingested_at_us);
    }

    fn finish(&mut self, out: &mut Vec<ArrayRef>) {
        out.push(take_strings(&mut self.topic));
        out.push(Arc::new(take_values(&mut self.partition)));
        out.push(Arc::new(take_values(&mut self.offset)));
        out.push(take_strings(&mut self.file));
        out.push(Arc::new(take_values(&mut self.line)));
        out.push(Arc::new(
            take_values(&mut self.ingested_at).with_timezone("UTC"),
        ));
    }
}

/// Appends events to the columns of `lease_events`.
#[derive(Default)]
pub struct EventBatchBuilder {
    ts: TimestampMicrosecondBuilder,
    kind: StringBuilder,
    source: StringBuilder,
    lease_id: StringBuilder,
    holder_id: StringBuilder,
    fencing_token: UInt64Builder,
    ttl_ms: Int64Builder,
    event_id: StringBuilder,
    backend: StringBuilder,
    latency_ms: Float64Builder,
    reason: StringBuilder,
    max_token: UInt64Builder,
    mono_ms: Float64Builder,
    keepalive_sent_mono_ms: Float64Builder,
    deadline_mono_ms: Float64Builder,
    trace_id: StringBuilder,
    span_id: StringBuilder,
    attrs: StringBuilder,
    origin: OriginBuilder,
    rows: usize,
    /// Reused for each event's attrs JSON, so appending allocates nothing.
    attrs_scratch: Vec<u8>,
}

impl EventBatchBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn append(&mut self, e: &LeaseEvent<'_>, origin: &Origin<'_>, ingested_at_us: i64) {
        self.ts.append_value(e.ts_us);
        self.kind.append_value(e.kind.as_str());
        self.source.append_value(e.source.as_str());
        self.lease_id.append_value(&e.lease_id);
        self.holder_id.append_option(e.holder_id.as_deref());
        self.fencing_token.append_option(e.fencing_token);
        self.ttl_ms.append_option(e.ttl_ms);
        self.event_id.append_option(e.event_id.as_deref());
        self.backend.append_option(e.backend.as_deref());
        self.latency_ms.append_option(e.latency_ms);
        self.reason.append_option(e.reason.as_deref());
        self.max_token.append_option(e.max_token);
        self.mono_ms.append_option(e.mono_ms);
        self.keepalive_sent_mono_ms
            .append_option(e.keepalive_sent_mono_ms);
        self.deadline_mono_ms.append_option(e.deadline_mono_ms);
        self.trace_id.append_option(e.trace_id.as_deref());
        self.span_id.append_option(e.span_id.as_deref());
        if e.attrs.is_empty() {
            self.attrs.append_null();
        } else {
            self.attrs_scratch.clear();
            e.write_attrs_json(&mut self.attrs_scratch);
            self.attrs.append_value(
                std::str::from_utf8(&self.attrs_scratch).expect("serde_json writes UTF-8"),
            );
        }
        self.origin.append(origin, ingested_at_us);
        self.rows += 1;
    }

    /// Takes the rows appended so far as one batch; the builder is left empty.
    pub fn finish(&mut self) -> RecordBatch {
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(take_values(&mut self.ts).with_timezone("UTC")),
            take_strings(&mut self.kind),
            take_strings(&mut self.source),
            take_strings(&mut self.lease_id),
            take_strings(&mut self.holder_id),
            Arc::new(take_values(&mut self.fencing_token)),
            Arc::new(take_values(&mut self.ttl_ms)),
            take_strings(&mut self.event_id),
            take_strings(&mut self.backend),
            Arc::new(take_values(&mut self.latency_ms)),
            take_strings(&mut self.reason),
            Arc::new(take_values(&mut self.max_token)),
            Arc::new(take_values(&mut self.mono_ms)),
            Arc::new(take_values(&mut self.keepalive_sent_mono_ms)),
            Arc::new(take_values(&mut self.deadline_mono_ms)),
            take_strings(&mut self.trace_id),
            take_strings(&mut self.span_id),
            take_strings(&mut self.attrs),
        ];
        self.origin.finish(&mut cols);
        self.rows = 0;
        RecordBatch::try_new(EVENTS_SCHEMA.clone(), cols)
            .expect("event columns match EVENTS_SCHEMA by construction")
    }
}

/// Appends refused messages to the columns of `lease_rejects`.
#[derive(Default)]
pub struct RejectBatchBuilder {
    raw: BinaryBuilder,
    reason: StringBuilder,
    message: StringBuilder,
    origin: OriginBuilder,
    rows: usize,
}

impl RejectBatchBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn append(
        &mut self,
        raw: &[u8],
        err: &DecodeError,
        origin: &Origin<'_>,
        ingested_at_us: i64,
    ) {
        self.raw.append_value(raw);
        self.reason.append_value(err.reason.to_string());
        self.message.append_value(&err.message);
        self.origin.append(origin, ingested_at_us);
        self.rows += 1;
    }

    pub fn finish(&mut self) -> RecordBatch {
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.raw.finish()),
            Arc::new(self.reason.finish()),
            Arc::new(self.message.finish()),
        ];
        self.origin.finish(&mut cols);
        self.rows = 0;
        RecordBatch::try_new(REJECTS_SCHEMA.clone(), cols)
            .expect("reject columns match REJECTS_SCHEMA by construction")
    }
}
