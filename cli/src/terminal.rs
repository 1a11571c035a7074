//! What a person at a terminal sees: errors said once with a hint, and
//! standard output that ends quietly when its reader goes away.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use leaseline_lake::LakeError;
use leaseline_query::QueryError;

/// Set once a write to standard output found the pipe closed (`leaseline
/// sql ... | head`). The reader has what it wanted, so that is a quiet
/// end, not an error.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Standard output for a command's results. Rust ignores SIGPIPE, so a
/// closed pipe comes back as an error from every write; this notes it so
/// that `main` can end quietly instead of printing "Broken pipe".
pub struct Stdout(io::StdoutLock<'static>);

pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

fn watch<T>(r: io::Result<T>) -> io::Result<T> {
    if let Err(e) = &r {
        if e.kind() == io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Ordering::SeqCst);
        }
    }
    r
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        watch(self.0.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        watch(self.0.flush())
    }
}

/// True when standard output's reader has gone away.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::SeqCst)
}

/// The error as one line: each message of its chain once. Wrappers that
/// print their source (`{0}`) would otherwise repeat it, and a query error
/// is already complete (its sources are DataFusion's own wrappers of the
/// same message, in Debug form).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if !parts.last().is_some_and(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        if cause.downcast_ref::<QueryError>().is_some() {
            break;
        }
    }
    parts.join(": ")
}

/// A line that helps with the error, when there is one to give.
pub fn hint(e: &anyhow::Error) -> Option<String> {
    for cause in e.chain() {
        if let Some(q) = cause.downcast_ref::<QueryError>() {
            return q.is_client_error().then(|| {
                format!(
                    "the tables are {}; every surface is read-only (SELECT, EXPLAIN, SHOW, DESCRIBE)",
                    leaseline_query::table_names().join(", ")
                )
            });
        }
        if let Some(LakeError::NotFound { .. }) = cause.downcast_ref::<LakeError>() {
            let found = lakes_near(Path::new("."));
            return Some(if found.is_empty() {
                "no lake found under the current directory; `leaseline import` or `leaseline ingest` create one, `--lake` (or LEASELINE_LAKE) points at one".to_string()
            } else {
                let list: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
                format!("lakes here: {} (pass one with --lake)", list.join(", "))
            });
        }
    }
    None
}

/// Lakes (directories whose `lease_events` has a Delta log, or lakes in
/// the format before Delta, to be migrated) in `dir`, its children and
/// grandchildren: where `./data/demo` or `./data/lake` would be.
pub fn lakes_near(dir: &Path) -> Vec<PathBuf> {
    fn is_lake(d: &Path) -> bool {
        ["lease_events/_delta_log", "_manifest"].iter().any(|log| {
            std::fs::read_dir(d.join(log))
                .map(|mut it| it.any(|e| e.is_ok()))
                .unwrap_or(false)
        })
    }
    fn children(d: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
    let mut found = Vec::new();
    if is_lake(dir) {
        found.push(dir.to_path_buf());
    }
    for c in children(dir) {
        if is_lake(&c) {
            found.push(c);
            continue;
        }
        found.extend(children(&c).into_iter().filter(|g| is_lake(g)));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_that_repeats_itself_is_said_once() {
        let inner = anyhow::anyhow!("sql parser error: Expected: an SQL statement");
        let e = inner
            .context("SQL error: sql parser error: Expected: an SQL statement")
            .context("running the query");
        assert_eq!(
            error_text(&e),
            "running the query: SQL error: sql parser error: Expected: an SQL statement"
        );
    }

    #[test]
    fn lakes_are_found_two_levels_down_and_sorted() {
        let dir = tempfile::tempdir().unwrap();
        for d in [
            "data/demo/lease_events/_delta_log",
            "data/lake/_manifest",
            "empty/lease_events/_delta_log",
            "other",
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        for log in ["data/demo/lease_events/_delta_log", "data/lake/_manifest"] {
            std::fs::write(dir.path().join(log).join("00000000000000000000.json"), "{}").unwrap();
        }
        let found: Vec<PathBuf> = lakes_near(dir.path())
            .into_iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            found,
            [PathBuf::from("data/demo"), PathBuf::from("data/lake")]
        );
    }
}
