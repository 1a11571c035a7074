//! A join whose build side is small reads only the row groups of its probe
//! side that can match: the filter it pushes into the `lease_events` scan
//! is an IN list the lake's statistics and `event_id` bloom filters prune
//! by. This is how the evidence of a violation is looked up
//! (docs/incident-queries.md) without reading every event.

mod common;

use common::{analyzed_scan, append, strings};
use leaseline_lake::Lake;
use leaseline_query::QueryEngine;

fn acquired(second: u32, holder: &str, token: u64, event_id: &str) -> String {
    format!(
        r#"{{"ts":"2026-09-14T10:00:{second:02}Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"{holder}","fencing_token":{token},"ttl_ms":1000,"event_id":"{event_id}"}}"#
    )
}

#[tokio::test]
async fn a_join_on_event_ids_reads_only_the_row_groups_that_hold_them() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    // The first file's ids span the second's: its statistics cannot tell
    // that it lacks "c9"; its bloom filter can.
    append(
        &lake,
        &[acquired(0, "a", 1, "a1"), acquired(10, "z", 2, "z9")],
    )
    .await;
    append(&lake, &[acquired(20, "c", 3, "c9")]).await;
    let engine = QueryEngine::new(lake);

    let join =
        "SELECT e.holder_id FROM (VALUES ('c9')) AS v(id) JOIN lease_events e ON e.event_id = v.id";
    let rows = engine.sql(join).await.unwrap();
    let holders = strings(&rows, 0);
    assert_eq!(holders, vec!["c"]);

    let (plan, scan) = analyzed_scan(&engine, join).await;
    assert!(
        scan.contains("output_rows=1,"),
        "the scan read one row, not the three of both files:\n{scan}"
    );
    assert!(plan.contains("mode=CollectLeft"), "{plan}");
}
