//! The audit's answers as Arrow batches, in the columns of
//! `leaseline_schema`'s audit schemas: what SQL serves, and what the lake
//! stores of settled rows.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, RecordBatch,
    StringBuilder, TimestampMicrosecondArray, TimestampMicrosecondBuilder, UInt64Builder,
};
use leaseline_schema::{
    HOLDERS_SCHEMA, STORED_TIMELINE_SCHEMA, STORED_VIOLATIONS_SCHEMA, TIMELINE_SCHEMA,
    VIOLATIONS_SCHEMA,
};

use crate::{Grant, LeaseHolder, Settled, Violation};

fn ts_col(b: TimestampMicrosecondBuilder) -> ArrayRef {
    let mut b = b;
    Arc::new(b.finish().with_timezone("UTC"))
}

/// Grants as `lease_timeline` rows.
pub fn timeline_batch(grants: &[Grant]) -> RecordBatch {
    let mut lease = StringBuilder::new();
    let mut token = UInt64Builder::new();
    let mut holder = StringBuilder::new();
    let mut backend = StringBuilder::new();
    let mut acquired = TimestampMicrosecondBuilder::new();
    let mut ended = TimestampMicrosecondBuilder::new();
    let mut end_kind = StringBuilder::new();
    let mut ttl = Int64Builder::new();
    let mut renewals = Int64Builder::new();
    let mut failures = Int64Builder::new();
    let mut gap = Float64Builder::new();
    let mut accepted = Int64Builder::new();
    let mut stale = Int64Builder::new();
    let mut trace = StringBuilder::new();
    let mut valid_until = TimestampMicrosecondBuilder::new();
    let mut acquired_by = StringBuilder::new();
    for g in grants {
        lease.append_value(&g.lease_id);
        token.append_value(g.fencing_token);
        holder.append_value(&g.holder_id);
        backend.append_option(g.backend.as_deref());
        acquired.append_value(g.acquired_at);
        ended.append_option(g.ended_at);
        end_kind.append_value(g.end_kind.as_str());
        ttl.append_option(g.ttl_ms);
        renewals.append_value(count(g.renewals));
        failures.append_value(count(g.renew_failures));
        gap.append_option(g.max_renew_gap_ms);
        accepted.append_value(count(g.writes_accepted));
        stale.append_value(count(g.stale_writes_rejected));
        trace.append_option(g.trace_id.as_deref());
        valid_until.append_option(g.valid_until);
        acquired_by.append_value(g.acquired_by.as_str());
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(lease.finish()),
        Arc::new(token.finish()),
        Arc::new(holder.finish()),
        Arc::new(backend.finish()),
        ts_col(acquired),
        ts_col(ended),
        Arc::new(end_kind.finish()),
        Arc::new(ttl.finish()),
        Arc::new(renewals.finish()),
        Arc::new(failures.finish()),
        Arc::new(gap.finish()),
        Arc::new(accepted.finish()),
        Arc::new(stale.finish()),
        Arc::new(trace.finish()),
        ts_col(valid_until),
        Arc::new(acquired_by.finish()),
    ];
    RecordBatch::try_new(TIMELINE_SCHEMA.clone(), cols).expect("timeline columns match")
}

/// Violations as `lease_violations` rows.
pub fn violations_batch(violations: &[Violation]) -> RecordBatch {
    let mut kind = StringBuilder::new();
    let mut lease = StringBuilder::new();
    let mut token = UInt64Builder::new();
    let mut holder = StringBuilder::new();
    let mut at = TimestampMicrosecondBuilder::new();
    let mut other_token = UInt64Builder::new();
    let mut other_holder = StringBuilder::new();
    let mut detail = StringBuilder::new();
    let mut evidence = ListBuilder::new(StringBuilder::new());
    for v in violations {
        kind.append_value(v.kind.as_str());
        lease.append_value(&v.lease_id);
        token.append_value(v.fencing_token);
        holder.append_option(v.holder_id.as_deref());
        at.append_value(v.at);
        other_token.append_option(v.other_fencing_token);
        other_holder.append_option(v.other_holder_id.as_deref());
        detail.append_value(&v.detail);
        for e in &v.evidence {
            evidence.values().append_value(e);
        }
        evidence.append(true);
    }
    let evidence = evidence.finish();
    // ListBuilder names its items "item" and makes them nullable, as the
    // schema says.
    let cols: Vec<ArrayRef> = vec![
        Arc::new(kind.finish()),
        Arc::new(lease.finish()),
        Arc::new(token.finish()),
        Arc::new(holder.finish()),
        ts_col(at),
        Arc::new(other_token.finish()),
        Arc::new(other_holder.finish()),
        Arc::new(detail.finish()),
        Arc::new(evidence),
    ];
    RecordBatch::try_new(VIOLATIONS_SCHEMA.clone(), cols).expect("violation columns match")
}

/// Holders as `lease_holders` rows.
pub fn holders_batch(holders: &[LeaseHolder]) -> RecordBatch {
    let mut lease = StringBuilder::new();
    let mut holder = StringBuilder::new();
    let mut token = UInt64Builder::new();
    let mut valid = BooleanBuilder::new();
    let mut acquired = TimestampMicrosecondBuilder::new();
    let mut valid_until = TimestampMicrosecondBuilder::new();
    let mut ended = TimestampMicrosecondBuilder::new();
    let mut end_kind = StringBuilder::new();
    let mut backend = StringBuilder::new();
    let mut ttl = Int64Builder::new();
    let mut renewals = Int64Builder::new();
    for h in holders {
        let g = &h.grant;
        lease.append_value(&g.lease_id);
        holder.append_value(&g.holder_id);
        token.append_value(g.fencing_token);
        valid.append_value(h.valid);
        acquired.append_value(g.acquired_at);
        valid_until.append_option(g.valid_until);
        ended.append_option(g.ended_at);
        end_kind.append_value(g.end_kind.as_str());
        backend.append_option(g.backend.as_deref());
        ttl.append_option(g.ttl_ms);
        renewals.append_value(count(g.renewals));
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(lease.finish()),
        Arc::new(holder.finish()),
        Arc::new(token.finish()),
        Arc::new(valid.finish()),
        ts_col(acquired),
        ts_col(valid_until),
        ts_col(ended),
        Arc::new(end_kind.finish()),
        Arc::new(backend.finish()),
        Arc::new(ttl.finish()),
        Arc::new(renewals.finish()),
    ];
    RecordBatch::try_new(HOLDERS_SCHEMA.clone(), cols).expect("holder columns match")
}

/// Counts are BIGINT in SQL: PostgreSQL clients have no unsigned type.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `batch` with a last column of `settled_before`, each row's from `cuts`.
fn with_cuts(
    batch: RecordBatch,
    cuts: Vec<i64>,
    schema: arrow::datatypes::SchemaRef,
) -> RecordBatch {
    let mut cols = batch.columns().to_vec();
    cols.push(Arc::new(
        TimestampMicrosecondArray::from(cuts).with_timezone("UTC"),
    ));
    RecordBatch::try_new(schema, cols).expect("stored columns match")
}

/// Settled rows as the lake stores them, each with its lease's cut as
/// `settled_before`.
pub struct StoredBatches {
    pub timeline: RecordBatch,
    pub violations: RecordBatch,
    /// The events each lease's later rows are judged against.
    pub context: RecordBatch,
}

/// The `lease_timeline`, `lease_violations` and `lease_context` rows of
/// `settled`.
pub fn stored_batches(settled: &[Settled]) -> StoredBatches {
    let grants: Vec<Grant> = settled
        .iter()
        .flat_map(|s| s.grants.iter().cloned())
        .collect();
    let violations: Vec<Violation> = settled
        .iter()
        .flat_map(|s| s.violations.iter().cloned())
        .collect();
    let grant_cuts = settled
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.cut, s.grants.len()))
        .collect();
    let violation_cuts = settled
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.cut, s.violations.len()))
        .collect();
    let context: Vec<(&leaseline_schema::LeaseEvent<'_>, i64)> = settled
        .iter()
        .flat_map(|s| s.context.iter().map(|e| (e, s.cut)))
        .collect();
    StoredBatches {
        timeline: with_cuts(
            timeline_batch(&grants),
            grant_cuts,
            STORED_TIMELINE_SCHEMA.clone(),
        ),
        violations: with_cuts(
            violations_batch(&violations),
            violation_cuts,
            STORED_VIOLATIONS_SCHEMA.clone(),
        ),
        context: leaseline_schema::context_batch(&context),
    }
}
