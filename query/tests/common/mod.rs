//! What the query tests (and the server's, which include this file) share.

use leaseline_lake::{Change, Lake, Manifest, Table};
use leaseline_schema::{decode, EventBatchBuilder, Origin};

/// Commits `lines` (events of the contract, one per line) as one file of
/// `lease_events`; the lake's manifest after the commit.
pub async fn append<S: AsRef<str>>(lake: &Lake, lines: &[S]) -> Manifest {
    let mut b = EventBatchBuilder::new();
    for (i, l) in lines.iter().enumerate() {
        let origin = Origin::File {
            path: "t.ndjson",
            line: i as u64 + 1,
        };
        b.append(&decode(l.as_ref().as_bytes()).unwrap(), &origin, 0);
    }
    let files = lake.write(Table::LeaseEvents, &b.finish()).await.unwrap();
    let base = lake.latest().await.unwrap();
    let change = Change::Append {
        files,
        kafka: vec![],
        reject_kafka: vec![],
    };
    lake.commit(&base, &change).await.unwrap();
    lake.latest().await.unwrap()
}
