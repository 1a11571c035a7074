//! The ingest loop with NDJSON files as its source: what reaches the
//! lake and, after each commit, the process's consumers.

use std::io::Write;

use leaseline_ingest::import::{import, ImportInput};
use leaseline_ingest::{Committed, Fanout, FlushPolicy};
use leaseline_lake::{Lake, Table};

fn line(id: usize, token: u64) -> String {
    format!(
        r#"{{"ts":"2026-09-14T10:00:{:02}Z","kind":"renewed","source":"holder","lease_id":"l/{}","holder_id":"h","fencing_token":{token},"event_id":"e{id}"}}"#,
        id % 60,
        id % 7
    )
}

fn file(dir: &std::path::Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    path.to_str().unwrap().to_string()
}

/// Imports `paths`, collecting what the fan-out delivers while it runs.
async fn import_collecting(
    lake: &Lake,
    paths: &[&str],
    policy: &FlushPolicy,
) -> (u64, Vec<Committed>) {
    // A capacity of one item: the import must wait for the consumer.
    let (fanout, mut rx) = Fanout::channel(1);
    let consumer = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(batch) = rx.recv().await {
            got.extend(batch);
        }
        got
    });
    let inputs = paths
        .iter()
        .map(|p| ImportInput::open(p).unwrap())
        .collect();
    let summary = import(lake.clone(), inputs, policy, Some(fanout), |_| {})
        .await
        .unwrap();
    (summary.events, consumer.await.unwrap())
}

fn event_ids(got: &[Committed]) -> Vec<String> {
    got.iter()
        .filter_map(|c| match c {
            Committed::Event(ev, _, _) => Some(ev.event_id.clone().unwrap().into_owned()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_import_hands_every_committed_event_to_consumers_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let mut lines: Vec<String> = (0..2_500).map(|i| line(i, 1)).collect();
    // A duplicate and a reject in the middle.
    lines.insert(100, line(5, 1));
    lines.insert(200, "{not json".to_string());
    let a = file(dir.path(), "a.ndjson", &lines);
    let small = FlushPolicy {
        max_rows: 300,
        ..FlushPolicy::default()
    };

    let (events, got) = import_collecting(&lake, &[&a], &small).await;
    assert_eq!(events, 2_500);
    let ids = event_ids(&got);
    let expected: Vec<String> = (0..2_500).map(|i| format!("e{i}")).collect();
    assert_eq!(ids, expected, "each event once, in the order read");
    assert_eq!(
        got.iter().rfind(|c| !matches!(c, Committed::Commit { .. })),
        Some(&Committed::CaughtUp(("".into(), 0))),
        "the end of the files comes after their last event"
    );
    let latest = lake.latest().await.unwrap();
    assert_eq!(latest.rows_of(Table::LeaseEvents), 2_500);
    let commits: Vec<u64> = got
        .iter()
        .filter_map(|c| match c {
            Committed::Commit { version, .. } => Some(*version),
            _ => None,
        })
        .collect();
    assert_eq!(commits.len(), 9, "one per flush of 300 rows");
    assert!(commits.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(commits.last(), Some(&latest.version));

    // Imported again, with a file of new events: only those are new.
    let b = file(
        dir.path(),
        "b.ndjson",
        &(2_500..2_600).map(|i| line(i, 1)).collect::<Vec<_>>(),
    );
    let (events, got) = import_collecting(&lake, &[&a, &b], &small).await;
    assert_eq!(events, 100);
    let expected: Vec<String> = (2_500..2_600).map(|i| format!("e{i}")).collect();
    assert_eq!(event_ids(&got), expected);
    assert_eq!(lake.latest().await.unwrap().rows_of(Table::LeaseRejects), 1);
}

/// `max_rows` holds however many lines a source has at once: each commit
/// of an import holds at most that many rows.
#[tokio::test]
async fn a_flush_policy_row_limit_holds_within_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let lines: Vec<String> = (0..1_000).map(|i| line(i, 1)).collect();
    let a = file(dir.path(), "a.ndjson", &lines);
    let policy = FlushPolicy {
        max_rows: 100,
        ..FlushPolicy::default()
    };
    let (events, _) = import_collecting(&lake, &[&a], &policy).await;
    assert_eq!(events, 1_000);
    let m = lake.latest().await.unwrap();
    let files: Vec<_> = m.files_of(Table::LeaseEvents).collect();
    assert_eq!(files.len(), 10, "{files:?}");
    assert!(files.iter().all(|f| f.rows == 100), "{files:?}");
}
