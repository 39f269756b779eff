//! BEVFusion BEV map segmentation on CUDA against the CPU reference, on the full
//! configurations (config/models/bevfusion_seg_{camera,fusion}.yaml) with random weights and the
//! nuScenes frame of tests/data/nuscenes: probabilities rel ≤ 2e-3, the 0.5 masks agreeing on
//! ≥ 99.9 % of the cells, every stage printed; a repeated run and the JPEG path (the
//! bench's) equal to the decoded-image path (to 1e-6); a masked camera against the CPU's; the
//! network replayed as a CUDA graph against the eager path. Skips without a GPU unless
//! SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common::{gpu, rel_err};
use crate::seg::*;
use sptr::sensors::image::encodings::{DecodeLimits, RgbImage};
use sptr::ops::image_preprocess::cuda::screen_jpegs;
use sptr::models::bevfusion::seg::{random_tensors, BevSegModel, BevSegOutput};
use sptr::ops::dense::conv_engine::ConvBackend;
use sptr::models::bevfusion::seg_cuda::CudaBevSeg;
use sptr::nn::Weights;

fn agreement(a: &[f32], b: &[f32]) -> f64 {
    let same = a.iter().zip(b).filter(|(x, y)| (**x >= 0.5) == (**y >= 0.5)).count();
    same as f64 / a.len() as f64
}

fn compare(case: &str, cpu: &BevSegOutput, cuda: &BevSegOutput) {
    let (sc, sg) = (cpu.stages.as_ref().unwrap(), cuda.stages.as_ref().unwrap());
    for ((name, a), (_, b)) in sc.named().into_iter().zip(sg.named()) {
        assert_eq!((a.n, a.h, a.w, a.c), (b.n, b.h, b.w, b.c), "{case}: stage {name} shapes");
        assert!(b.data.iter().all(|v| v.is_finite()), "{case}: stage {name} has non-finite values on CUDA");
        eprintln!("{case}: stage {name} [{}, {}, {}, {}] rel err {:.3e}", a.n, a.h, a.w, a.c, rel_err(&b.data, &a.data));
    }
    let (p, q) = (&cpu.map.probabilities, &cuda.map.probabilities);
    let rel = rel_err(q, p);
    let agree = agreement(q, p);
    eprintln!("{case}: probabilities rel err {rel:.3e}, masks at 0.5 agree on {:.4} % of {} cells", agree * 100.0, p.len());
    eprintln!("{case}: cuda stages {:?}", cuda.times.0);
    assert!(rel <= 2e-3, "{case}: probabilities rel err {rel:.3e} > 2e-3");
    assert!(agree >= 0.999, "{case}: masks agree on {agree}");
    assert_eq!(cpu.map.masked_cameras, cuda.map.masked_cameras);
}

fn check(kind: &str, seed: u64) {
    let Some(dev) = gpu(&format!("{kind}_cuda_matches_cpu")) else { return };
    let cfg = config(&full(kind));
    let w = Weights::from_tensors("random", random_tensors(&cfg, seed).unwrap()).unwrap();
    let mut model = BevSegModel::from_weights(&cfg, w).unwrap();
    let mut g = CudaBevSeg::upload(&dev, &model, ConvBackend::Cudnn).unwrap();
    let imgs = images();
    let refs: Vec<Option<&RgbImage>> = imgs.iter().map(Some).collect();
    let pts = (kind == "fusion").then(sweep5);
    let calib = calib();
    let t = std::time::Instant::now();
    let cpu = model.forward(&calib, &refs, pts.as_deref(), true).unwrap();
    eprintln!("{kind}: cpu forward {:.1} s", t.elapsed().as_secs_f64());
    let cuda = g.forward_images(&dev, &calib, &refs, pts.as_deref(), true).unwrap();
    compare(kind, &cpu, &cuda);
    if let (Some(a), Some(b)) = (&cpu.map.lidar, &cuda.map.lidar) {
        assert_eq!((a.points_in, a.points_non_finite, a.voxels, a.voxels_dropped), (b.points_in, b.points_non_finite, b.voxels, b.voxels_dropped), "{kind}: LiDAR stats");
    }
    // again, and from the JPEG bytes (the bench's path, same decoder): the same result (bit
    // equality reported; asserted to 1e-6, since a sparse conv kernel may sum in varying order)
    let again = g.forward_images(&dev, &calib, &refs, pts.as_deref(), false).unwrap();
    let jpegs: Vec<Vec<u8>> = camera_jpegs().iter().map(|p| std::fs::read(p).unwrap()).collect();
    let jrefs: Vec<&[u8]> = jpegs.iter().map(Vec::as_slice).collect();
    let j = g.forward_jpeg(&dev, &calib, &jrefs, pts.as_deref()).unwrap();
    // With nvJPEG the JPEG path decodes differently from the host decoder that made `imgs`
    // (IDCT and chroma upsampling: ~1e-2 rel at the network input, bounded in
    // tests/ops_image_preprocess.rs); through the network that measured 3.4e-5 (camera) and
    // 1.7e-5 (fusion) on the H100. The bound leaves 30x room; the 0.5 masks must still agree.
    let decoder = g.jpeg_decoder();
    let jpeg_tol = if decoder.contains("nvJPEG") { 1e-3 } else { 1e-6 };
    eprintln!("{kind}: JPEG decoder {decoder}");
    for (what, o, tol) in [("repeated run", &again, 1e-6), ("JPEG path", &j, jpeg_tol)] {
        let r = rel_err(&o.map.probabilities, &cuda.map.probabilities);
        let agree = o.map.masks(0.5).iter().zip(cuda.map.masks(0.5)).filter(|(a, b)| **a == *b).count() as f64 / cuda.map.probabilities.len() as f64;
        eprintln!("{kind}: {what}: rel {r:.2e}, bit-identical {}, masks agree {:.4} %", o.map.probabilities == cuda.map.probabilities, agree * 100.0);
        assert!(r <= tol, "{kind}: the {what} differs: rel {r:.3e} > {tol:e}");
        assert!(agree >= 0.999, "{kind}: the {what}'s masks agree on {:.4} % of cells", agree * 100.0);
    }
    eprintln!("{kind}: cuda stages (JPEG path) {:?}", j.times.0);
    // JPEGs screened by the caller (the camera branch's path): the same bits; with nvJPEG no
    // second header screen in the frame, and the scans checked beside the GPU on both paths
    let screened = screen_jpegs(&jrefs, &DecodeLimits::default()).unwrap();
    let c = g.forward_screened_jpeg_masked(&dev, &calib, &screened, &[], pts.as_deref()).unwrap();
    assert!(c.map.probabilities.iter().map(|v| v.to_bits()).eq(j.map.probabilities.iter().map(|v| v.to_bits())), "{kind}: screened JPEGs give other probabilities");
    let stage = |o: &BevSegOutput, name: &str| o.times.0.iter().filter(|(n, _)| n == name).count();
    let nv = usize::from(decoder.contains("nvJPEG"));
    for (name, with_j, with_c) in [("JPEG header checks (host)", nv, 0), ("JPEG scan checks (host, beside the GPU)", nv, nv)] {
        assert_eq!((stage(&j, name), stage(&c, name)), (with_j, with_c), "{kind}: {name}: stages {:?} / {:?}", j.times.0, c.times.0);
    }
    if nv == 1 {
        // a scan cut short (its end-of-image marker appended: the screen passes it) fails the
        // frame after the GPU work, naming the camera; the next frame is the first one's, bit for bit
        let mut cut = jpegs[4][..jpegs[4].len() * 6 / 10].to_vec();
        cut.extend_from_slice(&[0xFF, 0xD9]);
        let mut bad = jrefs.clone();
        bad[4] = &cut;
        let e = g.forward_jpeg(&dev, &calib, &bad, pts.as_deref()).unwrap_err().to_string();
        assert!(e.contains("camera 4") && e.contains("the file was cut short"), "{kind}: {e}");
        let after = g.forward_jpeg(&dev, &calib, &jrefs, pts.as_deref()).unwrap();
        assert!(after.map.probabilities.iter().map(|v| v.to_bits()).eq(j.map.probabilities.iter().map(|v| v.to_bits())), "{kind}: the frame after a refused one differs");
    }
    // the fusion model's LiDAR branch is timed on its own stream, beside the camera stages
    let lidar_stages = j.times.0.iter().filter(|(n, _)| n == "lidar (beside the camera branch)").count();
    assert_eq!(lidar_stages, usize::from(kind == "fusion"), "{kind}: stages {:?}", j.times.0);
    assert_eq!(g.geometry_builds(), 1, "{kind}: the geometry is built once per calibration");
    if kind == "camera" {
        // CAM_BACK masked on both backends
        let mut masked = refs.clone();
        masked[3] = None;
        let cpu_m = model.forward(&calib, &masked, None, true).unwrap();
        let cuda_m = g.forward_images(&dev, &calib, &masked, None, true).unwrap();
        assert_eq!(cuda_m.map.masked_cameras, vec!["CAM_BACK".to_string()]);
        compare("camera, CAM_BACK masked", &cpu_m, &cuda_m);
    }
}

#[test]
fn camera_only_cuda_matches_cpu() {
    check("camera", 2026);
}

#[test]
fn fusion_cuda_matches_cpu() {
    check("fusion", 2027);
}

/// The network replayed as a CUDA graph gives the eager path's probabilities: bit for bit in the
/// camera-only model; in the fusion model to 1e-6 (its LiDAR branch runs eagerly on its own
/// stream before the graph, and a sparse conv kernel may sum in varying order). One capture per calibration and
/// camera mask, one replay per frame; a frame asking for its stages runs eagerly.
fn check_graph(kind: &str, seed: u64) {
    let Some(dev) = gpu(&format!("{kind}_cuda_graph_replays_the_eager_result")) else { return };
    let cfg = config(&full(kind));
    let w = Weights::from_tensors("random", random_tensors(&cfg, seed).unwrap()).unwrap();
    let model = BevSegModel::from_weights(&cfg, w).unwrap();
    let mut g = CudaBevSeg::upload(&dev, &model, ConvBackend::Cudnn).unwrap();
    let imgs = images();
    let refs: Vec<Option<&RgbImage>> = imgs.iter().map(Some).collect();
    let mut masked = refs.clone();
    masked[3] = None;
    let pts = (kind == "fusion").then(sweep5);
    let calib = calib();
    let fwd = |g: &mut CudaBevSeg, r: &[Option<&RgbImage>], keep: bool| g.forward_images(&dev, &calib, r, pts.as_deref(), keep).unwrap();
    let eager = fwd(&mut g, &refs, false);
    let eager_masked = fwd(&mut g, &masked, false);
    let same = |case: &str, a: &BevSegOutput, b: &BevSegOutput| {
        let bits = a.map.probabilities.iter().map(|v| v.to_bits()).eq(b.map.probabilities.iter().map(|v| v.to_bits()));
        let r = rel_err(&a.map.probabilities, &b.map.probabilities);
        eprintln!("{kind}, {case}: graph vs eager rel {r:.2e}, bit-identical {bits}");
        if kind == "camera" {
            assert!(bits, "{kind}, {case}: the graph's probabilities differ from the eager ones (rel {r:.3e})");
        } else {
            assert!(r <= 1e-6, "{kind}, {case}: graph vs eager rel {r:.3e}");
        }
        assert_eq!(a.map.masked_cameras, b.map.masked_cameras, "{kind}, {case}");
    };
    g.set_graphs(true);
    for i in 0..3 {
        let out = fwd(&mut g, &refs, false);
        let st = g.graph_status();
        assert_eq!(st.refused, 0, "{kind}: the capture was refused: {:?}", st.last_refusal);
        assert!(out.times.0.iter().any(|(n, _)| n == "network (CUDA graph)"), "{kind}: stages {:?}", out.times.0);
        same(&format!("frame {i}"), &out, &eager);
    }
    assert_eq!((g.graph_status().captures, g.graph_status().replays), (1, 3), "{kind}");
    if kind == "camera" {
        // another camera mask is another graph (the mask is a kernel argument)
        let out = fwd(&mut g, &masked, false);
        assert_eq!(out.map.masked_cameras, vec!["CAM_BACK".to_string()]);
        same("CAM_BACK masked", &out, &eager_masked);
        assert_eq!((g.graph_status().captures, g.graph_status().replays), (2, 4));
    }
    let staged = fwd(&mut g, &refs, true);
    assert!(staged.stages.is_some(), "{kind}: a frame asking for its stages runs eagerly");
    assert!(!staged.times.0.iter().any(|(n, _)| n == "network (CUDA graph)"));
    same("stages asked for (eager)", &staged, &eager);
    eprintln!("{kind}: graph stages {:?}", fwd(&mut g, &refs, false).times.0);
}

#[test]
fn camera_only_cuda_graph_replays_the_eager_result() {
    check_graph("camera", 2026);
}

#[test]
fn fusion_cuda_graph_replays_the_eager_result() {
    check_graph("fusion", 2027);
}
