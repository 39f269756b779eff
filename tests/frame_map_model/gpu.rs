//! The seg model as the camera branch's `BevMapModel` (what the node and replay run) on CUDA
//! against the CPU, on frames made by the branch itself from the nuScenes sample (six JPEGs, the
//! calibration file, the sweep): all cameras; CAM_BACK masked (no image); no camera at all (the
//! fusion model LiDAR-only: every camera masked, nothing pooled — the CUDA path's empty mask).
//! The reduced fusion YAML with random weights: probabilities rel ≤ 2e-3, the 0.5 masks agreeing
//! on ≥ 99.9 % of the cells (the bars of tests/bevfusion_seg/gpu.rs for the FP16 path), the same
//! masked cameras and LiDAR counts. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::seg;
use crate::common::{gpu, rel_err};
use sptr::msgs::cdr::{CompressedImage, Header, Time};
use sptr::frame::cameras::{BevFrameInputs, BevMapModel, CameraImage};
use sptr::sensors::calib::camera::NUSCENES_CAMERAS;
use sptr::device::Device;
use sptr::frame::map_model::{SegMapModel, SegWeightsSource};

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

/// The reduced fusion model with the same random weights on the CPU and on CUDA.
fn cpu_and_cuda_models() -> (SegMapModel, SegMapModel) {
    let yaml = common::data("bevseg/fusion_small.yaml");
    let open = |device: Device| SegMapModel::open(&yaml, &SegWeightsSource::Random(5), device).unwrap();
    (open(Device::Cpu), open(Device::Cuda))
}

#[test]
fn cuda_map_model_agrees_with_the_cpu() {
    let Some(dev) = gpu("cuda_map_model_agrees_with_the_cpu") else { return };
    drop(dev); // SegMapModel opens GPU 0 itself
    let (mut cpu, mut cuda) = cpu_and_cuda_models();
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
/// first stage), against the CPU on the host-decoded frame, with the bars of
/// tests/bevfusion_seg/gpu.rs for the FP16 path (nvJPEG's decode differs from zune-jpeg's by
/// ~3e-5 at the output, well inside).
/// With CAM_BACK missing the batch still goes to nvJPEG (a stand-in in CAM_BACK's slot, masked).
/// Then CAM_BACK with data no decoder takes (its luma on a quantization table it lacks; its
/// components renamed R, G, B so that zune-jpeg, not nvJPEG, judges it): the model masks it and
/// reports it, and the map is the CPU's without CAM_BACK. The same damage on a YCbCr JPEG goes
/// to nvJPEG: what it answers is printed (an error sends the image to zune-jpeg, which refuses
/// it; a decode would be a silent wrong image).
#[test]
fn cuda_map_model_decodes_the_branchs_jpegs_and_masks_a_bad_one() {
    let Some(dev) = gpu("cuda_map_model_decodes_the_branchs_jpegs_and_masks_a_bad_one") else { return };
    drop(dev);
    let (mut cpu, mut cuda) = cpu_and_cuda_models();
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

/// Hostile camera inputs through the branch and the CUDA map model, as the node and replay run
/// them (JPEGs left to nvJPEG when it is loaded): CAM_FRONT cut in half and stamped like its
/// previous good image, CAM_FRONT cut at 60 % with an end-of-image marker appended, CAM_FRONT
/// with a stray marker in its scan data (the last two pass the branch's screen and fail the
/// model's scan checks beside the GPU), and CAM_BACK
/// a 1280 x 720 camera the model's resize + crop cannot take. Each such camera is masked with its
/// reason and the map is the CPU's map of the same frame without that camera (rel ≤ 2e-3, masks
/// agreeing on ≥ 99.9 %); the good frame after each is the first good frame's map, bit for bit.
#[test]
fn cuda_map_model_masks_hostile_cameras_and_the_next_frame_is_unaffected() {
    use sptr::frame::cameras::{CameraBranch, CameraStatus};
    let Some(dev) = gpu("cuda_map_model_masks_hostile_cameras_and_the_next_frame_is_unaffected") else { return };
    drop(dev);
    let (mut cpu, mut cuda) = cpu_and_cuda_models();
    let nvjpeg = cuda.decodes_jpeg();
    let jpeg = |i: usize| std::fs::read(seg::camera_jpeg(NUSCENES_CAMERAS[i])).unwrap();
    let sweep = common::nuscenes_sweep();
    let put = |b: &mut CameraBranch, i: usize, stamp: i64, data: Vec<u8>| {
        let h = header(stamp, &NUSCENES_CAMERAS[i].to_lowercase());
        b.on_image(i, CameraImage::Compressed(CompressedImage { header: h, format: "jpeg".into(), data }));
    };
    // frame k at 1 s + 50 ms k; images 10 ms before; `edit` changes camera 0's message
    let run = |b: &mut CameraBranch, model: &mut SegMapModel, k: i64, front: Option<(Vec<u8>, i64)>| {
        let t = 1_000 * MS + 50 * MS * k;
        for i in 0..6 {
            match (&front, i) {
                (Some((data, stamp)), 0) => put(b, 0, *stamp, data.clone()),
                _ => put(b, i, t - 10 * MS, jpeg(i)),
            }
        }
        let mut inputs = b.frame(t, "lidar_top", &sweep);
        let (map, _) = b.run_model(model, &mut inputs);
        (inputs, map.unwrap())
    };
    let close = |case: &str, a: &sptr::models::bevfusion::map::BevMap, b: &sptr::models::bevfusion::map::BevMap| {
        let rel = rel_err(&b.probabilities, &a.probabilities);
        let agree = a.probabilities.iter().zip(&b.probabilities).filter(|(x, y)| (**x >= 0.5) == (**y >= 0.5)).count() as f64 / a.probabilities.len() as f64;
        eprintln!("hostile inputs, {case}: rel err {rel:.3e}, masks agree on {:.4} %", agree * 100.0);
        assert!(rel <= 2e-3 && agree >= 0.999, "{case}: rel err {rel:.3e}, agree {agree}");
        assert_eq!(a.masked_cameras, b.masked_cameras, "{case}");
    };
    let mut b = seg::nuscenes_branch(nvjpeg);
    let mut c = seg::nuscenes_branch(false);
    let (_, good) = run(&mut b, &mut cuda, 0, None);
    let first_front_stamp = 990 * MS;
    let mut half = jpeg(0);
    half.truncate(half.len() / 2);
    let mut patched = jpeg(0);
    patched.truncate(patched.len() * 6 / 10);
    patched.extend_from_slice(&[0xFF, 0xD9]);
    let mut stray = jpeg(0);
    let sos = stray.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    stray[sos + 3000..sos + 3002].copy_from_slice(&[0xFF, 0x01]);
    let cases = [
        ("stamp collision", half, first_front_stamp),
        ("patched JPEG", patched, 1_000 * MS + 50 * MS * 2 - 10 * MS),
        ("stray marker", stray, 1_000 * MS + 50 * MS * 4 - 10 * MS),
    ];
    for (k, (case, data, stamp)) in cases.into_iter().enumerate() {
        let k = 2 * k as i64 + 1;
        let (inputs, map) = run(&mut b, &mut cuda, k, Some((data.clone(), stamp)));
        assert_eq!(inputs.cameras[0].status, CameraStatus::DecodeError, "{case}: {:?}", inputs.cameras[0]);
        assert!(inputs.cameras[1..].iter().all(|r| r.status == CameraStatus::Used), "{case}");
        let (ref_inputs, reference) = run(&mut c, &mut cpu, k, Some((data, stamp)));
        assert_eq!(ref_inputs.cameras[0].status, CameraStatus::DecodeError, "{case} on the CPU path");
        close(case, &reference, &map);
        let (after, next) = run(&mut b, &mut cuda, k + 1, None);
        assert_eq!(after.used(), 6, "{case}: the next frame");
        assert_eq!(next.probabilities, good.probabilities, "{case}: the next good frame's map is the first good frame's");
        run(&mut c, &mut cpu, k + 1, None);
    }
    // CAM_BACK a 1280 x 720 camera: unsupported_size, the map made from the five others
    let mut info = sptr::msgs::cdr::CameraInfo { header: header(0, "cam_back"), width: 1280, height: 720, ..Default::default() };
    info.k = [1000.0, 0.0, 640.0, 0.0, 1000.0, 360.0, 0.0, 0.0, 1.0];
    let raw = |stamp: i64| CameraImage::Raw(sptr::msgs::cdr::Image { header: header(stamp, "cam_back"), height: 720, width: 1280, encoding: "rgb8".into(), is_bigendian: 0, step: 3840, data: vec![90; 1280 * 720 * 3] });
    let mut maps = Vec::new();
    for (branch, model) in [(&mut b, &mut cuda), (&mut c, &mut cpu)] {
        branch.on_camera_info(3, &info).unwrap();
        let t = 1_000 * MS + 50 * MS * 8;
        for i in [0, 1, 2, 4, 5] {
            put(branch, i, t - 10 * MS, jpeg(i));
        }
        branch.on_image(3, raw(t - 10 * MS));
        let mut inputs = branch.frame(t, "lidar_top", &sweep);
        let (map, _) = branch.run_model(model, &mut inputs);
        assert_eq!(inputs.cameras[3].status, CameraStatus::UnsupportedSize, "{:?}", inputs.cameras[3]);
        assert!(inputs.cameras[3].detail.as_deref().is_some_and(|d| d.contains("1280x720")), "{:?}", inputs.cameras[3]);
        maps.push(map.unwrap());
    }
    assert_eq!(maps[0].masked_cameras, ["CAM_BACK"]);
    close("CAM_BACK 1280 x 720", &maps[1], &maps[0]);
}
