//! How long opening a Delta table takes after many commits: builds a lake
//! whose `lease_events` has `N` commits (default 10,000; one small file
//! each, checkpoints as configured), then times a fresh process's view of
//! it (`Lake::open_existing` + `latest`, which reads the last checkpoint
//! and the commits after it) several times and prints the median.
//!
//! `cargo run --release -p leaseline-lake --example bench_open -- [N] [DIR]`

use std::time::{Duration, Instant};

use leaseline_lake::{Change, KafkaRange, Lake, Table};
use leaseline_schema::{decode, EventBatchBuilder, Origin};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(10_000, |s| s.parse().expect("N"));
    let dir = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("leaseline-bench-open-{}", std::process::id()))
        });
    let location = dir.to_str().unwrap().to_string();
    let lake = Lake::open(&location).unwrap();
    lake.track_partitions("bench", [("t".to_string(), 0)]);
    let start = Instant::now();
    let mut base = lake.latest().await.unwrap();
    let have = base.next_offset("t", 0).unwrap_or(0) as u64;
    for i in have..n {
        let line = format!(
            r#"{{"ts":"2026-09-14T10:00:00Z","kind":"renewed","source":"holder","lease_id":"l/{}","holder_id":"h","fencing_token":1,"event_id":"e{i}"}}"#,
            i % 100
        );
        let mut b = EventBatchBuilder::new();
        let origin = Origin::Kafka {
            topic: "t",
            partition: 0,
            offset: i as i64,
        };
        b.append(&decode(line.as_bytes()).unwrap(), &origin, 0);
        let files = lake.write(Table::LeaseEvents, &b.finish()).await.unwrap();
        let change = Change::Append {
            files,
            kafka: vec![KafkaRange {
                topic: "t".into(),
                partition: 0,
                start: i as i64,
                end: i as i64 + 1,
            }],
            reject_kafka: vec![],
        };
        base = lake.commit(&base, &change).await.unwrap();
    }
    eprintln!("built {n} commits in {:.1?}", start.elapsed());
    let mut times: Vec<Duration> = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let fresh = Lake::open_existing(&location).await.unwrap();
        fresh.track_partitions("bench", [("t".to_string(), 0)]);
        let m = fresh.latest().await.unwrap();
        times.push(t.elapsed());
        assert_eq!(m.rows_of(Table::LeaseEvents), n);
        assert_eq!(m.next_offset("t", 0), Some(n as i64));
    }
    times.sort();
    println!(
        "open a lake whose lease_events has {n} commits ({} files): median {:.0} ms, min {:.0} ms, max {:.0} ms over {} opens",
        n,
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times.len()
    );
}
