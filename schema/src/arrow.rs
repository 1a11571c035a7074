//! Arrow schemas of the lake tables and builders that append decoded
//! events and rejects to them.

use std::sync::{Arc, LazyLock};

use arrow::array::{
    ArrayRef, BinaryBuilder, PrimitiveArray, RecordBatch, StringArray, StringBuilder,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Float64Type, Int32Type, Int64Type, Schema, SchemaRef,
    TimeUnit, TimestampMicrosecondType, UInt64Type,
};

use crate::decode::DecodeError;
use crate::event::{LeaseEvent, Origin};

/// Bumped whenever a table's stored columns change (2: Delta tables,
/// unsigned tokens as `decimal(20,0)`); stored in each Parquet file's
/// key-value metadata under [`SCHEMA_VERSION_KEY`].
pub const SCHEMA_VERSION: u32 = 2;
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

/// How many of [`EVENTS_SCHEMA`]'s columns are the contract's fields
/// (the rest say where a row came from).
pub const CONTRACT_COLUMNS: usize = 18;

/// Columns of the lake's stored `lease_context`: the contract's fields of
/// the events an audit cut keeps, then the lease's cut as
/// `settled_before` (see `alerts/src/stored.rs`).
pub static STORED_CONTEXT_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields: Vec<Field> = EVENTS_SCHEMA.fields()[..CONTRACT_COLUMNS]
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(crate::audit::SETTLED_BEFORE, ts_type(), false));
    Arc::new(Schema::new(fields))
});

/// `events` as `lease_context` rows, each with `cut` as `settled_before`.
pub fn context_batch(events: &[(&LeaseEvent<'_>, i64)]) -> RecordBatch {
    let mut b = EventBatchBuilder::new();
    let origin = Origin::File { path: "", line: 0 };
    for (e, _) in events {
        b.append(e, &origin, 0);
    }
    let batch = b.finish();
    let mut cols: Vec<ArrayRef> = batch.columns()[..CONTRACT_COLUMNS].to_vec();
    let cuts: Vec<i64> = events.iter().map(|(_, cut)| *cut).collect();
    cols.push(timestamps(
        PrimitiveArray::<TimestampMicrosecondType>::from(cuts),
    ));
    RecordBatch::try_new(STORED_CONTEXT_SCHEMA.clone(), cols)
        .expect("context columns match STORED_CONTEXT_SCHEMA by construction")
}

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

// Arrow's array builders cost about a third of decode-to-Arrow time: every
// append is an out-of-line call through null-buffer and offset checks, over
// 24 columns per event. These columns keep Arrow's layout in plain vectors
// whose appends inline, and hand the vectors to Arrow (without copying) when
// a batch is taken. Each leaves room for a batch like the one just taken,
// since regrowing from empty was once a fifth of the time.

/// Validity of a nullable column, packed as Arrow's bitmap as rows come.
/// Until the first null nothing is stored but the count, as in Arrow's
/// `NullBufferBuilder`: most columns of most batches have no nulls, or no
/// valid rows at all, and then the batch needs no bitmap.
#[derive(Default)]
struct Validity {
    /// Arrow's validity bits (least significant first) of every completed
    /// 64 rows, once materialised.
    bits: Vec<u8>,
    /// The bits of the rows after those in `bits`: a register's worth is
    /// gathered before it is stored.
    word: u64,
    materialised: bool,
    rows: usize,
    nulls: usize,
}

impl Validity {
    #[inline(always)]
    fn push(&mut self, valid: bool) {
        if !self.materialised {
            if valid {
                self.rows += 1;
                return;
            }
            self.materialise();
        }
        self.word |= u64::from(valid) << (self.rows % 64);
        self.rows += 1;
        self.nulls += usize::from(!valid);
        if self.rows.is_multiple_of(64) {
            self.bits.extend_from_slice(&self.word.to_le_bytes());
            self.word = 0;
        }
    }

    /// At the first null: the bits of the rows so far, all valid.
    #[cold]
    fn materialise(&mut self) {
        self.materialised = true;
        self.bits.resize(self.rows / 64 * 8, 0xff);
        let partial = self.rows % 64;
        self.word = if partial == 0 {
            0
        } else {
            (1u64 << partial) - 1
        };
    }

    fn take(&mut self, keep: usize) -> Option<NullBuffer> {
        let rows = std::mem::take(&mut self.rows);
        let nulls = std::mem::take(&mut self.nulls);
        let word = std::mem::take(&mut self.word);
        let mut bits = std::mem::take(&mut self.bits);
        // Keep room for a batch like this one only where it needed a bitmap.
        if std::mem::take(&mut self.materialised) {
            self.bits.reserve(keep.div_ceil(8));
        }
        if nulls == 0 {
            return None;
        }
        bits.extend_from_slice(&word.to_le_bytes()[..(rows % 64).div_ceil(8)]);
        Some(NullBuffer::new(BooleanBuffer::new(
            Buffer::from_vec(bits),
            0,
            rows,
        )))
    }
}

/// A nullable Utf8 column.
struct Strings {
    /// Starts with 0, one more entry than rows, as Arrow wants.
    offsets: Vec<i32>,
    bytes: Vec<u8>,
    validity: Validity,
}

impl Default for Strings {
    fn default() -> Self {
        Strings {
            offsets: vec![0],
            bytes: Vec::new(),
            validity: Validity::default(),
        }
    }
}

impl Strings {
    #[inline(always)]
    fn push(&mut self, s: Option<&str>) {
        if let Some(s) = s {
            self.bytes.extend_from_slice(s.as_bytes());
        }
        self.validity.push(s.is_some());
        // Arrow's own builders panic the same way past 2 GiB of text.
        let end = i32::try_from(self.bytes.len()).expect("a batch's strings fit i32 offsets");
        self.offsets.push(end);
    }

    fn take(&mut self) -> ArrayRef {
        let rows = self.offsets.len() - 1;
        let keep = rows.min(MAX_KEPT_ROWS);
        let bytes_kept = self.bytes.len() / rows.max(1) * keep;
        let offsets = std::mem::replace(&mut self.offsets, Vec::with_capacity(keep + 1));
        self.offsets.push(0);
        let bytes = std::mem::replace(&mut self.bytes, Vec::with_capacity(bytes_kept));
        let nulls = self.validity.take(keep);
        Arc::new(StringArray::new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from_vec(bytes),
            nulls,
        ))
    }
}

/// A nullable column of fixed-width values.
struct Values<T: ArrowPrimitiveType> {
    values: Vec<T::Native>,
    validity: Validity,
}

impl<T: ArrowPrimitiveType> Default for Values<T> {
    fn default() -> Self {
        Values {
            values: Vec::new(),
            validity: Validity::default(),
        }
    }
}

impl<T: ArrowPrimitiveType> Values<T> {
    #[inline(always)]
    fn push(&mut self, v: Option<T::Native>) {
        self.values.push(v.unwrap_or_default());
        self.validity.push(v.is_some());
    }

    fn take(&mut self) -> PrimitiveArray<T> {
        let keep = self.values.len().min(MAX_KEPT_ROWS);
        let values = std::mem::replace(&mut self.values, Vec::with_capacity(keep));
        PrimitiveArray::new(ScalarBuffer::from(values), self.validity.take(keep))
    }
}

fn timestamps(a: PrimitiveArray<TimestampMicrosecondType>) -> ArrayRef {
    Arc::new(a.with_timezone("UTC"))
}

#[derive(Default)]
struct OriginBuilder {
    topic: Strings,
    partition: Values<Int32Type>,
    offset: Values<Int64Type>,
    file: Strings,
    line: Values<Int64Type>,
    ingested_at: Values<TimestampMicrosecondType>,
}

impl OriginBuilder {
    #[inline]
    fn append(&mut self, origin: &Origin<'_>, ingested_at_us: i64) {
        match *origin {
            Origin::Kafka {
                topic,
                partition,
                offset,
            } => {
                self.topic.push(Some(topic));
                self.partition.push(Some(partition));
                self.offset.push(Some(offset));
                self.file.push(None);
                self.line.push(None);
            }
            Origin::KafkaRecord {
                topic,
                partition,
                offset,
                record,
            } => {
                self.topic.push(Some(topic));
                self.partition.push(Some(partition));
                self.offset.push(Some(offset));
                self.file.push(None);
                self.line.push(Some(record as i64));
            }
            Origin::File { path, line } => {
                self.topic.push(None);
                self.partition.push(None);
                self.offset.push(None);
                self.file.push(Some(path));
                self.line.push(Some(line as i64));
            }
        }
        self.ingested_at.push(Some(ingested_at_us));
    }

    fn finish(&mut self, out: &mut Vec<ArrayRef>) {
        out.push(self.topic.take());
        out.push(Arc::new(self.partition.take()));
        out.push(Arc::new(self.offset.take()));
        out.push(self.file.take());
        out.push(Arc::new(self.line.take()));
        out.push(timestamps(self.ingested_at.take()));
    }
}

/// Appends events to the columns of `lease_events`.
#[derive(Default)]
pub struct EventBatchBuilder {
    ts: Values<TimestampMicrosecondType>,
    kind: Strings,
    source: Strings,
    lease_id: Strings,
    holder_id: Strings,
    fencing_token: Values<UInt64Type>,
    ttl_ms: Values<Int64Type>,
    event_id: Strings,
    backend: Strings,
    latency_ms: Values<Float64Type>,
    reason: Strings,
    max_token: Values<UInt64Type>,
    mono_ms: Values<Float64Type>,
    keepalive_sent_mono_ms: Values<Float64Type>,
    deadline_mono_ms: Values<Float64Type>,
    trace_id: Strings,
    span_id: Strings,
    attrs: Strings,
    origin: OriginBuilder,
    rows: usize,
    /// Reused for each event's attrs JSON, so appending allocates nothing.
    attrs_scratch: String,
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
        self.ts.push(Some(e.ts_us));
        self.kind.push(Some(e.kind.as_str()));
        self.source.push(Some(e.source.as_str()));
        self.lease_id.push(Some(&e.lease_id));
        self.holder_id.push(e.holder_id.as_deref());
        self.fencing_token.push(e.fencing_token);
        self.ttl_ms.push(e.ttl_ms);
        self.event_id.push(e.event_id.as_deref());
        self.backend.push(e.backend.as_deref());
        self.latency_ms.push(e.latency_ms);
        self.reason.push(e.reason.as_deref());
        self.max_token.push(e.max_token);
        self.mono_ms.push(e.mono_ms);
        self.keepalive_sent_mono_ms.push(e.keepalive_sent_mono_ms);
        self.deadline_mono_ms.push(e.deadline_mono_ms);
        self.trace_id.push(e.trace_id.as_deref());
        self.span_id.push(e.span_id.as_deref());
        if e.attrs.is_empty() {
            self.attrs.push(None);
        } else {
            self.attrs_scratch.clear();
            e.write_attrs_json(&mut self.attrs_scratch);
            self.attrs.push(Some(&self.attrs_scratch));
        }
        self.origin.append(origin, ingested_at_us);
        self.rows += 1;
    }

    /// Takes the rows appended so far as one batch; the builder is left empty.
    pub fn finish(&mut self) -> RecordBatch {
        let mut cols: Vec<ArrayRef> = vec![
            timestamps(self.ts.take()),
            self.kind.take(),
            self.source.take(),
            self.lease_id.take(),
            self.holder_id.take(),
            Arc::new(self.fencing_token.take()),
            Arc::new(self.ttl_ms.take()),
            self.event_id.take(),
            self.backend.take(),
            Arc::new(self.latency_ms.take()),
            self.reason.take(),
            Arc::new(self.max_token.take()),
            Arc::new(self.mono_ms.take()),
            Arc::new(self.keepalive_sent_mono_ms.take()),
            Arc::new(self.deadline_mono_ms.take()),
            self.trace_id.take(),
            self.span_id.take(),
            self.attrs.take(),
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

#[cfg(test)]
mod tests {
    use super::Validity;

    /// Every pattern of nulls, including the first null after 0 to 17
    /// valid rows or around a 64-row word, and runs across byte and word
    /// edges, packs as Arrow would.
    #[test]
    fn validity_packs_like_arrow() {
        let mut v = Validity::default();
        for first_null in (0..18).chain([63, 64, 65, 127, 128, 129]) {
            for len in [
                first_null,
                first_null + 1,
                first_null + 9,
                first_null + 64,
                40,
                200,
            ] {
                if len < first_null {
                    continue;
                }
                let want: Vec<bool> = (0..len)
                    .map(|i| i < first_null || (i - first_null) % 3 == 1)
                    .collect();
                for &b in &want {
                    v.push(b);
                }
                let got = v.take(len);
                match got {
                    None => assert!(want.iter().all(|b| *b), "{want:?}"),
                    Some(nulls) => {
                        assert_eq!(nulls.len(), len);
                        let got: Vec<bool> = (0..len).map(|i| nulls.is_valid(i)).collect();
                        assert_eq!(got, want);
                    }
                }
            }
        }
    }

    #[test]
    fn context_rows_are_the_contract_columns_and_the_cut() {
        use super::*;
        let names: Vec<&str> = STORED_CONTEXT_SCHEMA
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names[CONTRACT_COLUMNS - 1], "attrs");
        assert_eq!(EVENTS_SCHEMA.field(CONTRACT_COLUMNS).name(), "kafka_topic");
        assert_eq!(names[CONTRACT_COLUMNS], crate::audit::SETTLED_BEFORE);
        let e = crate::decode_str(
            r#"{"ts":1000,"kind":"acquired","source":"coordinator","lease_id":"l","holder_id":"h","fencing_token":3,"ttl_ms":5000}"#,
        )
        .unwrap();
        let batch = context_batch(&[(&e, 7)]);
        assert_eq!(batch.num_rows(), 1);
        let cols = crate::EventColumns::new(&batch).unwrap();
        let back = cols.event(0).unwrap();
        assert_eq!((back.ts_us, back.fencing_token), (1_000_000, Some(3)));
        assert_eq!(back.holder_id.as_deref(), Some("h"));
        let cut = batch
            .column(CONTRACT_COLUMNS)
            .as_any()
            .downcast_ref::<PrimitiveArray<TimestampMicrosecondType>>()
            .unwrap();
        assert_eq!(cut.value(0), 7);
    }
}
