//! NDJSON import: the same decoder, reject path and lake writer as Kafka,
//! with the file and line as origin.

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use leaseline_lake::Lake;
use leaseline_schema::Origin;

use crate::config::FlushPolicy;
use crate::error::{IngestError, Result};
use crate::writer::LakeWriter;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportSummary {
    pub lines: u64,
    pub events: u64,
    pub duplicates: u64,
    pub rejects: u64,
    pub files_written: u64,
    pub elapsed: Duration,
}

impl ImportSummary {
    pub fn events_per_second(&self) -> f64 {
        self.lines as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One input: a name for the origin column and a reader.
pub struct ImportInput {
    pub name: String,
    pub reader: Box<dyn Read + Send>,
}

impl ImportInput {
    /// Opens a path, or standard input for `-`.
    pub fn open(path: &str) -> Result<Self> {
        if path == "-" {
            return Ok(ImportInput {
                name: "<stdin>".into(),
                reader: Box::new(std::io::stdin()),
            });
        }
        let read_error = |source| IngestError::Read {
            path: path.to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        // The absolute path is the file's identity: importing it again,
        // from anywhere, keeps each of its rejects once.
        let name = std::fs::canonicalize(path).map_err(read_error)?;
        Ok(ImportInput {
            name: name.to_string_lossy().into_owned(),
            reader: Box::new(file),
        })
    }
}

/// Imports NDJSON inputs into the lake; `tap` sees each new event. `progress` is called with the
/// number of bytes read so far. Blank lines are not messages and are
/// skipped; every other line becomes an event, a duplicate or a reject.
pub async fn import(
    lake: Lake,
    inputs: Vec<ImportInput>,
    policy: &FlushPolicy,
    tap: Option<crate::hooks::EventTap>,
    mut progress: impl FnMut(u64),
) -> Result<ImportSummary> {
    let started = Instant::now();
    let mut writer = LakeWriter::open(lake).await?;
    writer.attach(tap, None);
    let before = writer.stats();
    let mut lines = 0u64;
    let mut bytes_read = 0u64;
    let mut buf = Vec::with_capacity(4096);
    for input in inputs {
        let mut reader = BufReader::with_capacity(1 << 20, input.reader);
        let mut line_no = 0u64;
        loop {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|source| IngestError::Read {
                    path: input.name.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            line_no += 1;
            bytes_read += n as u64;
            let mut line = buf.as_slice();
            if let Some(rest) = line.strip_suffix(b"\n") {
                line = rest.strip_suffix(b"\r").unwrap_or(rest);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            lines += 1;
            writer.push(
                line,
                Origin::File {
                    path: &input.name,
                    line: line_no,
                },
            );
            if writer.should_flush(policy) {
                writer.flush().await?;
                progress(bytes_read);
            }
        }
        progress(bytes_read);
    }
    writer.flush().await?;
    let after = writer.stats();
    Ok(ImportSummary {
        lines,
        events: after.events - before.events,
        duplicates: after.duplicates - before.duplicates,
        rejects: after.rejects - before.rejects,
        files_written: after.files_written - before.files_written,
        elapsed: started.elapsed(),
    })
}
