//! Compaction's merge: files of one table and day, each sorted the way the
//! table lays its files out, merged into one sorted file while they are
//! decoded.
//!
//! Memory holds one small batch per input (smaller the more inputs there
//! are, [`READ_ROWS`] rows in all), the rows waiting to be written and the
//! encoded output, never the inputs decoded whole. A day of events
//! decodes to about ten times its Parquet size; merging it as one batch
//! (decode, concatenate, sort, encode) made compaction the largest
//! allocation of a long-running ingester, gigabytes at 128 MiB files,
//! which glibc then kept.
//!
//! The inputs are merged by their sort key in Arrow's row format (bytes
//! that compare as the key does, nulls first as [`sort_for_table`] puts
//! them); ties go to the earlier input, so the output is deterministic. An
//! input that is not sorted is an error ([`Unsorted`]), and the caller
//! merges that group the old way, by sorting it whole.
//!
//! [`sort_for_table`]: crate::parquet_io::sort_for_table

use arrow::array::{AsArray, RecordBatch};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ArrowWriter;

use crate::delta::{storage_schema, time_column};
use crate::error::{LakeError, Result};
use crate::manifest::Table;
use crate::parquet_io::{cast_to, schema_of, sort_columns, writer_properties};

/// Rows decoded at a time, over all inputs. A decoded `lease_events` row
/// takes up to a kilobyte with its strings' buffers: a batch of 8 Ki rows
/// from each of up to 64 inputs held 470–780 MB while it was merged, the
/// largest passing allocation of a long-running ingester (jemalloc's
/// profile of a 50 M-event build).
const READ_ROWS: usize = 64 * 1024;
/// Rows decoded per input at a time, at most and at least: fewer rows
/// per batch cost more per-batch work for each row decoded.
const READ_BATCH: (usize, usize) = (1024, 8 * 1024);
/// Rows gathered before they are handed to the Parquet writer.
const WRITE_BATCH: usize = 8 * 1024;

/// One merged file, encoded, and what its manifest entry records.
pub struct Merged {
    pub bytes: Vec<u8>,
    pub rows: u64,
    pub min_ts_us: i64,
    pub max_ts_us: i64,
}

/// Why [`merge_sorted`] refused its inputs: one of them is not in the
/// table's order, so a merge would not sort the output.
#[derive(Debug)]
pub struct Unsorted;

struct Input {
    reader: ParquetRecordBatchReader,
    /// Index of the current batch in the pool.
    batch: usize,
    rows: Rows,
    pos: usize,
}

/// How inputs are decoded and keyed.
struct Keys {
    schema: SchemaRef,
    converter: RowConverter,
    columns: Vec<usize>,
}

impl Keys {
    /// The reader's next non-empty batch, in the storage types, pushed to
    /// `pool`, and its keys; `None` at its end.
    fn next(
        &self,
        reader: &mut ParquetRecordBatchReader,
        pool: &mut Vec<RecordBatch>,
    ) -> Result<Option<(usize, Rows)>> {
        for batch in reader.by_ref() {
            let batch = cast_to(&batch?, self.schema.clone())?;
            if batch.num_rows() == 0 {
                continue;
            }
            let cols: Vec<_> = self
                .columns
                .iter()
                .map(|&i| batch.column(i).clone())
                .collect();
            let rows = self.converter.convert_columns(&cols)?;
            pool.push(batch);
            return Ok(Some((pool.len() - 1, rows)));
        }
        Ok(None)
    }
}

/// Rows decoded per input at a time when `inputs` are merged: their
/// share of [`READ_ROWS`], within [`READ_BATCH`].
fn read_batch(inputs: usize) -> usize {
    (READ_ROWS / inputs.max(1)).clamp(READ_BATCH.0, READ_BATCH.1)
}

/// Whether input `a`'s current row comes before input `b`'s.
fn before(inputs: &[Input], a: usize, b: usize) -> bool {
    let (x, y) = (&inputs[a], &inputs[b]);
    (x.rows.row(x.pos), a) < (y.rows.row(y.pos), b)
}

/// Merges `inputs` (Parquet files of `table`, each sorted by the table's
/// order) into one sorted Parquet file. `Err(Ok(Unsorted))` when an input
/// is out of order; `Err(Err(e))` when one cannot be read.
pub fn merge_sorted(
    table: Table,
    inputs: Vec<Bytes>,
) -> std::result::Result<Merged, std::result::Result<Unsorted, LakeError>> {
    let err = |e: LakeError| Err(e);
    let schema = storage_schema(&schema_of(table));
    let columns: Vec<usize> = sort_columns(table)
        .iter()
        .map(|n| schema.index_of(n).expect("sort column of the table"))
        .collect();
    let fields = columns
        .iter()
        .map(|&i| SortField::new(schema.field(i).data_type().clone()))
        .collect();
    let keys = Keys {
        schema: schema.clone(),
        converter: RowConverter::new(fields).map_err(|e| err(e.into()))?,
        columns,
    };
    let mut pool = Vec::new();
    let mut open = Vec::new();
    let batch_size = read_batch(inputs.len());
    for bytes in inputs {
        let mut reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.with_batch_size(batch_size).build())
            .map_err(|e| err(e.into()))?;
        if let Some((batch, rows)) = keys.next(&mut reader, &mut pool).map_err(err)? {
            open.push(Input {
                reader,
                batch,
                rows,
                pos: 0,
            });
        }
    }
    let mut inputs = open;
    // Inputs not yet exhausted, by their current row, first first.
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&inputs[a], &inputs[b]);
        (x.rows.row(x.pos), a).cmp(&(y.rows.row(y.pos), b))
    });

    let mut buf = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut buf, schema.clone(), Some(writer_properties(table)))
        .map_err(|e| err(e.into()))?;
    let ts = schema.index_of(time_column(table)).expect("time column");
    let (mut rows, mut min_ts_us, mut max_ts_us) = (0u64, i64::MAX, i64::MIN);
    let mut pending: Vec<(usize, usize)> = Vec::with_capacity(WRITE_BATCH);
    while let Some(&i) = order.first() {
        let input = &mut inputs[i];
        pending.push((input.batch, input.pos));
        input.pos += 1;
        if input.pos < input.rows.num_rows() {
            if input.rows.row(input.pos) < input.rows.row(input.pos - 1) {
                return Err(Ok(Unsorted));
            }
        } else {
            let last: OwnedRow = input.rows.row(input.pos - 1).owned();
            match keys.next(&mut input.reader, &mut pool).map_err(err)? {
                Some((batch, next)) => {
                    if next.row(0) < last.row() {
                        return Err(Ok(Unsorted));
                    }
                    (input.batch, input.rows, input.pos) = (batch, next, 0);
                }
                None => {
                    order.remove(0);
                }
            }
        }
        // Back in its place among the others; a run from one input stays
        // at the front without a search.
        if order.first() == Some(&i) && order.len() > 1 && !before(&inputs, i, order[1]) {
            order.remove(0);
            let at = order.partition_point(|&o| before(&inputs, o, i));
            order.insert(at, i);
        }
        if pending.len() == WRITE_BATCH || order.is_empty() {
            let batches: Vec<&RecordBatch> = pool.iter().collect();
            let out = interleave_record_batch(&batches, &pending).map_err(|e| err(e.into()))?;
            pending.clear();
            let t = out.column(ts).as_primitive::<TimestampMicrosecondType>();
            min_ts_us = min_ts_us.min(arrow::compute::min(t).unwrap_or(i64::MAX));
            max_ts_us = max_ts_us.max(arrow::compute::max(t).unwrap_or(i64::MIN));
            rows += out.num_rows() as u64;
            writer.write(&out).map_err(|e| err(e.into()))?;
            // From here on only the open inputs' current batches are
            // pointed into.
            let mut kept = Vec::with_capacity(order.len());
            for &o in &order {
                kept.push(pool[inputs[o].batch].clone());
                inputs[o].batch = kept.len() - 1;
            }
            pool = kept;
        }
    }
    writer.close().map_err(|e| Err(e.into()))?;
    if rows == 0 {
        (min_ts_us, max_ts_us) = (0, 0);
    }
    Ok(Merged {
        bytes: buf,
        rows,
        min_ts_us,
        max_ts_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parquet_io::{concat, encode, from_storage, sort_for_table};
    use leaseline_schema::{decode, EventBatchBuilder, Origin};

    #[test]
    fn the_more_inputs_the_fewer_rows_each_decodes_at_a_time() {
        assert_eq!(read_batch(0), 8 * 1024);
        assert_eq!(read_batch(1), 8 * 1024);
        assert_eq!(read_batch(8), 8 * 1024);
        assert_eq!(read_batch(16), 4 * 1024);
        assert_eq!(read_batch(64), 1024);
        assert_eq!(read_batch(1000), 1024);
        // Rows decoded at once stay within the budget up to 64 inputs.
        assert!((1..=64).all(|n| n * read_batch(n) <= READ_ROWS));
    }

    /// `n` events of a few leases at pseudo-random times, from Kafka
    /// partition `partition`; times repeat, so keys tie on `(lease, ts)`
    /// across inputs and are told apart by their Kafka position.
    fn events(n: u64, partition: i32, seed: u64) -> RecordBatch {
        let mut b = EventBatchBuilder::new();
        let mut x = seed;
        for offset in 0..n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let line = format!(
                r#"{{"ts":"2026-09-14T10:{:02}:{:02}Z","kind":"renewed","source":"holder","lease_id":"l/{}","holder_id":"h{partition}","fencing_token":{},"event_id":"e-{partition}-{offset}"}}"#,
                (x >> 40) % 60,
                (x >> 20) % 60,
                (x >> 8) % 13,
                x >> 1,
            );
            let ev = decode(line.as_bytes()).unwrap();
            let origin = Origin::Kafka {
                topic: "t",
                partition,
                offset: offset as i64,
            };
            b.append(&ev, &origin, 0);
        }
        b.finish()
    }

    fn file(batch: &RecordBatch) -> Bytes {
        Bytes::from(encode(Table::LeaseEvents, batch).unwrap())
    }

    fn read(bytes: Vec<u8>) -> RecordBatch {
        let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes))
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<_> = reader.map(|b| from_storage(b.unwrap()).unwrap()).collect();
        concat(Table::LeaseEvents, &batches).unwrap()
    }

    #[test]
    fn the_merge_is_the_sort_of_the_whole() {
        // Inputs of several read batches each, and an output of several
        // write batches; one input empty.
        merges_as_sorted(&[(20_000, 0), (9_000, 1), (0, 2), (17_500, 3)]);
        // Enough inputs for each to be read in batches of fewer rows.
        let many: Vec<(u64, i32)> = (0..48).map(|p| (2_000 + 37 * p as u64, p)).collect();
        assert_eq!(read_batch(many.len()), 1365);
        merges_as_sorted(&many);
    }

    /// Inputs of `(rows, partition)` merged are their concatenation sorted.
    fn merges_as_sorted(inputs: &[(u64, i32)]) {
        let parts: Vec<RecordBatch> = inputs
            .iter()
            .map(|&(n, p)| sort_for_table(Table::LeaseEvents, &events(n, p, p as u64 + 1)).unwrap())
            .collect();
        let merged = merge_sorted(Table::LeaseEvents, parts.iter().map(file).collect())
            .unwrap_or_else(|_| panic!("sorted inputs merge"));
        let whole = sort_for_table(
            Table::LeaseEvents,
            &concat(Table::LeaseEvents, &parts).unwrap(),
        )
        .unwrap();
        assert_eq!(merged.rows, inputs.iter().map(|&(n, _)| n).sum::<u64>());
        let ts = whole
            .column_by_name("ts")
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>();
        assert_eq!(
            (merged.min_ts_us, merged.max_ts_us),
            (
                arrow::compute::min(ts).unwrap(),
                arrow::compute::max(ts).unwrap()
            )
        );
        assert_eq!(read(merged.bytes), whole);
    }

    #[test]
    fn ties_go_to_the_earlier_input() {
        // The same keys in both inputs, told apart only by the holder.
        let a = sort_for_table(Table::LeaseEvents, &events(50, 0, 9)).unwrap();
        let holder = |batch: &RecordBatch, h: &str| {
            let idx = batch.schema().index_of("holder_id").unwrap();
            let mut cols = batch.columns().to_vec();
            cols[idx] =
                std::sync::Arc::new(arrow::array::StringArray::from(vec![h; batch.num_rows()]));
            RecordBatch::try_new(batch.schema(), cols).unwrap()
        };
        let merged = merge_sorted(
            Table::LeaseEvents,
            vec![file(&holder(&a, "first")), file(&holder(&a, "second"))],
        )
        .unwrap_or_else(|_| panic!("sorted inputs merge"));
        let out = read(merged.bytes);
        let holders = out.column_by_name("holder_id").unwrap().as_string::<i32>();
        let got: Vec<&str> = holders.iter().map(|h| h.unwrap()).collect();
        let want: Vec<&str> = (0..50).flat_map(|_| ["first", "second"]).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_input_out_of_order_is_refused() {
        let sorted = sort_for_table(Table::LeaseEvents, &events(100, 0, 3)).unwrap();
        let unsorted = events(100, 1, 4);
        match merge_sorted(Table::LeaseEvents, vec![file(&sorted), file(&unsorted)]) {
            Err(Ok(Unsorted)) => {}
            Ok(_) => panic!("an unsorted input was merged"),
            Err(Err(e)) => panic!("{e}"),
        }
    }
}
