//! The alert history: every state change, as rows of `lease_alerts`.
//!
//! Rows go to the lake's `lease_alerts` Delta table, one commit per flush,
//! so a reader sees a flush entirely or not at all. It is its own table:
//! alerts are derived data, and their commits never contend with ingest's
//! (a conflict with another alert writer is retried on the newer version).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::TimestampMicrosecondType;
use leaseline_lake::{Lake, Table};
use leaseline_schema::ALERTS_SCHEMA;

use crate::alert::{fingerprint, Alert, AlertState};
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
        lake.append(Table::LeaseAlerts, &batch).await?;
        let n = self.rows.len();
        self.rows.clear();
        Ok(n)
    }
}

/// The state changes `lease_alerts` holds, each by its alert's
/// fingerprint, start and state, and whether receivers were told: what a
/// rebuilt engine must not record or send again (see [`crate::rebuild`]).
#[derive(Debug, Default)]
pub struct Recorded(HashMap<(String, i64, AlertState), bool>);

fn opt(a: &StringArray, i: usize) -> Option<&str> {
    (!a.is_null(i)).then(|| a.value(i))
}

impl Recorded {
    /// Reads every file of `lease_alerts`' newest version. A file that cannot be read is
    /// logged and passed over: its alerts are then recorded and sent again,
    /// which a receiver takes as a repeat, rather than not at all.
    pub async fn load(lake: &Lake) -> Result<Recorded> {
        let mut out = Recorded::default();
        let m = lake.latest().await?;
        for f in m.files_of(Table::LeaseAlerts) {
            let rel = &f.path;
            match leaseline_lake::parquet_io::read_file(lake.store(), rel).await {
                Ok(batches) => {
                    for b in &batches {
                        out.add_batch(b)?;
                    }
                }
                Err(e) => {
                    tracing::error!(file = %rel, error = %e, "cannot read an alert history file; its alerts may be recorded again")
                }
            }
        }
        Ok(out)
    }

    fn add_batch(&mut self, b: &RecordBatch) -> Result<()> {
        let text = |name: &str| -> Result<&StringArray> {
            b.column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
                .ok_or_else(|| {
                    arrow::error::ArrowError::SchemaError(format!(
                        "lease_alerts has no text column {name}"
                    ))
                    .into()
                })
        };
        let (name, lease, holder, backend, kind, state) = (
            text("alertname")?,
            text("lease_id")?,
            text("holder_id")?,
            text("backend")?,
            text("kind")?,
            text("state")?,
        );
        let notified = b
            .column_by_name("notified")
            .and_then(|c| c.as_boolean_opt())
            .ok_or_else(|| {
                arrow::error::ArrowError::SchemaError("lease_alerts has no notified".into())
            })?;
        let starts = b
            .column_by_name("starts_at")
            .and_then(|c| c.as_primitive_opt::<TimestampMicrosecondType>())
            .ok_or_else(|| {
                arrow::error::ArrowError::SchemaError("lease_alerts has no starts_at".into())
            })?;
        for i in 0..b.num_rows() {
            let state = match state.value(i) {
                "pending" => AlertState::Pending,
                "firing" => AlertState::Firing,
                "resolved" => AlertState::Resolved,
                _ => continue,
            };
            let fp = fingerprint(
                name.value(i),
                [
                    ("lease_id", opt(lease, i)),
                    ("holder_id", opt(holder, i)),
                    ("backend", opt(backend, i)),
                    ("kind", opt(kind, i)),
                ],
            );
            let told = !notified.is_null(i) && notified.value(i);
            *self.0.entry((fp, starts.value(i), state)).or_default() |= told;
        }
        Ok(())
    }

    /// Whether this state change of this alert is recorded already, and
    /// with receivers told if `notifying` (a row that `check` or an import
    /// wrote without telling anyone does not stop a live engine with
    /// receivers from sending it).
    pub fn contains(&self, a: &Alert, notifying: bool) -> bool {
        self.0
            .get(&(a.fingerprint(), a.starts_at, a.state))
            .is_some_and(|told| *told || !notifying)
    }

    /// Adds what `other` holds.
    pub fn extend(&mut self, other: Recorded) {
        for (k, told) in other.0 {
            *self.0.entry(k).or_default() |= told;
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::{AlertKey, AlertName};
    use crate::config::Severity;

    fn alert(lease: &str, holder: Option<&str>, state: AlertState, starts_at: i64) -> Alert {
        Alert {
            key: AlertKey {
                name: AlertName::LeaseForcedExpiry,
                lease_id: Some(Arc::from(lease)),
                holder_id: holder.map(Arc::from),
                backend: Some(Arc::from("")),
                kind: None,
            },
            severity: Severity::Warning,
            state,
            starts_at,
            ends_at: None,
            summary: "s".into(),
            description: "d".into(),
            timeline_url: None,
        }
    }

    #[test]
    fn a_recorded_change_is_known_by_its_alert_start_and_state() {
        let firing = alert("l", Some("h"), AlertState::Firing, 10);
        let mut h = AlertHistory::new();
        h.record(std::slice::from_ref(&firing), 99, true);
        let quiet = alert("q", None, AlertState::Firing, 10);
        h.record(std::slice::from_ref(&quiet), 99, false);
        let mut r = Recorded::default();
        r.add_batch(&h.to_batch().unwrap()).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.contains(&firing, true));
        // Another state, start, holder or lease is another change.
        assert!(!r.contains(&alert("l", Some("h"), AlertState::Resolved, 10), true));
        assert!(!r.contains(&alert("l", Some("h"), AlertState::Firing, 11), true));
        assert!(!r.contains(&alert("l", None, AlertState::Firing, 10), true));
        assert!(!r.contains(&alert("m", Some("h"), AlertState::Firing, 10), true));
        // A row written with nobody told holds back only an engine that
        // tells nobody either.
        assert!(r.contains(&quiet, false));
        assert!(!r.contains(&quiet, true));
    }
}
