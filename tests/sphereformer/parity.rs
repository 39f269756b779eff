//! SphereFormer parity against the upstream network in PyTorch (spconv + sptr ops;
//! `tests/parity/sphereformer_ref.py`), from the same random weights exported to safetensors and
//! the same voxel inputs (our preprocessing). Run by `scripts/gpu_parity.sh OUT
//! model`, which writes, per case, `SPTR_MODEL_PARITY_DIR/<case>/`: `case.json` (model YAML, cloud,
//! float columns), `weights.safetensors`, `inputs/` (our preprocessing, `sptr prepare`: both
//! networks run on these voxels), `upstream_inputs/` (upstream's preprocessing, compared as sets)
//! and `ref/` (logits_fp32.f32, logits_fp16.f32, ref.json with upstream's timings and memory).
//! Prints one JSON line per case.
//!
//! Checks: our CUDA logits vs upstream FP32 ‖Δ‖/‖ref‖ ≤ 1e-2 and arg-max agreement ≥ 99.5 %. Also
//! reported: upstream's own FP16 autocast vs its FP32 (the scale of FP16 drift), our preprocessing
//! vs upstream's (voxel count, coordinates as sets), and end-to-end latency and memory beside
//! upstream's forward. Skips when the variable is not set.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{argmax, read_f32_le, read_i32_le, rel_err};
use sptr::device::Device;
use sptr::models::sphereformer::config::ModelConfig;
use sptr::bench::model::bench_segment;
use sptr::models::sphereformer::network::StageTimes;
use sptr::models::sphereformer::preprocess::{prepare_inputs, NetworkInputs};
use sptr::nn::Weights;
use sptr::sensors::cloud_files::{read_cloud, CloudFormat};
use sptr::models::sphereformer::segmenter::Segmenter;
use std::collections::HashSet;
use std::path::Path;

/// JSON files read with serde_yaml (JSON is YAML).
fn json(p: &Path) -> serde_yaml::Value {
    serde_yaml::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).expect("json")
}

fn agreement(a: &[f32], b: &[f32], k: usize) -> f64 {
    let n = a.len() / k;
    a.chunks(k).zip(b.chunks(k)).filter(|(x, y)| argmax(x) == argmax(y)).count() as f64 / n.max(1) as f64
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max)
}

/// Upstream's voxel inputs as our `NetworkInputs`.
fn load_inputs(dir: &Path, input_c: usize) -> NetworkInputs {
    let coords: Vec<[i32; 4]> = read_i32_le(&dir.join("coords.i32")).chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect();
    let feats = read_f32_le(&dir.join("feats.f32"));
    let xyz: Vec<[f32; 3]> = read_f32_le(&dir.join("xyz.f32")).chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect();
    let batch = read_i32_le(&dir.join("batch.i32"));
    let meta = json(&dir.join("inputs.json"));
    let shape: Vec<i32> = meta["spatial_shape"].as_sequence().expect("spatial_shape").iter().map(|v| v.as_i64().expect("int") as i32).collect();
    assert_eq!(feats.len(), coords.len() * input_c);
    NetworkInputs { coords, feats, xyz, batch, spatial_shape: [shape[0], shape[1], shape[2]], ..Default::default() }
}

fn stage_json(m: &std::collections::BTreeMap<String, f64>) -> String {
    let v: Vec<String> = m.iter().map(|(k, v)| format!("\"{k}\":{v:.3}")).collect();
    format!("{{{}}}", v.join(","))
}

#[test]
fn sphereformer_matches_upstream() {
    let Ok(root) = std::env::var("SPTR_MODEL_PARITY_DIR") else {
        eprintln!("SKIPPED: SPTR_MODEL_PARITY_DIR not set (scripts/gpu_parity.sh OUT model sets it)");
        return;
    };
    let mut cases: Vec<_> = std::fs::read_dir(&root).expect("parity dir").flatten().map(|e| e.path()).filter(|p| p.join("case.json").is_file()).collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases in {root}");
    let mut failures = Vec::new();
    for dir in cases {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let case = json(&dir.join("case.json"));
        let model = common::root().join(case["model"].as_str().expect("model"));
        let cfg = ModelConfig::load(&model).expect("model yaml").yaml;
        let k = cfg.classes;
        let weights = || Weights::from_file(&dir.join("weights.safetensors")).expect("weights");
        let seg = Segmenter::on_device(cfg.clone(), weights(), Device::Cuda).expect("cuda model");
        let inputs = load_inputs(&dir.join("inputs"), cfg.input_c);
        let (ours, range) = seg.run_network_checked(&inputs, &mut StageTimes::default()).expect("cuda forward");
        // the parity weights are in range: the FP16 range guard raises no false alarm
        if !range.is_clean() {
            failures.push(format!("{name}: FP16 range guard flagged in-range weights: {}", range.summary(5)));
        }
        let r32 = read_f32_le(&dir.join("ref/logits_fp32.f32"));
        let r16 = read_f32_le(&dir.join("ref/logits_fp16.f32"));
        let (e32, a32, m32) = (rel_err(&ours, &r32), agreement(&ours, &r32, k), max_abs(&ours, &r32));
        let (e16, a16) = (rel_err(&ours, &r16), agreement(&ours, &r16, k));
        let (up_e, up_a) = (rel_err(&r16, &r32), agreement(&r16, &r32, k));

        // our preprocessing of the same cloud (the network's inputs above) vs upstream's own voxels
        // (coordinates as sets; upstream may hold one coordinate twice)
        let cols = case["cols"].as_u64().expect("cols") as usize;
        let fmt = match cols {
            3 => CloudFormat::XyzBin,
            5 => CloudFormat::NuScenesBin,
            _ => CloudFormat::KittiBin,
        };
        let cloud = common::root().join(case["cloud"].as_str().expect("cloud"));
        let pts = read_cloud(&cloud, fmt).expect("cloud");
        let mine = prepare_inputs(&[&pts], &cfg).expect("our preprocessing");
        assert_eq!(mine.coords, inputs.coords, "{name}: inputs/ are sptr prepare's output for this cloud");
        let upstream = load_inputs(&dir.join("upstream_inputs"), cfg.input_c);
        let theirs: HashSet<[i32; 4]> = upstream.coords.iter().copied().collect();
        let same_coords = mine.coords.iter().filter(|c| theirs.contains(*c)).count();
        let upstream_dups = upstream.coords.len() - theirs.len();

        // end to end, ours (points on the host -> labels on the host) vs upstream's forward alone
        let bench = bench_segment(&seg, &name, &[&pts], 3, 20).expect("bench");
        let rj = json(&dir.join("ref/ref.json"));
        let up = |mode: &str, key: &str| rj["bench"][mode][key].as_f64().unwrap_or(f64::NAN);
        let (up32, up16) = (up("fp32", "forward_ms"), up("fp16", "forward_ms"));
        let up_mem = up("fp16", "peak_extra_bytes") / 1e6;
        println!(
            "{{\"case\":\"{name}\",\"voxels\":{},\"ours_vs_fp32\":{{\"rel\":{e32:.3e},\"max_abs\":{m32:.3e},\"argmax\":{a32:.5}}},\"ours_vs_fp16\":{{\"rel\":{e16:.3e},\"argmax\":{a16:.5}}},\"upstream_fp16_vs_fp32\":{{\"rel\":{up_e:.3e},\"argmax\":{up_a:.5}}},\"preprocess\":{{\"ours_voxels\":{},\"upstream_voxels\":{},\"coords_in_both\":{same_coords},\"ours_fixups\":{},\"upstream_duplicates\":{upstream_dups}}},\"ours_end_to_end_ms\":{:.3},\"ours_p90_ms\":{:.3},\"ours_frame_peak_mb\":{},\"upstream_forward_ms\":{{\"fp32\":{up32:.3},\"fp16\":{up16:.3}}},\"upstream_fp16_peak_mb\":{up_mem:.1},\"speedup_vs_fp16\":{:.2},\"speedup_vs_fp32\":{:.2},\"ours_stage_ms\":{}}}",
            inputs.coords.len(),
            mine.coords.len(),
            upstream.coords.len(),
            mine.coord_fixups,
            bench.ms,
            bench.p90_ms,
            bench.frame_peak_mb.map(|m| format!("{m:.1}")).unwrap_or_else(|| "null".into()),
            up16 / bench.ms,
            up32 / bench.ms,
            stage_json(&bench.stage_ms)
        );
        if !(e32 <= 1e-2 && a32 >= 0.995) {
            failures.push(format!("{name}: rel err {e32:.3e}, arg-max agreement {a32:.4}"));
        }
    }
    assert!(failures.is_empty(), "parity failures: {failures:?}");
}
