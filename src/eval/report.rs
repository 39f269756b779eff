//! The evaluation report, made from an [`EvalState`] alone: JSON with stable keys
//! (`report.json`, format `sptr-eval-report/1`) and Markdown (`report.md`).
//!
//! JSON layout (every key always present; `null` where there is nothing to say):
//!
//! ```text
//! format, run {bag, lidar_topic, model, weights, device, ground_truth, shards},
//! frames {in_bag, total, evaluated, replayed, no_ground_truth, skipped, without_intensity},
//! skipped [{frame, timestamp_ns, status, reason}], damage {file, frames_before, error} | null,
//! out_of_range [{frame, timestamp_ns, status, layers [...]}] (frames whose activations left the
//! FP16 range; status `skipped`: dropped as the node drops them, else replayed with probability 0),
//! metrics {miou, accuracy, points_evaluated, points_ignored, points_unmapped,
//!          points_out_of_range, points_unpredicted,
//!          classes [{id, name, iou, gt_points, pred_points, true_positives}],
//!          confusion [[...]], unpredicted [...]} | null,
//! latency_ms {end_to_end {count, p50_ms, p90_ms, p99_ms, max_ms, mean_ms} | null,
//!             stages [{stage, count, p50_ms, ...}]},
//! throughput {frames, points, processing_s, frames_per_s, points_per_s}
//! ```
//!
//! Latency covers segmented frames only. Throughput is per device: frames over the summed
//! processing time of the shards (for one run, its frame-loop wall time).

use serde::{Deserialize, Serialize};

use super::latency::LatencySummary;
use super::state::{EvalState, FrameStatus};

pub const REPORT_FORMAT: &str = "sptr-eval-report/1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    pub run: RunInfo,
    pub frames: FrameCounts,
    pub skipped: Vec<SkippedFrame>,
    /// Frames whose activations left the FP16 range (absent in reports written before it).
    #[serde(default)]
    pub out_of_range: Vec<OutOfRangeFrame>,
    /// `precision: auto`: frames whose FP16 pass left the range and were computed again in
    /// FP32 (their labels are good; the layers are the FP16 pass's flagged ones).
    #[serde(default)]
    pub recomputed_in_fp32: Vec<OutOfRangeFrame>,
    pub damage: Option<super::state::Damage>,
    pub metrics: Option<Metrics>,
    pub latency_ms: Latency,
    pub throughput: Throughput,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub bag: String,
    pub lidar_topic: String,
    pub model: String,
    pub weights: String,
    pub device: String,
    pub ground_truth: Option<String>,
    pub shards: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameCounts {
    pub in_bag: u64,
    pub total: u64,
    pub evaluated: u64,
    pub replayed: u64,
    pub no_ground_truth: u64,
    pub skipped: u64,
    /// Segmented frames whose cloud had no intensity field (the network saw intensity 0).
    #[serde(default)]
    pub without_intensity: u64,
}

/// A frame not segmented or not evaluated, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedFrame {
    pub frame: u64,
    pub timestamp_ns: i64,
    pub status: FrameStatus,
    pub reason: String,
}

/// A frame whose network activations left the FP16 range (NaN/inf on the CPU): its labels
/// cannot be trusted. `layers`: the flagged layers in execution order, the first is where the
/// range was left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutOfRangeFrame {
    pub frame: u64,
    pub timestamp_ns: i64,
    pub status: FrameStatus,
    pub layers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassMetrics {
    pub id: usize,
    pub name: String,
    pub iou: Option<f64>,
    pub gt_points: u64,
    pub pred_points: u64,
    pub true_positives: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub miou: Option<f64>,
    pub accuracy: Option<f64>,
    pub points_evaluated: u64,
    pub points_ignored: u64,
    pub points_unmapped: u64,
    pub points_out_of_range: u64,
    pub points_unpredicted: u64,
    pub classes: Vec<ClassMetrics>,
    pub confusion: Vec<Vec<u64>>,
    pub unpredicted: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageLatency {
    pub stage: String,
    #[serde(flatten)]
    pub summary: LatencySummary,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub end_to_end: Option<LatencySummary>,
    pub stages: Vec<StageLatency>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub frames: u64,
    pub points: u64,
    pub processing_s: f64,
    pub frames_per_s: Option<f64>,
    pub points_per_s: Option<f64>,
}

/// Name of the end-to-end entry in a frame's `stages_ns`.
pub const END_TO_END: &str = "end_to_end";

impl Report {
    pub fn from_state(s: &EvalState) -> Report {
        let count = |st: FrameStatus| s.frames.iter().filter(|f| f.status == st).count() as u64;
        let frames = FrameCounts {
            in_bag: s.frames_in_bag,
            total: s.frames.len() as u64,
            evaluated: count(FrameStatus::Evaluated),
            replayed: count(FrameStatus::Replayed),
            no_ground_truth: count(FrameStatus::NoGroundTruth),
            skipped: count(FrameStatus::Skipped),
            without_intensity: s.frames.iter().filter(|f| f.no_intensity).count() as u64,
        };
        let skipped = s
            .frames
            .iter()
            .filter(|f| matches!(f.status, FrameStatus::Skipped | FrameStatus::NoGroundTruth))
            .map(|f| SkippedFrame {
                frame: f.index,
                timestamp_ns: f.timestamp_ns,
                status: f.status,
                reason: f.reason.clone().unwrap_or_default(),
            })
            .collect();
        let out_of_range = s
            .frames
            .iter()
            .filter(|f| !f.out_of_range.is_empty())
            .map(|f| OutOfRangeFrame {
                frame: f.index,
                timestamp_ns: f.timestamp_ns,
                status: f.status,
                layers: f.out_of_range.clone(),
            })
            .collect();
        let recomputed_in_fp32 = s
            .frames
            .iter()
            .filter(|f| !f.recomputed_in_fp32.is_empty())
            .map(|f| OutOfRangeFrame {
                frame: f.index,
                timestamp_ns: f.timestamp_ns,
                status: f.status,
                layers: f.recomputed_in_fp32.clone(),
            })
            .collect();
        let metrics = s.ground_truth.as_ref().map(|_| {
            let c = &s.confusion;
            Metrics {
                miou: c.miou(),
                accuracy: c.accuracy(),
                points_evaluated: c.evaluated(),
                points_ignored: c.ignored,
                points_unmapped: c.unmapped,
                points_out_of_range: c.out_of_range,
                points_unpredicted: c.unpredicted.iter().sum(),
                classes: (0..c.classes)
                    .map(|k| ClassMetrics {
                        id: k,
                        name: s.class_names.get(k).cloned().unwrap_or_default(),
                        iou: c.iou(k),
                        gt_points: c.gt_points(k),
                        pred_points: c.pred_points(k),
                        true_positives: c.true_positives(k),
                    })
                    .collect(),
                confusion: (0..c.classes)
                    .map(|g| (0..c.classes).map(|p| c.get(g, p)).collect())
                    .collect(),
                unpredicted: c.unpredicted.clone(),
            }
        });
        // Stage names in the order they first ran.
        let mut names: Vec<&str> = Vec::new();
        for f in &s.frames {
            for (n, _) in &f.stages_ns {
                if n != END_TO_END && !names.contains(&n.as_str()) {
                    names.push(n);
                }
            }
        }
        let samples = |name: &str| -> Vec<u64> {
            s.frames
                .iter()
                .filter_map(|f| f.stages_ns.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
                .collect()
        };
        let latency = Latency {
            end_to_end: LatencySummary::of(&samples(END_TO_END)),
            stages: names
                .iter()
                .filter_map(|n| {
                    Some(StageLatency {
                        stage: n.to_string(),
                        summary: LatencySummary::of(&samples(n))?,
                    })
                })
                .collect(),
        };
        let segmented: Vec<_> = s
            .frames
            .iter()
            .filter(|f| f.status != FrameStatus::Skipped)
            .collect();
        let processing_s: f64 = s.processing_s.iter().sum();
        let points: u64 = segmented.iter().map(|f| f.points).sum();
        let rate = |v: f64| (processing_s > 0.0).then(|| v / processing_s);
        Report {
            format: REPORT_FORMAT.to_string(),
            run: RunInfo {
                bag: s.bag.clone(),
                lidar_topic: s.lidar_topic.clone(),
                model: s.model.clone(),
                weights: s.weights.clone(),
                device: s.device.clone(),
                ground_truth: s.ground_truth.clone(),
                shards: s.shard_count,
            },
            frames,
            skipped,
            out_of_range,
            recomputed_in_fp32,
            damage: s.damage.clone(),
            metrics,
            latency_ms: latency,
            throughput: Throughput {
                frames: segmented.len() as u64,
                points,
                processing_s,
                frames_per_s: rate(segmented.len() as f64),
                points_per_s: rate(points as f64),
            },
        }
    }

    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialization cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    pub fn to_markdown(&self) -> String {
        let mut m = String::new();
        self.summary_markdown(&mut m);
        self.segmentation_markdown(&mut m);
        self.latency_markdown(&mut m);
        if !self.out_of_range.is_empty() {
            m.push_str(
                "\n## Frames out of the FP16 range\n\nThe network's activations left the FP16 range (65,504; NaN/inf on the CPU): \
                 `skipped` frames were dropped as the node drops them (`on_overflow: drop`), the others replayed with \
                 probability 0. Layers in execution order, the first is where the range was left.\n\n\
                 | frame | timestamp (ns) | status | layers |\n| ---: | ---: | --- | --- |\n",
            );
            flagged_frames_rows(&mut m, &self.out_of_range);
        }
        if !self.recomputed_in_fp32.is_empty() {
            m.push_str(
                "\n## Frames computed again in FP32\n\n`precision: auto`: the FP16 pass of these frames left the FP16 range, \
                 so each was computed again with FP32 storage and its FP32 labels were kept; the model \
                 stays on FP32 after the first. Layers are the FP16 pass's flagged ones, in execution order.\n\n\
                 | frame | timestamp (ns) | status | FP16 layers |\n| ---: | ---: | --- | --- |\n",
            );
            flagged_frames_rows(&mut m, &self.recomputed_in_fp32);
        }
        self.skipped_markdown(&mut m);
        m
    }

    /// The run in a list: bag, model, ground truth, frame counts, and what needs a look.
    fn summary_markdown(&self, m: &mut String) {
        let r = &self.run;
        m.push_str("# sptr replay report\n\n");
        m.push_str(&format!(
            "- bag: `{}` (LiDAR topic `{}`)\n",
            r.bag, r.lidar_topic
        ));
        m.push_str(&format!(
            "- model: `{}`, weights: `{}`, device: {}\n",
            r.model, r.weights, r.device
        ));
        m.push_str(&format!(
            "- ground truth: {}\n",
            r.ground_truth.as_deref().unwrap_or("none (no evaluation)")
        ));
        if r.shards > 1 {
            m.push_str(&format!("- merged from {} shards\n", r.shards));
        }
        let f = &self.frames;
        m.push_str(&format!(
            "- frames: {} replayed of {} read from the bag; {} evaluated, {} without ground truth, {} skipped\n",
            f.total - f.skipped,
            f.in_bag,
            f.evaluated,
            f.no_ground_truth,
            f.skipped
        ));
        if f.without_intensity > 0 {
            m.push_str(&format!(
                "- **{} frame(s) without an intensity field**: the network saw intensity 0 for their points (it was trained with intensity)\n",
                f.without_intensity
            ));
        }
        if let Some(d) = &self.damage {
            m.push_str(&format!(
                "- **bag damaged**: `{}` after {} LiDAR frames: {}\n",
                d.file, d.frames_before, d.error
            ));
        }
        if !self.recomputed_in_fp32.is_empty() {
            m.push_str(&format!(
                "- **{} frame(s) computed again in FP32** (`precision: auto`; their FP16 pass left the range, see below)\n",
                self.recomputed_in_fp32.len()
            ));
        }
        if !self.out_of_range.is_empty() {
            m.push_str(&format!(
                "- **{} frame(s) left the FP16 range**: their labels cannot be trusted (see below)\n",
                self.out_of_range.len()
            ));
        }
        m.push('\n');
    }

    /// mIoU, accuracy and the per-class table (with ground truth).
    fn segmentation_markdown(&self, m: &mut String) {
        if let Some(x) = &self.metrics {
            m.push_str("## Segmentation\n\n");
            m.push_str(&format!(
                "mIoU **{}**, accuracy **{}** over {} points ({} ignored, {} unmapped, {} out of range; {} with no prediction).\n\n",
                pct(x.miou),
                pct(x.accuracy),
                x.points_evaluated,
                x.points_ignored,
                x.points_unmapped,
                x.points_out_of_range,
                x.points_unpredicted
            ));
            m.push_str("| id | class | IoU | GT points | predicted | TP |\n| ---: | --- | ---: | ---: | ---: | ---: |\n");
            for c in &x.classes {
                m.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} |\n",
                    c.id,
                    c.name,
                    pct(c.iou),
                    c.gt_points,
                    c.pred_points,
                    c.true_positives
                ));
            }
            m.push('\n');
        }
    }

    /// Per-stage latency percentiles and the throughput.
    fn latency_markdown(&self, m: &mut String) {
        m.push_str("## Latency (ms)\n\n| stage | frames | p50 | p90 | p99 | max | mean |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        let row = |name: &str, s: &LatencySummary| {
            format!(
                "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                s.count, s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms
            )
        };
        for s in &self.latency_ms.stages {
            m.push_str(&row(&s.stage, &s.summary));
        }
        if let Some(e) = &self.latency_ms.end_to_end {
            m.push_str(&row("**end to end**", e));
        }
        let t = &self.throughput;
        m.push_str(&format!(
            "\nThroughput: {} frames, {} points in {:.3} s: {} frames/s, {} points/s.\n",
            t.frames,
            t.points,
            t.processing_s,
            t.frames_per_s.map_or("-".into(), |v| format!("{v:.2}")),
            t.points_per_s.map_or("-".into(), |v| format!("{v:.0}"))
        ));
    }

    /// The frames not evaluated and why.
    fn skipped_markdown(&self, m: &mut String) {
        if !self.skipped.is_empty() {
            m.push_str("\n## Frames not evaluated\n\n| frame | timestamp (ns) | status | reason |\n| ---: | ---: | --- | --- |\n");
            for s in &self.skipped {
                m.push_str(&format!(
                    "| {} | {} | {:?} | {} |\n",
                    s.frame,
                    s.timestamp_ns,
                    s.status,
                    s.reason.replace('|', "\\|")
                ));
            }
        }
    }
}

/// The rows of a table of frames with flagged layers: the first 8 layers, then a count.
fn flagged_frames_rows(m: &mut String, frames: &[OutOfRangeFrame]) {
    for f in frames {
        let shown: Vec<&str> = f.layers.iter().take(8).map(String::as_str).collect();
        let more = f.layers.len().saturating_sub(shown.len());
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        m.push_str(&format!(
            "| {} | {} | {:?} | {}{tail} |\n",
            f.frame,
            f.timestamp_ns,
            f.status,
            shown.join(", ").replace('|', "\\|")
        ));
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2} %", 100.0 * v))
}
