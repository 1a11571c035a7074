//! The lake writer on a local lake: de-duplication, what happens when two
//! writers race for the same partition or the same event, and what reaches
//! the process's consumers (only what the lake committed).

use leaseline_ingest::{
    Committed, Fanout, FlushPolicy, InputPartition, LakeWriter, Notice, Pushed,
};
use leaseline_lake::{Lake, Table};
use leaseline_schema::Origin;

fn event(id: &str, token: u64) -> Vec<u8> {
    format!(
        r#"{{"ts":"2026-09-14T10:00:00Z","kind":"renewed","source":"holder","lease_id":"l/1","holder_id":"h","fencing_token":{token},"event_id":"{id}"}}"#
    )
    .into_bytes()
}

fn kafka(partition: i32, offset: i64) -> Origin<'static> {
    Origin::Kafka {
        topic: "t",
        partition,
        offset,
    }
}

async fn rows(lake: &Lake, table: Table) -> u64 {
    lake.latest().await.unwrap().rows_of(table)
}

#[tokio::test]
async fn duplicates_are_dropped_within_a_batch_and_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    assert_eq!(w.push(&event("a", 1), kafka(0, 0)), Pushed::Event);
    assert_eq!(w.push(&event("a", 1), kafka(0, 1)), Pushed::Duplicate);
    assert_eq!(w.push(b"{oops", kafka(0, 2)), Pushed::Reject);
    let report = w.flush().await.unwrap();
    assert_eq!((report.events, report.rejects), (1, 1));
    assert_eq!(w.manifest().next_offset("t", 0), Some(3));
    assert!(w.already_committed("t", 0, 2));
    assert!(!w.already_committed("t", 0, 3));
    drop(w);

    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    assert_eq!(
        w.push(&event("a", 1), Origin::File { path: "x", line: 1 }),
        Pushed::Duplicate
    );
    assert_eq!(
        w.push(&event("b", 2), Origin::File { path: "x", line: 2 }),
        Pushed::Event
    );
    // A reader of the topic with no position in the lake (another
    // consumer group) meets the malformed message again: kept once.
    assert_eq!(w.push(b"{oops", kafka(0, 2)), Pushed::Duplicate);
    w.flush().await.unwrap();
    assert_eq!(rows(&lake, Table::LeaseEvents).await, 2);
    assert_eq!(rows(&lake, Table::LeaseRejects).await, 1);
}

#[tokio::test]
async fn a_zombie_writer_cannot_commit_a_partition_another_writer_took() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut zombie = LakeWriter::open(lake.clone()).await.unwrap();
    let mut owner = LakeWriter::open(lake.clone()).await.unwrap();
    // Both consumed partition 0 from offset 0 (the zombie was paused through
    // a rebalance); the zombie also has partition 1, which nobody took.
    for o in 0..10 {
        zombie.push(&event(&format!("p0-{o}"), 1), kafka(0, o));
    }
    zombie.push(&event("p1-0", 1), kafka(1, 0));
    for o in 0..15 {
        owner.push(&event(&format!("p0-{o}"), 1), kafka(0, o));
    }
    owner.flush().await.unwrap();

    let report = zombie.flush().await.unwrap();
    assert_eq!(report.lost_partitions, vec![("t".to_string(), 0)]);
    assert_eq!(report.events, 1, "only partition 1's row is committed");
    let m = lake.latest().await.unwrap();
    assert_eq!(m.next_offset("t", 0), Some(15));
    assert_eq!(m.next_offset("t", 1), Some(1));
    assert_eq!(m.rows_of(Table::LeaseEvents), 16);

    // If the zombie reads partition 0 again from the lake's offset, the
    // rows it dropped do not count as seen.
    assert_eq!(zombie.push(&event("p0-15", 1), kafka(0, 15)), Pushed::Event);
}

#[tokio::test]
async fn the_same_event_through_two_writers_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut a = LakeWriter::open(lake.clone()).await.unwrap();
    let mut b = LakeWriter::open(lake.clone()).await.unwrap();
    // A producer retry sent one event to two partitions owned by two writers.
    a.push(&event("retry", 7), kafka(0, 0));
    a.push(&event("only-a", 7), kafka(0, 1));
    b.push(&event("retry", 7), kafka(1, 0));
    b.flush().await.unwrap();
    let report = a.flush().await.unwrap();
    assert_eq!(report.events, 1);
    assert_eq!(rows(&lake, Table::LeaseEvents).await, 2);
    assert_eq!(lake.latest().await.unwrap().next_offset("t", 0), Some(2));
    assert_eq!(a.stats().duplicates, 1);
}

#[tokio::test]
async fn flush_policy_by_rows_bytes_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut w = LakeWriter::open(lake).await.unwrap();
    // Rows and bytes are checked with a time limit that cannot pass
    // during the test, so a slow machine cannot make them flaky.
    let never = FlushPolicy {
        max_rows: 3,
        max_bytes: bytesize::ByteSize::b(10_000),
        flush_interval: std::time::Duration::from_secs(3600),
        idle_flush: std::time::Duration::from_secs(3600),
    };
    assert!(!w.should_flush(&never));
    assert!(
        !w.idle_flush_due(&FlushPolicy::default()),
        "nothing buffered"
    );
    w.push(&event("1", 1), kafka(0, 0));
    assert!(!w.should_flush(&never), "one row, few bytes, young");
    let soon = FlushPolicy {
        flush_interval: std::time::Duration::from_millis(50),
        ..never
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!w.should_flush(&never), "time limit not reached");
    assert!(w.should_flush(&soon), "time limit");
    assert!(!w.idle_flush_due(&never), "idle limit not reached");
    let quiet = FlushPolicy {
        idle_flush: std::time::Duration::from_millis(50),
        ..never
    };
    assert!(w.idle_flush_due(&quiet), "idle limit");
    assert!(
        !w.should_flush(&quiet),
        "the idle limit counts only when the input is quiet"
    );
    w.flush().await.unwrap();
    assert!(
        !w.should_flush(&soon),
        "the clock starts at the first buffered row"
    );
    for i in 0..3 {
        w.push(&event(&format!("r{i}"), 1), kafka(0, 1 + i));
    }
    assert!(w.should_flush(&never), "row limit");
    w.flush().await.unwrap();
    // Bytes are the message payloads: the limit falls between one and two.
    let two = (event("b1", 1).len() + event("b2", 1).len()) as u64;
    let big = FlushPolicy {
        max_rows: 1000,
        max_bytes: bytesize::ByteSize::b(two),
        ..never
    };
    w.push(&event("b1", 1), kafka(0, 10));
    assert!(
        !w.should_flush(&big),
        "one small row is under the byte limit"
    );
    w.push(&event("b2", 1), kafka(0, 11));
    assert!(w.should_flush(&big), "byte limit");
}

/// The event ids in the batches a fan-out has received so far.
fn fanned_out(rx: &mut leaseline_ingest::CommittedReceiver) -> Vec<String> {
    let mut ids = Vec::new();
    while let Ok(batch) = rx.try_recv() {
        for c in batch {
            if let Committed::Event(ev, _, _) = c {
                ids.push(ev.event_id.unwrap().into_owned());
            }
        }
    }
    ids
}

#[tokio::test]
async fn consumers_see_an_event_only_once_the_lake_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let (fanout, mut rx) = Fanout::channel(8);
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    w.attach(Some(fanout), None);
    w.push(&event("a", 1), kafka(0, 0));
    w.push(&event("a", 1), kafka(0, 1));
    w.push(b"{oops", kafka(0, 2));
    w.signal(Notice::CaughtUp(InputPartition {
        topic: "t",
        partition: 0,
    }));
    w.send_notices().await;
    assert!(rx.try_recv().is_err(), "nothing is committed yet");
    let report = w.flush().await.unwrap();
    let batch = rx.try_recv().unwrap();
    assert_eq!(batch.len(), 3, "{batch:?}");
    assert!(
        matches!(&batch[0], Committed::Event(ev, (t, 0), _) if &**t == "t" && ev.event_id.as_deref() == Some("a"))
    );
    assert_eq!(batch[1], Committed::CaughtUp(("t".into(), 0)));
    assert_eq!(
        batch[2],
        Committed::Commit {
            version: report.version,
            lake_rows: report.lake_events,
        },
        "the batch ends with the version that holds it"
    );
    assert_eq!(report.version, lake.latest().await.unwrap().version);
}

#[tokio::test]
async fn rows_a_conflict_drops_never_reach_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let (fanout, mut rx) = Fanout::channel(8);
    let mut zombie = LakeWriter::open(lake.clone()).await.unwrap();
    zombie.attach(Some(fanout), None);
    let mut owner = LakeWriter::open(lake.clone()).await.unwrap();
    for o in 0..10 {
        zombie.push(&event(&format!("p0-{o}"), 1), kafka(0, o));
    }
    zombie.push(&event("p1-0", 1), kafka(1, 0));
    // Partition 2 carries an event another writer commits through another
    // partition first: a producer retry.
    zombie.push(&event("retry", 1), kafka(2, 0));
    for o in 0..15 {
        owner.push(&event(&format!("p0-{o}"), 1), kafka(0, o));
    }
    owner.push(&event("retry", 1), kafka(3, 0));
    owner.flush().await.unwrap();

    zombie.flush().await.unwrap();
    assert_eq!(fanned_out(&mut rx), vec!["p1-0".to_string()]);

    // Read again from the lake's offset, partition 0's next event is new,
    // and reaches consumers after its commit.
    zombie.push(&event("p0-15", 1), kafka(0, 15));
    zombie.flush().await.unwrap();
    assert_eq!(fanned_out(&mut rx), vec!["p0-15".to_string()]);
}

#[tokio::test]
async fn a_reset_forgets_what_was_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let (fanout, mut rx) = Fanout::channel(8);
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    w.attach(Some(fanout), None);
    w.push(&event("lost", 1), kafka(0, 0));
    // As after a failed flush: the buffer is gone, read again later.
    w.reset().await.unwrap();
    w.push(&event("lost", 1), kafka(0, 0));
    w.flush().await.unwrap();
    assert_eq!(fanned_out(&mut rx), vec!["lost".to_string()]);
}

fn event_on(day: &str, id: &str) -> Vec<u8> {
    format!(
        r#"{{"ts":"{day}T10:00:00Z","kind":"renewed","source":"holder","lease_id":"l/1","holder_id":"h","fencing_token":1,"event_id":"{id}"}}"#
    )
    .into_bytes()
}

async fn event_ids(lake: &Lake) -> Vec<String> {
    use arrow::array::AsArray;
    let m = lake.latest().await.unwrap();
    let batch = lake.read_table(&m, Table::LeaseEvents).await.unwrap();
    let mut ids: Vec<String> = batch
        .column_by_name("event_id")
        .unwrap()
        .as_string::<i32>()
        .iter()
        .flatten()
        .map(str::to_string)
        .collect();
    ids.sort();
    ids
}

/// The first minute in memory once `event_on(day, _)` is the newest event:
/// the minutes of the three days up to it.
fn window_start(day: &str) -> i32 {
    let t = chrono::DateTime::parse_from_rfc3339(&format!("{day}T10:00:00Z")).unwrap();
    leaseline_lake::slot_of(t.timestamp_micros()) + 1 - leaseline_lake::MAX_RESIDENT_SLOTS
}

/// Memory holds the ids of the newest three days of minutes at most; a
/// duplicate of an older minute, days later, is found in the files that
/// span it.
#[tokio::test]
async fn a_duplicate_days_after_its_original_left_memory_is_still_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    let mut offset = 0;
    let mut push = |w: &mut LakeWriter, payload: Vec<u8>| {
        offset += 1;
        w.push(&payload, kafka(0, offset))
    };
    for i in 0..50 {
        assert_eq!(
            push(&mut w, event_on("2026-09-01", &format!("old-{i}"))),
            Pushed::Event
        );
    }
    w.flush().await.unwrap();
    assert_eq!(w.ids_in_memory(), (50, Some(window_start("2026-09-01"))));
    // Five days on: 2026-09-01 leaves memory.
    for i in 0..10 {
        push(&mut w, event_on("2026-09-06", &format!("new-{i}")));
    }
    w.flush().await.unwrap();
    assert_eq!(w.ids_in_memory(), (10, Some(window_start("2026-09-06"))));

    // Redelivered a week later: unknown to memory when pushed, found in
    // the lake at the commit. Twice in one buffer, and a genuinely new
    // late event beside them.
    let before = w.stats().duplicates;
    push(&mut w, event_on("2026-09-01", "old-7"));
    push(&mut w, event_on("2026-09-01", "old-7"));
    assert_eq!(
        push(&mut w, event_on("2026-09-01", "late-but-new")),
        Pushed::Event
    );
    let report = w.flush().await.unwrap();
    assert_eq!(report.events, 1);
    assert_eq!(w.stats().duplicates - before, 2);
    assert_eq!(event_ids(&lake).await.len(), 61);
    // Memory still holds only the newest minutes.
    assert_eq!(w.ids_in_memory().0, 10);

    // A restarted writer loads only the newest minutes' ids, and still drops
    // the old duplicate, and the late one it committed last.
    drop(w);
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    assert_eq!(w.ids_in_memory(), (10, Some(window_start("2026-09-06"))));
    assert_eq!(
        w.push(&event_on("2026-09-01", "old-3"), kafka(0, 100)),
        Pushed::Event
    );
    w.push(&event_on("2026-09-01", "late-but-new"), kafka(0, 101));
    assert_eq!(
        w.push(&event_on("2026-09-06", "new-3"), kafka(0, 102)),
        Pushed::Duplicate
    );
    let report = w.flush().await.unwrap();
    assert_eq!(report.events, 0);
    assert_eq!(w.manifest().next_offset("t", 0), Some(103));
    let ids = event_ids(&lake).await;
    assert_eq!(ids.len(), 61);
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(distinct, ids);
}

/// The old day's files were merged by compaction (and the replaced ones
/// vacuumed) before the duplicate came: it is found in the merged file.
#[tokio::test]
async fn a_duplicate_arriving_after_its_day_was_compacted_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let mut w = LakeWriter::open(lake.clone()).await.unwrap();
    let mut offset = 0;
    for batch in 0..4 {
        for i in 0..25 {
            offset += 1;
            w.push(
                &event_on("2026-09-01", &format!("b{batch}-{i}")),
                kafka(0, offset),
            );
        }
        w.flush().await.unwrap();
    }
    for i in 0..5 {
        offset += 1;
        w.push(
            &event_on("2026-09-10", &format!("later-{i}")),
            kafka(0, offset),
        );
    }
    w.flush().await.unwrap();
    let report = lake
        .compact(&leaseline_lake::CompactionPolicy::default())
        .await
        .unwrap();
    assert_eq!(report.merged_files, 4);
    lake.vacuum(std::time::Duration::ZERO).await.unwrap();
    let m = lake.latest().await.unwrap();
    assert_eq!(
        m.files_of(Table::LeaseEvents)
            .filter(|f| f.path.contains("date=2026-09-01"))
            .count(),
        1
    );

    w.refresh().await.unwrap();
    offset += 1;
    w.push(&event_on("2026-09-01", "b2-13"), kafka(0, offset));
    let report = w.flush().await.unwrap();
    assert_eq!(report.events, 0);
    assert_eq!(event_ids(&lake).await.len(), 105);
}
