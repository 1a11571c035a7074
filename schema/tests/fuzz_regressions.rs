//! Replays the fuzzing inputs as plain tests: every seed of `fuzz/seeds/`
//! and every input under `tests/fuzz-regressions/` (crashes or slow inputs
//! the fuzzer found, kept after the fix) goes through the same checks as
//! the fuzz target: no panic, and a valid event round-trips through
//! `EventBatchBuilder` and a JSON re-encoding; a refusal lands in a reject
//! batch byte for byte.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::roundtrip;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

fn replay(path: &Path) -> Result<(), leaseline_schema::DecodeError> {
    let data = std::fs::read(path).unwrap();
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(|| roundtrip::check(&data));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(Box::new(format!(
            "{}: {:?}",
            path.display(),
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
        )));
    }
    // The fuzzer runs with -timeout=10; a debug build of the checks gets 10 s too.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{} took {:?}",
        path.display(),
        started.elapsed()
    );
    leaseline_schema::decode(&data).map(|_| ())
}

#[test]
fn fuzz_seeds_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let files = inputs(&dir);
    assert!(
        files.len() >= 10,
        "seed corpus went missing: {}",
        dir.display()
    );
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let outcome = replay(&path);
        // Seeds are named for what they are.
        if name.starts_with("bad-") {
            assert!(outcome.is_err(), "{name} decoded");
        } else {
            assert!(outcome.is_ok(), "{name} refused: {}", outcome.unwrap_err());
        }
    }
}

#[test]
fn fuzz_regressions_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    for path in inputs(&dir) {
        let _ = replay(&path);
    }
}
