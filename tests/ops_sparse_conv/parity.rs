//! Parity and speed against spconv 2.3.x on the same GPU, from the reference written by
//! `tests/parity/spconv_parity.py` (see tests/parity/README.md).
//!
//! Set `SPTR_PARITY_DIR` to that script's `--out` directory. Unset, the test reports SKIPPED and
//! passes, also under `SPTR_REQUIRE_GPU=1` (the reference needs spconv, which the GPU runner does
//! not always have). Set, a missing GPU or manifest fails.
//!
//! Per manifest case: our kernel map is built on the GPU from the same coordinates
//! (`submanifold_cuda` / `strided_cuda` / `inverse_cuda` of the strided map), spconv's
//! `state_dict` weight is uploaded in the layout spconv reads it with (`spconv_weight_layout`),
//! and `conv_cuda` runs on the same FP16 features. Checked: the same output coordinate set (and
//! the same order where spconv defines it: submanifold outputs = inputs, inverse outputs = the
//! strided conv's inputs), features matched by coordinate with ‖out−ref‖/‖ref‖ ≤ 2e-3 and no
//! NaN/Inf. The reference is spconv run with FP32 accumulation requested (`fp32_accum=True`);
//! spconv's default output is compared too and printed, not asserted.
//!
//! An f64 arbiter decides disagreements: on ~1024 sampled output rows the exact conv of the same
//! FP16 inputs and weights is computed. Ours must be within 2e-3 of it; where ours and spconv's
//! differ by more than 2e-3, ours must also be the closer of the two to the exact result (the
//! difference is then spconv's rounding, not a different function).
//!
//! Timing: host wall clock (`std::time::Instant`) around one call followed by a stream
//! synchronize, after a warm-up; median of 50 (of 10 after 2 warm-ups when one call takes over
//! 20 ms). The synchronize adds some microseconds per call that spconv's CUDA-event timing does
//! not count, so small-case ratios are slightly pessimistic for us. "cached": the conv alone on a
//! ready map; "built": the device coordinates copied (device to device), hashed, the map built and
//! the conv run. One JSON line per (case, mode) on stdout:
//! `{"case":..,"mode":..,"n":..,"spconv_ms":..,"sptr_ms":..,"ratio":..}`, ratio = spconv / sptr
//! (> 1: we are faster).
#![cfg(feature = "cuda-core")]

use half::f16;
use serde::Deserialize;
use sptr::device::cuda::CudaDevice;
use sptr::ops::sparse_conv::cpu::{spconv_weight_layout, WeightLayout};
use sptr::ops::sparse_conv::cuda::{conv_cuda, CudaConvWeights};
use sptr::ops::sparse_conv::kernel_map::{inverse, strided, submanifold, ConvGeometry};
use sptr::ops::sparse_conv::kernel_map_cuda::{inverse_cuda, strided_cuda, submanifold_cuda, CudaKernelMap, CudaSites};
use sptr::ops::sparse_conv::tensor::SparseTensor;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

const TOL: f64 = 2e-3;

#[derive(Debug, Deserialize)]
struct Manifest {
    #[serde(default)]
    spconv_version: String,
    #[serde(default)]
    device: String,
    clouds: Vec<Cloud>,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Cloud {
    name: String,
    coords: String,
    n: usize,
    spatial_shape: [i32; 3],
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    cloud: String,
    kind: String,
    kernel: [i32; 3],
    stride: [i32; 3],
    padding: [i32; 3],
    dilation: [i32; 3],
    cin: usize,
    cout: usize,
    n_in: usize,
    n_out: usize,
    feats: String,
    weight: String,
    weight_shape: Vec<usize>,
    out: String,
    #[serde(default)]
    out_default: Option<String>,
    out_coords: String,
    out_spatial_shape: [i32; 3],
    #[serde(default)]
    in_coords: Option<String>,
    timings_ms: BTreeMap<String, f64>,
}

fn read(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("reading {}: {e}", dir.join(file).display()))
}
fn read_i32x4(dir: &Path, file: &str) -> Vec<[i32; 4]> {
    let b = read(dir, file);
    assert_eq!(b.len() % 16, 0, "{file}: not int32 [N, 4]");
    b.chunks_exact(16)
        .map(|r| [0, 1, 2, 3].map(|i| i32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap())))
        .collect()
}
fn read_f16(dir: &Path, file: &str) -> Vec<f16> {
    read(dir, file).chunks_exact(2).map(|r| f16::from_bits(u16::from_le_bytes([r[0], r[1]]))).collect()
}
fn read_f32(dir: &Path, file: &str) -> Vec<f32> {
    read(dir, file).chunks_exact(4).map(|r| f32::from_le_bytes(r.try_into().unwrap())).collect()
}

fn geometry(c: &Case) -> ConvGeometry {
    ConvGeometry { kernel: c.kernel, stride: c.stride, padding: c.padding, dilation: c.dilation }
}

/// The layout spconv reads this layer's stored weight with, from a CPU map of the same geometry
/// on a one-site tensor (cheap; `spconv_weight_layout` only looks at the kind and geometry).
fn layout_for(c: &Case) -> WeightLayout {
    let g = geometry(c);
    let shape = [0, 1, 2].map(|a| (g.kernel[a] * g.dilation[a] + g.stride[a]).max(1));
    let tiny = SparseTensor::new(vec![[0, 0, 0, 0]], vec![0.0], 1, shape).unwrap();
    let map = match c.kind.as_str() {
        "subm" => submanifold(&tiny, g.kernel, g.dilation).unwrap(),
        "strided" => strided(&tiny, g).unwrap(),
        "inverse" => inverse(&strided(&tiny, g).unwrap()).unwrap(),
        k => panic!("unknown case kind {k}"),
    };
    spconv_weight_layout(&map)
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in got.iter().zip(want) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Median wall time (ms) of `f` followed by a stream synchronize, and the iteration count.
fn median_ms(dev: &CudaDevice, mut f: impl FnMut()) -> (f64, usize) {
    let t = Instant::now();
    f();
    dev.synchronize().unwrap();
    let first = t.elapsed().as_secs_f64() * 1e3;
    let (warm, iters) = if first > 20.0 { (2, 10) } else { (10, 50) };
    for _ in 0..warm {
        f();
    }
    dev.synchronize().unwrap();
    let mut v: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            dev.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[iters / 2], iters)
}

struct CloudData {
    tensor: SparseTensor,
    coords: Vec<[i32; 4]>,
}

/// Our output (coordinates in our order, features `[n, cout]`) against spconv's (its order):
/// returns (errors, rel err vs reference, rel err vs spconv's default output if given).
#[allow(clippy::too_many_arguments)]
fn compare(
    case: &str,
    ours_coords: &[[i32; 4]],
    ours: &[f32],
    ref_coords: &[[i32; 4]],
    reference: &[f32],
    default: Option<&[f32]>,
    cout: usize,
    order_defined: bool,
) -> (Vec<String>, f64, Option<f64>) {
    let mut errs = Vec::new();
    if ours_coords.len() != ref_coords.len() {
        errs.push(format!("{case}: {} output sites, spconv {}", ours_coords.len(), ref_coords.len()));
    }
    if order_defined && ours_coords != ref_coords {
        errs.push(format!("{case}: output coordinates not in spconv's order"));
    }
    let mut a = ours_coords.to_vec();
    let mut b = ref_coords.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    if a != b {
        let only_ours = a.iter().filter(|c| b.binary_search(c).is_err()).count();
        let only_ref = b.iter().filter(|c| a.binary_search(c).is_err()).count();
        errs.push(format!("{case}: output coordinate sets differ ({only_ours} only ours, {only_ref} only spconv's)"));
    }
    if ours.iter().any(|v| !v.is_finite()) {
        errs.push(format!("{case}: NaN/Inf in our output"));
    }
    // Our rows in spconv's order (rows spconv has and we lack stay zero and count as error).
    let row: HashMap<[i32; 4], usize> = ours_coords.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let mut got = vec![0f32; ref_coords.len() * cout];
    for (j, c) in ref_coords.iter().enumerate() {
        if let Some(&i) = row.get(c) {
            got[j * cout..(j + 1) * cout].copy_from_slice(&ours[i * cout..(i + 1) * cout]);
        }
    }
    // The feature tolerance is decided by the caller, with the f64 arbiter (see `exact_rows`).
    let e = rel_err(&got, reference);
    let e_def = default.map(|d| rel_err(&got, d));
    (errs, e, e_def)
}

/// Rows sampled for the f64 arbiter (≈1024, evenly spaced in spconv's output order).
const ARBITER_ROWS: usize = 1024;

/// The exact (f64) conv on sampled output rows, from the same FP16 inputs (`x`, our input row
/// order), our neighbour table and spconv's stored weights: returns (ours vs exact, spconv vs
/// exact) relative errors over those rows. It tells whose rounding a disagreement comes from.
#[allow(clippy::too_many_arguments)]
fn exact_rows(
    ours_coords: &[[i32; 4]],
    ours: &[f32],
    ref_coords: &[[i32; 4]],
    reference: &[f32],
    nbr: &[i32],
    kv: usize,
    x: &[f16],
    w: &[f32],
    layout: WeightLayout,
    cin: usize,
    cout: usize,
) -> (f64, f64) {
    use rayon::prelude::*;
    let row: HashMap<[i32; 4], usize> = ours_coords.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let step = (ref_coords.len() / ARBITER_ROWS).max(1);
    let picked: Vec<(usize, usize)> = (0..ref_coords.len()).step_by(step).filter_map(|j| row.get(&ref_coords[j]).map(|&i| (i, j))).collect();
    let widx = |k: usize, ci: usize, co: usize| match layout {
        WeightLayout::Krsc => (co * kv + k) * cin + ci,
        WeightLayout::Rskc => (k * cout + co) * cin + ci,
        WeightLayout::Rsck => (k * cin + ci) * cout + co,
    };
    let exact: Vec<Vec<f64>> = picked
        .par_iter()
        .map(|&(i, _)| {
            let mut acc = vec![0f64; cout];
            for k in 0..kv {
                let src = nbr[i * kv + k];
                if src < 0 {
                    continue;
                }
                let xr = &x[src as usize * cin..(src as usize + 1) * cin];
                for (ci, xv) in xr.iter().enumerate() {
                    let xv = xv.to_f64();
                    for (co, a) in acc.iter_mut().enumerate() {
                        *a += xv * w[widx(k, ci, co)] as f64;
                    }
                }
            }
            acc
        })
        .collect();
    let (mut d_ours, mut d_ref, mut norm) = (0f64, 0f64, 0f64);
    for ((i, j), ex) in picked.iter().zip(&exact) {
        for co in 0..cout {
            let e = ex[co];
            d_ours += (ours[i * cout + co] as f64 - e).powi(2);
            d_ref += (reference[j * cout + co] as f64 - e).powi(2);
            norm += e * e;
        }
    }
    let norm = norm.max(1e-300);
    ((d_ours / norm).sqrt(), (d_ref / norm).sqrt())
}

fn to_f32(v: &[f16]) -> Vec<f32> {
    v.iter().map(|h| h.to_f32()).collect()
}

fn json_line(case: &Case, mode: &str, spconv_key: &str, sptr_ms: f64, iters: usize, errs: (f64, f64, f64), e_def: Option<f64>) {
    let (e, e_ours_exact, e_spconv_exact) = errs;
    let spconv_ms = case.timings_ms.get(spconv_key).copied();
    let fp32 = case.timings_ms.get(&format!("{spconv_key}_fp32acc")).copied();
    let num = |v: Option<f64>| v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "null".into());
    let ratio = spconv_ms.map(|s| s / sptr_ms);
    println!(
        "{{\"case\":\"{}\",\"mode\":\"{mode}\",\"n\":{},\"n_out\":{},\"cin\":{},\"cout\":{},\"spconv_ms\":{},\"spconv_fp32acc_ms\":{},\"sptr_ms\":{sptr_ms:.4},\"ratio\":{},\"iters\":{iters},\"rel_err\":{e:.3e},\"ours_vs_exact\":{e_ours_exact:.3e},\"spconv_vs_exact\":{e_spconv_exact:.3e},\"rel_err_vs_spconv_default\":{}}}",
        case.name,
        case.n_in,
        case.n_out,
        case.cin,
        case.cout,
        num(spconv_ms),
        num(fp32),
        num(ratio),
        e_def.map(|x| format!("{x:.3e}")).unwrap_or_else(|| "null".into()),
    );
}

#[test]
fn spconv_parity() {
    let Some(dir) = std::env::var_os("SPTR_PARITY_DIR").map(PathBuf::from) else {
        eprintln!("SKIPPED spconv_parity: SPTR_PARITY_DIR is not set (see tests/parity/README.md)");
        return;
    };
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .unwrap_or_else(|e| panic!("reading {}/manifest.json: {e}", dir.display()));
    // JSON is YAML: serde_yaml reads the manifest (no JSON crate needed).
    let m: Manifest = serde_yaml::from_str(&text).expect("manifest.json parses");
    let mut clouds: HashMap<String, CloudData> = HashMap::new();
    for c in &m.clouds {
        let coords = read_i32x4(&dir, &c.coords);
        assert_eq!(coords.len(), c.n, "{}: coordinate count", c.name);
        let tensor = SparseTensor::new(coords.clone(), vec![0.0; coords.len()], 1, c.spatial_shape)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        clouds.insert(c.name.clone(), CloudData { tensor, coords });
    }
    for case in &m.cases {
        assert!(clouds.contains_key(&case.cloud), "{}: unknown cloud {}", case.name, case.cloud);
        let _ = layout_for(case);
    }
    eprintln!("spconv_parity: manifest read: {} clouds, {} cases from spconv {} on {}", m.clouds.len(), m.cases.len(), m.spconv_version, m.device);
    let dev = CudaDevice::new(0).unwrap_or_else(|e| panic!("spconv_parity: SPTR_PARITY_DIR is set but no usable GPU: {e}"));
    eprintln!("spconv_parity: running on {}", dev.name);
    let s = &dev.stream;
    let mut failures: Vec<String> = Vec::new();
    for case in &m.cases {
        let cloud = clouds.get(&case.cloud).unwrap_or_else(|| panic!("{}: unknown cloud {}", case.name, case.cloud));
        let t = &cloud.tensor;
        let g = geometry(case);
        let kv = g.kernel_volume();
        let layout = layout_for(case);
        if layout == WeightLayout::Krsc {
            let want = [case.cout, g.kernel[0] as usize, g.kernel[1] as usize, g.kernel[2] as usize, case.cin];
            assert_eq!(case.weight_shape, want, "{}: spconv weight shape is not [Cout, kx, ky, kz, Cin]", case.name);
        }
        let w = read_f32(&dir, &case.weight);
        let weights = CudaConvWeights::upload(&dev, &w, layout, kv, case.cin, case.cout, None).unwrap();
        let feats = read_f16(&dir, &case.feats);
        assert_eq!(feats.len(), case.n_in * case.cin, "{}: feature count", case.name);
        let reference = to_f32(&read_f16(&dir, &case.out));
        assert_eq!(reference.len(), case.n_out * case.cout, "{}: output size", case.name);
        let default = case.out_default.as_ref().map(|f| to_f32(&read_f16(&dir, f)));
        let ref_coords = read_i32x4(&dir, &case.out_coords);
        let coords_flat: Vec<i32> = cloud.coords.iter().flatten().copied().collect();
        let coords_dev = s.clone_htod(&coords_flat).unwrap();
        let n = cloud.coords.len();
        let build_sites = || CudaSites::build(&dev, s.clone_dtod(&coords_dev).unwrap(), n).unwrap();

        // Our map, the input in our row order, and spconv's row order of the input.
        let (map, x, x_host, ours_coords, order_defined): (CudaKernelMap, _, Vec<f16>, Vec<[i32; 4]>, bool) = match case.kind.as_str() {
            "subm" => {
                let map = submanifold_cuda(&dev, t, CudaSites::upload(&dev, t).unwrap(), g.kernel, g.dilation).unwrap();
                let x = s.clone_htod(&feats).unwrap();
                let oc = map.out.coords_to_host(&dev).unwrap();
                (map, x, feats.clone(), oc, true)
            }
            "strided" => {
                let sites = CudaSites::upload(&dev, t).unwrap();
                let (map, out_shape, out_origin) = strided_cuda(&dev, t, &sites, g).unwrap();
                if out_shape != case.out_spatial_shape || out_origin != [0; 3] {
                    failures.push(format!(
                        "{}: output spatial shape {out_shape:?} origin {out_origin:?}, spconv {:?}",
                        case.name, case.out_spatial_shape
                    ));
                }
                let oc = map.out.coords_to_host(&dev).unwrap();
                let x = s.clone_htod(&feats).unwrap();
                (map, x, feats.clone(), oc, false)
            }
            "inverse" => {
                let sites = CudaSites::upload(&dev, t).unwrap();
                let (down, _, _) = strided_cuda(&dev, t, &sites, g).unwrap();
                // spconv's inverse input rows are its strided outputs in its (hash) order: put
                // them in our strided output order.
                let theirs = read_i32x4(&dir, case.in_coords.as_deref().expect("inverse case has in_coords"));
                let ours_in = down.out.coords_to_host(&dev).unwrap();
                let pos: HashMap<[i32; 4], usize> = theirs.iter().enumerate().map(|(i, c)| (*c, i)).collect();
                let mut xin = vec![f16::ZERO; ours_in.len() * case.cin];
                let mut missing = 0usize;
                for (j, c) in ours_in.iter().enumerate() {
                    match pos.get(c) {
                        Some(&i) => xin[j * case.cin..(j + 1) * case.cin].copy_from_slice(&feats[i * case.cin..(i + 1) * case.cin]),
                        None => missing += 1,
                    }
                }
                if missing > 0 || ours_in.len() != theirs.len() {
                    failures.push(format!(
                        "{}: our strided map has {} outputs, spconv's {} ({missing} of ours not in spconv's)",
                        case.name,
                        ours_in.len(),
                        theirs.len()
                    ));
                }
                let inv = inverse_cuda(&dev, &down, sites).unwrap();
                let x = s.clone_htod(&xin).unwrap();
                let oc = inv.out.coords_to_host(&dev).unwrap();
                (inv, x, xin, oc, true)
            }
            k => panic!("{}: unknown kind {k}", case.name),
        };

        let out = conv_cuda(&dev, &x, &map, &weights, None, None).unwrap();
        dev.synchronize().unwrap();
        let ours = to_f32(&s.clone_dtoh(&out.slice(..map.out_count * case.cout)).unwrap());
        drop(out);
        let (errs, e, e_def) = compare(
            &case.name,
            &ours_coords,
            &ours,
            &ref_coords,
            &reference,
            default.as_deref(),
            case.cout,
            order_defined,
        );
        eprintln!(
            "{}: {} -> {} sites, Cin {} Cout {}, layout {layout:?}, rel err {e:.2e} (vs spconv default accumulation {})",
            case.name,
            case.n_in,
            map.out_count,
            case.cin,
            case.cout,
            e_def.map(|v| format!("{v:.2e}")).unwrap_or_else(|| "n/a".into())
        );
        failures.extend(errs);
        let nbr = map.nbr_to_host(&dev).unwrap();
        let (e_ours_exact, e_spconv_exact) =
            exact_rows(&ours_coords, &ours, &ref_coords, &reference, &nbr, map.kv, &x_host, &w, layout, case.cin, case.cout);
        eprintln!("{}: f64 arbiter on sampled rows: ours {e_ours_exact:.2e}, spconv {e_spconv_exact:.2e}", case.name);
        if !(e_ours_exact <= TOL) {
            failures.push(format!("{}: rel err {e_ours_exact:.3e} > {TOL:e} vs the exact f64 conv", case.name));
        }
        // Features must agree with spconv within FP16 tolerance, unless the difference is
        // spconv's own rounding: then we must be the closer of the two to the exact result.
        if !(e <= TOL || (e_ours_exact <= TOL && e_ours_exact < e_spconv_exact)) {
            failures.push(format!(
                "{}: rel err {e:.3e} > {TOL:e} vs spconv, and spconv is not further from the exact result (ours {e_ours_exact:.2e}, spconv {e_spconv_exact:.2e})",
                case.name
            ));
        }
        let e = (e, e_ours_exact, e_spconv_exact);

        // Timings.
        match case.kind.as_str() {
            "subm" => {
                let (ms, it) = median_ms(&dev, || drop(conv_cuda(&dev, &x, &map, &weights, None, None).unwrap()));
                json_line(case, "cached", "cached", ms, it, e, e_def);
                let (ms, it) = median_ms(&dev, || {
                    let m = submanifold_cuda(&dev, t, build_sites(), g.kernel, g.dilation).unwrap();
                    drop(conv_cuda(&dev, &x, &m, &weights, None, None).unwrap());
                });
                json_line(case, "built", "built", ms, it, e, e_def);
            }
            "strided" => {
                let (ms, it) = median_ms(&dev, || {
                    let sites = build_sites();
                    let (m, _, _) = strided_cuda(&dev, t, &sites, g).unwrap();
                    drop(conv_cuda(&dev, &x, &m, &weights, None, None).unwrap());
                });
                json_line(case, "built", "built", ms, it, e, e_def);
            }
            _ => {
                let (ms, it) = median_ms(&dev, || drop(conv_cuda(&dev, &x, &map, &weights, None, None).unwrap()));
                json_line(case, "cached", "cached", ms, it, e, e_def);
            }
        }
    }
    assert!(failures.is_empty(), "spconv parity failures:\n  {}", failures.join("\n  "));
}
