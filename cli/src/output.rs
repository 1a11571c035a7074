//! Printing query results.

use std::io::Write;

use arrow::array::RecordBatch;
use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An aligned text table.
    Table,
    /// CSV with a header line.
    Csv,
    /// A JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

pub fn write(format: Format, batches: &[RecordBatch], out: &mut dyn Write) -> anyhow::Result<()> {
    match format {
        Format::Table => {
            writeln!(
                out,
                "{}",
                arrow::util::pretty::pretty_format_batches(batches)?
            )?;
        }
        Format::Csv => {
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
    }
    Ok(())
}
