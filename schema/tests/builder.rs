//! `EventBatchBuilder` over many rows and batches: every row reads back as
//! the event appended, whichever optional fields it had, and a builder
//! reused after `finish` starts clean.

mod support;

use leaseline_schema::{decode, EventBatchBuilder, Origin};
use support::roundtrip::read_back;

/// An event with each optional field present or not by the bits of `i`.
fn line(i: u32) -> String {
    let mut fields = vec![
        format!(r#""ts":{}"#, 1_789_380_000_000u64 + u64::from(i)),
        r#""kind":"write_accepted""#.to_string(),
        r#""source":"resource""#.to_string(),
        format!(r#""lease_id":"lease-{}""#, i % 7),
        format!(r#""fencing_token":{i}"#),
    ];
    let optional = [
        format!(r#""holder_id":"h{i}""#),
        r#""ttl_ms":5000"#.to_string(),
        format!(r#""event_id":"e{i}""#),
        r#""backend":"etcd""#.to_string(),
        format!(r#""latency_ms":{}.5"#, i % 100),
        r#""reason":"r""#.to_string(),
        format!(r#""max_token":{}"#, i + 1),
        format!(r#""mono_ms":{i}.25"#),
        r#""keepalive_sent_mono_ms":1.5"#.to_string(),
        r#""deadline_mono_ms":2.5"#.to_string(),
        r#""trace_id":"0af7651916cd43dd8448eb211c80319c""#.to_string(),
        r#""span_id":"b7ad6b7169203331""#.to_string(),
        format!(r#""attrs":{{"n":"{i}"}}"#),
    ];
    // A different mix per row: bit k of a scrambled i decides field k.
    let bits = i.wrapping_mul(0x9e37_79b9) >> 7;
    for (k, f) in optional.into_iter().enumerate() {
        if bits >> k & 1 == 1 {
            fields.push(f);
        }
    }
    format!("{{{}}}", fields.join(","))
}

#[test]
fn every_row_of_many_batches_reads_back() {
    let mut b = EventBatchBuilder::new();
    for (batch_no, rows) in [1000u32, 3, 0, 777].into_iter().enumerate() {
        let lines: Vec<String> = (0..rows)
            .map(|i| line(i + batch_no as u32 * 10_000))
            .collect();
        let events: Vec<_> = lines
            .iter()
            .map(|l| decode(l.as_bytes()).unwrap())
            .collect();
        for (i, e) in events.iter().enumerate() {
            let origin = if i % 2 == 0 {
                Origin::Kafka {
                    topic: "t",
                    partition: 1,
                    offset: i as i64,
                }
            } else {
                Origin::File {
                    path: "f",
                    line: i as u64,
                }
            };
            b.append(e, &origin, 7);
        }
        assert_eq!(b.len(), rows as usize);
        let batch = b.finish();
        assert!(b.is_empty());
        assert_eq!(batch.num_rows(), rows as usize);
        for (i, e) in events.iter().enumerate() {
            assert_eq!(
                read_back(&batch, i),
                *e,
                "batch {batch_no} row {i}: {}",
                lines[i]
            );
        }
    }
}
