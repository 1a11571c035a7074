//! `migrate`: a lake of the format before Delta tables (Parquet files named
//! by `_manifest/<version>.json`, `lease_alerts` beside it) becomes Delta
//! tables with the same rows and the same Kafka positions.

use std::path::Path;

use arrow::array::RecordBatch;
use leaseline_lake::{migrate, parquet_io, Lake, LakeError, Table};
use leaseline_schema::{decode, EventBatchBuilder, Origin, RejectBatchBuilder};
use parquet::arrow::ArrowWriter;

fn old_file(lake: &Path, rel: &str, batch: &RecordBatch) {
    let path = lake.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // The old format stored the tables' Arrow types as they are.
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

fn old_lake(lake: &Path) -> (RecordBatch, RecordBatch) {
    let mut events = EventBatchBuilder::new();
    for i in 0..50u64 {
        let line = format!(
            r#"{{"ts":"2026-09-14T10:00:{:02}Z","kind":"acquired","source":"coordinator","lease_id":"l/{}","holder_id":"h","fencing_token":{},"ttl_ms":1000,"event_id":"e{i}"}}"#,
            i % 60,
            i % 5,
            u64::MAX - i
        );
        let origin = Origin::Kafka {
            topic: "t",
            partition: (i % 2) as i32,
            offset: (i / 2) as i64,
        };
        events.append(&decode(line.as_bytes()).unwrap(), &origin, 1);
    }
    let events = events.finish();
    let mut rejects = RejectBatchBuilder::new();
    let err = decode(b"{oops").unwrap_err();
    rejects.append(
        b"{oops",
        &err,
        &Origin::File {
            path: "x.ndjson",
            line: 3,
        },
        1_789_380_000_000_000,
    );
    let rejects = rejects.finish();
    let first = events.slice(0, 20);
    let second = events.slice(20, 30);
    old_file(lake, "lease_events/date=2026-09-14/a.parquet", &first);
    old_file(lake, "lease_events/date=2026-09-14/b.parquet", &second);
    old_file(lake, "lease_rejects/date=2026-09-14/c.parquet", &rejects);
    // An orphan of a writer that died before committing: not in the lake.
    old_file(lake, "lease_events/date=2026-09-14/orphan.parquet", &first);
    let manifest = serde_json::json!({
        "version": 3,
        "schema_version": 1,
        "committed_at": "2026-09-14T10:01:00Z",
        "operation": "append",
        "files": [
            {"table": "lease_events", "path": "lease_events/date=2026-09-14/a.parquet", "rows": 20, "bytes": 1, "min_ts_us": 0, "max_ts_us": 0, "level": 0},
            {"table": "lease_events", "path": "lease_events/date=2026-09-14/b.parquet", "rows": 30, "bytes": 1, "min_ts_us": 0, "max_ts_us": 0, "level": 0},
            {"table": "lease_rejects", "path": "lease_rejects/date=2026-09-14/c.parquet", "rows": 1, "bytes": 1, "min_ts_us": 0, "max_ts_us": 0, "level": 0}
        ],
        "kafka": {"t": {"0": 25, "1": 25}},
        "removed": []
    });
    std::fs::create_dir_all(lake.join("_manifest")).unwrap();
    std::fs::write(
        lake.join("_manifest/00000000000000000003.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    (events, rejects)
}

fn sorted(table: Table, b: &RecordBatch) -> RecordBatch {
    parquet_io::sort_for_table(table, b).unwrap()
}

#[tokio::test]
async fn an_old_lake_becomes_delta_tables_with_the_same_rows_and_positions() {
    let dir = tempfile::tempdir().unwrap();
    let (events, rejects) = old_lake(dir.path());
    let location = dir.path().to_str().unwrap();
    let err = Lake::open_existing(location).await.unwrap_err();
    assert!(err.to_string().contains("leaseline migrate"), "{err}");
    // A migration that died after writing a Delta log starts over.
    std::fs::create_dir_all(dir.path().join("lease_events/_delta_log")).unwrap();
    std::fs::write(
        dir.path()
            .join("lease_events/_delta_log/00000000000000000000.json"),
        "{}",
    )
    .unwrap();

    let report = migrate(location, "g").await.unwrap();
    assert_eq!(
        (report.from_version, report.events, report.rejects),
        (3, 50, 1)
    );
    assert!(!dir.path().join("_manifest").exists());
    assert!(!dir
        .path()
        .join("lease_events/date=2026-09-14/a.parquet")
        .exists());

    let lake = Lake::open_existing(location).await.unwrap();
    lake.track_partitions("g", [("t".to_string(), 0), ("t".to_string(), 1)]);
    let m = lake.latest().await.unwrap();
    assert_eq!(m.next_offset("t", 0), Some(25));
    assert_eq!(m.next_offset("t", 1), Some(25));
    assert_eq!(m.next_reject_offset("t", 1), Some(25));
    let got = lake.read_table(&m, Table::LeaseEvents).await.unwrap();
    assert_eq!(
        sorted(Table::LeaseEvents, &got),
        sorted(Table::LeaseEvents, &events),
        "every event, with all 64 bits of its token"
    );
    let got = lake.read_table(&m, Table::LeaseRejects).await.unwrap();
    assert_eq!(got, rejects);

    // Run again: there is nothing left to migrate.
    let err = migrate(location, "g").await.unwrap_err();
    assert!(matches!(err, LakeError::Delta(_)), "{err}");
    assert!(err.to_string().contains("already"), "{err}");
}

#[tokio::test]
async fn a_count_that_does_not_match_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    old_lake(dir.path());
    let path = dir.path().join("_manifest/00000000000000000003.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(r#""rows":30"#, r#""rows":31"#);
    std::fs::write(&path, text).unwrap();
    let err = migrate(dir.path().to_str().unwrap(), "g")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nothing was changed"), "{err}");
    assert!(path.exists());
    assert!(dir
        .path()
        .join("lease_events/date=2026-09-14/a.parquet")
        .exists());
}
