//! The alert history: every state change, as rows of `lease_alerts`.
//!
//! Rows are written as Parquet files under `lease_alerts/` in the lake, one
//! file per flush, each put in one atomic write with a unique name, so a
//! reader sees a flush entirely or not at all. The table is append-only and
//! outside the lake's manifest: alerts are derived data, and writing them
//! must never contend with ingest's commits.

use arrow::array::{
    ArrayRef, BooleanBuilder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use leaseline_lake::Lake;
use leaseline_schema::{ALERTS_SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::alert::Alert;
use crate::error::Result;

/// The lake folder of `lease_alerts`.
pub const ALERTS_DIR: &str = "lease_alerts";

/// Rows waiting to be written.
#[derive(Default)]
pub struct AlertHistory {
    rows: Vec<(Alert, i64, bool)>,
}

impl AlertHistory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records state changes, `notified` saying whether receivers were told.
    pub fn record(&mut self, alerts: &[Alert], recorded_at_us: i64, notified: bool) {
        self.rows
            .extend(alerts.iter().map(|a| (a.clone(), recorded_at_us, notified)));
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The waiting rows as one batch of [`ALERTS_SCHEMA`].
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let mut s: Vec<StringBuilder> = (0..6).map(|_| StringBuilder::new()).collect();
        let mut summary = StringBuilder::new();
        let mut description = StringBuilder::new();
        let utc = || TimestampMicrosecondBuilder::new().with_timezone("UTC");
        let (mut starts, mut ends, mut recorded) = (utc(), utc(), utc());
        let mut notified = BooleanBuilder::new();
        for (a, at, n) in &self.rows {
            let k = &a.key;
            s[0].append_value(k.name.as_str());
            s[1].append_option(k.lease_id.as_deref());
            s[2].append_option(k.holder_id.as_deref());
            s[3].append_option(k.backend.as_deref());
            s[4].append_option(k.kind);
            s[5].append_value(a.severity.as_str());
            summary.append_value(&a.summary);
            description.append_value(&a.description);
            starts.append_value(a.starts_at);
            ends.append_option(a.ends_at);
            recorded.append_value(*at);
            notified.append_value(*n);
        }
        let mut state = StringBuilder::new();
        for (a, _, _) in &self.rows {
            state.append_value(a.state.as_str());
        }
        let mut cols: Vec<ArrayRef> = s
            .iter_mut()
            .map(|b| std::sync::Arc::new(b.finish()) as ArrayRef)
            .collect();
        cols.push(std::sync::Arc::new(state.finish()));
        cols.push(std::sync::Arc::new(starts.finish()));
        cols.push(std::sync::Arc::new(ends.finish()));
        cols.push(std::sync::Arc::new(summary.finish()));
        cols.push(std::sync::Arc::new(description.finish()));
        cols.push(std::sync::Arc::new(recorded.finish()));
        cols.push(std::sync::Arc::new(notified.finish()));
        Ok(RecordBatch::try_new(ALERTS_SCHEMA.clone(), cols)?)
    }

    /// Writes the waiting rows to the lake as one new file and forgets them.
    /// Nothing is written when there are none. On error the rows stay.
    pub async fn flush(&mut self, lake: &Lake) -> Result<usize> {
        if self.rows.is_empty() {
            return Ok(0);
        }
        let batch = self.to_batch()?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                SCHEMA_VERSION_KEY.to_string(),
                SCHEMA_VERSION.to_string(),
            )]))
            .build();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
        w.write(&batch)?;
        w.close()?;
        let day = chrono::Utc::now().format("%Y-%m-%d");
        let name = format!("{ALERTS_DIR}/date={day}/{}.parquet", uuid::Uuid::new_v4());
        lake.store().put(&name, buf).await?;
        let n = self.rows.len();
        self.rows.clear();
        Ok(n)
    }
}
