//! The seg model as the camera branch's `BevMapModel` (what the node and replay run) on CUDA
//! against the CPU, on frames made by the branch itself from the nuScenes sample (six JPEGs, the
//! calibration file, the sweep): all cameras; CAM_BACK masked (no image); no camera at all (the
//! fusion model LiDAR-only: every camera masked, nothing pooled — the CUDA path's empty mask).
//! The reduced fusion YAML with random weights: probabilities rel ≤ 2e-3, the 0.5 masks agreeing
//! on ≥ 99.9 % of the cells (gpu_bevseg's bars for the FP16 path), the same masked cameras and
//! LiDAR counts. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda")]

mod common;
#[path = "common/bevseg.rs"]
mod seg;

use common::{gpu, rel_err};
use sptr::bag::cdr::{CompressedImage, Header, Time};
use sptr::bev::branch::{BevFrameInputs, BevMapModel, CameraImage};
use sptr::bev::calib::NUSCENES_CAMERAS;
use sptr::model::bevfusion_seg_map_model::{SegMapModel, SegWeightsSource};

const MS: i64 = 1_000_000;

fn header(ns: i64, frame: &str) -> Header {
    Header { stamp: Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }, frame_id: frame.into() }
}

/// A frame of the branch at 1 s with the cameras `with` given an image 10 ms before the cloud.
fn frame(with: &[&str]) -> BevFrameInputs {
    frame_with(with, false, |_, _| {})
}

/// The same, the JPEGs left to the model when `defer`, each changed by `edit` first.
fn frame_with(with: &[&str], defer: bool, edit: impl Fn(usize, &mut Vec<u8>)) -> BevFrameInputs {
    let mut b = seg::nuscenes_branch(defer);
    for (i, cam) in NUSCENES_CAMERAS.iter().enumerate() {
        if with.contains(cam) {
            let mut data = std::fs::read(seg::camera_jpeg(cam)).unwrap();
            edit(i, &mut data);
            b.on_image(i, CameraImage::Compressed(CompressedImage { header: header(990 * MS, &cam.to_lowercase()), format: "jpeg".into(), data }));
        }
    }
    b.frame(1_000 * MS, "lidar_top", &common::nuscenes_sweep())
}

#[test]
fn cuda_map_model_agrees_with_the_cpu() {
    let Some(dev) = gpu("gpu_bev_map_model") else { return };
    drop(dev); // SegMapModel opens GPU 0 itself
    let yaml = common::data("bevseg/fusion_small.yaml");
    let mut cpu = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), false).unwrap();
    let mut cuda = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), true).unwrap();
    let all: Vec<&str> = NUSCENES_CAMERAS.to_vec();
    let no_back: Vec<&str> = NUSCENES_CAMERAS.iter().copied().filter(|c| *c != "CAM_BACK").collect();
    for (case, with) in [("six cameras", all), ("CAM_BACK masked", no_back), ("no camera", Vec::new())] {
        let inputs = frame(&with);
        let a = cpu.forward(&inputs).unwrap();
        let b = cuda.forward(&inputs).unwrap();
        let (p, q) = (&a.probabilities, &b.probabilities);
        assert!(q.iter().all(|v| v.is_finite()), "{case}: non-finite probabilities on CUDA");
        let rel = rel_err(q, p);
        let agree = p.iter().zip(q).filter(|(x, y)| (**x >= 0.5) == (**y >= 0.5)).count() as f64 / p.len() as f64;
        eprintln!("{case}: rel err {rel:.3e}, masks agree on {:.4} %; cuda stages {:?}", agree * 100.0, cuda.last_stages());
        assert!(rel <= 2e-3, "{case}: rel err {rel:.3e}");
        assert!(agree >= 0.999, "{case}: masks agree on {agree}");
        assert_eq!(a.masked_cameras, b.masked_cameras, "{case}");
        assert_eq!(a.masked_cameras.len(), 6 - with.len(), "{case}");
        let (la, lb) = (a.lidar.unwrap(), b.lidar.unwrap());
        assert_eq!((la.points_in, la.voxels), (lb.points_in, lb.voxels), "{case}");
        assert!(!cuda.last_stages().is_empty());
    }
}

/// The node's CUDA path: the branch leaves the JPEGs to the model (nvJPEG decodes them in its
/// first stage), against the CPU on the host-decoded frame, with gpu_bevseg's bars for the
/// FP16 path (nvJPEG's decode differs from zune-jpeg's by ~3e-5 at the output, well inside).
/// With CAM_BACK missing the batch still goes to nvJPEG (a stand-in in CAM_BACK's slot, masked).
/// Then CAM_BACK with data no decoder takes (its luma on a quantization table it lacks; its
/// components renamed R, G, B so that zune-jpeg, not nvJPEG, judges it): the model masks it and
/// reports it, and the map is the CPU's without CAM_BACK. The same damage on a YCbCr JPEG goes
/// to nvJPEG: what it answers is printed (an error sends the image to zune-jpeg, which refuses
/// it; a decode would be a silent wrong image).
#[test]
fn cuda_map_model_decodes_the_branchs_jpegs_and_masks_a_bad_one() {
    let Some(dev) = gpu("gpu_bev_map_model") else { return };
    drop(dev);
    let yaml = common::data("bevseg/fusion_small.yaml");
    let mut cpu = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), false).unwrap();
    let mut cuda = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), true).unwrap();
    let nvjpeg = cuda.decodes_jpeg();
    eprintln!("CUDA model decodes JPEGs itself: {nvjpeg}");
    if std::env::var("SPTR_REQUIRE_NVJPEG").is_ok() {
        assert!(nvjpeg, "SPTR_REQUIRE_NVJPEG set, but the CUDA map model does not use nvJPEG");
    }
    let all: Vec<&str> = NUSCENES_CAMERAS.to_vec();
    let bad_back = |i: usize, d: &mut Vec<u8>| {
        if i == 3 {
            seg::with_rgb_component_ids(d);
            seg::with_missing_quant_table(d);
        }
    };
    let no_back: Vec<&str> = NUSCENES_CAMERAS.iter().copied().filter(|c| *c != "CAM_BACK").collect();
    let cases: [(&str, BevFrameInputs, BevFrameInputs, usize); 3] = [
        ("deferred JPEGs", frame_with(&all, nvjpeg, |_, _| {}), frame(&all), 0),
        ("deferred JPEGs, CAM_BACK missing", frame_with(&no_back, nvjpeg, |_, _| {}), frame(&no_back), 0),
        ("CAM_BACK's data bad", frame_with(&all, nvjpeg, bad_back), frame(&no_back), 1),
    ];
    for (case, deferred, reference, bad) in cases {
        if nvjpeg {
            assert_eq!(deferred.used(), reference.used() + bad, "{case}: header checks pass");
        }
        let a = cpu.forward(&reference).unwrap();
        let b = cuda.forward(&deferred).unwrap();
        let failures = cuda.take_decode_failures();
        let stages: Vec<String> = cuda.last_stages().into_iter().map(|(n, _)| n).collect();
        let rel = rel_err(&b.probabilities, &a.probabilities);
        let agree = a.probabilities.iter().zip(&b.probabilities).filter(|(x, y)| (**x >= 0.5) == (**y >= 0.5)).count() as f64 / a.probabilities.len() as f64;
        eprintln!("{case}: rel err {rel:.3e}, masks agree on {:.4} %; failures {failures:?}; stages {stages:?}", agree * 100.0);
        assert!(rel <= 2e-3, "{case}: rel err {rel:.3e}");
        assert!(agree >= 0.999, "{case}: masks agree on {agree}");
        assert_eq!(a.masked_cameras, b.masked_cameras, "{case}");
        if nvjpeg {
            assert_eq!(failures.len(), bad, "{case}: {failures:?}");
            assert!(failures.iter().all(|(cam, why)| *cam == 3 && why.contains("quantization table")), "{case}: {failures:?}");
            if bad == 0 {
                assert!(stages.iter().any(|n| n.contains("nvJPEG")), "{case}: the nvJPEG path was not taken: {stages:?}");
            }
        }
    }
    // the same damage on the YCbCr JPEG, which nvJPEG is given (reported, not asserted)
    let damaged = frame_with(&all, nvjpeg, |i, d| {
        if i == 3 {
            seg::with_missing_quant_table(d);
        }
    });
    let b = cuda.forward(&damaged).unwrap();
    eprintln!(
        "missing quantization table on a YCbCr JPEG: masked {:?}, failures {:?}",
        b.masked_cameras,
        cuda.take_decode_failures()
    );
}
