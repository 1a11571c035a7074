//! A filter on `lease_events` that keeps few rows is applied while Parquet
//! is decoded: the other columns of a row group are decoded only for the
//! rows it keeps. A row group's statistics cannot rule it out when the
//! value sought lies between its smallest and largest; the filter then
//! still spares decoding the rest of every row it rejects. Filters that
//! keep a large share of every row group (the keepalives) are applied to
//! whole decoded batches instead.

mod common;

use common::{analyzed_scan, analyzed_scan_in, append, events_batch, strings};
use leaseline_lake::{Lake, PendingRows, PendingSnapshot};
use leaseline_query::QueryEngine;

/// Grant `n`'s event of `kind` from `source`, at second `n` of minute `minute`.
fn event(kind: &str, source: &str, n: u32, minute: u32, id: &str) -> String {
    format!(
        r#"{{"ts":"2026-09-14T10:{minute:02}:{:02}Z","kind":"{kind}","source":"{source}","lease_id":"L{n}","holder_id":"h{n:02}","fencing_token":{},"ttl_ms":1000,"event_id":"{id}{n}","latency_ms":{n}}}"#,
        n % 60,
        n + 1
    )
}

fn acquired(n: u32) -> String {
    event("acquired", "coordinator", n, 0, "e")
}

/// 20 grants, each renewed once by holder and coordinator: the holders'
/// keepalives are a third of the rows.
fn keepalives() -> Vec<String> {
    (0..20)
        .flat_map(|n| {
            [
                acquired(n),
                event("renewed", "holder", n, 1, "rh"),
                event("renewed", "coordinator", n, 1, "rc"),
            ]
        })
        .collect()
}

async fn engine_of(lines: &[String]) -> (tempfile::TempDir, QueryEngine) {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    append(&lake, lines).await;
    (dir, QueryEngine::new(lake))
}

#[tokio::test]
async fn a_filter_is_applied_while_decoding_and_the_rows_it_rejects_are_not_decoded_further() {
    // One file, one row group, holders h00 to h49: its statistics hold h07.
    let lines: Vec<String> = (0..50).map(acquired).collect();
    let (_dir, engine) = engine_of(&lines).await;

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

#[tokio::test]
async fn a_filter_keeping_the_keepalives_is_applied_to_whole_batches_with_the_same_answer() {
    let lines = keepalives();
    let (_dir, engine) = engine_of(&lines).await;

    // Keepalive health's filter (docs/incident-queries.md).
    let query = "SELECT count(*), CAST(sum(latency_ms) AS BIGINT) FROM lease_events \
                 WHERE kind IN ('renewed', 'renew_failed') AND source = 'holder'";
    let rows = engine.sql(query).await.unwrap();
    assert_eq!(strings(&rows, 0), vec!["20"]);
    assert_eq!(strings(&rows, 1), vec![(0..20).sum::<u32>().to_string()]);
    let (plan, scan) = analyzed_scan(&engine, query).await;
    assert!(
        !scan.contains("pushdown_rows_matched=20"),
        "no row was filtered while decoding:\n{scan}"
    );
    assert!(
        plan.contains("FilterExec"),
        "the filter runs above the scan:\n{plan}"
    );

    // One lease among them is few rows again: filtered while decoding.
    let one = format!("{query} AND lease_id = 'L3'");
    let rows = engine.sql(&one).await.unwrap();
    assert_eq!(strings(&rows, 0), vec!["1"]);
    let (_, scan) = analyzed_scan(&engine, &one).await;
    assert!(
        scan.contains("pushdown_rows_matched=1"),
        "the filter kept 1 row while decoding:\n{scan}"
    );
}

#[tokio::test]
async fn the_long_lived_session_and_buffered_rows_give_the_scan_its_filters() {
    let lines = keepalives();
    let (_dir, engine) = engine_of(&lines).await;
    // Rows an ingester holds, not yet in a file: one more holder keepalive.
    let pending = PendingRows::new();
    pending.publish(PendingSnapshot {
        base: Some(std::sync::Arc::new(engine.lake().latest().await.unwrap())),
        events: vec![events_batch(&[event("renewed", "holder", 20, 1, "rh")])],
        rejects: vec![],
    });
    let buffered = engine.clone().with_pending(pending);
    let query = "SELECT count(*) FROM lease_events \
                 WHERE kind IN ('renewed', 'renew_failed') AND source = 'holder'";
    let one = format!("{query} AND lease_id = 'L3'");
    for (name, ctx, keepalives) in [
        (
            "the long-lived session",
            engine.live_session().unwrap(),
            "20",
        ),
        ("with buffered rows", buffered.live_session().unwrap(), "21"),
    ] {
        let rows = ctx.sql(query).await.unwrap().collect().await.unwrap();
        assert_eq!(strings(&rows, 0), vec![keepalives], "{name}");
        let (plan, scan) = analyzed_scan_in(&ctx, query).await;
        assert!(
            scan.contains("pushdown_rows_pruned=0") && plan.contains("FilterExec"),
            "{name}: the keepalives' filter runs above the scan, on whole batches:\n{plan}"
        );
        let rows = ctx.sql(&one).await.unwrap().collect().await.unwrap();
        assert_eq!(strings(&rows, 0), vec!["1"], "{name}");
        let (_, scan) = analyzed_scan_in(&ctx, &one).await;
        assert!(
            scan.contains("pushdown_rows_matched=1"),
            "{name}: one lease's filter is applied while decoding:\n{scan}"
        );
    }
}
