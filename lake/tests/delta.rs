//! The lake's tables on their Delta logs: what a commit writes, what a
//! stale writer gets, compaction, checkpoints and vacuum.

use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::UInt64Type;
use leaseline_lake::{Change, KafkaRange, Lake, LakeError, Table};
use leaseline_schema::{decode, EventBatchBuilder, Origin};

fn events(ids: std::ops::Range<u64>, token: u64) -> RecordBatch {
    let mut b = EventBatchBuilder::new();
    for i in ids {
        let line = format!(
            r#"{{"ts":"2026-09-14T10:00:{:02}Z","kind":"renewed","source":"holder","lease_id":"l/{}","holder_id":"h","fencing_token":{token},"event_id":"e-{i}"}}"#,
            i % 60,
            i % 7
        );
        let ev = decode(line.as_bytes()).unwrap();
        let origin = Origin::Kafka {
            topic: "t",
            partition: 0,
            offset: i as i64,
        };
        b.append(&ev, &origin, 0);
    }
    b.finish()
}

/// Commits a settle of `add` and `remove` on `m`.
async fn commit_settle(
    lake: &Lake,
    m: &leaseline_lake::Manifest,
    add: Vec<leaseline_lake::DataFile>,
    remove: Vec<String>,
) -> leaseline_lake::Manifest {
    let change = Change::Settle {
        add,
        remove,
        kafka: vec![],
    };
    lake.commit(m, &change).await.unwrap()
}

/// The values of a string column, sorted.
fn sorted(rows: &RecordBatch, column: &str) -> Vec<String> {
    let mut v: Vec<String> = rows
        .column_by_name(column)
        .unwrap()
        .as_string::<i32>()
        .iter()
        .map(|s| s.unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn range(start: i64, end: i64) -> KafkaRange {
    KafkaRange {
        topic: "t".into(),
        partition: 0,
        start,
        end,
    }
}

fn log(dir: &std::path::Path, table: &str, version: u64) -> String {
    std::fs::read_to_string(
        dir.join(table)
            .join("_delta_log")
            .join(format!("{version:020}.json")),
    )
    .unwrap()
}

async fn append(lake: &Lake, ids: std::ops::Range<u64>) -> leaseline_lake::Result<()> {
    let base = lake.latest().await?;
    let files = lake
        .write(Table::LeaseEvents, &events(ids.clone(), 1))
        .await?;
    let change = Change::Append {
        files,
        kafka: vec![range(ids.start as i64, ids.end as i64)],
        reject_kafka: vec![],
    };
    lake.commit(&base, &change).await.map(|_| ())
}

#[tokio::test]
async fn an_append_is_one_delta_commit_with_its_rows_and_txn() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    lake.track_partitions("g", [("t".to_string(), 0)]);
    append(&lake, 0..10).await.unwrap();

    let commit = log(dir.path(), "lease_events", 1);
    let actions: Vec<serde_json::Value> = commit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let txns: Vec<&serde_json::Value> = actions.iter().filter_map(|a| a.get("txn")).collect();
    let ids: Vec<&str> = txns.iter().map(|t| t["appId"].as_str().unwrap()).collect();
    // The lake's position of the partition, and the group's.
    assert_eq!(ids, vec!["leaseline:t:0", "leaseline:g:t:0"]);
    assert!(txns.iter().all(|t| t["version"] == 10));
    let add = actions
        .iter()
        .find_map(|a| a.get("add"))
        .expect("an add action");
    assert_eq!(add["partitionValues"]["date"], "2026-09-14");
    assert!(add["path"]
        .as_str()
        .unwrap()
        .starts_with("date=2026-09-14/"));
    let stats: serde_json::Value = serde_json::from_str(add["stats"].as_str().unwrap()).unwrap();
    assert_eq!(stats["numRecords"], 10);

    // Another process, opening the lake afresh, sees the same.
    let other = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap();
    other.track_partitions("g", [("t".to_string(), 0)]);
    let m = other.latest().await.unwrap();
    assert_eq!(m.rows_of(Table::LeaseEvents), 10);
    assert_eq!(m.next_offset("t", 0), Some(10));
    assert_eq!(m.tables[&Table::LeaseEvents], 1);
    // Another consumer group resumes where the lake is, not from scratch.
    let third = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap();
    third.track_partitions("other", [("t".to_string(), 0)]);
    assert_eq!(third.latest().await.unwrap().next_offset("t", 0), Some(10));
}

#[tokio::test]
async fn a_stale_writer_conflicts_and_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let stale = lake.latest().await.unwrap();
    append(&lake, 0..10).await.unwrap();

    let files = lake
        .write(Table::LeaseEvents, &events(10..20, 1))
        .await
        .unwrap();
    let path = dir.path().join(&files[0].path);
    assert!(path.exists());
    let change = Change::Append {
        files,
        kafka: vec![range(10, 20)],
        reject_kafka: vec![],
    };
    let err = lake.commit(&stale, &change).await.unwrap_err();
    assert!(matches!(err, LakeError::Conflict { .. }), "{err}");
    assert!(!path.exists(), "an uncommitted file is deleted");

    // A zombie that read the same offsets again is refused on the fresh
    // snapshot too, even by a handle that never asked about the partition.
    let zombie = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let err = append(&zombie, 5..12).await.unwrap_err();
    assert!(matches!(err, LakeError::Conflict { .. }), "{err}");
    assert_eq!(lake.latest().await.unwrap().rows_of(Table::LeaseEvents), 10);
}

#[tokio::test]
async fn tokens_keep_all_64_bits() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let base = lake.latest().await.unwrap();
    let files = lake
        .write(Table::LeaseEvents, &events(0..3, u64::MAX))
        .await
        .unwrap();
    lake.commit(
        &base,
        &Change::Append {
            files,
            kafka: vec![],
            reject_kafka: vec![],
        },
    )
    .await
    .unwrap();
    let m = lake.latest().await.unwrap();
    let rows = lake.read_table(&m, Table::LeaseEvents).await.unwrap();
    let tokens = rows
        .column_by_name("fencing_token")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert!(tokens.iter().all(|t| t == Some(u64::MAX)));
}

#[tokio::test]
async fn compaction_replaces_files_in_one_commit_and_vacuum_deletes_them_later() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    for i in 0..4 {
        append(&lake, i * 10..i * 10 + 10).await.unwrap();
    }
    let before = lake.latest().await.unwrap();
    let old: Vec<_> = before.files_of(Table::LeaseEvents).cloned().collect();
    assert_eq!(old.len(), 4);
    let report = lake
        .compact(&leaseline_lake::CompactionPolicy::default())
        .await
        .unwrap();
    assert_eq!(
        (report.merged_files, report.written_files, report.rows),
        (4, 1, 40)
    );
    let after = lake.latest().await.unwrap();
    assert_eq!(after.rows_of(Table::LeaseEvents), 40);
    assert_eq!(after.files_of(Table::LeaseEvents).count(), 1);
    assert_eq!(after.tables[&Table::LeaseEvents], 5);
    let commit = log(dir.path(), "lease_events", 5);
    let removes = commit.lines().filter(|l| l.contains(r#""remove""#)).count();
    assert_eq!(removes, 4);
    assert!(commit.contains(r#""dataChange":false"#));
    assert!(commit.contains("OPTIMIZE"));

    // Within the retention the replaced files stay for readers that
    // started before; past it, vacuum deletes them.
    assert_eq!(lake.vacuum(Duration::from_secs(3600)).await.unwrap(), 0);
    assert!(old.iter().all(|f| dir.path().join(&f.path).exists()));
    assert_eq!(lake.vacuum(Duration::ZERO).await.unwrap(), 4);
    assert!(old.iter().all(|f| !dir.path().join(&f.path).exists()));
    let (m, missing) = lake.check_files().await.unwrap();
    assert!(missing.is_empty());
    assert_eq!(m.rows_of(Table::LeaseEvents), 40);
}

#[tokio::test]
async fn a_checkpoint_every_hundred_commits() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    for i in 0..101 {
        append(&lake, i..i + 1).await.unwrap();
    }
    let log_dir = dir.path().join("lease_events/_delta_log");
    // The 100th commit (version 99) writes one.
    assert!(log_dir
        .join("00000000000000000099.checkpoint.parquet")
        .exists());
    assert!(log_dir.join("_last_checkpoint").exists());
    let other = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap();
    other.track_partitions("", [("t".to_string(), 0)]);
    let m = other.latest().await.unwrap();
    assert_eq!(m.rows_of(Table::LeaseEvents), 101);
    assert_eq!(m.next_offset("t", 0), Some(101));
}

#[tokio::test]
async fn a_reader_never_creates_a_lake_and_names_the_old_format() {
    let dir = tempfile::tempdir().unwrap();
    let err = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, LakeError::NotFound { .. }), "{err}");
    assert!(!dir.path().join("lease_events").exists());
    std::fs::create_dir_all(dir.path().join("_manifest")).unwrap();
    std::fs::write(dir.path().join("_manifest/00000000000000000001.json"), "{}").unwrap();
    let err = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("leaseline migrate"), "{err}");
}

#[tokio::test]
async fn a_snapshot_lists_files_in_the_order_they_were_committed() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut committed = Vec::new();
    for i in 0..12 {
        append(&lake, i * 5..i * 5 + 5).await.unwrap();
        let m = lake.latest().await.unwrap();
        let newest = m.files_of(Table::LeaseEvents).last().unwrap().path.clone();
        assert!(!committed.contains(&newest), "the newest file comes last");
        committed.push(newest);
    }
    let other = Lake::open_existing(dir.path().to_str().unwrap())
        .await
        .unwrap();
    let listed: Vec<String> = other
        .latest()
        .await
        .unwrap()
        .files_of(Table::LeaseEvents)
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(listed, committed);
}

/// Stored `lease_timeline` rows, one per `(lease, token)`, each with its
/// lease's cut.
fn grants(rows: &[(&str, u64, i64)]) -> RecordBatch {
    let schema = leaseline_schema::STORED_TIMELINE_SCHEMA.clone();
    let lines: String = rows
        .iter()
        .map(|(lease, token, cut)| {
            format!(
                r#"{{"lease_id":"{lease}","fencing_token":{token},"holder_id":"h","acquired_at":{},"end_kind":"released","renewals":0,"renew_failures":0,"writes_accepted":0,"stale_writes_rejected":0,"acquired_by":"coordinator","settled_before":{cut}}}"#,
                1_789_380_000_000_000 + *token as i64
            ) + "\n"
        })
        .collect();
    let mut reader = arrow::json::ReaderBuilder::new(schema)
        .build(std::io::Cursor::new(lines))
        .unwrap();
    reader.next().unwrap().unwrap()
}

#[tokio::test]
async fn stored_audit_rows_tell_their_cuts_and_a_lease_is_rewritten_out_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let base = lake.latest().await.unwrap();
    let mut add = lake
        .write(
            Table::LeaseTimeline,
            &grants(&[("a", 1, 10), ("b", 1, 20), ("a", 2, 30)]),
        )
        .await
        .unwrap();
    add.extend(
        lake.write(Table::LeaseTimeline, &grants(&[("c", 1, 5)]))
            .await
            .unwrap(),
    );
    let settle = Change::Settle {
        add,
        remove: vec![],
        kafka: vec![range(9, 9)],
    };
    let m = lake.commit(&base, &settle).await.unwrap();
    assert_eq!(m.stored_kafka["t"][&0], 9);
    let cuts = lake
        .stored_cuts(&m.files.iter().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(cuts.len(), 3);
    assert_eq!((cuts["a"], cuts["b"], cuts["c"]), (30, 20, 5));

    // A writer that decided on the snapshot before conflicts.
    let again = Change::Settle {
        add: lake
            .write(Table::LeaseTimeline, &grants(&[("d", 1, 5)]))
            .await
            .unwrap(),
        remove: vec![],
        kafka: vec![],
    };
    assert!(matches!(
        lake.commit(&base, &again).await,
        Err(LakeError::Conflict { .. })
    ));

    // Voiding "a": the file with a's rows is rewritten with b's alone;
    // c's file is left as it is.
    let void = std::collections::HashSet::from(["a"]);
    let (remove, add) = lake.rewrite_without(&m, &void).await.unwrap();
    assert_eq!(remove.len(), 1);
    assert_eq!(add.len(), 1);
    assert_eq!(add[0].rows, 1);
    let m2 = commit_settle(&lake, &m, add, remove).await;
    let cuts = lake
        .stored_cuts(&m2.files.iter().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(cuts.len(), 2);
    assert_eq!((cuts["b"], cuts["c"]), (20, 5));
    let rows = lake.read_table(&m2, Table::LeaseTimeline).await.unwrap();
    assert_eq!(sorted(&rows, "lease_id"), ["b", "c"]);
}

/// `lease_context` rows: each `(lease, event id, cut)`.
fn context(rows: &[(&str, &str, i64)]) -> RecordBatch {
    let lines: Vec<String> = rows
        .iter()
        .map(|(lease, id, _)| {
            format!(
                r#"{{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"{lease}","holder_id":"h","fencing_token":1,"ttl_ms":1000,"event_id":"{id}"}}"#
            )
        })
        .collect();
    let events: Vec<_> = lines
        .iter()
        .map(|l| decode(l.as_bytes()).unwrap())
        .collect();
    let with_cuts: Vec<_> = events.iter().zip(rows).map(|(e, r)| (e, r.2)).collect();
    leaseline_schema::context_batch(&with_cuts)
}

#[tokio::test]
async fn superseded_context_rows_are_dropped_and_the_current_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let base = lake.latest().await.unwrap();
    // Three settles: "a" cut at 10, 20 then 30; "b" at 10 then 20; "c"
    // and "d" once, at 10.
    let mut add = Vec::new();
    for rows in [
        &[
            ("a", "a1", 10),
            ("b", "b1", 10),
            ("c", "c1", 10),
            ("d", "d1", 10),
        ][..],
        &[("a", "a2", 20), ("b", "b2", 20)][..],
        &[("a", "a3", 30)][..],
    ] {
        add.extend(
            lake.write(Table::LeaseContext, &context(rows))
                .await
                .unwrap(),
        );
    }
    let settle = Change::Settle {
        add,
        remove: vec![],
        kafka: vec![],
    };
    let m = lake.commit(&base, &settle).await.unwrap();
    assert_eq!(m.files_of(Table::LeaseContext).count(), 3);
    // The commit about to land cuts "b" at 40; "d" is not known.
    let cut_of = |l: &str| match l {
        "a" => Some(30),
        "b" => Some(40),
        "c" => Some(10),
        _ => None,
    };
    let (remove, add) = lake.drop_superseded_context(&m, cut_of).await.unwrap();
    assert_eq!(remove.len(), 3);
    let m2 = commit_settle(&lake, &m, add, remove).await;
    assert_eq!(m2.files_of(Table::LeaseContext).count(), 1);
    let rows = lake.read_table(&m2, Table::LeaseContext).await.unwrap();
    assert_eq!(sorted(&rows, "event_id"), ["a3", "c1", "d1"]);
    let cuts = lake
        .stored_cuts(&m2.files.iter().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        (cuts["a"], cuts["c"], cuts["d"], cuts.get("b")),
        (30, 10, 10, None)
    );
}

/// `lease_events` rows of `(lease, second after 2026-09-14T10:00:00Z)`.
fn events_at(rows: &[(&str, u32)], first_offset: i64) -> RecordBatch {
    let mut b = EventBatchBuilder::new();
    for (i, (lease, second)) in rows.iter().enumerate() {
        let line = format!(
            r#"{{"ts":"2026-09-14T10:00:{second:02}Z","kind":"renewed","source":"holder","lease_id":"{lease}","holder_id":"h","fencing_token":1,"event_id":"{lease}-{second}"}}"#
        );
        let ev = decode(line.as_bytes()).unwrap();
        let origin = Origin::Kafka {
            topic: "t",
            partition: 0,
            offset: first_offset + i as i64,
        };
        b.append(&ev, &origin, 0);
    }
    b.finish()
}

/// A lake of `lease_events` files of seconds 0-10, 20-30 and 40-50 of
/// leases `a` and `b`, and one of second 55 of `c`; `a` and `b` stored
/// with a cut at second 35, within the third file, whose path is returned.
async fn lake_cut_within_a_file(dir: &std::path::Path) -> (Lake, String) {
    let lake = Lake::open(dir.to_str().unwrap()).unwrap();
    let files = [
        vec![("a", 0), ("b", 10)],
        vec![("a", 20), ("b", 30)],
        vec![("a", 40), ("b", 50)],
        vec![("c", 55)],
    ];
    for (i, rows) in files.iter().enumerate() {
        let base = lake.latest().await.unwrap();
        let batch = events_at(rows, 10 * i as i64);
        let change = Change::Append {
            files: lake.write(Table::LeaseEvents, &batch).await.unwrap(),
            kafka: vec![range(10 * i as i64, 10 * i as i64 + 2)],
            reject_kafka: vec![],
        };
        lake.commit(&base, &change).await.unwrap();
    }
    let m = lake.latest().await.unwrap();
    let third = m.files_of(Table::LeaseEvents).nth(2).unwrap().path.clone();
    let cut = 1_789_380_035_000_000;
    let add = lake
        .write(
            Table::LeaseTimeline,
            &grants(&[("a", 1, cut), ("b", 1, cut)]),
        )
        .await
        .unwrap();
    commit_settle(&lake, &m, add, vec![]).await;
    (lake, third)
}

#[tokio::test]
async fn compaction_leaves_the_files_after_their_leases_cuts_until_the_cuts_pass_them() {
    let waiting = |wait: Duration| leaseline_lake::CompactionPolicy {
        unsettled_wait: wait,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (lake, third) = lake_cut_within_a_file(dir.path()).await;
    // The files before the cuts, and the one of `c` (no cut holds it),
    // are merged; the one the cuts fall within is left.
    let report = lake
        .compact(&waiting(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!((report.merged_files, report.rows), (3, 5));
    let m = lake.latest().await.unwrap();
    let left: Vec<_> = m
        .files_of(Table::LeaseEvents)
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(left.len(), 2);
    assert!(left.contains(&third));
    // Without a wait, it is merged.
    let report = lake.compact(&waiting(Duration::ZERO)).await.unwrap();
    assert_eq!((report.merged_files, report.rows), (2, 7));

    // The wait is counted back from the newest event (second 55): four
    // seconds leave the third file (up to second 50) nothing to wait for.
    let dir = tempfile::tempdir().unwrap();
    let (lake, _) = lake_cut_within_a_file(dir.path()).await;
    let report = lake
        .compact(&waiting(Duration::from_secs(4)))
        .await
        .unwrap();
    assert_eq!((report.merged_files, report.rows), (4, 7));
    let m = lake.latest().await.unwrap();
    assert_eq!(m.files_of(Table::LeaseEvents).count(), 1);
}
