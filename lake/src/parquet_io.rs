//! Parquet files of the lake: written sorted and split by day, read back
//! whole or by column.

use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch, SortColumn};
use arrow::datatypes::{DataType, TimestampMicrosecondType};
use std::sync::Arc;

use bytes::Bytes;
use leaseline_schema::{
    ALERTS_SCHEMA, EVENTS_SCHEMA, REJECTS_SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY,
    STORED_CONTEXT_SCHEMA, STORED_TIMELINE_SCHEMA, STORED_VIOLATIONS_SCHEMA,
};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
pub use parquet::file::reader::ChunkReader;

use crate::error::Result;
use crate::manifest::{DataFile, Table};
use crate::store::LakeStore;

const MICROS_PER_DAY: i64 = 86_400_000_000;

use crate::delta::{storage_schema, time_column, U64_STORAGE};

pub fn schema_of(table: Table) -> arrow::datatypes::SchemaRef {
    match table {
        Table::LeaseEvents => EVENTS_SCHEMA.clone(),
        Table::LeaseRejects => REJECTS_SCHEMA.clone(),
        Table::LeaseAlerts => ALERTS_SCHEMA.clone(),
        Table::LeaseTimeline => STORED_TIMELINE_SCHEMA.clone(),
        Table::LeaseViolations => STORED_VIOLATIONS_SCHEMA.clone(),
        Table::LeaseContext => STORED_CONTEXT_SCHEMA.clone(),
    }
}

/// `batch`'s columns cast to `schema`'s types (which name the same
/// columns in the same order).
pub(crate) fn cast_to(
    batch: &RecordBatch,
    schema: arrow::datatypes::SchemaRef,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let cols = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                arrow::compute::cast(c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, cols)
}

/// A batch as the tables store it (see [`crate::delta`]): unsigned 64-bit
/// columns as `decimal(20,0)`, which holds all of them exactly.
pub fn to_storage(batch: &RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type() == &DataType::UInt64)
    {
        return Ok(batch.clone());
    }
    Ok(cast_to(batch, storage_schema(&batch.schema()))?)
}

/// A stored batch back in the tables' Arrow types: `decimal(20,0)` columns
/// as `UInt64`.
pub fn from_storage(batch: RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type() == &U64_STORAGE)
    {
        return Ok(batch);
    }
    let fields: Vec<arrow::datatypes::Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let t = if f.data_type() == &U64_STORAGE {
                DataType::UInt64
            } else {
                f.data_type().clone()
            };
            arrow::datatypes::Field::new(f.name(), t, f.is_nullable())
        })
        .collect();
    cast_to(
        &batch,
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
    )
}

pub(crate) fn writer_properties(table: Table) -> WriterProperties {
    let builder = match table {
        // Lookups of one event (is this id in the lake?) skip row groups
        // that cannot hold it.
        Table::LeaseEvents => {
            WriterProperties::builder().set_column_bloom_filter_enabled("event_id".into(), true)
        }
        _ => WriterProperties::builder(),
    };
    builder
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid level"),
        ))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(1_048_576))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            SCHEMA_VERSION_KEY.to_string(),
            SCHEMA_VERSION.to_string(),
        )]))
        .build()
}

/// The columns files are sorted by: events by `(lease_id, ts)`, so one
/// lease's history is contiguous and row-group statistics prune lookups of
/// one lease; rejects by arrival.
pub(crate) fn sort_columns(table: Table) -> &'static [&'static str] {
    match table {
        Table::LeaseEvents => &[
            "lease_id",
            "ts",
            "kafka_partition",
            "kafka_offset",
            "file_line",
        ],
        Table::LeaseRejects => &[
            "ingested_at",
            "kafka_partition",
            "kafka_offset",
            "file_line",
        ],
        Table::LeaseAlerts => &["recorded_at", "alertname", "lease_id"],
        // One lease's rows together, as for events: a re-audit reads the
        // files that hold a lease.
        Table::LeaseTimeline => &["lease_id", "acquired_at", "fencing_token"],
        Table::LeaseViolations => &["lease_id", "at", "kind", "fencing_token"],
        Table::LeaseContext => &["lease_id", "ts"],
    }
}

/// Sorts a batch the way files are laid out ([`sort_columns`]).
pub fn sort_for_table(table: Table, batch: &RecordBatch) -> Result<RecordBatch> {
    if batch.num_rows() <= 1 {
        return Ok(batch.clone());
    }
    let cols: Vec<SortColumn> = sort_columns(table)
        .iter()
        .map(|n| SortColumn {
            values: batch.column_by_name(n).expect("table column").clone(),
            options: None,
        })
        .collect();
    let idx = lexsort_to_indices(&cols, None)?;
    Ok(take_record_batch(batch, &idx)?)
}

/// Splits a batch by the UTC day of its time column.
fn split_by_day(table: Table, batch: &RecordBatch) -> Result<Vec<(i64, RecordBatch)>> {
    let ts = batch
        .column_by_name(time_column(table))
        .expect("time column")
        .as_primitive::<TimestampMicrosecondType>();
    let mut days: Vec<(i64, Vec<u32>)> = Vec::new();
    for i in 0..ts.len() {
        let day = ts.value(i).div_euclid(MICROS_PER_DAY);
        match days.iter_mut().find(|(d, _)| *d == day) {
            Some((_, rows)) => rows.push(i as u32),
            None => days.push((day, vec![i as u32])),
        }
    }
    if days.len() == 1 {
        return Ok(vec![(days[0].0, batch.clone())]);
    }
    days.into_iter()
        .map(|(day, rows)| Ok((day, take_record_batch(batch, &UInt32Array::from(rows))?)))
        .collect()
}

fn day_dir(day: i64) -> String {
    let date = chrono::DateTime::from_timestamp_micros(day * MICROS_PER_DAY)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "out-of-range".into());
    format!("date={date}")
}

/// Encodes one sorted batch of `table` as a Parquet file in memory.
pub fn encode(table: Table, batch: &RecordBatch) -> Result<Vec<u8>> {
    let batch = to_storage(batch)?;
    let mut buf = Vec::with_capacity(batch.get_array_memory_size() / 4 + 1024);
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(writer_properties(table)))?;
    w.write(&batch)?;
    w.close()?;
    Ok(buf)
}

fn min_max(table: Table, batch: &RecordBatch) -> (i64, i64) {
    let ts = batch
        .column_by_name(time_column(table))
        .expect("time column")
        .as_primitive::<TimestampMicrosecondType>();
    let min = arrow::compute::min(ts).unwrap_or(0);
    let max = arrow::compute::max(ts).unwrap_or(0);
    (min, max)
}

/// Writes `batch` as one file per day of the table's time column, each
/// sorted, and returns the files for a manifest commit. The files are not
/// part of the lake until that commit succeeds.
pub async fn write_table(
    store: &LakeStore,
    table: Table,
    batch: &RecordBatch,
    level: u32,
) -> Result<Vec<DataFile>> {
    if batch.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (day, part) in split_by_day(table, batch)? {
        let part = sort_for_table(table, &part)?;
        let bytes = encode(table, &part)?;
        let path = format!(
            "{}/{}/{}.parquet",
            table.name(),
            day_dir(day),
            uuid::Uuid::new_v4().simple()
        );
        let (min_ts_us, max_ts_us) = min_max(table, &part);
        let size = bytes.len() as u64;
        store.put(&path, bytes).await?;
        out.push(DataFile {
            table,
            path,
            rows: part.num_rows() as u64,
            bytes: size,
            min_ts_us,
            max_ts_us,
            level,
        });
    }
    Ok(out)
}

/// Reads a whole file.
pub async fn read_file(store: &LakeStore, rel: &str) -> Result<Vec<RecordBatch>> {
    let bytes: Bytes = store.get(rel).await?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?
        .with_batch_size(64 * 1024)
        .build()?;
    Ok(reader
        .map(|b| b.and_then(from_storage))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Reads the named columns of a file.
pub async fn read_columns(
    store: &LakeStore,
    rel: &str,
    columns: &[&str],
) -> Result<Vec<RecordBatch>> {
    let bytes: Bytes = store.get(rel).await?;
    Ok(column_reader(bytes, columns)?.collect::<Result<Vec<_>, _>>()?)
}

/// The batches of `columns` in one file's bytes, decoded as they are
/// pulled (CPU work: pull them off the async runtime). Lets a caller work
/// on one batch while the next is decoded.
pub fn column_reader(
    bytes: Bytes,
    columns: &[&str],
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    batches_of(ParquetRecordBatchReaderBuilder::try_new(bytes)?, columns)
}

/// The batches of `columns` that `builder` (a file, perhaps narrowed to
/// some rows) reads, in the table's Arrow types.
fn batches_of<R: ChunkReader + 'static>(
    builder: ParquetRecordBatchReaderBuilder<R>,
    columns: &[&str],
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    let mask = ProjectionMask::columns(builder.parquet_schema(), columns.iter().copied());
    let reader: ParquetRecordBatchReader = builder
        .with_projection(mask)
        .with_batch_size(64 * 1024)
        .build()?;
    Ok(reader.map(|b| b.and_then(from_storage)))
}

/// [`column_reader`] of the row groups whose timestamp `column` reaches
/// `from` (Unix microseconds): those whose largest value, by the footer's
/// statistics, is before it are not decoded. A row group without
/// statistics is read.
pub fn column_reader_from(
    bytes: Bytes,
    columns: &[&str],
    column: &str,
    from: i64,
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    use parquet::file::statistics::Statistics;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let meta = builder.metadata().clone();
    let at = builder
        .parquet_schema()
        .columns()
        .iter()
        .position(|c| c.name() == column);
    let groups: Vec<usize> = (0..meta.num_row_groups())
        .filter(
            |&g| match at.and_then(|i| meta.row_group(g).column(i).statistics()) {
                Some(Statistics::Int64(s)) => s.max_opt().is_none_or(|&max| max >= from),
                _ => true,
            },
        )
        .collect();
    batches_of(builder.with_row_groups(groups), columns)
}

/// [`column_reader`] with the string columns named in `dictionary` read as
/// `Dictionary(Int32, Utf8)`: a scan that looks each value up (a lease's
/// cut, a Kafka topic) then does it once per distinct value of a batch
/// rather than once per row, and no row's string is copied out. `file`
/// is the file's bytes, or the local file itself, of which only the
/// footer and the chunks of `columns` are then read.
pub fn dictionary_reader<R: ChunkReader + 'static>(
    file: R,
    columns: &[&str],
    dictionary: &[&str],
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    let meta = footer(&file)?;
    dictionary_reader_with(file, &meta, columns, dictionary)
}

/// A Parquet file's footer, read once.
pub type Footer = ArrowReaderMetadata;

/// The footer of `file`, for a caller that reads its statistics
/// ([`int_ranges`]) before its rows ([`dictionary_reader_with`]).
pub fn footer<R: ChunkReader + 'static>(file: &R) -> Result<Footer> {
    Ok(ArrowReaderMetadata::load(file, ArrowReaderOptions::new())?)
}

/// [`dictionary_reader`] of a file whose footer was read already.
pub fn dictionary_reader_with<R: ChunkReader + 'static>(
    file: R,
    meta: &Footer,
    columns: &[&str],
    dictionary: &[&str],
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    use arrow::datatypes::{Field, Schema};
    let fields: Vec<Field> = meta
        .schema()
        .fields()
        .iter()
        .map(|f| {
            if dictionary.contains(&f.name().as_str()) && f.data_type() == &DataType::Utf8 {
                let t = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
                Field::new(f.name(), t, f.is_nullable())
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    let options = ArrowReaderOptions::new().with_schema(Arc::new(Schema::new(fields)));
    let meta = ArrowReaderMetadata::try_new(meta.metadata().clone(), options)?;
    batches_of(
        ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta),
        columns,
    )
}

/// The distinct values of string column `name` in each row group, read
/// from the row group's dictionary page alone, without its data pages:
/// `None` unless every row group's chunk of the column has statistics
/// showing no null, a dictionary, and only data pages that index it (no
/// fallback to plain values), so that the dictionary holds every value of
/// the chunk. A dictionary may also hold a value that no row has: the
/// values are a superset, for checks that every value passes.
pub fn dictionary_values<R: ChunkReader + 'static>(
    file: R,
    meta: &Footer,
    name: &str,
) -> Result<Option<Vec<Vec<String>>>> {
    use parquet::basic::Encoding;
    use parquet::column::page::{Page, PageReader};
    use parquet::file::serialized_reader::SerializedPageReader;
    let file = Arc::new(file);
    let mut groups = Vec::new();
    for rg in meta.metadata().row_groups() {
        let Some(chunk) = rg
            .columns()
            .iter()
            .find(|c| c.column_path().string() == name)
        else {
            return Ok(None);
        };
        let all_indexed = chunk.dictionary_page_offset().is_some()
            && chunk.page_encoding_stats_mask().is_some_and(|mask| {
                mask.is_only(Encoding::RLE_DICTIONARY) || mask.is_only(Encoding::PLAIN_DICTIONARY)
            });
        let no_null = chunk
            .statistics()
            .is_some_and(|s| s.null_count_opt() == Some(0));
        if !all_indexed || !no_null {
            return Ok(None);
        }
        let rows = usize::try_from(rg.num_rows()).unwrap_or(0);
        let mut pages = SerializedPageReader::new(file.clone(), chunk, rows, None)?;
        let Some(Page::DictionaryPage {
            buf,
            num_values,
            encoding,
            ..
        }) = pages.get_next_page()?
        else {
            return Ok(None);
        };
        if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
            return Ok(None);
        }
        // PLAIN byte arrays: each a little-endian u32 length, then the bytes.
        let mut values = Vec::with_capacity(num_values as usize);
        let mut rest: &[u8] = &buf;
        for _ in 0..num_values {
            let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                return Ok(None);
            };
            let len = u32::from_le_bytes(*len) as usize;
            if tail.len() < len {
                return Ok(None);
            }
            let Ok(value) = std::str::from_utf8(&tail[..len]) else {
                return Ok(None);
            };
            values.push(value.to_string());
            rest = &tail[len..];
        }
        groups.push(values);
    }
    Ok(Some(groups))
}

/// Per row group, the `(least, largest)` of each column asked for; see
/// [`int_ranges`].
pub type IntRanges = Vec<Option<Vec<(i64, i64)>>>;

/// Of each row group of a file (its [`footer`]), the least and the
/// largest value of each integer column of `columns`, from the
/// statistics, so that no page is read. `None` for a row group where one
/// is not recorded, or where the column holds a null.
pub fn int_ranges(meta: &Footer, columns: &[&str]) -> IntRanges {
    use parquet::file::statistics::Statistics;
    meta.metadata()
        .row_groups()
        .iter()
        .map(|rg| {
            columns
                .iter()
                .map(|name| {
                    let chunk = rg
                        .columns()
                        .iter()
                        .find(|c| c.column_path().string() == *name)?;
                    let stats = chunk.statistics()?;
                    if stats.null_count_opt() != Some(0) {
                        return None;
                    }
                    match stats {
                        Statistics::Int32(s) => {
                            Some((i64::from(*s.min_opt()?), i64::from(*s.max_opt()?)))
                        }
                        Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?)),
                        _ => None,
                    }
                })
                .collect()
        })
        .collect()
}

/// [`column_reader`] of the rows whose index is true in `keep` (one entry
/// per row of the file): rows left out are skipped while decoding rather
/// than decoded and filtered.
pub fn selected_reader(
    bytes: Bytes,
    columns: &[&str],
    keep: &[bool],
) -> Result<impl Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send> {
    let selection = parquet::arrow::arrow_reader::RowSelection::from_filters(&[
        arrow::array::BooleanArray::from(keep.to_vec()),
    ]);
    batches_of(
        ParquetRecordBatchReaderBuilder::try_new(bytes)?.with_row_selection(selection),
        columns,
    )
}

/// Concatenates batches of one table into one (empty if none).
pub fn concat(table: Table, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let schema = schema_of(table);
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    Ok(concat_batches(&schema, batches)?)
}

/// Keeps the rows of `batch` whose index is true in `keep`.
pub fn filter_rows(batch: &RecordBatch, keep: &[bool]) -> Result<RecordBatch> {
    let mask = arrow::array::BooleanArray::from(keep.to_vec());
    Ok(arrow::compute::filter_record_batch(batch, &mask)?)
}

/// One file of the lake read in ranges, for the async Parquet reader: the
/// footer, a bloom filter or a column chunk is fetched alone, never the
/// whole object.
pub struct RangeReader {
    store: Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
    size: u64,
}

impl RangeReader {
    pub fn new(store: &LakeStore, rel: &str, size: u64) -> Self {
        RangeReader {
            store: store.object_store(),
            path: store.path(rel),
            size,
        }
    }
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl parquet::arrow::async_reader::AsyncFileReader for RangeReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Bytes>> {
        use futures::FutureExt;
        use object_store::ObjectStoreExt;
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        use futures::FutureExt;
        async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<
        'a,
        parquet::errors::Result<Arc<parquet::file::metadata::ParquetMetaData>>,
    > {
        use futures::FutureExt;
        async move {
            let size = self.size;
            let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(&mut *self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// A Parquet file of the lake to read a few columns or dictionary pages
/// of: in a local lake the file itself, of which only those chunks are
/// read; otherwise its bytes, fetched whole. (A file whose rows are read
/// by selection is better fetched whole even when local: the selected
/// rows are read page by page, which costs more from a file.)
pub enum Source {
    Local(std::path::PathBuf),
    Fetched(bytes::Bytes),
}

/// Record batches of a [`Source`].
pub type Batches = Box<dyn Iterator<Item = Result<RecordBatch, arrow::error::ArrowError>> + Send>;

impl Source {
    /// The file at `path` of `store`'s lake.
    pub async fn of(store: &LakeStore, path: &str) -> Result<Source> {
        Ok(match store.local_root() {
            Some(root) => Source::Local(root.join(path)),
            None => Source::Fetched(store.get(path).await?),
        })
    }

    fn open(path: &std::path::Path) -> Result<std::fs::File> {
        std::fs::File::open(path).map_err(|e| {
            let named = format!("{}: {e}", path.display());
            crate::error::LakeError::Io(std::io::Error::new(e.kind(), named))
        })
    }

    /// The file's footer ([`footer`]).
    pub fn footer(&self) -> Result<Footer> {
        Ok(match self {
            Source::Local(p) => footer(&Source::open(p)?)?,
            Source::Fetched(b) => footer(b)?,
        })
    }

    /// [`dictionary_values`] of the file.
    pub fn dictionary_values(
        &self,
        meta: &Footer,
        column: &str,
    ) -> Result<Option<Vec<Vec<String>>>> {
        Ok(match self {
            Source::Local(p) => dictionary_values(Source::open(p)?, meta, column)?,
            Source::Fetched(b) => dictionary_values(b.clone(), meta, column)?,
        })
    }

    /// [`dictionary_reader_with`] of the file.
    pub fn dictionary_reader(
        &self,
        meta: &Footer,
        columns: &[&str],
        dictionary: &[&str],
    ) -> Result<Batches> {
        Ok(match self {
            Source::Local(p) => Box::new(dictionary_reader_with(
                Source::open(p)?,
                meta,
                columns,
                dictionary,
            )?),
            Source::Fetched(b) => Box::new(dictionary_reader_with(
                b.clone(),
                meta,
                columns,
                dictionary,
            )?),
        })
    }
}
