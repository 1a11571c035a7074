//! A filter on `lease_events` is applied while Parquet is decoded: the
//! other columns of a row group are decoded only for the rows it keeps.
//! A row group's statistics cannot rule it out when the value sought lies
//! between its smallest and largest; the filter then still spares decoding
//! the rest of every row it rejects.

mod common;

use common::{analyzed_scan, append, strings};
use leaseline_lake::Lake;
use leaseline_query::QueryEngine;

fn acquired(n: u32) -> String {
    format!(
        r#"{{"ts":"2026-09-14T10:00:{:02}Z","kind":"acquired","source":"coordinator","lease_id":"L{n}","holder_id":"h{n:02}","fencing_token":{},"ttl_ms":1000,"event_id":"e{n}"}}"#,
        n % 60,
        n + 1
    )
}

#[tokio::test]
async fn a_filter_is_applied_while_decoding_and_the_rows_it_rejects_are_not_decoded_further() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    // One file, one row group, holders h00 to h49: its statistics hold h07.
    let lines: Vec<String> = (0..50).map(acquired).collect();
    append(&lake, &lines).await;
    let engine = QueryEngine::new(lake);

    let query = "SELECT event_id, lease_id FROM lease_events WHERE holder_id = 'h07'";
    let rows = engine.sql(query).await.unwrap();
    assert_eq!(strings(&rows, 0), vec!["e7"]);
    assert_eq!(strings(&rows, 1), vec!["L7"]);

    let (_, scan) = analyzed_scan(&engine, query).await;
    assert!(
        scan.contains("pushdown_rows_pruned=49") && scan.contains("pushdown_rows_matched=1"),
        "the filter kept 1 row of 50 while decoding:\n{scan}"
    );
}
