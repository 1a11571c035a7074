//! The audit's tables as Arrow schemas: what SQL answers
//! (`lease_timeline`, `lease_violations`, `lease_holders`) and what the
//! lake stores of the first two once settled (the same columns and
//! [`SETTLED_BEFORE`]).

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Columns of `lease_timeline`: one row per grant.
pub static TIMELINE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("lease_id", DataType::Utf8, false),
        Field::new("fencing_token", DataType::UInt64, false),
        Field::new("holder_id", DataType::Utf8, false),
        Field::new("backend", DataType::Utf8, true),
        Field::new("acquired_at", ts_type(), false),
        Field::new("ended_at", ts_type(), true),
        Field::new("end_kind", DataType::Utf8, false),
        Field::new("ttl_ms", DataType::Int64, true),
        Field::new("renewals", DataType::Int64, false),
        Field::new("renew_failures", DataType::Int64, false),
        Field::new("max_renew_gap_ms", DataType::Float64, true),
        Field::new("writes_accepted", DataType::Int64, false),
        Field::new("stale_writes_rejected", DataType::Int64, false),
        Field::new("trace_id", DataType::Utf8, true),
        // Two columns past the grant's own facts, for the dashboards and
        // postmortems: when validity ends even while the grant is still
        // open, and whose report the start time comes from.
        Field::new("valid_until", ts_type(), true),
        Field::new("acquired_by", DataType::Utf8, false),
    ]))
});

/// Columns of `lease_violations`: one row per safety violation.
pub static VIOLATIONS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("kind", DataType::Utf8, false),
        Field::new("lease_id", DataType::Utf8, false),
        Field::new("fencing_token", DataType::UInt64, false),
        Field::new("holder_id", DataType::Utf8, true),
        Field::new("at", ts_type(), false),
        Field::new("other_fencing_token", DataType::UInt64, true),
        Field::new("other_holder_id", DataType::Utf8, true),
        Field::new("detail", DataType::Utf8, false),
        Field::new(
            "evidence",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
    ]))
});

/// Columns of `lease_holders`: each lease's newest grant.
pub static HOLDERS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("lease_id", DataType::Utf8, false),
        Field::new("holder_id", DataType::Utf8, false),
        Field::new("fencing_token", DataType::UInt64, false),
        Field::new("valid", DataType::Boolean, false),
        Field::new("acquired_at", ts_type(), false),
        Field::new("valid_until", ts_type(), true),
        Field::new("ended_at", ts_type(), true),
        Field::new("end_kind", DataType::Utf8, false),
        Field::new("backend", DataType::Utf8, true),
        Field::new("ttl_ms", DataType::Int64, true),
        Field::new("renewals", DataType::Int64, false),
    ]))
});

/// The column a stored audit row adds to its SQL columns: the cut of its
/// lease when the row was written. Every row of the lease from before that
/// time is stored, so the largest value per lease tells a restarted
/// writer where its lease's stored rows end.
pub const SETTLED_BEFORE: &str = "settled_before";

fn stored(sql: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = sql.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(SETTLED_BEFORE, ts_type(), false));
    Arc::new(Schema::new(fields))
}

/// Columns of the lake's stored `lease_timeline`.
pub static STORED_TIMELINE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| stored(&TIMELINE_SCHEMA));

/// Columns of the lake's stored `lease_violations`.
pub static STORED_VIOLATIONS_SCHEMA: LazyLock<SchemaRef> =
    LazyLock::new(|| stored(&VIOLATIONS_SCHEMA));
