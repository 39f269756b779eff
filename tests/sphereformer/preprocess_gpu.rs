//! SphereFormer's preprocessing and its way back on the GPU (`model::preprocess::cuda`) against
//! the CPU reference: the network inputs must be identical — coordinates, batch indices, spatial
//! shape, point map, statistics and duplicate fix-ups exactly; positions bit for bit (the same
//! float32 sums in the same order); features bit for bit after the FP16 rounding the network
//! applies on either path. Point labels from voxel logits: the same arg-max, probabilities within
//! 2 float32 ulps (the GPU's double `exp` may differ from the host's in the last bits of a double,
//! far below float32 resolution). Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{coordinate_collision_cloud, gpu, nuscenes_sweep, rotated_z, sphereformer_yaml, Rng};
use half::f16;
use sptr::models::sphereformer::config::ModelYaml;
use sptr::ops::voxelize::cpu::VoxelOrigin;
use sptr::device::cuda::CudaDevice;
use sptr::models::sphereformer::preprocess::cuda::{labels_to_points_cuda, prepare_inputs_cuda};
use sptr::models::sphereformer::preprocess::prepare_inputs;
use sptr::models::sphereformer::segmenter::{argmax_softmax, UNLABELED};
use sptr::Points;
use std::path::PathBuf;

/// The dense benchmark cloud (shipped in gpu-stage/, or beside the repository), xyz float32.
fn dense_cloud() -> Option<Points> {
    let root = common::root();
    let candidates: [PathBuf; 2] = [root.join("gpu-stage/benchmark-pc.bin"), root.join("../shared/data/dense-cloud/benchmark-pc.bin")];
    let path = candidates.iter().find(|p| p.is_file())?;
    Some(Points::read_bin(path, 3).expect("dense cloud reads"))
}

/// GPU inputs equal the CPU's; returns (voxels, fix-ups).
fn same_inputs(dev: &CudaDevice, case: &str, clouds: &[&Points], y: &ModelYaml) -> (usize, usize) {
    let want = prepare_inputs(clouds, y).expect("cpu inputs");
    let got = prepare_inputs_cuda(dev, clouds, y).expect("cuda inputs");
    assert_eq!(got.len, want.len(), "{case}: voxels");
    let got = got.to_host(dev).expect("to host");
    assert_eq!(got.stats, want.stats, "{case}: voxel statistics");
    assert_eq!(got.coord_fixups, want.coord_fixups, "{case}: duplicate fix-ups");
    assert_eq!(got.spatial_shape, want.spatial_shape, "{case}: spatial shape");
    assert_eq!(got.point_to_voxel, want.point_to_voxel, "{case}: point map");
    if let Some(i) = (0..want.len()).find(|&i| got.coords[i] != want.coords[i]) {
        panic!("{case}: voxel {i} coordinate {:?}, cpu {:?}", got.coords[i], want.coords[i]);
    }
    assert_eq!(got.batch, want.batch, "{case}: batch indices");
    let bits = |v: &[[f32; 3]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&got.xyz) == bits(&want.xyz), "{case}: voxel positions differ");
    let half: Vec<u16> = want.feats.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    let got_half: Vec<u16> = got.feats.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    assert!(half == got_half, "{case}: features differ after FP16 rounding");
    eprintln!("{case}: {} voxels, {} fix-ups, spatial shape {:?}: identical", want.len(), want.coord_fixups, want.spatial_shape);
    (want.len(), want.coord_fixups)
}

#[test]
fn gpu_network_inputs_equal_the_cpu_reference() {
    let Some(dev) = gpu("gpu_network_inputs_equal_the_cpu_reference") else { return };
    let nus = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let kitti = sphereformer_yaml("sphereformer_semantickitti.yaml");
    let sweep = nuscenes_sweep();
    same_inputs(&dev, "nuScenes sweep, nuScenes config (float32 keys, xyz_norm)", &[&sweep], &nus);
    same_inputs(&dev, "nuScenes sweep, SemanticKITTI config (float64 keys, clip)", &[&sweep], &kitti);
    let kitti_pts = Points::read_bin(&common::data("semantickitti/000000.bin"), 4).expect("kitti sample");
    same_inputs(&dev, "SemanticKITTI sample", &[&kitti_pts], &kitti);
    // the long replay bag's rotations (frame k turned by k * 1.8 degrees)
    for k in [1, 2, 3, 50, 104] {
        let r = rotated_z(&sweep, 1.8 * k as f32);
        same_inputs(&dev, &format!("sweep turned {:.1} degrees", 1.8 * k as f32), &[&r], &nus);
    }
    let turned = rotated_z(&sweep, 37.0);
    same_inputs(&dev, "batch of two sweeps", &[&sweep, &turned], &kitti);
    let (pts, _) = coordinate_collision_cloud();
    let (_, fixups) = same_inputs(&dev, "constructed coordinate collision", &[&pts], &kitti);
    assert_eq!(fixups, 1, "the constructed cloud has one collision");
    match dense_cloud() {
        Some(d) => {
            let (_, fixups) = same_inputs(&dev, "dense cloud", &[&d], &kitti);
            assert!(fixups > 0, "the dense cloud is the real case with collisions");
        }
        None if common::gpu_required() => panic!("the dense cloud (gpu-stage/benchmark-pc.bin) is missing"),
        None => eprintln!("dense cloud not found: that case skipped"),
    }
    // NaN points, a voxel cap (points past it have no voxel), an empty and an all-NaN cloud
    let mut holes = sweep.clone();
    for i in (0..holes.len()).step_by(97) {
        holes.y[i] = f32::NAN;
    }
    same_inputs(&dev, "sweep with NaN points", &[&holes], &nus);
    let mut capped = nus.clone();
    capped.voxelization.max_voxels = 1000;
    same_inputs(&dev, "voxel cap 1000", &[&sweep], &capped);
    same_inputs(&dev, "empty cloud", &[&Points::default()], &nus);
    let nan = Points::from_interleaved(&[f32::NAN, 0.0, 0.0, 1.0].repeat(5), 4).expect("points");
    same_inputs(&dev, "all-NaN cloud", &[&nan], &nus);
    // origin zero: negative coordinates are the same clear error on both paths
    let mut zero = nus.clone();
    zero.voxelization.origin = VoxelOrigin::Zero;
    let cpu = prepare_inputs(&[&sweep], &zero).expect_err("negative coordinates");
    let err = prepare_inputs_cuda(&dev, &[&sweep], &zero).err().expect("negative coordinates on the GPU");
    assert!(format!("{cpu}").contains("negative") && format!("{err}").contains("negative"), "{cpu} / {err}");
}

#[test]
fn gpu_point_labels_equal_the_cpu_arg_max() {
    let Some(dev) = gpu("gpu_point_labels_equal_the_cpu_arg_max") else { return };
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let mut sweep = nuscenes_sweep();
    sweep.x[5] = f32::NAN; // a point without a voxel
    let inputs = prepare_inputs_cuda(&dev, &[&sweep], &y).expect("inputs");
    let host = inputs.to_host(&dev).expect("to host");
    let k = y.classes;
    let mut rng = Rng(41);
    let mut logits: Vec<f32> = (0..inputs.len * k).map(|_| rng.uniform(-8.0, 8.0)).collect();
    // exact ties: the first class wins, as torch.max
    for v in 0..inputs.len.min(50) {
        logits[v * k + 3] = 9.0;
        logits[v * k + 7] = 9.0;
    }
    let d_logits = dev.stream.clone_htod(&logits).expect("upload logits");
    let (labels, probs) = labels_to_points_cuda(&dev, &d_logits, &inputs.point_map, k, UNLABELED).expect("labels");
    let per_voxel = argmax_softmax(&logits, k);
    assert_eq!(labels.len(), sweep.len());
    for (p, &v) in host.point_to_voxel.iter().enumerate() {
        let (want_l, want_p) = if v < 0 { (UNLABELED, 0.0) } else { per_voxel[v as usize] };
        assert_eq!(labels[p], want_l, "point {p} label");
        let ulps = (probs[p].to_bits() as i64 - want_p.to_bits() as i64).abs();
        assert!(ulps <= 2, "point {p}: probability {} vs {want_p}", probs[p]);
    }
    assert_eq!(labels[5], UNLABELED);
    let tied: Vec<u32> = host.point_to_voxel.iter().zip(&labels).filter(|(&v, _)| (0..50).contains(&v)).map(|(_, &l)| l).collect();
    assert!(!tied.is_empty() && tied.iter().all(|&l| l == 3), "ties go to the first class");
}
