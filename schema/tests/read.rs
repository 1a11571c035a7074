//! `lease_events` rows read back are the events that were written, minus
//! their attributes.

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use leaseline_schema::{decode, EventBatchBuilder, EventColumns, Origin, ReadError};
use std::sync::Arc;

const LINES: [&str; 3] = [
    r#"{"ts":"2026-09-14T10:00:00.123456Z","kind":"acquired","source":"coordinator","lease_id":"orders/1","holder_id":"b-1","fencing_token":18446744073709551615,"ttl_ms":10000,"event_id":"e1","backend":"etcd","latency_ms":1.5,"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331","attrs":{"zone":"a"}}"#,
    r#"{"ts":1789380000000,"kind":"fenced","source":"holder","lease_id":"orders/1","holder_id":"b-1","fencing_token":7,"mono_ms":12.25,"keepalive_sent_mono_ms":3.5,"deadline_mono_ms":9.75,"reason":"deadline"}"#,
    r#"{"ts":"2026-09-14T10:00:01Z","kind":"stale_write_rejected","source":"resource","lease_id":"orders/1","fencing_token":6,"max_token":7}"#,
];

fn batch() -> RecordBatch {
    let mut b = EventBatchBuilder::new();
    for (i, line) in LINES.iter().enumerate() {
        let e = decode(line.as_bytes()).unwrap();
        b.append(
            &e,
            &Origin::File {
                path: "x.ndjson",
                line: i as u64 + 1,
            },
            0,
        );
    }
    b.finish()
}

#[test]
fn rows_read_back_equal_the_decoded_events_without_attrs() {
    let batch = batch();
    let cols = EventColumns::new(&batch).unwrap();
    assert_eq!(cols.len(), 3);
    for (i, line) in LINES.iter().enumerate() {
        let mut want = decode(line.as_bytes()).unwrap();
        want.attrs.clear();
        assert_eq!(cols.event(i).unwrap(), want, "row {i}");
    }
}

#[test]
fn string_views_are_cast() {
    let batch = batch();
    let schema = batch.schema();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut cols = batch.columns().to_vec();
    let i = schema.index_of("lease_id").unwrap();
    fields[i] = Field::new("lease_id", DataType::Utf8View, false);
    cols[i] = arrow::compute::cast(&cols[i], &DataType::Utf8View).unwrap();
    let viewed = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    let read = EventColumns::new(&viewed).unwrap();
    assert_eq!(read.event(2).unwrap().lease_id, "orders/1");
}

#[test]
fn missing_columns_and_bad_values_are_errors() {
    let batch = batch();
    let without = batch.project(&[0, 1]).unwrap();
    assert!(matches!(
        EventColumns::new(&without),
        Err(ReadError::MissingColumn("source"))
    ));
    let schema = batch.schema();
    let mut cols = batch.columns().to_vec();
    let k = schema.index_of("kind").unwrap();
    cols[k] = Arc::new(StringArray::from(vec!["acquired", "nonsense", "fenced"]));
    let bad = RecordBatch::try_new(schema, cols).unwrap();
    let read = EventColumns::new(&bad).unwrap();
    assert!(read.event(0).is_ok());
    let err = read.event(1).unwrap_err().to_string();
    assert!(err.contains("row 1") && err.contains("nonsense"), "{err}");
}

/// The builder keeps room for the next batch after `finish`; what it
/// builds next must be exactly what a fresh builder would.
#[test]
fn a_reused_builder_builds_what_a_fresh_one_does() {
    let fill = |b: &mut EventBatchBuilder, lines: &[&str]| {
        for (i, line) in lines.iter().enumerate() {
            let origin = if i % 2 == 0 {
                Origin::File {
                    path: "x.ndjson",
                    line: i as u64 + 1,
                }
            } else {
                Origin::Kafka {
                    topic: "t",
                    partition: 2,
                    offset: i as i64,
                }
            };
            b.append(&decode(line.as_bytes()).unwrap(), &origin, 7);
        }
        b.finish()
    };
    let mut reused = EventBatchBuilder::new();
    let first = fill(&mut reused, &LINES);
    for lines in [&LINES[1..], &LINES[..1], &LINES[..]] {
        let again = fill(&mut reused, lines);
        let fresh = fill(&mut EventBatchBuilder::new(), lines);
        assert_eq!(again, fresh);
        assert_eq!(again.num_rows(), lines.len());
    }
    assert_eq!(first, fill(&mut EventBatchBuilder::new(), &LINES));
}

/// `EventColumns::COLUMNS` is what readers project a file to: exactly the
/// columns `EventColumns::new` needs, so reading the projection works and
/// leaving out any one of them is a `MissingColumn` naming it.
#[test]
fn the_listed_columns_are_exactly_those_read() {
    let batch = batch();
    let schema = batch.schema();
    let index = |name: &str| schema.index_of(name).unwrap();
    let all: Vec<usize> = EventColumns::COLUMNS.iter().map(|c| index(c)).collect();
    let projected = batch.project(&all).unwrap();
    assert_eq!(EventColumns::new(&projected).unwrap().len(), 3);
    for (k, name) in EventColumns::COLUMNS.iter().enumerate() {
        let mut fewer = all.clone();
        fewer.remove(k);
        match EventColumns::new(&batch.project(&fewer).unwrap()) {
            Err(ReadError::MissingColumn(missing)) => assert_eq!(missing, *name),
            Err(e) => panic!("without {name}: {e}"),
            Ok(_) => panic!("read without {name}"),
        }
    }
    assert!(!EventColumns::COLUMNS.contains(&"attrs"));
}
