//! A point whose x, y, z are finite but whose intensity (a voxel feature the network reads) is
//! NaN or infinite never reaches the network: decoding drops it (counted in
//! `dropped_non_finite`), the voxelizer gives it no voxel (counted in `non_finite`), and every
//! other point comes out exactly as if it were not in the cloud. The nuScenes sweep, CPU.

mod common;

use sptr::msgs::cloud::{decode, encode_points, finite_mask, Layout};
use sptr::models::sphereformer::config::ModelConfig;
use sptr::models::sphereformer::random::random_weights;
use sptr::models::sphereformer::segmenter::{Segmenter, UNLABELED};
use sptr::ops::voxelize::cpu::voxelize_cpu;
use sptr::Points;

/// Points of the sweep given bad intensities (spread over the cloud) and the values.
const BAD: [(usize, f32); 3] = [(17, f32::NAN), (12_345, f32::INFINITY), (30_001, f32::NEG_INFINITY)];

/// The sweep (x, y, z, intensity; no ring), with BAD's intensities, and without those points.
fn sweeps() -> (Points, Points) {
    let mut sweep = common::nuscenes_sweep();
    sweep.ring = None;
    let mut bad = sweep.clone();
    for (i, v) in BAD {
        bad.intensity[i] = v;
    }
    let keep: Vec<usize> = (0..sweep.len()).filter(|i| !BAD.iter().any(|(b, _)| b == i)).collect();
    let pick = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
    let without = Points {
        x: pick(&sweep.x),
        y: pick(&sweep.y),
        z: pick(&sweep.z),
        intensity: pick(&sweep.intensity),
        has_intensity: true,
        ring: None,
        time: None,
    };
    (bad, without)
}

fn is_bad(i: usize) -> bool {
    BAD.iter().any(|(b, _)| *b == i)
}

/// The node's and replay's path: a PointCloud2 with bad intensities decodes to the cloud
/// without those points, and the report counts them; the ground-truth alignment mask agrees.
#[test]
fn decode_drops_and_counts_points_with_a_non_finite_intensity() {
    let (bad, without) = sweeps();
    for layout in [Layout::XyzI32, Layout::XyzIrt] {
        let msg = encode_points(&bad, layout).unwrap();
        let (pts, report) = decode(&msg.view()).unwrap();
        assert_eq!(report.total, bad.len(), "{layout:?}");
        assert_eq!(report.dropped_non_finite, BAD.len(), "{layout:?}");
        assert_eq!(report.kept, without.len(), "{layout:?}");
        assert_eq!((&pts.x, &pts.y, &pts.z, &pts.intensity), (&without.x, &without.y, &without.z, &without.intensity), "{layout:?}");
        let mask = finite_mask(&msg.view()).unwrap().unwrap();
        assert_eq!(mask.iter().filter(|k| !**k).count(), BAD.len());
        assert!(mask.iter().enumerate().all(|(i, &k)| k != is_bad(i)));
    }
}

/// The files' path (`sptr segment`, `prepare`, `bench model`): the voxelizer gives such points
/// no voxel, counts them, and the voxels are exactly those of the cloud without them.
#[test]
fn voxelize_gives_no_voxel_to_points_with_a_non_finite_intensity() {
    let (bad, without) = sweeps();
    for model in ["sphereformer_nuscenes.yaml", "sphereformer_semantickitti.yaml"] {
        let params = ModelConfig::load(&common::root().join("config/models").join(model)).unwrap().voxel_params();
        let a = voxelize_cpu(&[&bad], &params).unwrap();
        let b = voxelize_cpu(&[&without], &params).unwrap();
        assert_eq!(a.stats.non_finite, BAD.len(), "{model}");
        assert_eq!(a.stats.points_in, b.stats.points_in + BAD.len(), "{model}");
        assert_eq!((&a.coords, &a.counts, &a.xyz), (&b.coords, &b.counts, &b.xyz), "{model}");
        assert!(a.feats.iter().all(|v| v.is_finite()), "{model}: a non-finite voxel feature");
        assert_eq!(a.feats, b.feats, "{model}");
        let kept: Vec<i32> = a.point_to_voxel.iter().enumerate().filter(|(i, _)| !is_bad(*i)).map(|(_, &v)| v).collect();
        assert_eq!(kept, b.point_to_voxel, "{model}");
        assert!(BAD.iter().all(|&(i, _)| a.point_to_voxel[i] == -1), "{model}");
    }
}

/// The network's labels: every other point gets exactly the class and probability it gets
/// without the bad points; the bad points are unlabeled and counted. (Before the fix one NaN
/// intensity changed the class of hundreds of points.) A narrowed nuScenes model with random
/// weights and 0.2 m voxels keep it fast in a debug build.
#[test]
fn segment_labels_every_other_point_as_without_the_bad_points() {
    let (bad, without) = sweeps();
    let dir = std::env::temp_dir().join(format!("sptr-non-finite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = ModelConfig::load(std::path::Path::new(&common::small_nuscenes_model(&dir))).unwrap().yaml;
    let seg = Segmenter::new(cfg.clone(), random_weights(&cfg, 7).unwrap()).unwrap();
    let a = seg.segment(&[&bad]).unwrap();
    let b = seg.segment(&[&without]).unwrap();
    assert_eq!(a.voxel_stats.non_finite, BAD.len());
    assert_eq!(a.voxels, b.voxels);
    for &(i, _) in &BAD {
        assert_eq!((a.labels[i], a.probs[i]), (UNLABELED, 0.0), "bad point {i}");
    }
    let kept = |v: &[u32]| v.iter().enumerate().filter(|(i, _)| !is_bad(*i)).map(|(_, &l)| l).collect::<Vec<u32>>();
    let kept_p = |v: &[f32]| v.iter().enumerate().filter(|(i, _)| !is_bad(*i)).map(|(_, &p)| p).collect::<Vec<f32>>();
    let (la, lb) = (kept(&a.labels), b.labels.clone());
    let differ = la.iter().zip(&lb).filter(|(x, y)| x != y).count();
    assert_eq!(differ, 0, "{differ} other points changed class");
    assert_eq!(kept_p(&a.probs), b.probs, "other points' probabilities changed");
    assert!(lb.iter().any(|&l| l != UNLABELED), "the network labeled nothing");
    let _ = std::fs::remove_dir_all(&dir);
}
