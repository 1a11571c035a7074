//! NDJSON import: a source of the ingest loop ([`crate::pipeline`]), with
//! the same decoder, reject path and lake writer as Kafka, and the file and
//! line as origin.

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leaseline_lake::Lake;
use leaseline_schema::Origin;
use tokio_util::sync::CancellationToken;

use crate::config::FlushPolicy;
use crate::error::{IngestError, Result};
use crate::fanout::Fanout;
use crate::hooks::InputPartition;
use crate::pipeline::{self, Polled, Source, Step};
use crate::writer::{FlushReport, LakeWriter};

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

/// Imports NDJSON inputs into the lake; `fanout`, if any, receives each
/// new event once it is committed. `progress` is called with the number of
/// bytes read so far. Blank lines are not messages and are skipped; every
/// other line becomes an event, a duplicate or a reject.
pub async fn import(
    lake: Lake,
    inputs: Vec<ImportInput>,
    policy: &FlushPolicy,
    fanout: Option<Fanout>,
    progress: impl FnMut(u64) + Send + 'static,
) -> Result<ImportSummary> {
    let started = Instant::now();
    let mut writer = LakeWriter::open(lake).await?;
    writer.attach(fanout, None);
    let before = writer.stats();
    let source = FileSource {
        inputs: inputs.into_iter(),
        current: None,
        lines: Arc::new(AtomicU64::new(0)),
        bytes_read: 0,
        buf: Vec::with_capacity(4096),
        error: None,
        progress: Box::new(progress),
    };
    let lines = source.lines.clone();
    let after = pipeline::run(
        source,
        Arc::new(Mutex::new(writer)),
        policy.clone(),
        CancellationToken::new(),
    )
    .await?;
    Ok(ImportSummary {
        lines: lines.load(Ordering::Relaxed),
        events: after.events - before.events,
        duplicates: after.duplicates - before.duplicates,
        rejects: after.rejects - before.rejects,
        files_written: after.files_written - before.files_written,
        elapsed: started.elapsed(),
    })
}

/// The input being read, its name and its last line number.
type Reading = (BufReader<Box<dyn Read + Send>>, String, u64);

/// NDJSON inputs, one after the other, as one input partition.
struct FileSource {
    inputs: std::vec::IntoIter<ImportInput>,
    current: Option<Reading>,
    lines: Arc<AtomicU64>,
    bytes_read: u64,
    buf: Vec<u8>,
    /// A read error ends the input; the loop flushes what was read before.
    error: Option<IngestError>,
    progress: Box<dyn FnMut(u64) + Send>,
}

/// How many lines one poll hands over: enough that the loop's own work per
/// poll does not show, few enough that a flush is never far behind its
/// policy.
const LINES_PER_POLL: usize = 4096;

impl Source for FileSource {
    fn poll(&mut self, _timeout: Duration, take: &mut dyn FnMut(Polled<'_>) -> bool) -> Step {
        for _ in 0..LINES_PER_POLL {
            if self.current.is_none() {
                match self.inputs.next() {
                    Some(input) => {
                        self.current = Some((
                            BufReader::with_capacity(1 << 20, input.reader),
                            input.name,
                            0,
                        ))
                    }
                    None => {
                        let _ = take(Polled::CaughtUp(InputPartition::FILE));
                        return Step::End;
                    }
                }
            }
            let (reader, name, line_no) = self.current.as_mut().expect("an input");
            self.buf.clear();
            let n = match reader.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                Err(source) => {
                    self.error = Some(IngestError::Read {
                        path: name.clone(),
                        source,
                    });
                    return Step::End;
                }
            };
            if n == 0 {
                (self.progress)(self.bytes_read);
                self.current = None;
                continue;
            }
            *line_no += 1;
            self.bytes_read += n as u64;
            let mut line = self.buf.as_slice();
            if let Some(rest) = line.strip_suffix(b"\n") {
                line = rest.strip_suffix(b"\r").unwrap_or(rest);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.lines.fetch_add(1, Ordering::Relaxed);
            let more = take(Polled::Message(
                line,
                Origin::File {
                    path: name,
                    line: *line_no,
                },
            ));
            if !more {
                break;
            }
        }
        Step::More
    }

    fn committed(&mut self, _w: &LakeWriter, _report: &FlushReport) {
        (self.progress)(self.bytes_read);
    }

    fn finish(&mut self, _w: &LakeWriter) -> Result<()> {
        // What was read before the error is committed; the error is the
        // import's answer.
        self.error.take().map_or(Ok(()), Err)
    }
}
