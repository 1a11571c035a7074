//! The alert history: every state change, as rows of `lease_alerts`.
//!
//! Rows are written as Parquet files under `lease_alerts/` in the lake, one
//! file per flush, each put in one atomic write with a unique name, so a
//! reader sees a flush entirely or not at all. The table is append-only and
//! outside the lake's manifest: alerts are derived data, and writing them
//! must never contend with ingest's commits.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray, TimestampMicrosecondArray};
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

/// One waiting row: the alert, when it was recorded, whether receivers
/// were told.
type Row = (Alert, i64, bool);

/// Rows waiting to be written.
#[derive(Default)]
pub struct AlertHistory {
    rows: Vec<Row>,
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
        let text = |f: &dyn Fn(&Alert) -> Option<&str>| -> ArrayRef {
            Arc::new(
                self.rows
                    .iter()
                    .map(|(a, _, _)| f(a))
                    .collect::<StringArray>(),
            )
        };
        let time = |f: &dyn Fn(&Row) -> Option<i64>| -> ArrayRef {
            Arc::new(
                self.rows
                    .iter()
                    .map(f)
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            )
        };
        let cols: Vec<ArrayRef> = vec![
            text(&|a| Some(a.key.name.as_str())),
            text(&|a| a.key.lease_id.as_deref()),
            text(&|a| a.key.holder_id.as_deref()),
            text(&|a| a.key.backend.as_deref()),
            text(&|a| a.key.kind),
            text(&|a| Some(a.severity.as_str())),
            text(&|a| Some(a.state.as_str())),
            time(&|(a, _, _)| Some(a.starts_at)),
            time(&|(a, _, _)| a.ends_at),
            text(&|a| Some(&a.summary)),
            text(&|a| Some(&a.description)),
            time(&|(_, at, _)| Some(*at)),
            Arc::new(
                self.rows
                    .iter()
                    .map(|(_, _, n)| Some(*n))
                    .collect::<BooleanArray>(),
            ),
        ];
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
