//! The files of a replay output directory besides the bag: the state, the reports and the
//! plots, written from an [`EvalState`] by a replay and by `sptr eval merge`.

use std::path::{Path, PathBuf};

use super::ReplayError;
use crate::eval::plots;
use crate::eval::report::{Report, END_TO_END};
use crate::eval::state::{EvalState, STATE_FILE};

/// Files a replay or merge writes at the top of its output directory.
const OUTPUT_FILES: &[&str] = &[
    STATE_FILE,
    "report.json",
    "report.md",
    "confusion.png",
    "iou.png",
    "latency.png",
    super::cameras::CAMERAS_FILE,
];

/// Removes the files an earlier run left in `out` (only the names replay writes, and the BEV
/// PNGs), so a re-run without ground truth does not leave the old run's plots beside its report.
pub(crate) fn remove_stale_outputs(out: &Path) -> Result<(), ReplayError> {
    let remove = |path: PathBuf| match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(ReplayError::Io { path, source: e })
        }
        _ => Ok(()),
    };
    for name in OUTPUT_FILES {
        remove(out.join(name))?;
    }
    if let Ok(entries) = std::fs::read_dir(out.join("bev")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if (name.starts_with("frame_") || name.starts_with("map_")) && name.ends_with(".png") {
                remove(e.path())?;
            }
        }
    }
    Ok(())
}

/// Writes `report.json`, `report.md` and the plots of `state` into `out`.
pub fn write_reports(state: &EvalState, out: &Path) -> Result<Report, ReplayError> {
    let report = Report::from_state(state);
    let write = |name: &str, text: String| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|source| ReplayError::Io { path, source })
    };
    write("report.json", report.to_json())?;
    write("report.md", report.to_markdown())?;
    if report.metrics.is_some() {
        plots::confusion_png(&report, &out.join("confusion.png"))?;
        plots::iou_png(&report, &out.join("iou.png"))?;
    }
    let e2e: Vec<f64> = state
        .frames
        .iter()
        .filter_map(|f| {
            f.stages_ns
                .iter()
                .find(|(n, _)| n == END_TO_END)
                .map(|(_, v)| *v as f64 * 1e-6)
        })
        .collect();
    if !e2e.is_empty() {
        let title = match &report.latency_ms.end_to_end {
            Some(l) => format!(
                "End-to-end latency per frame: p50 {:.1} ms, p99 {:.1} ms ({} frames)",
                l.p50_ms, l.p99_ms, l.count
            ),
            None => "End-to-end latency per frame".to_string(),
        };
        plots::latency_png(&e2e, &title, &out.join("latency.png"))?;
    }
    Ok(report)
}

/// `sptr eval merge`: loads the shard states in `dirs`, merges them and writes the state and
/// the reports of the whole run into `out`.
pub fn merge_shards(dirs: &[PathBuf], out: &Path) -> Result<Report, ReplayError> {
    let states = dirs
        .iter()
        .map(|d| EvalState::load(d).map(|s| (d.display().to_string(), s)))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = EvalState::merge_named(states)?;
    std::fs::create_dir_all(out).map_err(|source| ReplayError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    remove_stale_outputs(out)?;
    merged.save(&out.join(STATE_FILE))?;
    write_reports(&merged, out)
}
