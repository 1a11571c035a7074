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
    match format {
        Format::Table => {
            // With no batches the table would have no header either; an
            // empty batch of the schema keeps the column names, as psql
            // shows them for an empty result.
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let empty = [RecordBatch::new_empty(schema.clone())];
            let shown = if rows == 0 { &empty[..] } else { batches };
            let table = arrow::util::pretty::pretty_format_batches(shown)?;
            writeln!(out, "{table}")?;
            writeln!(out, "({rows} {})", if rows == 1 { "row" } else { "rows" })?;
        }
        Format::Csv => {
            if batches.is_empty() {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                writeln!(out, "{}", names.join(","))?;
            }
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::ArrayWriter::new(&mut *out);
            for b in batches {
                w.write(b)?;
            }
            // Prints `[]` for no rows.
            w.finish()?;
            writeln!(out)?;
        }
        Format::Ndjson => {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut *out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        Format::ArrowIpc => {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(out, schema)?;
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(())
}
