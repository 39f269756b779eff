//! The node's two models beside each other on one GPU: the SphereFormer LiDAR path on
//! this thread and the BEVFusion map model on another, each on its own device handle and stream,
//! as `perception_node` runs a frame. The outputs of frames run together must be those of frames
//! run one after the other: nothing the two share (the context, the memory pool, the kernel
//! cache) may leak between them. Full nuScenes models, random weights, the sample sweep and six
//! JPEGs (nvJPEG-decoded in the model, as in the node).
//!
//! Bar: when two serial runs give bit-identical outputs, every overlapped run must too. A kernel
//! that sums with atomics in a varying order would make the serial runs differ by a few FP16
//! roundings; then overlapped outputs may differ from the serial ones by as much (rel ≤ 1e-3,
//! a tenth of the FP16 bar against the CPU) and the masks and labels must agree on ≥ 99.99 %.
//! Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::seg;
use crate::common::{gpu, rel_err};
use sptr::msgs::cdr::{CompressedImage, Header, Time};
use sptr::frame::cameras::{BevFrameInputs, BevMapModel, CameraImage};
use sptr::sensors::calib::camera::NUSCENES_CAMERAS;
use sptr::device::Device;
use sptr::models::sphereformer::config::ModelConfig;
use sptr::frame::map_model::{SegMapModel, SegWeightsSource};
use sptr::models::sphereformer::preprocess::prepare_inputs;
use sptr::models::sphereformer::random::random_weights;
use sptr::models::sphereformer::network::StageTimes;
use sptr::models::sphereformer::segmenter::Segmenter;

const MS: i64 = 1_000_000;
const OVERLAPPED_FRAMES: usize = 12;

/// The branch's frame at 1 s, every camera's JPEG 10 ms older, left to the model (nvJPEG).
fn camera_frame() -> BevFrameInputs {
    let mut b = seg::nuscenes_branch(true);
    for (i, cam) in NUSCENES_CAMERAS.iter().enumerate() {
        let data = std::fs::read(seg::camera_jpeg(cam)).unwrap();
        let ns = 990 * MS;
        let header = Header { stamp: Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }, frame_id: cam.to_lowercase() };
        b.on_image(i, CameraImage::Compressed(CompressedImage { header, format: "jpeg".into(), data }));
    }
    b.frame(1_000 * MS, "lidar_top", &common::nuscenes_sweep())
}

/// Fraction of equal entries of two label (or mask) vectors.
fn agreement<T: PartialEq>(a: &[T], b: &[T]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len().max(1) as f64
}

fn argmax_rows(logits: &[f32], k: usize) -> Vec<usize> {
    logits
        .chunks(k)
        .map(|r| r.iter().enumerate().fold(0, |best, (i, &v)| if v > r[best] { i } else { best }))
        .collect()
}

fn masks(p: &[f32]) -> Vec<bool> {
    p.iter().map(|&v| v >= 0.5).collect()
}

#[test]
fn lidar_and_map_models_overlapped_give_the_serial_outputs() {
    let Some(dev) = gpu("lidar_and_map_models_overlapped_give_the_serial_outputs") else { return };
    drop(dev); // each model opens GPU 0 itself, as in the node
    let y = ModelConfig::load(&common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap().yaml;
    let lidar = Segmenter::on_device(y.clone(), random_weights(&y, 3).unwrap(), Device::Cuda).expect("CUDA SphereFormer");
    let mut map_model = SegMapModel::open(&seg::full("fusion"), &SegWeightsSource::Random(5), Device::Cuda).expect("CUDA map model");
    let sweep = common::nuscenes_sweep();
    let lidar_in = prepare_inputs(&[&sweep], &y).unwrap();
    let cam_in = camera_frame();
    let run_lidar = || lidar.run_network(&lidar_in, &mut StageTimes::default()).expect("LiDAR forward");

    // one after the other, twice: the reference, and whether the models are bit-deterministic
    let (l0, m0) = (run_lidar(), map_model.forward(&cam_in).expect("map forward").probabilities);
    let (l1, m1) = (run_lidar(), map_model.forward(&cam_in).expect("map forward").probabilities);
    let deterministic = l0 == l1 && m0 == m1;
    eprintln!(
        "serial repeat: bit-identical {deterministic} (LiDAR rel {:.2e}, map rel {:.2e}); {} voxels, {} map cells x classes",
        rel_err(&l1, &l0),
        rel_err(&m1, &m0),
        lidar_in.len(),
        m0.len()
    );
    let k = y.classes;
    let (labels0, masks0) = (argmax_rows(&l0, k), masks(&m0));

    for f in 0..OVERLAPPED_FRAMES {
        let (l, m) = std::thread::scope(|s| {
            let map = s.spawn(|| map_model.forward(&cam_in).expect("overlapped map forward").probabilities);
            let l = run_lidar();
            (l, map.join().expect("the map thread"))
        });
        assert!(l.iter().chain(&m).all(|v| v.is_finite()), "frame {f}: non-finite output");
        let (lr, mr) = (rel_err(&l, &l0), rel_err(&m, &m0));
        let (la, ma) = (agreement(&argmax_rows(&l, k), &labels0), agreement(&masks(&m), &masks0));
        eprintln!("overlapped frame {f}: LiDAR rel {lr:.2e}, labels {:.4} %; map rel {mr:.2e}, masks {:.4} %", la * 100.0, ma * 100.0);
        if deterministic {
            assert!(l == l0 && m == m0, "frame {f}: overlapped outputs differ from the serial ones (LiDAR rel {lr:.2e}, map rel {mr:.2e})");
        } else {
            assert!(lr <= 1e-3 && mr <= 1e-3, "frame {f}: LiDAR rel {lr:.2e}, map rel {mr:.2e} (bar 1e-3)");
            assert!(la >= 0.9999 && ma >= 0.9999, "frame {f}: labels agree on {la}, masks on {ma} (bar 99.99 %)");
        }
    }
}
