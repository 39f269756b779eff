//! Evaluation metrics on hand-computed confusion matrices, latency percentiles, label maps,
//! shard-state merging and the report's stable JSON keys.

mod common;

use sptr::eval::confusion::Confusion;
use sptr::eval::labels::{GroundTruth, LabelMap};
use sptr::device::percentile::percentile;
use sptr::eval::latency::LatencySummary;
use sptr::eval::report::{Report, END_TO_END};
use sptr::eval::state::{EvalState, FrameRecord, FrameStatus, STATE_FORMAT};

fn close(a: Option<f64>, b: f64) {
    let a = a.expect("a value");
    assert!((a - b).abs() < 1e-12, "{a} != {b}");
}

/// 3 classes, rows = ground truth:
///
/// ```text
///        pred0 pred1 pred2
/// gt0      5     1     0
/// gt1      2     3     1
/// gt2      0     0     0
/// ```
///
/// class 0: TP 5, FP 2, FN 1 -> 5/8; class 1: TP 3, FP 1, FN 3 -> 3/7; class 2: TP 0, FP 1,
/// FN 0 -> 0/1 = 0. mIoU = (5/8 + 3/7 + 0) / 3; accuracy = 8/12.
#[test]
fn iou_miou_accuracy_by_hand() {
    let c = Confusion::from_rows(&[vec![5, 1, 0], vec![2, 3, 1], vec![0, 0, 0]]);
    close(c.iou(0), 5.0 / 8.0);
    close(c.iou(1), 3.0 / 7.0);
    close(c.iou(2), 0.0);
    close(c.miou(), (5.0 / 8.0 + 3.0 / 7.0) / 3.0);
    close(c.accuracy(), 8.0 / 12.0);
    assert_eq!(
        (c.gt_points(1), c.pred_points(0), c.evaluated()),
        (6, 7, 12)
    );
}

/// A class nobody has (no ground truth, no prediction) has no IoU and is not averaged.
#[test]
fn absent_class_is_left_out_of_miou() {
    let c = Confusion::from_rows(&[vec![4, 0, 0], vec![0, 2, 0], vec![0, 0, 0]]);
    assert_eq!(c.iou(2), None);
    close(c.miou(), 1.0);
    close(c.accuracy(), 1.0);
    let empty = Confusion::new(4);
    assert_eq!((empty.miou(), empty.accuracy()), (None, None));
}

/// Points with ground truth but no prediction (no voxel) are misses of their class; ignored,
/// unmapped and out-of-range ground truth is counted apart.
#[test]
fn unpredicted_and_ignored_points() {
    let mut c = Confusion::new(2);
    for (gt, pred) in [
        (GroundTruth::Class(0), Some(0)),
        (GroundTruth::Class(0), None),
        (GroundTruth::Class(1), Some(0)),
        (GroundTruth::Class(1), Some(1)),
        (GroundTruth::Ignored, Some(1)),
        (GroundTruth::Unmapped, Some(1)),
        (GroundTruth::OutOfRange, None),
        (GroundTruth::Class(7), Some(0)),
    ] {
        c.add(gt, pred);
    }
    // class 0: TP 1, FP 1 (gt1 -> 0), FN 1 (unpredicted) -> 1/3; class 1: TP 1, FN 1 -> 1/2.
    close(c.iou(0), 1.0 / 3.0);
    close(c.iou(1), 0.5);
    close(c.accuracy(), 2.0 / 4.0);
    assert_eq!(
        (c.ignored, c.unmapped, c.out_of_range, c.unpredicted.clone()),
        (1, 1, 2, vec![1, 0])
    );
}

#[test]
fn merged_matrices_add_up() {
    let a = Confusion::from_rows(&[vec![1, 2], vec![3, 4]]);
    let b = Confusion::from_rows(&[vec![10, 0], vec![0, 10]]);
    let mut m = a.clone();
    m.merge(&b).unwrap();
    assert_eq!(m, Confusion::from_rows(&[vec![11, 2], vec![3, 14]]));
    assert!(m.merge(&Confusion::new(3)).is_err());
}

#[test]
fn percentiles_are_nearest_rank() {
    let s: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&s, 50.0), Some(50));
    assert_eq!(percentile(&s, 90.0), Some(90));
    assert_eq!(percentile(&s, 99.0), Some(99));
    let l = LatencySummary::of(&[4_000_000, 1_000_000, 2_000_000, 3_000_000]).unwrap();
    assert_eq!(
        (l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, l.mean_ms),
        (2.0, 4.0, 4.0, 4.0, 2.5)
    );
    assert!(LatencySummary::of(&[]).is_none());
}

#[test]
fn semantickitti_label_map_file() {
    let root = common::root();
    let m = LabelMap::load(&root.join("tests/data/semantickitti/label_map.yaml")).unwrap();
    // building 50 -> learning 13 -> class 12; vegetation 70 -> 15 -> 14; outlier 1 -> ignored.
    assert_eq!(m.resolve(50, 19), GroundTruth::Class(12));
    assert_eq!(m.resolve(70 | (3 << 16), 19), GroundTruth::Class(14));
    assert_eq!(m.resolve(1, 19), GroundTruth::Ignored);
    assert_eq!(m.resolve(52, 19), GroundTruth::Ignored);
    assert_eq!(m.resolve(12345, 19), GroundTruth::Unmapped);
    let err = LabelMap::load(std::path::Path::new("/nonexistent/map.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/map.yaml"), "{err}");
}

fn frame(index: u64, e2e: u64) -> FrameRecord {
    FrameRecord {
        index,
        timestamp_ns: 1000 + index as i64,
        status: FrameStatus::Evaluated,
        reason: None,
        points: 10,
        labeled_points: 9,
        stages_ns: vec![
            ("decode".into(), e2e / 4),
            ("voxelize".into(), e2e / 2),
            (END_TO_END.into(), e2e),
        ],
        out_of_range: Vec::new(),
        recomputed_in_fp32: Vec::new(),
        no_intensity: false,
    }
}

fn state(shard: u32, count: u32, frames: Vec<FrameRecord>, conf: Confusion) -> EvalState {
    EvalState {
        format: STATE_FORMAT,
        bag: "b".into(),
        lidar_topic: "/sptr/input/points".into(),
        model: "m.yaml".into(),
        weights: "w".into(),
        device: "cpu".into(),
        class_names: vec!["a".into(), "b".into()],
        ground_truth: Some("labels".into()),
        shard_count: count,
        shards: vec![shard],
        frames,
        frames_in_bag: 4,
        confusion: conf,
        processing_s: vec![1.0],
        damage: None,
    }
}

/// Merged shards: frames in index order, matrices summed, latency from the pooled samples.
#[test]
fn shard_states_merge_into_the_whole_run() {
    let s0 = state(
        0,
        2,
        vec![frame(0, 4_000_000), frame(2, 8_000_000)],
        Confusion::from_rows(&[vec![1, 0], vec![0, 1]]),
    );
    let s1 = state(
        1,
        2,
        vec![frame(1, 2_000_000), frame(3, 6_000_000)],
        Confusion::from_rows(&[vec![0, 1], vec![1, 0]]),
    );
    let m = EvalState::merge(vec![s1.clone(), s0.clone()]).unwrap();
    assert_eq!(
        m.frames.iter().map(|f| f.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(m.shards, vec![0, 1]);
    assert_eq!(m.confusion, Confusion::from_rows(&[vec![1, 1], vec![1, 1]]));
    let r = Report::from_state(&m);
    let e = r.latency_ms.end_to_end.unwrap();
    assert_eq!((e.count, e.p50_ms, e.max_ms), (4, 4.0, 8.0));
    assert_eq!(r.throughput.processing_s, 2.0);
    close(r.metrics.as_ref().unwrap().miou, 1.0 / 3.0);
    // Missing, doubled and foreign shards are refused.
    assert!(EvalState::merge(vec![s0.clone()])
        .unwrap_err()
        .to_string()
        .contains("missing"));
    assert!(EvalState::merge(vec![s0.clone(), s0.clone()])
        .unwrap_err()
        .to_string()
        .contains("twice"));
    let mut other = s1.clone();
    other.model = "other.yaml".into();
    assert!(EvalState::merge(vec![s0, other])
        .unwrap_err()
        .to_string()
        .contains("model"));
}

/// The report's top-level and nested keys are the documented ones.
#[test]
fn report_json_keys_are_stable() {
    let s = state(
        0,
        1,
        vec![frame(0, 1_000_000)],
        Confusion::from_rows(&[vec![3, 1], vec![0, 2]]),
    );
    let r = Report::from_state(&s);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut top = keys(&v);
    top.sort();
    assert_eq!(
        top,
        [
            "damage",
            "format",
            "frames",
            "latency_ms",
            "metrics",
            "out_of_range",
            "recomputed_in_fp32",
            "run",
            "skipped",
            "throughput"
        ]
    );
    assert_eq!(v["format"], "sptr-eval-report/1");
    let mut mk = keys(&v["metrics"]);
    mk.sort();
    assert_eq!(
        mk,
        [
            "accuracy",
            "classes",
            "confusion",
            "miou",
            "points_evaluated",
            "points_ignored",
            "points_out_of_range",
            "points_unmapped",
            "points_unpredicted",
            "unpredicted"
        ]
    );
    let mut lk = keys(&v["latency_ms"]["end_to_end"]);
    lk.sort();
    assert_eq!(
        lk,
        ["count", "max_ms", "mean_ms", "p50_ms", "p90_ms", "p99_ms"]
    );
    assert_eq!(v["latency_ms"]["stages"][0]["stage"], "decode");
    assert_eq!(
        v["metrics"]["confusion"],
        serde_json::json!([[3, 1], [0, 2]])
    );
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
    let md = r.to_markdown();
    assert!(md.contains("| 0 | a | 75.00 % |"), "{md}");
}

/// A damaged or foreign state file is an error naming it, never a panic.
#[test]
fn bad_state_files_are_errors() {
    let dir = std::env::temp_dir().join(format!("sptr-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("eval_state.json");
    let mut s = state(
        0,
        1,
        vec![frame(0, 1)],
        Confusion::from_rows(&[vec![1, 0], vec![0, 1]]),
    );
    s.save(&path).unwrap();
    assert_eq!(EvalState::load(&dir).unwrap(), s);
    s.confusion.matrix.pop();
    s.save(&path).unwrap();
    let e = EvalState::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("eval_state.json") && e.contains("3 cells"),
        "{e}"
    );
    std::fs::write(&path, "{\"format\": 1}").unwrap();
    assert!(EvalState::load(&path)
        .unwrap_err()
        .to_string()
        .contains("not a replay state file"));
    let e = EvalState::load(&dir.join("nowhere"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nowhere"), "{e}");
}

/// The confusion matrix PNG reads on its own: a colour scale (dark blue = 100 % of the row at
/// its top, lightening to white = 0 % at its bottom, with tick labels) and the class names on
/// both axes (the predicted names turned below the matrix: long names reach 40-70 px below it,
/// where class ids never would).
#[test]
fn confusion_png_has_a_colour_scale_and_names_on_both_axes() {
    const FULL: [u8; 3] = [8, 48, 107]; // the colour of 100 %
    let mut s = state(0, 1, vec![frame(0, 1_000_000)], Confusion::from_rows(&[vec![3, 1], vec![0, 2]]));
    s.class_names = vec!["traffic-sign".into(), "vegetation".into()];
    let r = Report::from_state(&s);
    let path = std::env::temp_dir().join(format!("sptr-eval-confusion-{}.png", std::process::id()));
    sptr::eval::plots::confusion_png(&r, &path).unwrap();
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
    let mut rd = dec.read_info().unwrap();
    let mut px = vec![0u8; rd.output_buffer_size().unwrap()];
    let info = rd.next_frame(&mut px).unwrap();
    let _ = std::fs::remove_file(&path);
    let (w, h) = (info.width as usize, info.height as usize);
    let at = |x: usize, y: usize| -> [u8; 3] { px[(y * w + x) * 3..(y * w + x) * 3 + 3].try_into().unwrap() };
    let is_text = |c: [u8; 3]| c.iter().all(|&v| v < 140);
    let lum = |c: [u8; 3]| c.iter().map(|&v| v as u32).sum::<u32>();
    let count = |xs: std::ops::Range<usize>, ys: std::ops::Range<usize>| {
        xs.flat_map(|x| ys.clone().map(move |y| (x, y))).filter(|&(x, y)| is_text(at(x, y))).count()
    };

    // The scale, right of the matrix: a bar from FULL at the top, lightening to white.
    let right = w - 110;
    let (sx, top) = (right..w)
        .find_map(|x| (0..h).position(|y| at(x, y) == FULL).map(|y| (x, y)))
        .expect("the scale's 100 % colour on the right");
    let bar: Vec<u32> = (top..h).map(|y| at(sx + 3, y)).take_while(|&c| c != [0, 0, 0]).map(lum).collect();
    assert!(bar.len() > 50, "a bar, not a swatch: {} px", bar.len());
    assert!(bar.windows(2).all(|p| p[0] <= p[1]), "the scale lightens from top to bottom");
    assert_eq!(*bar.last().unwrap(), 765, "white at 0 %");
    assert!(count(sx + 30..w, top..top + bar.len()) > 50, "no tick labels beside the scale");

    // Ground-truth names left of the matrix; predicted names turned below it.
    let matrix_bottom = (0..h).rev().find(|&y| (0..right).any(|x| at(x, y) == FULL)).expect("a 100 % cell");
    assert!(count(40..150, 0..matrix_bottom) > 100, "no ground-truth names on the left");
    let below = count(0..right, matrix_bottom + 40..(matrix_bottom + 70).min(h));
    assert!(below > 20, "no predicted-class names below the matrix (bottom at y {matrix_bottom})");
}

/// `precision: auto`'s frames computed again in FP32 are listed with the FP16 pass's layers
/// (JSON and Markdown) apart from out-of-range frames (their labels are good); a report
/// written before the field reads as none.
#[test]
fn frames_computed_again_in_fp32_are_listed() {
    let mut again = frame(1, 2_000_000);
    again.recomputed_in_fp32 = vec!["enc.0.attn.qkv (overflow)".into()];
    let s = state(0, 1, vec![frame(0, 1_000_000), again], Confusion::from_rows(&[vec![3, 1], vec![0, 2]]));
    let r = Report::from_state(&s);
    assert!(r.out_of_range.is_empty());
    assert_eq!(r.recomputed_in_fp32.len(), 1);
    let f = &r.recomputed_in_fp32[0];
    assert_eq!((f.frame, f.timestamp_ns, f.status, f.layers.clone()), (1, 1001, FrameStatus::Evaluated, vec!["enc.0.attn.qkv (overflow)".to_string()]));
    let md = r.to_markdown();
    assert!(md.contains("1 frame(s) computed again in FP32") && md.contains("## Frames computed again in FP32"), "{md}");
    assert!(md.contains("| 1 | 1001 | Evaluated | enc.0.attn.qkv (overflow) |"), "{md}");
    assert!(!md.contains("## Frames out of the FP16 range"), "{md}");
    let mut json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["recomputed_in_fp32"][0]["layers"][0], "enc.0.attn.qkv (overflow)");
    json.as_object_mut().unwrap().remove("recomputed_in_fp32");
    let old: Report = serde_json::from_value(json).unwrap();
    assert!(old.recomputed_in_fp32.is_empty());
}

/// Frames whose activations left the FP16 range are listed with their layers (JSON and
/// Markdown), merged like the rest; a state or report written before the field reads as none.
#[test]
fn out_of_range_frames_are_listed() {
    let mut bad = frame(1, 2_000_000);
    bad.status = FrameStatus::Skipped;
    bad.reason = Some("rejected as the node would reject it (overflow: ...)".into());
    bad.out_of_range = vec!["input_conv.0 (overflow)".into(), "unet.blocks.block0.conv_branch.2 (overflow, NaN/inf)".into()];
    let s = state(0, 1, vec![frame(0, 1_000_000), bad], Confusion::from_rows(&[vec![3, 1], vec![0, 2]]));
    let r = Report::from_state(&s);
    assert_eq!(r.out_of_range.len(), 1);
    let f = &r.out_of_range[0];
    assert_eq!((f.frame, f.timestamp_ns, f.status), (1, 1001, FrameStatus::Skipped));
    assert_eq!(f.layers[0], "input_conv.0 (overflow)");
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["out_of_range"][0]["layers"][1], "unet.blocks.block0.conv_branch.2 (overflow, NaN/inf)");
    assert_eq!(v["out_of_range"][0]["status"], "skipped");
    let md = r.to_markdown();
    assert!(md.contains("1 frame(s) left the FP16 range") && md.contains("## Frames out of the FP16 range"), "{md}");
    assert!(md.contains("| 1 | 1001 | Skipped | input_conv.0 (overflow), unet.blocks.block0.conv_branch.2 (overflow, NaN/inf) |"), "{md}");
    // in-range frames add nothing
    let clean = Report::from_state(&state(0, 1, vec![frame(0, 1_000_000)], Confusion::from_rows(&[vec![1]])));
    assert!(clean.out_of_range.is_empty() && !clean.to_markdown().contains("FP16"));
    // older files: no `out_of_range` in a frame record or a report
    let mut json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    json.as_object_mut().unwrap().remove("out_of_range");
    let old: Report = serde_json::from_value(json).unwrap();
    assert!(old.out_of_range.is_empty());
    let rec: FrameRecord = serde_json::from_str(r#"{"index":0,"timestamp_ns":5,"status":"replayed","points":1,"labeled_points":1,"stages_ns":[]}"#).unwrap();
    assert!(rec.out_of_range.is_empty());
    // shards merge: the frame keeps its layers
    let merged = EvalState::merge(vec![s.clone()]).unwrap();
    assert_eq!(Report::from_state(&merged).out_of_range, r.out_of_range);
}
