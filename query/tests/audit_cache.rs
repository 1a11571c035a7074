//! The audit tables follow the lake: appended files are added to the
//! cached engine, a compaction (same rows, new files) gives the same answer
//! without counting events twice, and a query over an older snapshot does
//! not disturb the cache.

mod common;

use arrow::array::AsArray;
use common::append;
use leaseline_lake::{CompactionPolicy, Lake, Table};
use leaseline_query::QueryEngine;
use leaseline_schema::decode;

const ACQ7: &str = r#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"a","fencing_token":7,"ttl_ms":10000,"event_id":"a7"}"#;
// Renewals without event_id: a second push of the same file would count
// them twice.
const RENEW: &str = r#"{"ts":"2026-09-14T10:00:03Z","kind":"renewed","source":"holder","lease_id":"L","holder_id":"a","fencing_token":7,"ttl_ms":10000}"#;
const RENEW2: &str = r#"{"ts":"2026-09-14T10:00:06Z","kind":"renewed","source":"holder","lease_id":"L","holder_id":"a","fencing_token":7,"ttl_ms":10000}"#;
const ACQ9: &str = r#"{"ts":"2026-09-14T10:00:30Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"c","fencing_token":9,"ttl_ms":10000,"event_id":"c9"}"#;
const NEXT_DAY: &str = r#"{"ts":"2026-09-15T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"M","holder_id":"d","fencing_token":1,"ttl_ms":10000,"event_id":"d1"}"#;
const ACQ8: &str = r#"{"ts":"2026-09-14T10:00:08Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"b","fencing_token":8,"ttl_ms":10000,"event_id":"b8"}"#;

/// Merges every file of the lake that can be merged into one.
async fn compact_all(lake: &Lake) -> leaseline_lake::CompactionReport {
    lake.compact(&CompactionPolicy {
        target_file_bytes: 1 << 30,
        max_inputs: 100,
        unsettled_wait: std::time::Duration::ZERO,
    })
    .await
    .unwrap()
}

async fn csv(engine: &QueryEngine, q: &str) -> String {
    let r = engine.query(q).await.unwrap();
    let mut out = Vec::new();
    leaseline_query::output::write(
        leaseline_query::output::Format::Csv,
        &r.schema,
        &r.batches,
        &mut out,
    )
    .unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn audit_tables_follow_appends_and_survive_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let engine = QueryEngine::new(lake.clone());
    assert_eq!(
        csv(&engine, "SELECT count(*) AS n FROM lease_timeline").await,
        "n\n0\n"
    );

    append(&lake, &[ACQ7, RENEW]).await;
    let q = "SELECT fencing_token, holder_id, renewals FROM lease_timeline ORDER BY fencing_token";
    assert_eq!(
        csv(&engine, q).await,
        "fencing_token,holder_id,renewals\n7,a,1\n"
    );
    let v1 = engine.audit_tables().await.unwrap().version;
    let tables_at_v1 = lake.latest().await.unwrap().tables;

    append(&lake, &[RENEW2, ACQ8]).await;
    assert_eq!(
        csv(&engine, q).await,
        "fencing_token,holder_id,renewals\n7,a,2\n8,b,0\n"
    );
    assert_eq!(
        csv(
            &engine,
            "SELECT kind, fencing_token, other_fencing_token FROM lease_violations"
        )
        .await,
        "kind,fencing_token,other_fencing_token\noverlapping_ownership,8,7\n"
    );
    let holders = "SELECT lease_id, holder_id, fencing_token, valid FROM lease_holders";
    assert_eq!(
        csv(&engine, holders).await,
        "lease_id,holder_id,fencing_token,valid\nL,b,8,true\n"
    );

    // Compaction replaces both files with one: the same answer, and the
    // id-less renewals still count once each, from the cached engine.
    let rebuilds = engine.audit_cache().rebuilds();
    let report = compact_all(&lake).await;
    assert!(report.merged_files >= 2, "{report:?}");
    assert_eq!(
        csv(&engine, q).await,
        "fencing_token,holder_id,renewals\n7,a,2\n8,b,0\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds);
    // An append after the compaction is pushed alone.
    append(&lake, &[ACQ9]).await;
    assert_eq!(
        csv(&engine, q).await,
        "fencing_token,holder_id,renewals\n7,a,2\n8,b,0\n9,c,0\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds);

    // An older snapshot is answered as it was, and leaves the cache alone.
    let mut old = lake.latest().await.unwrap();
    old.version = v1;
    old.tables = tables_at_v1;
    old.files.retain(|_| false);
    let ctx = engine.session_at(&old).unwrap();
    let batches = leaseline_query::run_read_only(&ctx, "SELECT count(*) AS n FROM lease_timeline")
        .await
        .unwrap();
    assert_eq!(
        arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
            .lines()
            .nth(3)
            .unwrap()
            .trim(),
        "| 0 |"
    );
    assert_eq!(
        csv(&engine, q).await,
        "fencing_token,holder_id,renewals\n7,a,2\n8,b,0\n9,c,0\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds);
}

/// What the cached engine cannot follow is audited again from the lake:
/// an append that a compaction merged with files the engine had before
/// the engine saw it (its id-less renewal would count twice, or not at
/// all), and an expiry (its rows are gone).
#[tokio::test]
async fn an_unseen_append_compacted_or_an_expiry_is_audited_again() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let engine = QueryEngine::new(lake.clone());
    append(&lake, &[ACQ7, RENEW]).await;
    let q = "SELECT lease_id, fencing_token, holder_id, renewals FROM lease_timeline ORDER BY 1, 2";
    assert_eq!(
        csv(&engine, q).await,
        "lease_id,fencing_token,holder_id,renewals\nL,7,a,1\n"
    );
    let rebuilds = engine.audit_cache().rebuilds();

    append(&lake, &[RENEW2]).await;
    let report = compact_all(&lake).await;
    assert_eq!(report.merged_files, 2, "{report:?}");
    assert_eq!(
        csv(&engine, q).await,
        "lease_id,fencing_token,holder_id,renewals\nL,7,a,2\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds + 1);

    append(&lake, &[NEXT_DAY]).await;
    assert_eq!(
        csv(&engine, q).await,
        "lease_id,fencing_token,holder_id,renewals\nL,7,a,2\nM,1,d,0\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds + 1);
    let (files, rows) = lake
        .expire(chrono::NaiveDate::from_ymd_opt(2026, 9, 15).unwrap())
        .await
        .unwrap();
    assert_eq!((files, rows), (1, 3));
    assert_eq!(
        csv(&engine, q).await,
        "lease_id,fencing_token,holder_id,renewals\nM,1,d,0\n"
    );
    assert_eq!(engine.audit_cache().rebuilds(), rebuilds + 2);
}

/// Big derived tables come as many modest batches, in the engine's order,
/// so DataFusion never has to reserve a whole table at once.
#[tokio::test]
async fn big_derived_tables_come_in_modest_batches_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let leases = 20_000;
    let lines: Vec<String> = (0..leases)
        .map(|i| {
            format!(
                r#"{{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"L{i:05}","holder_id":"a","fencing_token":1,"ttl_ms":10000,"event_id":"e{i}"}}"#
            )
        })
        .collect();
    append(&lake, &lines).await;
    let engine = QueryEngine::new(lake.clone());
    let tables = engine.audit_tables().await.unwrap();
    let holders = tables.get(leaseline_query::AuditView::Holders);
    assert!(holders.len() >= 3, "{} batches", holders.len());
    assert!(holders.iter().all(|b| b.num_rows() <= 8192));
    assert_eq!(holders.iter().map(|b| b.num_rows()).sum::<usize>(), leases);
    // The engine hands its rows over in lease order; SQL without ORDER BY
    // promises none (queries run on several threads).
    let engine_order: Vec<String> = holders
        .iter()
        .flat_map(|b| {
            let ids = b.column_by_name("lease_id").unwrap().as_string::<i32>();
            ids.iter()
                .map(|s| s.unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        engine_order.windows(2).all(|w| w[0] < w[1]),
        "engine order kept"
    );
    let out = csv(
        &engine,
        "SELECT lease_id FROM lease_holders ORDER BY lease_id",
    )
    .await;
    let ids: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(ids, engine_order);
    assert_eq!(
        csv(
            &engine,
            "SELECT count(DISTINCT lease_id) AS n FROM lease_timeline"
        )
        .await,
        format!("n\n{leases}\n")
    );
}

/// A process's alert engine that has taken commit `v1` but not the newer
/// `v2` answers the audit's tables for `v1`, and the answer says so; once
/// it takes `v2`, for `v2`. Another writer's rows it never took make no
/// commit whole, and the lake is audited instead.
#[tokio::test]
async fn the_alert_engines_audit_answers_for_the_newest_commit_it_holds_whole() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let shared = leaseline_audit::SharedAuditor::new(leaseline_audit::AuditConfig::default());
    let engine = QueryEngine::new(lake.clone()).with_live_audit(shared.clone());
    let feed = |lines: &[&str]| {
        let mut a = shared.lock();
        for l in lines {
            a.push(&decode(l.as_bytes()).unwrap());
        }
    };
    let grants = "SELECT fencing_token FROM lease_timeline ORDER BY fencing_token";
    let answer = |q: &'static str| {
        let engine = engine.clone();
        async move {
            let s = engine.stream(q, None).await.unwrap();
            let (lake_version, audit_version) = (s.lake_version, s.audit_version);
            let rows: Vec<i64> = s
                .rows
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .flat_map(|b| {
                    let b = b.unwrap();
                    let c = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Int64)
                        .unwrap();
                    c.as_primitive::<arrow::datatypes::Int64Type>()
                        .values()
                        .to_vec()
                })
                .collect();
            (rows, lake_version, audit_version)
        }
    };

    append(&lake, &[ACQ7, RENEW]).await;
    let v1 = lake.latest().await.unwrap();
    feed(&[ACQ7, RENEW]);
    shared.mark(v1.version, v1.rows_of(Table::LeaseEvents));
    assert_eq!(
        answer(grants).await,
        (vec![7], v1.version, Some(v1.version))
    );

    // Ingest commits v2; the engine has not taken it.
    append(&lake, &[ACQ9]).await;
    let v2 = lake.latest().await.unwrap();
    assert!(v2.version > v1.version);
    assert_eq!(
        answer(grants).await,
        (vec![7], v2.version, Some(v1.version))
    );
    let reads = engine.live_audit().unwrap().reads();
    assert_eq!(
        (reads.1, reads.2),
        (1, 0),
        "answered behind, the lake not audited"
    );
    // A query of the lake's own tables reads v2 and names no audit version.
    let events = "SELECT count(*) AS n FROM lease_events";
    let (_, lake_version, audit_version) = answer(events).await;
    assert_eq!((lake_version, audit_version), (v2.version, None));

    // The engine takes v2.
    feed(&[ACQ9]);
    shared.mark(v2.version, v2.rows_of(Table::LeaseEvents));
    assert_eq!(
        answer(grants).await,
        (vec![7, 9], v2.version, Some(v2.version))
    );

    // Another writer's row in v3, which the engine never takes: its mark
    // of v3 is not whole, so the lake is audited for v3.
    append(&lake, &[ACQ8]).await;
    let v3 = lake.latest().await.unwrap();
    shared.mark(v3.version, v3.rows_of(Table::LeaseEvents));
    let passed_before = engine.live_audit().unwrap().reads().2;
    let (rows, _, audit_version) = answer(grants).await;
    assert_eq!(audit_version, Some(v3.version), "the lake's own audit");
    assert_eq!(rows, vec![7, 8, 9]);
    assert_eq!(engine.live_audit().unwrap().reads().2, passed_before + 1);
}

const REL7: &str = r#"{"ts":"2026-09-14T10:00:02Z","kind":"released","source":"coordinator","lease_id":"L","holder_id":"a","fencing_token":7,"event_id":"r7"}"#;

/// A snapshot's number sums its tables' versions, so an ingester's own
/// snapshot (its commit on top of one that predates another table's
/// commit) can carry the number of a different snapshot of the lake. The
/// rows it buffers after its snapshot are audited on top of that
/// snapshot's events, not of the other's: there, the release between
/// them would be missing, and the next grant would overlap the last.
#[tokio::test]
async fn buffered_rows_are_audited_on_their_own_snapshot_not_on_one_of_the_same_number() {
    use leaseline_lake::{Change, KafkaRange, PendingRows, PendingSnapshot};
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let pending = PendingRows::new();
    let engine = QueryEngine::new(lake.clone()).with_pending(pending.clone());
    let ingesters = append(&lake, &[ACQ7]).await;
    // Another table's commit (the stored audit rows' position).
    let settle = Change::Settle {
        add: vec![],
        remove: vec![],
        kafka: vec![KafkaRange {
            topic: "t".into(),
            partition: 0,
            start: 1,
            end: 1,
        }],
    };
    let other = lake
        .commit(&lake.latest().await.unwrap(), &settle)
        .await
        .unwrap();
    let violations = "SELECT kind, fencing_token FROM lease_violations";
    assert_eq!(csv(&engine, violations).await, "kind,fencing_token\n");
    // The ingester commits the release on its own snapshot, and buffers
    // the next grant after it.
    let files = lake
        .write(Table::LeaseEvents, &common::events_batch(&[REL7]))
        .await
        .unwrap();
    let append = Change::Append {
        files,
        kafka: vec![],
        reject_kafka: vec![],
    };
    let committed = lake.commit(&ingesters, &append).await.unwrap();
    assert_eq!(committed.version, other.version, "the same number");
    pending.publish(PendingSnapshot {
        base: Some(std::sync::Arc::new(committed)),
        events: vec![common::events_batch(&[ACQ8])],
        rejects: vec![],
    });
    assert_eq!(csv(&engine, violations).await, "kind,fencing_token\n");
    let grants = "SELECT fencing_token FROM lease_timeline ORDER BY fencing_token";
    assert_eq!(csv(&engine, grants).await, "fencing_token\n7\n8\n");
}
