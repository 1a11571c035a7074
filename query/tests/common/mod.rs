//! What the query tests (and the server's, which include this file) share.

use leaseline_lake::{Change, Lake, Manifest, Table};
use leaseline_schema::{decode, EventBatchBuilder, Origin};

/// Commits `lines` (events of the contract, one per line) as one file of
/// `lease_events`; the lake's manifest after the commit.
pub async fn append<S: AsRef<str>>(lake: &Lake, lines: &[S]) -> Manifest {
    let files = lake
        .write(Table::LeaseEvents, &events_batch(lines))
        .await
        .unwrap();
    let base = lake.latest().await.unwrap();
    let change = Change::Append {
        files,
        kafka: vec![],
        reject_kafka: vec![],
    };
    lake.commit(&base, &change).await.unwrap();
    lake.latest().await.unwrap()
}

/// `lines` (events of the contract, one per line) as the rows an ingester
/// buffers.
#[allow(dead_code)] // not every test that includes this file buffers rows
pub fn events_batch<S: AsRef<str>>(lines: &[S]) -> arrow::array::RecordBatch {
    let mut b = EventBatchBuilder::new();
    for (i, l) in lines.iter().enumerate() {
        let origin = Origin::File {
            path: "t.ndjson",
            line: i as u64 + 1,
        };
        b.append(&decode(l.as_ref().as_bytes()).unwrap(), &origin, 0);
    }
    b.finish()
}

/// One column of `batches` as text (cast to UTF-8), row by row.
#[allow(dead_code)] // not every test that includes this file reads text
pub fn strings(batches: &[arrow::array::RecordBatch], column: usize) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c =
                arrow::compute::cast(b.column(column), &arrow::datatypes::DataType::Utf8).unwrap();
            arrow::array::AsArray::as_string::<i32>(&c)
                .iter()
                .map(|s| s.unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The plan of `EXPLAIN ANALYZE query`, and its Parquet scan's line (its
/// metrics with it).
#[allow(dead_code)] // not every test that includes this file reads plans
pub async fn analyzed_scan(engine: &leaseline_query::QueryEngine, query: &str) -> (String, String) {
    let explained = engine
        .sql(&format!("EXPLAIN ANALYZE {query}"))
        .await
        .unwrap();
    plan_and_scan(&explained)
}

/// [`analyzed_scan`] in a session of the caller's.
#[allow(dead_code)] // as above
pub async fn analyzed_scan_in(
    ctx: &datafusion::prelude::SessionContext,
    query: &str,
) -> (String, String) {
    let explained = ctx
        .sql(&format!("EXPLAIN ANALYZE {query}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    plan_and_scan(&explained)
}

#[allow(dead_code)] // as above
fn plan_and_scan(explained: &[arrow::array::RecordBatch]) -> (String, String) {
    let plan = strings(explained, 1).join("\n");
    let scan = plan
        .lines()
        .find(|l| l.contains("file_type=parquet"))
        .unwrap_or_else(|| panic!("no parquet scan in\n{plan}"))
        .to_owned();
    (plan, scan)
}
