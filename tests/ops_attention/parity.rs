//! Parity and speed against PyPI sptr 1.1.1 on the same GPU, from the reference directory
//! written by `tests/parity/sptr_parity.py` (see tests/parity/README.md).
//!
//! Set `SPTR_ATTN_PARITY_DIR` to that script's `--out` directory. Unset, the test reports SKIPPED
//! and passes (the reference needs the sptr build, which the plain GPU runner does not have).
//!
//! Per case: the same voxel positions, batch, FP16-representable q/k/v and RPE tables are
//! uploaded; our partitions are built on the GPU and compared with sptr's (the size of every
//! voxel's window: order-free); our SphereFormer attention core runs in FP16 and is compared with
//! sptr in FP32 (what SphereFormer runs) and with our CPU f64 reference, ‖out−ref‖/‖ref‖ ≤ 2e-3
//! and no NaN; the same without RPE. sptr's FP16 output is compared with the f64 reference too and
//! printed (its kernels accumulate in FP16). Timing: CUDA events, median; one JSON line per case
//! and mode with sptr's times (FP16 and FP32 builds of its ops), ours, and ratio = sptr FP16 / ours.
#![cfg(feature = "cuda-core")]

use crate::common::rel_err;
use half::f16;
use serde_yaml::Value;
use sptr::bench::attention::stage_extra_bytes;
use sptr::ops::attention::cpu::HeadSlice;
use sptr::ops::attention::cuda::{sphere_attention_cuda, window_attention_cuda, CudaContextual, CudaSphereTables, CudaSphereWindows, CudaTerm, QkvView};
use sptr::ops::attention::{sphere_attention_cpu, RpeTables, SphereLevel, SphereTables, SphereWindows};
use sptr::device::cuda::CudaDevice;
use std::path::Path;

const TOL: f64 = 2e-3;

fn read_f32(dir: &Path, file: &str) -> Vec<f32> {
    let b = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn read_i32(dir: &Path, file: &str) -> Vec<i32> {
    let b = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn f3(v: &Value) -> [f32; 3] {
    let s = v.as_sequence().expect("3 floats");
    [0, 1, 2].map(|i| s[i].as_f64().expect("float") as f32)
}
fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("manifest: {key} missing"))
}

#[test]
fn attention_matches_sptr_and_is_timed_beside_it() {
    let Some(dir) = std::env::var_os("SPTR_ATTN_PARITY_DIR") else {
        eprintln!("SKIPPED attention parity: SPTR_ATTN_PARITY_DIR is not set (see tests/parity/README.md)");
        return;
    };
    let dir = Path::new(&dir);
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json in SPTR_ATTN_PARITY_DIR");
    let m: Value = serde_yaml::from_str(&text).expect("manifest parses");
    let dev = CudaDevice::new(0).expect("a GPU (SPTR_ATTN_PARITY_DIR is set)");
    eprintln!("sptr {:?} torch {:?} on {:?}; ours on {}", m["sptr_version"], m["torch_version"], m["device"], dev.name);
    let s = &dev.stream;
    let mut failures = Vec::new();
    for case in m["cases"].as_sequence().expect("cases") {
        let name = case["name"].as_str().expect("name").to_string();
        let n = num(case, "n") as usize;
        let heads = num(case, "heads") as usize;
        let d = num(case, "head_dim") as usize;
        let channels = heads * d;
        let p = &case["params"];
        let level = SphereLevel {
            cubic_window: f3(&p["window"]),
            cubic_quant: f3(&p["quant"]),
            cubic_grid_length: num(p, "L") as i32,
            sphere_window: f3(&p["window_sphere"]),
            sphere_quant: f3(&p["quant_sphere"]),
            sphere_grid_length: num(p, "L_sphere") as i32,
            a: num(p, "a") as f32,
            shift: p["shift"].as_bool().unwrap_or(false),
        };
        let f = &case["files"];
        let file = |k: &str| f[k].as_str().unwrap_or_else(|| panic!("{name}: file {k} missing")).to_string();
        let xyz_flat = read_f32(dir, &file("xyz"));
        let xyz: Vec<[f32; 3]> = xyz_flat.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        let batch = read_i32(dir, &file("batch"));
        let (q, k, v) = (read_f32(dir, &file("q")), read_f32(dir, &file("k")), read_f32(dir, &file("v")));
        let tc: Vec<Vec<f32>> = ["tq_cubic", "tk_cubic", "tv_cubic"].iter().map(|t| read_f32(dir, &file(t))).collect();
        let ts: Vec<Vec<f32>> = ["tq_sphere", "tk_sphere", "tv_sphere"].iter().map(|t| read_f32(dir, &file(t))).collect();
        let sptr32 = read_f32(dir, &file("out_fp32"));
        let norpe32 = read_f32(dir, &file("out_norpe_fp32"));
        let sptr16 = f["out_fp16"].as_str().map(|x| read_f32(dir, x));
        assert_eq!(xyz.len(), n);

        // ours, on the device
        let up16 = |x: &[f32]| s.clone_htod(&x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<_>>()).unwrap();
        let xyz_d = s.clone_htod(&xyz_flat).unwrap();
        let batch_d = s.clone_htod(&batch).unwrap();
        let (qd, kd, vd) = (up16(&q), up16(&k), up16(&v));
        let qkv = QkvView { q: &qd, k: &kd, v: &vd, ld: channels };
        let tables = CudaSphereTables::upload(&dev, [&tc[0], &tc[1], &tc[2]], [&ts[0], &ts[1], &ts[2]]).unwrap();
        let windows = CudaSphereWindows::build(&dev, &xyz_d, &batch_d, n, &level).unwrap();
        let mut out = s.alloc_zeros::<f16>(n * channels).unwrap();
        sphere_attention_cuda(&dev, qkv, heads, d, &xyz_d, &windows, &tables, &mut out).unwrap();
        let ours: Vec<f32> = s.clone_dtoh(&out).unwrap().into_iter().map(|x| x.to_f32()).collect();

        // partitions: the size of every voxel's window, as sptr grouped them
        for (kind, part, want_file) in [("cubic", &windows.cubic, "wincount_cubic"), ("sphere", &windows.sphere, "wincount_sphere")] {
            let got = part.to_host(&dev).unwrap().window_size_of_each(n);
            let want = read_i32(dir, &file(want_file));
            let differ = got.iter().zip(&want).filter(|(a, b)| **a as i32 != **b).count();
            eprintln!("{name}: {kind} partition: {} windows, {differ} voxels whose window size differs from sptr's", part.windows);
            if differ != 0 {
                failures.push(format!("{name}: {kind} partition differs for {differ} voxels"));
            }
        }

        // the f64 CPU reference on the GPU's spherical coordinates (same partition inputs)
        let sph: Vec<[f32; 3]> = s.clone_dtoh(&windows.sphere_pos).unwrap().chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        let w = SphereWindows::from_sphere_positions(&xyz, sph, &batch, &level).unwrap();
        let exact = sphere_attention_cpu(
            &q,
            &k,
            &v,
            heads,
            d,
            &xyz,
            &w,
            SphereTables { cubic: RpeTables { q: &tc[0], k: &tc[1], v: &tc[2] }, sphere: RpeTables { q: &ts[0], k: &ts[1], v: &ts[2] } },
        )
        .unwrap();
        let nonfinite = ours.iter().filter(|x| !x.is_finite()).count();
        let (e_sptr, e_exact) = (rel_err(&ours, &sptr32), rel_err(&ours, &exact));
        let e_sptr32_exact = rel_err(&sptr32, &exact);
        let e_sptr16_exact = sptr16.as_ref().map(|o| rel_err(o, &exact));
        eprintln!(
            "{name}: ours vs sptr fp32 {e_sptr:.2e}, ours vs exact {e_exact:.2e}, sptr fp32 vs exact {e_sptr32_exact:.2e}, sptr fp16 vs exact {e_sptr16_exact:?}, non-finite {nonfinite}"
        );
        if nonfinite > 0 || e_sptr > TOL || e_exact > TOL {
            failures.push(format!("{name}: ours vs sptr fp32 {e_sptr:.2e}, vs exact {e_exact:.2e}, non-finite {nonfinite}"));
        }

        // without RPE
        let hc = heads / 2;
        let mut out_nr = s.alloc_zeros::<f16>(n * channels).unwrap();
        if hc > 0 {
            window_attention_cuda(&dev, qkv, HeadSlice { heads, head_dim: d, first: 0, count: hc }, &windows.cubic, CudaTerm::None, &mut out_nr, channels).unwrap();
        }
        window_attention_cuda(&dev, qkv, HeadSlice { heads, head_dim: d, first: hc, count: heads - hc }, &windows.sphere, CudaTerm::None, &mut out_nr, channels).unwrap();
        let ours_nr: Vec<f32> = s.clone_dtoh(&out_nr).unwrap().into_iter().map(|x| x.to_f32()).collect();
        let e_nr = rel_err(&ours_nr, &norpe32);
        eprintln!("{name}: no RPE: ours vs sptr fp32 {e_nr:.2e}");
        if !(e_nr <= TOL) {
            failures.push(format!("{name}: no-RPE rel err {e_nr:.2e}"));
        }

        // timings beside sptr's
        let tm = &case["timings_ms"];
        let mem = &case["peak_extra_mb"];
        let cubic_term = CudaTerm::Contextual(CudaContextual {
            geometry: windows.cubic_rpe,
            quant: &windows.cubic_quant,
            positions: &xyz_d,
            tables: [&tables.cubic[0], &tables.cubic[1], &tables.cubic[2]],
        });
        let cubic_slice = HeadSlice { heads, head_dim: d, first: 0, count: hc.max(1).min(heads) };
        let core_ms = dev.time_median_ms(10, 50, || window_attention_cuda(&dev, qkv, cubic_slice, &windows.cubic, cubic_term, &mut out, channels)).unwrap();
        let stage_ms = dev
            .time_median_ms(5, 30, || {
                let w = CudaSphereWindows::build(&dev, &xyz_d, &batch_d, n, &level)?;
                sphere_attention_cuda(&dev, qkv, heads, d, &xyz_d, &w, &tables, &mut out)
            })
            .unwrap();
        let cached_ms = dev.time_median_ms(10, 50, || sphere_attention_cuda(&dev, qkv, heads, d, &xyz_d, &windows, &tables, &mut out)).unwrap();
        let ours_mb = stage_extra_bytes(&dev, qkv, heads, d, &xyz_d, &batch_d, n, &level, &tables).unwrap() as f64 / 1e6;
        for (mode, ours_ms, key) in [("cubic_core", core_ms, "cubic_core"), ("stage", stage_ms, "stage"), ("stage_windows_cached", cached_ms, "stage_cached")] {
            let s16 = tm[format!("{key}_fp16_ms").as_str()].as_f64();
            let s32 = tm[format!("{key}_fp32_ms").as_str()].as_f64();
            let m16 = mem[format!("{key}_fp16_peak_mb").as_str()].as_f64();
            let ratio = s16.map(|x| x / ours_ms);
            let mem_ours = if mode == "stage" { format!("{ours_mb:.1}") } else { "null".into() };
            println!(
                "{{\"case\":\"{name}\",\"mode\":\"{mode}\",\"n\":{n},\"heads\":{heads},\"sptr_fp16_ms\":{},\"sptr_fp32_ms\":{},\"sptr_ms\":{ours_ms:.4},\"ratio\":{},\"sptr_fp16_peak_mb\":{},\"ours_extra_mb\":{mem_ours}}}",
                s16.map(|x| format!("{x:.4}")).unwrap_or("null".into()),
                s32.map(|x| format!("{x:.4}")).unwrap_or("null".into()),
                ratio.map(|x| format!("{x:.2}")).unwrap_or("null".into()),
                m16.map(|x| format!("{x:.1}")).unwrap_or("null".into()),
            );
        }
    }
    assert!(failures.is_empty(), "attention parity failures:\n{}", failures.join("\n"));
}
