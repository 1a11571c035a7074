//! What the benchmark drivers share.

use std::path::Path;

/// The peak resident memory of process `pid` (`VmHWM`), in KiB; 0 once it
/// is gone.
pub fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

/// The `lease_events` rows and bytes the lake has committed: from its
/// Delta log, or from the manifest of the format before Delta tables (so
/// that an older release can be measured the same way). Zero before the
/// first commit.
pub fn committed_rows(lake: &Path) -> (u64, u64) {
    let log = lake.join("lease_events/_delta_log");
    if log.is_dir() {
        return delta_rows(&log);
    }
    legacy_rows(lake)
}

/// Replays the commit files (every one is kept: log cleanup only removes
/// commits older than 30 days): `add`s less `remove`s.
fn delta_rows(log: &Path) -> (u64, u64) {
    let Ok(rd) = std::fs::read_dir(log) else {
        return (0, 0);
    };
    let mut commits: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    commits.sort();
    let mut files: std::collections::HashMap<String, (u64, u64)> = Default::default();
    for c in commits {
        let Ok(text) = std::fs::read_to_string(&c) else {
            continue;
        };
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(add) = v.get("add") {
                let rows = add["stats"]
                    .as_str()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
                    .and_then(|s| s["numRecords"].as_u64())
                    .unwrap_or(0);
                let path = add["path"].as_str().unwrap_or_default().to_string();
                files.insert(path, (rows, add["size"].as_u64().unwrap_or(0)));
            } else if let Some(rm) = v.get("remove") {
                files.remove(rm["path"].as_str().unwrap_or_default());
            }
        }
    }
    files
        .values()
        .fold((0, 0), |(r, b), (fr, fb)| (r + fr, b + fb))
}

fn legacy_rows(lake: &Path) -> (u64, u64) {
    let Ok(rd) = std::fs::read_dir(lake.join("_manifest")) else {
        return (0, 0);
    };
    let Some(last) = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .max()
    else {
        return (0, 0);
    };
    let Some(v) = std::fs::read_to_string(last)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return (0, 0);
    };
    let events = || {
        v["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["table"] == "lease_events")
    };
    let sum = |field: &str| events().map(|f| f[field].as_u64().unwrap_or(0)).sum();
    (sum("rows"), sum("bytes"))
}
