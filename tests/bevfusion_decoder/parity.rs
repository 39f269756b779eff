//! Parity of the fuser, BEV decoders and map head against the PyTorch reference written by
//! `tests/parity/bev_decoder_ref.py` (the upstream modules transcribed; see its header): the same
//! random weights (loaded through the checked loader: the reference's `state_dict` names and
//! shapes must be exactly ours), the same FP16-exact BEV inputs.
//!
//! Set `SPTR_BEV_DECODER_PARITY_DIR` to the script's `--out` directory; unset, the test reports
//! SKIPPED and passes (also under SPTR_REQUIRE_GPU=1: the reference needs PyTorch on the GPU
//! host).
//!
//! Per case (`fusion`, `camera`): our CPU path (f32) against the float32 reference, per module
//! (each fed the reference's own input to it) and end to end: rel ≤ 1e-4 (summation order only).
//! Our CUDA path on both conv backends (cuDNN when it loads, im2col + cuBLAS): per module and end
//! to end rel ≤ 2e-3 (FP16 weights and activations against float32), thresholded masks (0.5)
//! agreeing on ≥ 99.9 % of cells. One JSON line per case and backend.
#![cfg(feature = "cuda-core")]

use crate::common::{gpu, rel_err, root};
use cudarc::cublas::CudaBlas;
use sptr::nn::npy::read_f32;
use sptr::ops::dense::conv_engine::ConvBackend;
use sptr::ops::dense::cuda::CudaFeatureMap;
use sptr::ops::dense::FeatureMap;
use sptr::models::bevfusion::config::BevConfig;
use sptr::models::bevfusion::bev_stack::BevStack;
use sptr::models::bevfusion::bev_stack_cuda::CudaBevStack;
use sptr::nn::Weights;
use std::path::{Path, PathBuf};

/// An NCHW float32 `.npy` as an NHWC map.
fn read_map(path: &Path) -> FeatureMap {
    let (shape, data) = read_f32(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(shape.len(), 4, "{}: shape {shape:?}", path.display());
    FeatureMap::from_nchw(shape[0], shape[1], shape[2], shape[3], &data).unwrap()
}

fn agree(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| (**x > 0.5) == (**y > 0.5)).count() as f64 / a.len() as f64
}

fn case(dir: &Path, name: &str) {
    let d = dir.join(name);
    let yaml = std::fs::read_to_string(d.join("model.txt")).unwrap();
    let cfg = BevConfig::load(&root().join(yaml.trim())).unwrap();
    let weights = Weights::from_file(&d.join("weights.safetensors")).unwrap();
    let stack = BevStack::from_weights(&cfg, weights).unwrap_or_else(|e| panic!("{name}: the reference's weights do not load: {e}"));
    let inputs: Vec<FeatureMap> = match &cfg.fuser {
        Some(_) => vec![read_map(&d.join("camera.npy")), read_map(&d.join("lidar.npy"))],
        None => vec![read_map(&d.join("camera.npy"))],
    };
    let refs: Vec<&FeatureMap> = inputs.iter().collect();
    let fused_ref = cfg.fuser.as_ref().map(|_| read_map(&d.join("fused.npy")));
    let decoded_ref = read_map(&d.join("decoded.npy"));
    let (mshape, maps_ref) = read_f32(&d.join("maps.npy")).unwrap();
    assert_eq!(mshape, vec![1, cfg.head.classes.len(), 200, 200], "{name}: maps shape");
    let bench = std::fs::read_to_string(d.join("bench.json")).ok();

    // CPU f32, each module on the reference's input to it, then end to end
    let dec_in = fused_ref.as_ref().unwrap_or(&inputs[0]);
    let mut cpu = serde_json::Map::new();
    if let (Some(f), Some(r)) = (&stack.fuser, &fused_ref) {
        let e = rel_err(&f.forward(&refs).unwrap().data, &r.data);
        cpu.insert("fuser".into(), e.into());
        assert!(e <= 1e-4, "{name} CPU fuser: rel err {e}");
    }
    let e = rel_err(&stack.decoder.forward(dec_in).unwrap().data, &decoded_ref.data);
    cpu.insert("decoder".into(), e.into());
    assert!(e <= 1e-4, "{name} CPU decoder: rel err {e}");
    let e = rel_err(&stack.head.forward(&decoded_ref).unwrap().data, &maps_ref);
    cpu.insert("head".into(), e.into());
    assert!(e <= 1e-4, "{name} CPU head: rel err {e}");
    let all = stack.forward(&refs).unwrap();
    let e = rel_err(&all.maps.data, &maps_ref);
    cpu.insert("end_to_end".into(), e.into());
    assert!(e <= 1e-4, "{name} CPU end to end: rel err {e}");

    let Some(dev) = gpu("bev_decoder_parity") else { return };
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let up = |m: &FeatureMap| CudaFeatureMap::upload(&dev, m).unwrap();
    let gin: Vec<CudaFeatureMap> = inputs.iter().map(up).collect();
    let grefs: Vec<&CudaFeatureMap> = gin.iter().collect();
    let gdec_in = up(dec_in);
    let gdecoded_ref = up(&decoded_ref);
    for backend in [ConvBackend::Cudnn, ConvBackend::Im2col] {
        let g = CudaBevStack::upload(&dev, &stack, backend).unwrap();
        if g.backend() != backend {
            println!("{{\"case\": \"{name}\", \"backend\": \"{}\", \"skipped\": \"cuDNN not available\"}}", backend.name());
            continue;
        }
        let mut row = serde_json::Map::new();
        row.insert("case".into(), name.into());
        row.insert("backend".into(), backend.name().into());
        if let (Some(f), Some(r)) = (&g.fuser, &fused_ref) {
            let e = rel_err(&f.forward(&dev, &blas, &grefs).unwrap().download(&dev).unwrap().data, &r.data);
            row.insert("fuser_rel".into(), e.into());
        }
        let e = rel_err(&g.decoder.forward(&dev, &blas, &gdec_in).unwrap().download(&dev).unwrap().data, &decoded_ref.data);
        row.insert("decoder_rel".into(), e.into());
        let m = g.head.forward(&dev, &blas, &gdecoded_ref).unwrap().download(&dev).unwrap();
        row.insert("head_rel".into(), rel_err(&m.data, &maps_ref).into());
        row.insert("head_mask_agree".into(), agree(&m.data, &maps_ref).into());
        let s = g.forward(&dev, &blas, &grefs).unwrap();
        if let (Some(f), Some(r)) = (&s.fused, &fused_ref) {
            row.insert("chain_fused_rel".into(), rel_err(&f.download(&dev).unwrap().data, &r.data).into());
        }
        row.insert("chain_decoded_rel".into(), rel_err(&s.decoded.download(&dev).unwrap().data, &decoded_ref.data).into());
        let m = s.maps.download(&dev).unwrap();
        assert!(m.data.iter().all(|v| v.is_finite()), "{name} {backend:?}: non-finite probabilities");
        row.insert("chain_maps_rel".into(), rel_err(&m.data, &maps_ref).into());
        row.insert("chain_mask_agree".into(), agree(&m.data, &maps_ref).into());
        row.insert("cpu_rel".into(), serde_json::Value::Object(cpu.clone()));
        if let Some(b) = &bench {
            row.insert("torch".into(), serde_json::from_str(b).unwrap_or(serde_json::Value::Null));
        }
        let line = serde_json::Value::Object(row.clone()).to_string();
        println!("{line}");
        for (k, v) in &row {
            let Some(v) = v.as_f64() else { continue };
            if k.ends_with("_rel") {
                assert!(v <= 2e-3, "{name} {backend:?} {k}: rel err {v}");
            } else if k.ends_with("_agree") {
                assert!(v >= 0.999, "{name} {backend:?} {k}: masks agree on {v}");
            }
        }
    }
}

#[test]
fn bev_decoder_parity() {
    let Some(dir) = std::env::var_os("SPTR_BEV_DECODER_PARITY_DIR").map(PathBuf::from) else {
        eprintln!("SKIPPED bev_decoder_parity: SPTR_BEV_DECODER_PARITY_DIR is not set (see tests/parity/bev_decoder_ref.py)");
        return;
    };
    for name in ["fusion", "camera"] {
        case(&dir, name);
    }
}
