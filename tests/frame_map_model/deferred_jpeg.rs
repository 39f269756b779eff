//! JPEGs left undecoded by the camera branch for a model that decodes them itself (nvJPEG on
//! CUDA; `CameraBranch::set_defer_jpeg`): when the model cannot use them as a batch, it decodes
//! them on the host, and a JPEG whose markers are whole but whose data is bad is masked for that
//! frame and reported (`take_decode_failures`, through `CameraBranch::run_model`), never a failed frame or a silent hole. Here on
//! the CPU backend (reduced fusion model, random weights), which takes the host path always; the
//! GPU half is in `gpu` (tests/frame_map_model/gpu.rs).

use crate::common;
use crate::seg;
use sptr::msgs::cdr::{CompressedImage, Header, Time};
use sptr::frame::cameras::{BevFrameInputs, BevMapModel, CameraBranch, CameraImage, CameraStatus, FrameImage};
use sptr::sensors::calib::camera::NUSCENES_CAMERAS;
use sptr::frame::map_model::{SegMapModel, SegWeightsSource};

const MS: i64 = 1_000_000;

fn branch(defer: bool) -> CameraBranch {
    seg::nuscenes_branch(defer)
}

/// The frame at 1 s with each camera's JPEG (changed by `edit`) 10 ms before the cloud.
fn frame(b: &mut CameraBranch, edit: impl Fn(usize, &mut Vec<u8>)) -> BevFrameInputs {
    for (i, cam) in NUSCENES_CAMERAS.iter().enumerate() {
        let mut data = std::fs::read(seg::camera_jpeg(cam)).unwrap();
        edit(i, &mut data);
        let header = Header { stamp: Time { sec: 0, nanosec: 990_000_000 }, frame_id: cam.to_lowercase() };
        b.on_image(i, CameraImage::Compressed(CompressedImage { header, format: "jpeg".into(), data }));
    }
    b.frame(1_000 * MS, "lidar_top", &common::nuscenes_sweep())
}

/// CAM_BACK's luma pointing at a quantization table it does not have: the markers read, so
/// the branch hands it over; the decoder refuses the data.
fn corrupt_back(i: usize, data: &mut Vec<u8>) {
    if i == 3 {
        seg::with_missing_quant_table(data);
    }
}

#[test]
fn deferred_jpegs_give_the_decoded_frames_map_and_a_bad_one_is_masked_and_reported() {
    let yaml = common::data("bevseg/fusion_small.yaml");
    let mut model = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), sptr::device::Device::Cpu).unwrap();
    assert!(!model.decodes_jpeg(), "the CPU backend decodes on the host");

    // Deferred or decoded by the branch: the same map (the same host decoder either way).
    let decoded = model.forward(&frame(&mut branch(false), |_, _| {})).unwrap();
    let deferred_inputs = frame(&mut branch(true), |_, _| {});
    assert!(deferred_inputs.images.iter().all(|i| matches!(i, Some(FrameImage::Jpeg { .. }))));
    let deferred = model.forward(&deferred_inputs).unwrap();
    assert!(model.take_decode_failures().is_empty());
    assert_eq!(deferred.probabilities, decoded.probabilities);

    // CAM_BACK's data is bad: the branch cannot tell from the markers, the model can.
    let mut b = branch(true);
    let mut inputs = frame(&mut b, corrupt_back);
    assert_eq!(inputs.used(), 6, "the header checks pass: {:?}", inputs.cameras);
    // Through the branch, as the node, replay and the bench run the model.
    let (map, failures) = b.run_model(&mut model, &mut inputs);
    let map = map.unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, 3);
    assert!(failures[0].1.contains("quantization table"), "{}", failures[0].1);
    assert_eq!(map.masked_cameras, vec!["CAM_BACK".to_string()]);
    assert_eq!(inputs.cameras[3].status, CameraStatus::DecodeError);
    assert_eq!(b.stats()[3].count(CameraStatus::DecodeError), 1);
    assert_eq!(b.stats()[3].count(CameraStatus::Used), 0);
    assert!(model.take_decode_failures().is_empty(), "taken once");

    // ... which is the map of the frame without CAM_BACK's image.
    let mut b = branch(false);
    let without_back = frame(&mut b, |i, d| {
        if i == 3 {
            d.clear();
        }
    });
    assert_eq!(without_back.cameras[3].status, CameraStatus::DecodeError);
    let expect = model.forward(&without_back).unwrap();
    assert_eq!(map.probabilities, expect.probabilities);
}

/// A stray marker in the scan data (0xFF01, which nvJPEG decodes through) and a JPEG cut short
/// with its end-of-image marker appended pass the branch's screen (headers only) and are the
/// model's to catch: its scan checks (beside the GPU on CUDA) or its host decode refuse them,
/// and through `run_model` each camera is a decode error of the frame, with the fault named.
#[test]
fn scan_faults_pass_the_branchs_screen_and_are_reported_by_the_model() {
    let yaml = common::data("bevseg/fusion_small.yaml");
    let mut model = SegMapModel::open(&yaml, &SegWeightsSource::Random(5), sptr::device::Device::Cpu).unwrap();
    let mut b = branch(true);
    let mut inputs = frame(&mut b, |i, d| {
        let sos = d.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        if i == 2 {
            d[sos + 3000] = 0xFF;
            d[sos + 3001] = 0x01;
        }
        if i == 5 {
            d.truncate(d.len() * 6 / 10);
            d.extend_from_slice(&[0xFF, 0xD9]);
        }
    });
    assert_eq!(inputs.used(), 6, "the screen passes both: {:?}", inputs.cameras);
    let (map, failures) = b.run_model(&mut model, &mut inputs);
    let map = map.unwrap();
    assert_eq!(failures.iter().map(|f| f.0).collect::<Vec<_>>(), vec![2, 5], "{failures:?}");
    for (cam, fault) in [(2, "0xFF01"), (5, "the file was cut short")] {
        assert_eq!(inputs.cameras[cam].status, CameraStatus::DecodeError);
        let why = inputs.cameras[cam].detail.clone().unwrap_or_default();
        assert!(why.contains(fault), "camera {cam}: {why}");
        assert!(inputs.images[cam].is_none());
        assert_eq!(b.stats()[cam].count(CameraStatus::DecodeError), 1);
    }
    assert_eq!(map.masked_cameras.len(), 2, "{:?}", map.masked_cameras);
}

/// The damage tests/frame_map_model/gpu.rs gives CAM_BACK (components renamed R, G, B so that
/// nvJPEG is not given it, luma on a missing quantization table): the branch hands it over, the
/// host decoder refuses it, and the renaming alone still decodes.
#[test]
fn the_gpu_tests_damaged_jpeg_passes_the_branch_and_fails_the_decoder() {
    use sptr::sensors::image::encodings::DecodeLimits;
    use sptr::sensors::image::jpeg_markers::{read_layout, GpuEligibility};
    let mut b = branch(true);
    let inputs = frame(&mut b, |i, d| {
        if i == 3 {
            seg::with_rgb_component_ids(d);
        }
        if i == 4 {
            seg::with_rgb_component_ids(d);
            seg::with_missing_quant_table(d);
        }
    });
    assert_eq!(inputs.used(), 6, "{:?}", inputs.cameras);
    for i in [3, 4] {
        let jpeg = inputs.images[i].as_ref().and_then(FrameImage::jpeg).unwrap();
        assert_eq!(jpeg.gpu_eligibility(), GpuEligibility::NotYcbcr);
        assert_eq!(read_layout(jpeg.bytes()).unwrap().gpu_eligibility(), jpeg.gpu_eligibility(), "the branch's check read the headers the bytes hold");
    }
    let limits = DecodeLimits::default();
    assert!(inputs.images[3].as_ref().unwrap().to_rgb(&limits).is_ok());
    let e = inputs.images[4].as_ref().unwrap().to_rgb(&limits).unwrap_err();
    assert!(e.contains("quantization table"), "{e}");
}
