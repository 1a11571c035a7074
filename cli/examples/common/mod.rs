//! What the benchmark drivers share.

use std::path::Path;

/// The `lease_events` rows and bytes of the lake's newest manifest: what
/// it has committed. Zero before the first commit (or while the manifest
/// being written cannot be read yet).
pub fn committed_rows(lake: &Path) -> (u64, u64) {
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
