//! Reading `lease_events` rows back into events, so the audit can run over
//! the lake (and over rows still buffered for it).

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt64Array,
};
use arrow::compute::cast;
use arrow::datatypes::{
    DataType, Float64Type, Int64Type, TimeUnit, TimestampMicrosecondType, UInt64Type,
};

use crate::event::{Kind, LeaseEvent, Source};

/// Why a batch could not be read as `lease_events` rows.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("lease_events batch has no column {0}")]
    MissingColumn(&'static str),
    #[error("lease_events column {column}: {message}")]
    BadColumn {
        column: &'static str,
        message: String,
    },
    #[error("lease_events row {row}: {message}")]
    BadRow { row: usize, message: String },
}

/// The columns of a `lease_events` batch that the audit reads, typed.
///
/// Every contract field is read except `attrs`, which the audit never looks
/// at: events read back carry no attributes. Columns of a compatible type
/// (string views, other timestamp zones) are cast first, so a batch from any
/// engine reading the lake's Parquet files will do.
pub struct EventColumns {
    rows: usize,
    ts: TimestampMicrosecondArray,
    kind: StringArray,
    source: StringArray,
    lease_id: StringArray,
    holder_id: StringArray,
    fencing_token: UInt64Array,
    ttl_ms: Int64Array,
    event_id: StringArray,
    backend: StringArray,
    latency_ms: Float64Array,
    reason: StringArray,
    max_token: UInt64Array,
    mono_ms: Float64Array,
    keepalive_sent_mono_ms: Float64Array,
    deadline_mono_ms: Float64Array,
    trace_id: StringArray,
    span_id: StringArray,
}

fn column(
    batch: &RecordBatch,
    name: &'static str,
    to: &DataType,
) -> Result<Arc<dyn Array>, ReadError> {
    let col = batch
        .column_by_name(name)
        .ok_or(ReadError::MissingColumn(name))?;
    if col.data_type() == to {
        return Ok(col.clone());
    }
    cast(col, to).map_err(|e| ReadError::BadColumn {
        column: name,
        message: e.to_string(),
    })
}

fn strings(batch: &RecordBatch, name: &'static str) -> Result<StringArray, ReadError> {
    Ok(column(batch, name, &DataType::Utf8)?
        .as_string::<i32>()
        .clone())
}

fn u64s(batch: &RecordBatch, name: &'static str) -> Result<UInt64Array, ReadError> {
    Ok(column(batch, name, &DataType::UInt64)?
        .as_primitive::<UInt64Type>()
        .clone())
}

fn i64s(batch: &RecordBatch, name: &'static str) -> Result<Int64Array, ReadError> {
    Ok(column(batch, name, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

fn f64s(batch: &RecordBatch, name: &'static str) -> Result<Float64Array, ReadError> {
    Ok(column(batch, name, &DataType::Float64)?
        .as_primitive::<Float64Type>()
        .clone())
}

fn opt_str(a: &StringArray, row: usize) -> Option<Cow<'_, str>> {
    a.is_valid(row).then(|| Cow::Borrowed(a.value(row)))
}

fn opt<T: arrow::datatypes::ArrowPrimitiveType>(
    a: &arrow::array::PrimitiveArray<T>,
    row: usize,
) -> Option<T::Native> {
    a.is_valid(row).then(|| a.value(row))
}

impl EventColumns {
    /// The names of the columns read: every contract field but `attrs`, in
    /// the contract's order. For readers that project a file's columns.
    pub const COLUMNS: [&'static str; 17] = {
        let mut names = [""; 17];
        let mut i = 0;
        while i < names.len() {
            names[i] = crate::decode::Field::NAMES[i];
            i += 1;
        }
        names
    };

    pub fn new(batch: &RecordBatch) -> Result<EventColumns, ReadError> {
        let ts_type = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        Ok(EventColumns {
            rows: batch.num_rows(),
            ts: column(batch, "ts", &ts_type)?
                .as_primitive::<TimestampMicrosecondType>()
                .clone(),
            kind: strings(batch, "kind")?,
            source: strings(batch, "source")?,
            lease_id: strings(batch, "lease_id")?,
            holder_id: strings(batch, "holder_id")?,
            fencing_token: u64s(batch, "fencing_token")?,
            ttl_ms: i64s(batch, "ttl_ms")?,
            event_id: strings(batch, "event_id")?,
            backend: strings(batch, "backend")?,
            latency_ms: f64s(batch, "latency_ms")?,
            reason: strings(batch, "reason")?,
            max_token: u64s(batch, "max_token")?,
            mono_ms: f64s(batch, "mono_ms")?,
            keepalive_sent_mono_ms: f64s(batch, "keepalive_sent_mono_ms")?,
            deadline_mono_ms: f64s(batch, "deadline_mono_ms")?,
            trace_id: strings(batch, "trace_id")?,
            span_id: strings(batch, "span_id")?,
        })
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Hands `f` the history of each of `leases` in `batches`, in row
    /// order (empty for a lease with no row): a lake's history of a few
    /// leases, read back to audit them again.
    pub fn for_each_history<L: AsRef<str>>(
        batches: &[RecordBatch],
        leases: &[L],
        mut f: impl FnMut(&str, &[LeaseEvent<'_>]),
    ) -> Result<(), ReadError> {
        let columns: Vec<EventColumns> = batches
            .iter()
            .map(EventColumns::new)
            .collect::<Result<_, _>>()?;
        let mut by_lease: std::collections::HashMap<&str, Vec<LeaseEvent<'_>>> =
            leases.iter().map(|l| (l.as_ref(), Vec::new())).collect();
        for c in &columns {
            for i in 0..c.len() {
                let ev = c.event(i)?;
                if let Some(events) = by_lease.get_mut(&*ev.lease_id) {
                    events.push(ev);
                }
            }
        }
        for lease in leases {
            f(lease.as_ref(), &by_lease[lease.as_ref()]);
        }
        Ok(())
    }

    /// The event of one row, borrowing its strings from the batch.
    pub fn event(&self, row: usize) -> Result<LeaseEvent<'_>, ReadError> {
        let bad = |message: String| ReadError::BadRow { row, message };
        fn required<'c>(a: &'c StringArray, row: usize, name: &str) -> Result<&'c str, ReadError> {
            if a.is_valid(row) {
                Ok(a.value(row))
            } else {
                Err(ReadError::BadRow {
                    row,
                    message: format!("{name} is null"),
                })
            }
        }
        if !self.ts.is_valid(row) {
            return Err(bad("ts is null".into()));
        }
        let kind = required(&self.kind, row, "kind")?;
        let source = required(&self.source, row, "source")?;
        Ok(LeaseEvent {
            ts_us: self.ts.value(row),
            kind: Kind::parse(kind).ok_or_else(|| bad(format!("unknown kind {kind:?}")))?,
            source: Source::parse(source)
                .ok_or_else(|| bad(format!("unknown source {source:?}")))?,
            lease_id: Cow::Borrowed(required(&self.lease_id, row, "lease_id")?),
            holder_id: opt_str(&self.holder_id, row),
            fencing_token: opt(&self.fencing_token, row),
            ttl_ms: opt(&self.ttl_ms, row),
            event_id: opt_str(&self.event_id, row),
            backend: opt_str(&self.backend, row),
            latency_ms: opt(&self.latency_ms, row),
            reason: opt_str(&self.reason, row),
            max_token: opt(&self.max_token, row),
            mono_ms: opt(&self.mono_ms, row),
            keepalive_sent_mono_ms: opt(&self.keepalive_sent_mono_ms, row),
            deadline_mono_ms: opt(&self.deadline_mono_ms, row),
            trace_id: opt_str(&self.trace_id, row),
            span_id: opt_str(&self.span_id, row),
            attrs: Vec::new(),
        })
    }
}
