//! Query results as bytes: the formats of `leaseline sql` and of the HTTP
//! API's `Accept` header.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An aligned text table (for terminals).
    Table,
    /// CSV with a header line (`text/csv`).
    Csv,
    /// A JSON array of objects, one per row (`application/json`).
    Json,
    /// One JSON object per line (`application/x-ndjson`).
    Ndjson,
    /// An Arrow IPC stream (`application/vnd.apache.arrow.stream`).
    ArrowIpc,
}

impl Format {
    pub const ALL: [Format; 5] = [
        Format::Table,
        Format::Csv,
        Format::Json,
        Format::Ndjson,
        Format::ArrowIpc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Ndjson => "ndjson",
            Format::ArrowIpc => "arrow",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Table => "text/plain; charset=utf-8",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Json => "application/json",
            Format::Ndjson => "application/x-ndjson",
            Format::ArrowIpc => "application/vnd.apache.arrow.stream",
        }
    }

    /// The format a media type (without parameters) asks for.
    pub fn from_media_type(media: &str) -> Option<Format> {
        match media.trim().to_ascii_lowercase().as_str() {
            "application/json" => Some(Format::Json),
            "text/csv" => Some(Format::Csv),
            "application/x-ndjson" | "application/jsonl" => Some(Format::Ndjson),
            "application/vnd.apache.arrow.stream" => Some(Format::ArrowIpc),
            "text/plain" => Some(Format::Table),
            _ => None,
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                format!("unknown format {s:?}; one of {}", names.join(", "))
            })
    }
}

/// Writes `batches` (of `schema`, which an empty result still needs for
/// CSV headers and Arrow streams) in `format`.
pub fn write(
    format: Format,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    out: &mut dyn Write,
) -> Result<(), ArrowError> {
    let mut enc = Encoder::new(format, schema.clone())?;
    for b in batches {
        out.write_all(&enc.write(b)?)?;
    }
    out.write_all(&enc.finish()?)?;
    Ok(())
}

/// A result encoded batch by batch, so that it can be sent while it is
/// computed: each call returns the bytes that are ready. Every format but
/// [`Format::Table`] (whose column widths depend on all rows) holds no
/// more than the batch at hand.
pub struct Encoder {
    schema: SchemaRef,
    buf: SharedBuf,
    kind: Kind,
    rows: usize,
}

enum Kind {
    Table(Vec<RecordBatch>),
    Csv(Box<arrow::csv::Writer<SharedBuf>>),
    Json(arrow::json::ArrayWriter<SharedBuf>),
    Ndjson(arrow::json::LineDelimitedWriter<SharedBuf>),
    ArrowIpc(arrow::ipc::writer::StreamWriter<SharedBuf>),
}

/// The writers' output, taken after each call.
#[derive(Clone, Default)]
struct SharedBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedBuf {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().expect("an encoder is used by one thread"))
    }
}

impl Write for SharedBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("an encoder is used by one thread")
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Encoder {
    pub fn new(format: Format, schema: SchemaRef) -> Result<Encoder, ArrowError> {
        let buf = SharedBuf::default();
        let kind = match format {
            Format::Table => Kind::Table(Vec::new()),
            Format::Csv => Kind::Csv(Box::new(
                arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(buf.clone()),
            )),
            Format::Json => Kind::Json(arrow::json::ArrayWriter::new(buf.clone())),
            Format::Ndjson => Kind::Ndjson(arrow::json::LineDelimitedWriter::new(buf.clone())),
            Format::ArrowIpc => Kind::ArrowIpc(arrow::ipc::writer::StreamWriter::try_new(
                buf.clone(),
                &schema,
            )?),
        };
        Ok(Encoder {
            schema,
            buf,
            kind,
            rows: 0,
        })
    }

    /// Rows encoded so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Encodes one batch; returns the bytes ready to send.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
        if batch.num_rows() == 0 {
            return Ok(self.buf.take());
        }
        self.rows += batch.num_rows();
        match &mut self.kind {
            Kind::Table(batches) => batches.push(batch.clone()),
            Kind::Csv(w) => w.write(batch)?,
            Kind::Json(w) => w.write(batch)?,
            Kind::Ndjson(w) => w.write(batch)?,
            Kind::ArrowIpc(w) => w.write(batch)?,
        }
        Ok(self.buf.take())
    }

    /// Ends the result; returns the last bytes.
    pub fn finish(self) -> Result<Vec<u8>, ArrowError> {
        let mut out = self.buf.take();
        match self.kind {
            Kind::Table(batches) => {
                // With no batches the table would have no header either;
                // an empty batch of the schema keeps the column names, as
                // psql shows them for an empty result.
                let rows = self.rows;
                let empty = [RecordBatch::new_empty(self.schema.clone())];
                let shown = if rows == 0 { &empty[..] } else { &batches[..] };
                let table = arrow::util::pretty::pretty_format_batches(shown)?;
                writeln!(out, "{table}")?;
                writeln!(out, "({rows} {})", if rows == 1 { "row" } else { "rows" })?;
            }
            Kind::Csv(_) => {
                if self.rows == 0 {
                    let names: Vec<&str> = self
                        .schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect();
                    writeln!(out, "{}", names.join(","))?;
                }
            }
            Kind::Json(mut w) => {
                // Writes `[]` for no rows.
                w.finish()?;
                out.extend(self.buf.take());
                writeln!(out)?;
            }
            Kind::Ndjson(mut w) => {
                w.finish()?;
                out.extend(self.buf.take());
            }
            Kind::ArrowIpc(mut w) => {
                w.finish()?;
                out.extend(self.buf.take());
            }
        }
        Ok(out)
    }
}
