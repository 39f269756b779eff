//! The LiDAR branch (hard voxelization + SparseEncoder) against the PyTorch + spconv 2.x reference
//! of the upstream modules (tests/parity/lidar_encoder_ref.py), same random weights (written by
//! the reference in the released checkpoints' spconv 1.x layout), same points:
//! - voxelization: coordinates in the same order, counts implied, stats equal, means rel ≤ 1e-6
//!   (PyTorch's sum over the point slots may round differently in the last bit);
//! - every stage (conv_input, encoder_layer1..4, conv_out): the same site set, features by
//!   coordinate rel ≤ 2e-3 (ours FP16, the reference FP32);
//! - the BEV map (1, 256, 128, 128) rel ≤ 2e-3, no NaN; the error of the reference's own FP16 run
//!   is printed beside it.
//! Then ours is timed (voxelize, encoder, medians) beside the reference's timings (JSON lines).
//!
//! `scripts/gpu_parity.sh OUT lidarenc` prepares `SPTR_LIDAR_PARITY_DIR` (weights.safetensors and
//! ref/ with points.bin, *.npy, ref.json). Without it the test prints SKIPPED and passes.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::rel_err;
use sptr::nn::npy;
use sptr::ops::dense::FeatureMap;
use sptr::device::cuda::CudaDevice;
use sptr::models::bevfusion::lidar_encoder::cuda::CudaLidarEncoder;
use sptr::models::bevfusion::lidar_encoder::{LidarEncoder, LidarEncoderConfig};
use sptr::nn::Weights;
use sptr::ops::voxelize::hard::{hard_voxelize_cpu, HardVoxels, POINT_COLUMNS};
use std::collections::HashMap;
use std::path::Path;

fn load(dir: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let p = dir.join(name);
    npy::read_f32(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn coords_of(v: &[f32]) -> Vec<[i32; 4]> {
    v.chunks_exact(4).map(|c| [c[0] as i32, c[1] as i32, c[2] as i32, c[3] as i32]).collect()
}

/// Our voxels against the reference's: coordinates in order, stats, means rel ≤ 1e-6. Prints a
/// JSON line.
fn check_voxels(case: &str, host: &HardVoxels, refd: &Path, ref_json: &serde_json::Value) -> Result<(), String> {
    let want_coords = coords_of(&load(refd, "voxel_coords.npy").1);
    let (_, want_feats) = load(refd, "voxel_feats.npy");
    let s = &ref_json["stats"];
    let stat = |k: &str| s[k].as_u64().unwrap_or(u64::MAX) as usize;
    let st = host.stats;
    let stats_ok = (st.points_in, st.non_finite, st.out_of_range, st.voxels_total, st.voxels_kept, st.points_capped, st.points_over_max)
        == (stat("points_in"), stat("non_finite"), stat("out_of_range"), stat("voxels_total"), stat("voxels_kept"), stat("points_capped"), stat("points_over_max"));
    let coords_ok = host.coords == want_coords;
    let fe = if host.feats.len() == want_feats.len() { rel_err(&host.feats, &want_feats) } else { f64::INFINITY };
    println!(
        "{{\"case\": \"{case}\", \"points\": {}, \"voxels\": {}, \"voxels_total\": {}, \"coords_equal\": {coords_ok}, \"stats_equal\": {stats_ok}, \"rel_err\": {fe:.3e}}}",
        st.points_in,
        host.coords.len(),
        st.voxels_total
    );
    if coords_ok && stats_ok && fe <= 1e-6 {
        Ok(())
    } else {
        Err(format!("{case}: coords equal {coords_ok}, stats {st:?} vs {s}, means rel {fe:.3e}"))
    }
}

fn read_points(path: &Path) -> Vec<[f32; POINT_COLUMNS]> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4 * POINT_COLUMNS)
        .map(|r| std::array::from_fn(|c| f32::from_le_bytes([r[4 * c], r[4 * c + 1], r[4 * c + 2], r[4 * c + 3]])))
        .collect()
}

fn parity_dir() -> Option<std::path::PathBuf> {
    match std::env::var("SPTR_LIDAR_PARITY_DIR") {
        Ok(d) => Some(d.into()),
        Err(_) => {
            eprintln!("SKIPPED: SPTR_LIDAR_PARITY_DIR not set (scripts/gpu_parity.sh OUT lidarenc sets it)");
            None
        }
    }
}

/// The CPU voxelizer against the reference (needs no GPU: the reference's `--voxels-only` mode
/// needs numpy only).
#[test]
fn hard_voxelize_cpu_matches_the_reference() {
    let Some(dir) = parity_dir() else { return };
    let refd = dir.join("ref");
    let cfg = LidarEncoderConfig::load(&common::root().join("config/models/bevfusion_seg_fusion.yaml")).expect("config");
    let pts = read_points(&refd.join("points.bin"));
    let ref_json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(refd.join("ref.json")).expect("ref.json")).expect("json");
    let v = hard_voxelize_cpu(&pts, &cfg.voxelize).expect("voxelize");
    check_voxels("lidarenc_voxelize_cpu", &v, &refd, &ref_json).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn lidar_encoder_matches_the_spconv_reference() {
    let Some(dir) = parity_dir() else { return };
    if !dir.join("weights.safetensors").exists() {
        eprintln!("SKIPPED: no weights.safetensors in {} (a --voxels-only reference)", dir.display());
        return;
    }
    let refd = dir.join("ref");
    let cfg = LidarEncoderConfig::load(&common::root().join("config/models/bevfusion_seg_fusion.yaml")).expect("config");
    let weights = Weights::from_file(&dir.join("weights.safetensors")).expect("weights");
    let enc = LidarEncoder::load(&cfg, &weights).expect("the reference's weights load (spconv 1.x layout)");
    let pts = read_points(&refd.join("points.bin"));
    let ref_json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(refd.join("ref.json")).expect("ref.json")).expect("json");
    let dev = CudaDevice::new(0).expect("GPU");
    let gpu = CudaLidarEncoder::upload(&dev, &enc).expect("upload");
    let mut failures = Vec::new();

    // voxelization
    let v = gpu.voxelize(&dev, &pts).expect("voxelize");
    let host = v.to_host(&dev).expect("download");
    if let Err(e) = check_voxels("lidarenc_voxelize", &host, &refd, &ref_json) {
        failures.push(e);
    }
    let st = host.stats;

    // stages and BEV
    let (bev, stages) = gpu.forward_voxels(&dev, v, true).expect("forward");
    for g in &stages {
        let wc = coords_of(&load(&refd, &format!("stage_{}_coords.npy", g.name)).1);
        let (shape, wf) = load(&refd, &format!("stage_{}_feats.npy", g.name));
        let c = g.channels;
        assert_eq!(shape.get(1).copied(), Some(c), "{}: channels", g.name);
        let index: HashMap<[i32; 4], usize> = wc.iter().enumerate().map(|(i, q)| (*q, i)).collect();
        let same_sites = wc.len() == g.coords.len() && g.coords.iter().all(|q| index.contains_key(q));
        let err = if same_sites {
            let mut want = Vec::with_capacity(g.feats.len());
            for q in &g.coords {
                let i = index[q];
                want.extend_from_slice(&wf[i * c..(i + 1) * c]);
            }
            rel_err(&g.feats, &want)
        } else {
            f64::INFINITY
        };
        let finite = g.feats.iter().all(|x| x.is_finite());
        println!(
            "{{\"case\": \"lidarenc_{}\", \"sites\": {}, \"ref_sites\": {}, \"same_sites\": {same_sites}, \"channels\": {c}, \"rel_err\": {err:.3e}, \"finite\": {finite}}}",
            g.name,
            g.coords.len(),
            wc.len()
        );
        if !(same_sites && finite && err <= 2e-3) {
            failures.push(format!("{}: same sites {same_sites}, rel err {err:.3e}, finite {finite}", g.name));
        }
    }
    let got = bev.download(&dev).expect("download");
    let nchw = |name: &str| -> FeatureMap {
        let (shape, data) = load(&refd, name);
        let [n, c, h, w] = shape[..] else { panic!("{name}: shape {shape:?}") };
        FeatureMap::from_nchw(n, c, h, w, &data).expect("reference map")
    };
    let want = nchw("bev.npy");
    assert_eq!((got.n, got.h, got.w, got.c), (want.n, want.h, want.w, want.c), "BEV shape");
    let err = rel_err(&got.data, &want.data);
    let finite = got.data.iter().all(|x| x.is_finite());
    let err16 = refd.join("bev_fp16.npy").exists().then(|| rel_err(&got.data, &nchw("bev_fp16.npy").data));
    println!(
        "{{\"case\": \"lidarenc_bev\", \"shape\": [1, {}, {}, {}], \"rel_err\": {err:.3e}, \"rel_err_vs_ref_fp16\": {}, \"ref_fp16_vs_fp32\": {}, \"finite\": {finite}}}",
        got.c,
        got.h,
        got.w,
        err16.map_or("null".into(), |e| format!("{e:.3e}")),
        ref_json.get("fp16_rel_err_vs_fp32").map_or("null".into(), |e| e.to_string())
    );
    if !(finite && err <= 2e-3) {
        failures.push(format!("BEV map: rel err {err:.3e}, finite {finite}"));
    }

    // timing: ours from host points (voxelize alone, then the whole branch), beside the reference
    let vox_ms = dev.time_median_ms(5, 20, || gpu.voxelize(&dev, &pts).map(|_| ())).expect("time voxelize");
    let all_ms = dev.time_median_ms(5, 20, || gpu.forward(&dev, &pts).map(|_| ())).expect("time forward");
    let r = |k: &str| ref_json.get(k).map_or("null".into(), |v| v.to_string());
    println!(
        "{{\"bench\": \"lidarenc\", \"points\": {}, \"voxels\": {}, \"sptr_voxelize_ms\": {vox_ms:.3}, \"sptr_voxelize_encoder_ms\": {all_ms:.3}, \"ref_encoder_fp32_ms\": {}, \"ref_encoder_fp16_ms\": {}}}",
        pts.len(),
        st.voxels_kept,
        r("encoder_fp32_ms"),
        r("encoder_fp16_ms")
    );
    assert!(failures.is_empty(), "parity failures:\n{}", failures.join("\n"));
}
