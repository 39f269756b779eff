//! SphereFormer on the CPU: weight names and shapes, safetensors reading/writing, the upstream
//! preprocessing, and the network end to end on the committed samples with a small config.

use crate::common;
use crate::common::{rel_err, semantickitti_sample, sphereformer_yaml, Rng};
use sptr::models::sphereformer::config::ModelYaml;
use sptr::models::sphereformer::preprocess::prepare_inputs;
use sptr::models::sphereformer::random::{random_tensors, random_weights};
use sptr::nn::random::{safetensors_bytes, save_tensors};
use sptr::models::sphereformer::network::{weight_specs, SphereFormer};
use sptr::nn::{ModelError, Weights};
use sptr::models::sphereformer::segmenter::{Segmenter, UNLABELED};
use sptr::Points;
use std::collections::HashMap;
use std::path::PathBuf;

/// A small configuration of the same architecture: 3 levels (16, 32, 48 channels), one block
/// per stage, attention on levels 1 and 2 (level 1: one spherical head; level 2: one cubic and
/// one spherical head), so both branches, the down/up path and the 2C→C tail all run.
fn small(base: &str) -> ModelYaml {
    let mut y = sphereformer_yaml(base);
    y.m = 16;
    y.layers = vec![16, 32, 48];
    y.block_reps = 1;
    y.sphere_layers = vec![1, 2];
    y
}

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sptr-model-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn spec_map(y: &ModelYaml) -> HashMap<String, Vec<usize>> {
    weight_specs(y).expect("specs").into_iter().map(|s| (s.name, s.shape)).collect()
}

/// Every 4th point of the nuScenes sweep: the same scene at a quarter of the cost (debug CI).
fn nuscenes_quarter() -> Points {
    let p = common::nuscenes_sweep();
    let keep: Vec<usize> = (0..p.len()).step_by(4).collect();
    let pick = |v: &Vec<f32>| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
    Points { x: pick(&p.x), y: pick(&p.y), z: pick(&p.z), intensity: pick(&p.intensity), has_intensity: true, ring: None, time: None }
}

// ------------------------------------------------------------------------------------------------
// Names and shapes

#[test]
fn weight_specs_semantickitti_match_upstream_names() {
    let y = sphereformer_yaml("sphereformer_semantickitti.yaml");
    let specs = weight_specs(&y).expect("specs");
    let map: HashMap<String, Vec<usize>> = specs.iter().map(|s| (s.name.clone(), s.shape.clone())).collect();
    assert_eq!(map.len(), specs.len(), "names are unique");
    // Hand count from the module tree: per non-last level 20 (2 blocks) + 18 (transformer) + 5
    // (conv) + 5 (deconv) + 21 (tail: 11 with the 1x1 i_branch + 10) = 69, the last level 38;
    // 4 x 69 + 38 + input_conv 1 + output_layer 4 + linear 2 = 321.
    assert_eq!(specs.len(), 321);
    // Level 1: window 0.05 x 6 = 0.3 m, quant 0.3 / 24 -> L = 24: cubic 2L-1 = 47 rows, spherical
    // 2 deg / (2/24) -> L = 24: 2L = 48 rows; heads 32 / 16 = 2, one per branch.
    let expect: &[(&str, &[usize])] = &[
        ("input_conv.0.weight", &[32, 3, 3, 3, 4]),
        ("unet.blocks.block0.conv_branch.0.weight", &[32]),
        ("unet.blocks.block0.conv_branch.0.running_var", &[32]),
        ("unet.blocks.block0.conv_branch.2.weight", &[32, 3, 3, 3, 32]),
        ("unet.blocks.block0.conv_branch.3.bias", &[32]),
        ("unet.blocks.block1.conv_branch.5.weight", &[32, 3, 3, 3, 32]),
        ("unet.transformer_block.norm1.weight", &[32]),
        ("unet.transformer_block.attn.relative_pos_query_table", &[47, 3, 1, 16]),
        ("unet.transformer_block.attn.relative_pos_value_table", &[47, 3, 1, 16]),
        ("unet.transformer_block.attn.relative_pos_key_table_sphere", &[48, 3, 1, 16]),
        ("unet.transformer_block.attn.qkv.weight", &[96, 32]),
        ("unet.transformer_block.attn.qkv.bias", &[96]),
        ("unet.transformer_block.attn.proj.weight", &[32, 32]),
        ("unet.transformer_block.norm2.bias", &[32]),
        ("unet.transformer_block.mlp.fc1.weight", &[128, 32]),
        ("unet.transformer_block.mlp.fc2.weight", &[32, 128]),
        ("unet.conv.0.running_mean", &[32]),
        ("unet.conv.2.weight", &[64, 2, 2, 2, 32]),
        ("unet.deconv.0.weight", &[64]),
        ("unet.deconv.2.weight", &[32, 2, 2, 2, 64]),
        ("unet.blocks_tail.block0.i_branch.0.weight", &[32, 1, 1, 1, 64]),
        ("unet.blocks_tail.block0.conv_branch.0.weight", &[64]),
        ("unet.blocks_tail.block0.conv_branch.2.weight", &[32, 3, 3, 3, 64]),
        ("unet.blocks_tail.block1.conv_branch.2.weight", &[32, 3, 3, 3, 32]),
        ("unet.u.blocks.block0.conv_branch.2.weight", &[64, 3, 3, 3, 64]),
        ("unet.u.transformer_block.attn.relative_pos_query_table", &[47, 3, 2, 16]),
        ("unet.u.u.u.conv.2.weight", &[256, 2, 2, 2, 256]),
        ("unet.u.u.u.u.blocks.block1.conv_branch.5.weight", &[256, 3, 3, 3, 256]),
        ("unet.u.u.u.u.transformer_block.attn.relative_pos_value_table_sphere", &[48, 3, 8, 16]),
        ("unet.u.u.u.u.transformer_block.mlp.fc1.bias", &[1024]),
        ("output_layer.0.weight", &[32]),
        ("output_layer.0.running_mean", &[32]),
        ("linear.weight", &[19, 32]),
        ("linear.bias", &[19]),
    ];
    for (name, shape) in expect {
        assert_eq!(map.get(*name).map(Vec::as_slice), Some(*shape), "{name}");
    }
    for absent in [
        "unet.blocks.block0.i_branch.0.weight", // C -> C: identity i_branch has no weight
        "unet.blocks_tail.block1.i_branch.0.weight",
        "unet.u.u.u.u.conv.0.weight", // the last level has no down path
        "unet.u.u.u.u.u.blocks.block0.conv_branch.0.weight",
        "unet.blocks.block0.conv_branch.0.num_batches_tracked", // a counter, not a weight
    ] {
        assert!(!map.contains_key(absent), "{absent} should not be a weight");
    }
    assert_eq!(specs[0].name, "input_conv.0.weight", "state_dict order starts with input_conv");
    assert_eq!(specs.last().map(|s| s.name.as_str()), Some("linear.bias"));
}

#[test]
fn nuscenes_sphere_tables_follow_its_window() {
    // nuScenes: voxel 0.1 -> cubic window 0.6, quant 0.025, L = 24; sphere [2, 2, 120], L = 24.
    let map = spec_map(&sphereformer_yaml("sphereformer_nuscenes.yaml"));
    assert_eq!(map["unet.transformer_block.attn.relative_pos_query_table"], vec![47, 3, 1, 16]);
    assert_eq!(map["unet.transformer_block.attn.relative_pos_query_table_sphere"], vec![48, 3, 1, 16]);
    assert_eq!(map["linear.weight"], vec![16, 32]);
}

#[test]
fn vgg_blocks_have_conv_layers() {
    let mut y = small("sphereformer_nuscenes.yaml");
    y.block_residual = false;
    let map = spec_map(&y);
    assert_eq!(map["unet.blocks.block0.conv_layers.0.weight"], vec![16]);
    assert_eq!(map["unet.blocks.block0.conv_layers.2.weight"], vec![16, 3, 3, 3, 16]);
    assert_eq!(map["unet.blocks_tail.block0.conv_layers.2.weight"], vec![16, 3, 3, 3, 32]);
    assert!(!map.keys().any(|k| k.contains("conv_branch") || k.contains("i_branch")));
}

#[test]
fn unbuildable_configs_are_errors() {
    let mut y = small("sphereformer_nuscenes.yaml");
    y.block_reps = 3;
    assert!(matches!(weight_specs(&y), Err(ModelError::Config(_))));
    let mut y = small("sphereformer_nuscenes.yaml");
    y.m = 32;
    assert!(matches!(weight_specs(&y), Err(ModelError::Config(_))));
    let mut y = small("sphereformer_nuscenes.yaml");
    y.layers = vec![8, 32, 48]; // 8 channels: no 16-wide head at an attention level
    y.m = 8;
    assert!(matches!(weight_specs(&y), Err(ModelError::Config(_))));
}

// ------------------------------------------------------------------------------------------------
// Weights files

#[test]
fn mismatch_lists_missing_unexpected_and_misshaped_at_once() {
    let y = small("sphereformer_nuscenes.yaml");
    let mut t = random_tensors(&y, 7).expect("random");
    t.retain(|(n, _, _)| n != "unet.u.conv.2.weight" && n != "linear.bias");
    t.push(("unet.extra.weight".into(), vec![2], vec![0.0, 1.0]));
    for (n, s, v) in t.iter_mut() {
        if n == "unet.transformer_block.attn.qkv.weight" {
            *s = vec![16, 48];
        }
        if n == "output_layer.0.weight" {
            *s = vec![1, 16];
            let _ = v;
        }
    }
    let w = Weights::from_tensors("test.safetensors", t).expect("weights");
    match SphereFormer::from_weights(&y, w) {
        Err(ModelError::Mismatch { file, missing, unexpected, misshaped }) => {
            assert_eq!(file, "test.safetensors");
            assert_eq!(missing, vec!["unet.u.conv.2.weight".to_string(), "linear.bias".to_string()]);
            assert_eq!(unexpected, vec!["unet.extra.weight".to_string()]);
            let names: Vec<&str> = misshaped.iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, vec!["unet.transformer_block.attn.qkv.weight", "output_layer.0.weight"]);
            assert_eq!(misshaped[0].expected, vec![48, 16]);
            assert_eq!(misshaped[0].found, vec![16, 48]);
        }
        other => panic!("expected a mismatch error, got {other:?}"),
    }
    // The message names every problem too.
    let mut t = random_tensors(&y, 7).expect("random");
    t.retain(|(n, _, _)| n != "linear.bias");
    t.push(("bogus".into(), vec![1], vec![0.0]));
    let msg = SphereFormer::from_weights(&y, Weights::from_tensors("w.st", t).expect("w")).expect_err("mismatch").to_string();
    assert!(msg.contains("missing: linear.bias") && msg.contains("unexpected: bogus") && msg.contains("w.st"), "{msg}");
}

#[test]
fn safetensors_round_trip_and_module_prefix() {
    let y = small("sphereformer_nuscenes.yaml");
    let tensors = random_tensors(&y, 42).expect("random");
    let path = temp_path("round_trip.safetensors");
    save_tensors(&path, &tensors).expect("write");
    let w = Weights::from_file(&path).expect("read back");
    assert_eq!(w.len(), tensors.len());
    for (name, shape, data) in &tensors {
        let t = w.get(name).expect("present");
        assert_eq!(&t.shape, shape, "{name}");
        // Bit-exact: F32 written and read.
        assert!(t.data.iter().zip(data).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}");
    }
    assert!(w.check(&weight_specs(&y).expect("specs")).is_ok());
    // Deterministic: the same seed gives the same values, another seed others.
    assert_eq!(random_tensors(&y, 42).expect("again"), tensors);
    assert_ne!(random_tensors(&y, 43).expect("other")[0].2, tensors[0].2);

    // `module.` prefixes (DistributedDataParallel checkpoints) are stripped.
    let prefixed: Vec<(String, Vec<usize>, Vec<f32>)> =
        tensors.iter().map(|(n, s, v)| (format!("module.{n}"), s.clone(), v.clone())).collect();
    let p2 = temp_path("prefixed.safetensors");
    save_tensors(&p2, &prefixed).expect("write");
    assert!(SphereFormer::from_weights(&y, Weights::from_file(&p2).expect("read")).is_ok());
}

#[test]
fn random_bn_statistics_are_not_identity() {
    let y = small("sphereformer_nuscenes.yaml");
    let t = random_tensors(&y, 1).expect("random");
    let get = |n: &str| t.iter().find(|(name, _, _)| name == n).map(|(_, _, v)| v.clone()).expect(n);
    let var = get("unet.conv.0.running_var");
    assert!(var.iter().all(|&v| (0.5..1.5).contains(&v)) && var.iter().any(|&v| (v - 1.0).abs() > 0.05));
    let mean = get("unet.conv.0.running_mean");
    assert!(mean.iter().all(|&v| v.abs() <= 0.1) && mean.iter().any(|&v| v.abs() > 0.01));
    let gamma = get("output_layer.0.weight");
    assert!(gamma.iter().all(|&v| (0.9..=1.1).contains(&v)));
    let conv = get("input_conv.0.weight"); // fan-in 27 x 4: bound sqrt(3/108)
    let bound = (3.0f32 / 108.0).sqrt();
    assert!(conv.iter().all(|&v| v.abs() <= bound) && conv.iter().any(|&v| v.abs() > 0.5 * bound));
    let table = get("unet.u.transformer_block.attn.relative_pos_query_table");
    let std = (table.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / table.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.002, "table std {std}"); // 47*3*16 = 2256 draws: ±5 % of std
}

#[test]
fn half_precision_and_counters_are_read() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let h: Vec<u8> = [1.5f32, -2.0, 0.25].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    let b: Vec<u8> = [3.0f32, 0.5].iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    let c: Vec<u8> = 1234i64.to_le_bytes().to_vec();
    let views = vec![
        ("a".to_string(), TensorView::new(Dtype::F16, vec![3], &h).expect("view")),
        ("b".to_string(), TensorView::new(Dtype::BF16, vec![2, 1], &b).expect("view")),
        ("x.num_batches_tracked".to_string(), TensorView::new(Dtype::I64, vec![], &c).expect("view")),
    ];
    let bytes = safetensors::serialize(views, None).expect("serialize");
    let w = Weights::from_bytes(&bytes, "mixed.safetensors").expect("read");
    assert_eq!(w.get("a").map(|t| t.data.clone()), Some(vec![1.5, -2.0, 0.25]));
    assert_eq!(w.get("b").map(|t| (t.shape.clone(), t.data.clone())), Some((vec![2, 1], vec![3.0, 0.5])));
    assert!(w.get("x.num_batches_tracked").is_none(), "counters are dropped");

    // Integer tensors (BEVFusion's `nx`) are read when f32 holds them exactly ...
    let views = vec![("w".to_string(), TensorView::new(Dtype::I64, vec![1], &c).expect("view"))];
    let bytes = safetensors::serialize(views, None).expect("serialize");
    let w = Weights::from_bytes(&bytes, "ints.safetensors").expect("small I64 values");
    assert_eq!(w.get("w").map(|t| t.data.clone()), Some(vec![1234.0]));
    // ... and an error naming the file and the tensor when it cannot.
    let big: Vec<u8> = (1i64 << 40).to_le_bytes().to_vec();
    let views = vec![("w".to_string(), TensorView::new(Dtype::I64, vec![1], &big).expect("view"))];
    let bytes = safetensors::serialize(views, None).expect("serialize");
    let e = Weights::from_bytes(&bytes, "ints.safetensors").expect_err("I64 beyond 2^24").to_string();
    assert!(e.contains("ints.safetensors") && e.contains("`w`") && e.contains("I64"), "{e}");
    let u: Vec<u8> = vec![7u8];
    let views = vec![("w".to_string(), TensorView::new(Dtype::U8, vec![1], &u).expect("view"))];
    let bytes = safetensors::serialize(views, None).expect("serialize");
    assert!(Weights::from_bytes(&bytes, "u8.safetensors").is_err());
}

#[test]
fn truncated_or_corrupt_files_are_errors() {
    let bytes = safetensors_bytes(&[("t", &[4], &[1.0, 2.0, 3.0, 4.0])]).expect("bytes");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short_len", bytes[..5].to_vec()),
        ("truncated_header", bytes[..12].to_vec()),
        ("truncated_data", bytes[..bytes.len() - 3].to_vec()),
        ("bad_header", {
            let mut b = bytes.clone();
            b[8] = b'#'; // JSON header starts with '{'
            b
        }),
        ("huge_len", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
    ];
    for (name, data) in cases {
        let path = temp_path(&format!("{name}.safetensors"));
        std::fs::write(&path, &data).expect("write");
        match Weights::from_file(&path) {
            Err(e @ ModelError::File { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{name}: {e}")
            }
            other => panic!("{name}: expected a file error, got {other:?}"),
        }
    }
    let missing = temp_path("does_not_exist.safetensors");
    let e = Weights::from_file(&missing).expect_err("missing file");
    assert!(e.to_string().contains("does_not_exist"), "{e}");
    // Converted to the crate's error with the message kept.
    let e: sptr::Error = e.into();
    assert!(e.to_string().contains("does_not_exist"));
}

// ------------------------------------------------------------------------------------------------
// Preprocessing

/// An independent reading of upstream's val-mode preprocessing for one SemanticKITTI scan
/// (float64 clip and key with a float32 voxel size, float32 means), compared voxel by voxel.
#[test]
fn kitti_preprocessing_follows_upstream_arithmetic() {
    let y = sphereformer_yaml("sphereformer_semantickitti.yaml");
    let mut pts = semantickitti_sample();
    // Push a few points past the range so the clip matters (x = 60 m clips to 51.2).
    for i in 0..3 {
        pts.x[i] = 60.0 + i as f32;
    }
    let inp = prepare_inputs(&[&pts], &y).expect("prepare");
    let r = y.pc_range.expect("kitti has a range");
    let vs = y.voxel_size.map(|v| v as f32);
    let clip: Vec<[f64; 3]> = (0..pts.len())
        .map(|i| {
            let p = [pts.x[i], pts.y[i], pts.z[i]];
            [0, 1, 2].map(|a| (p[a] as f64).clamp(r[0][a], r[1][a]))
        })
        .collect();
    let min = [0, 1, 2].map(|a| clip.iter().map(|c| c[a]).fold(f64::INFINITY, f64::min));
    let mut groups: HashMap<[i64; 3], Vec<usize>> = HashMap::new();
    for (i, c) in clip.iter().enumerate() {
        let key = [0, 1, 2].map(|a| ((c[a] - min[a]) / vs[a] as f64).floor() as i64);
        groups.entry(key).or_default().push(i);
    }
    assert_eq!(inp.len(), groups.len(), "one voxel per upstream key");
    for members in groups.values() {
        let v = inp.point_to_voxel[members[0]];
        assert!(members.iter().all(|&i| inp.point_to_voxel[i] == v), "a key's points share a voxel");
        let v = v as usize;
        let n = members.len() as f32;
        let mean_norm = [0, 1, 2].map(|a| members.iter().map(|&i| (clip[i][a] - min[a]) as f32).sum::<f32>() / n);
        let want = [0, 1, 2].map(|a| (mean_norm[a] / vs[a]).floor() as i32);
        assert_eq!(inp.coords[v], [0, want[0], want[1], want[2]]);
        let xyz = [0, 1, 2].map(|a| members.iter().map(|&i| clip[i][a] as f32).sum::<f32>() / n);
        assert_eq!(inp.xyz[v], xyz);
        let raw = |i: usize| [pts.x[i], pts.y[i], pts.z[i], pts.intensity[i]];
        let feat = [0, 1, 2, 3].map(|c| members.iter().map(|&i| raw(i)[c]).sum::<f32>() / n);
        assert_eq!(&inp.feats[v * 4..v * 4 + 4], &feat);
    }
    assert_eq!(inp.coord_fixups, 0);
    let maxc = [1, 2, 3].map(|a| inp.coords.iter().map(|c| c[a]).max().unwrap_or(0) + 1);
    assert_eq!(inp.spatial_shape, maxc.map(|m| m.max(128)));
    assert_eq!(y.voxel_params().voxel_size[0], 0.05f32 as f64);
}

// ------------------------------------------------------------------------------------------------
// End to end

fn segmenter(y: &ModelYaml, seed: u64) -> Segmenter {
    Segmenter::new(y.clone(), random_weights(y, seed).expect("random weights")).expect("model builds")
}

#[test]
fn kitti_sample_end_to_end_residual_and_vgg() {
    let pts = semantickitti_sample();
    for residual in [true, false] {
        let mut y = small("sphereformer_semantickitti.yaml");
        y.block_residual = residual;
        let s = segmenter(&y, 11);
        let a = s.segment(&[&pts]).expect("segment");
        assert_eq!(a.labels.len(), pts.len());
        assert!(a.labels.iter().all(|&l| (l as usize) < y.classes), "every point labeled");
        let floor = 1.0 / y.classes as f32;
        assert!(a.probs.iter().all(|&p| p >= floor - 1e-6 && p <= 1.0), "arg-max softmax in [1/classes, 1]");
        let b = s.segment(&[&pts]).expect("segment again");
        assert_eq!(a.labels, b.labels);
        assert!(a.probs.iter().zip(&b.probs).all(|(x, y)| x.to_bits() == y.to_bits()), "bitwise deterministic");
    }
}

#[test]
fn nuscenes_sample_end_to_end() {
    let y = small("sphereformer_nuscenes.yaml");
    let s = segmenter(&y, 5);
    let mut pts = nuscenes_quarter();
    // Two points that cannot be voxelized.
    pts.x[0] = f32::NAN;
    pts.z[1] = f32::INFINITY;
    let a = s.segment(&[&pts]).expect("segment");
    assert_eq!(a.labels.len(), pts.len());
    assert_eq!(a.labels[0], UNLABELED);
    assert_eq!(a.labels[1], UNLABELED);
    assert_eq!(a.probs[0], 0.0);
    assert_eq!(a.voxel_stats.non_finite, 2);
    assert!(a.labels[2..].iter().all(|&l| (l as usize) < y.classes), "every finite point labeled");
    assert!(a.voxels > 1000, "{} voxels", a.voxels);
    // Random weights still spread over several classes (a dead network would give one).
    let mut hist = vec![0usize; y.classes];
    for &l in &a.labels[2..] {
        hist[l as usize] += 1;
    }
    assert!(hist.iter().filter(|&&c| c > 0).count() >= 2, "{hist:?}");
    for stage in ["voxelize", "input_conv", "l1.blocks", "l1.attention", "l2.attention", "l3.blocks", "l1.tail", "head", "devoxelize"] {
        assert!(a.times.get(stage).is_some(), "stage {stage} timed");
    }
    assert!(a.times.get("l3.attention").is_none(), "level 3 has no attention in this config");
    let b = s.segment(&[&pts]).expect("again");
    assert_eq!(a.labels, b.labels);
    assert!(a.probs.iter().zip(&b.probs).all(|(x, y)| x.to_bits() == y.to_bits()), "bitwise deterministic");
}

/// Voxel order does not change the function: permuting the voxels permutes the logits.
#[test]
fn forward_is_independent_of_voxel_order() {
    let y = small("sphereformer_nuscenes.yaml");
    let model = SphereFormer::from_weights(&y, random_weights(&y, 9).expect("w")).expect("model");
    let pts = nuscenes_quarter();
    let inp = prepare_inputs(&[&pts], &y).expect("prepare");
    // Half the voxels keep the run short; a contiguous half of the sorted order keeps the
    // neighbourhoods (and so the windows and convs) dense.
    let n = inp.len() / 2;
    let base = model.forward_cpu(&inp.coords[..n], &inp.feats[..n * 4], &inp.xyz[..n], &inp.batch[..n], inp.spatial_shape).expect("forward");
    let mut perm: Vec<usize> = (0..n).collect();
    Rng(2024).shuffle(&mut perm);
    let coords: Vec<[i32; 4]> = perm.iter().map(|&i| inp.coords[i]).collect();
    let feats: Vec<f32> = perm.iter().flat_map(|&i| inp.feats[i * 4..i * 4 + 4].to_vec()).collect();
    let xyz: Vec<[f32; 3]> = perm.iter().map(|&i| inp.xyz[i]).collect();
    let batch: Vec<i32> = perm.iter().map(|&i| inp.batch[i]).collect();
    let out = model.forward_cpu(&coords, &feats, &xyz, &batch, inp.spatial_shape).expect("forward permuted");
    let c = y.classes;
    let back: Vec<f32> = {
        let mut v = vec![0f32; n * c];
        for (j, &i) in perm.iter().enumerate() {
            v[i * c..(i + 1) * c].copy_from_slice(&out[j * c..(j + 1) * c]);
        }
        v
    };
    // Convs, norms and the down/up maps sum in an order fixed by coordinates, not rows; only the
    // attention's f64 window sums change order (~1e-16 relative), so differences are f32 rounding
    // flips (~1e-7) carried through a few layers.
    let e = rel_err(&back, &base);
    assert!(e < 1e-5, "relative error {e}");
    assert!(base.iter().all(|v| v.is_finite()));
}

#[test]
fn empty_and_all_invalid_inputs() {
    let y = small("sphereformer_semantickitti.yaml");
    let s = segmenter(&y, 3);
    // Zero points: an empty result, not an error.
    let empty = Points::default();
    let r = s.segment(&[&empty]).expect("empty cloud");
    assert!(r.labels.is_empty() && r.probs.is_empty() && r.voxels == 0);
    // Only NaN points: every point unlabeled, the network does not run.
    let nan = Points { x: vec![f32::NAN; 3], y: vec![0.0; 3], z: vec![0.0; 3], intensity: vec![0.0; 3], ..Default::default() };
    let r = s.segment(&[&nan]).expect("all-NaN cloud");
    assert_eq!(r.labels, vec![UNLABELED; 3]);
    assert!(r.times.get("input_conv").is_none());
    // The network itself refuses zero voxels.
    assert!(s.model().forward_cpu(&[], &[], &[], &[], [128; 3]).is_err());
}

#[test]
fn batch_of_two_labels_each_sample() {
    let y = small("sphereformer_semantickitti.yaml");
    let s = segmenter(&y, 4);
    let a = semantickitti_sample();
    let b = common::rotated_z(&a, 90.0);
    let r = s.segment(&[&a, &b]).expect("batch");
    assert_eq!(r.offsets, vec![0, a.len(), a.len() + b.len()]);
    assert_eq!(r.sample_labels(1).map(<[u32]>::len), Some(b.len()));
    assert!(r.labels.iter().all(|&l| (l as usize) < y.classes));
    // Sample 0 alone gives the same labels as in the batch: samples do not interact (windows and
    // convs never cross the batch index).
    let alone = s.segment(&[&a]).expect("alone");
    assert_eq!(alone.labels, r.sample_labels(0).expect("sample 0").to_vec());
}

#[test]
fn bad_network_inputs_are_errors() {
    let y = small("sphereformer_semantickitti.yaml");
    let s = segmenter(&y, 3);
    let m = s.model();
    let coords = vec![[0, 1, 1, 1], [0, 2, 1, 1]];
    let feats = vec![0.5f32; 8];
    let xyz = vec![[1.0f32, 0.0, 0.0], [1.1, 0.0, 0.0]];
    assert!(m.forward_cpu(&coords, &feats, &xyz, &[0, 0], [128; 3]).is_ok());
    assert!(m.forward_cpu(&coords, &feats[..7], &xyz, &[0, 0], [128; 3]).is_err(), "short features");
    assert!(m.forward_cpu(&coords, &feats, &xyz, &[0, 1], [128; 3]).is_err(), "batch disagrees with coords");
    let dup = vec![[0, 1, 1, 1], [0, 1, 1, 1]];
    assert!(m.forward_cpu(&dup, &feats, &xyz, &[0, 0], [128; 3]).is_err(), "duplicate coordinates");
    assert!(m.forward_cpu(&coords, &feats, &[[f32::NAN, 0.0, 0.0], [0.0; 3]], &[0, 0], [128; 3]).is_err(), "NaN xyz");
}

#[test]
fn label_file_has_one_uint32_per_point() {
    use sptr::cli::segment_files::{write_label_file, LabelIds};
    use sptr::sensors::cloud_files::{read_cloud, CloudFormat};
    let y = small("sphereformer_semantickitti.yaml");
    let path = common::data("semantickitti/000000.bin");
    let fmt = CloudFormat::from_path(&path).expect("format from name");
    assert_eq!(fmt, CloudFormat::KittiBin);
    let pts = read_cloud(&path, fmt).expect("read");
    let r = segmenter(&y, 8).segment(&[&pts]).expect("segment");
    let out = temp_path("000000.label");
    let ids = LabelIds::for_classes(&y.class_names);
    assert_eq!(ids, LabelIds::SemanticKitti, "the SemanticKITTI classes get its raw ids");
    write_label_file(&out, &r.labels, ids).expect("write");
    let bytes = std::fs::read(&out).expect("read back");
    assert_eq!(bytes.len(), 4 * pts.len());
    let raw: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    // SemanticKITTI raw ids of the 19 classes (learning_map_inv).
    let valid = [10, 11, 15, 18, 20, 30, 31, 32, 40, 44, 48, 49, 50, 51, 70, 71, 72, 80, 81];
    assert!(raw.iter().all(|v| valid.contains(v)), "{raw:?}");
    assert_eq!(CloudFormat::from_path(std::path::Path::new("a/x.pcd.bin")), Some(CloudFormat::NuScenesBin));
}

#[test]
fn colliding_recomputed_coordinates_go_back_to_their_keys() {
    let y = sphereformer_yaml("sphereformer_semantickitti.yaml");
    let (pts, k) = common::coordinate_collision_cloud();
    let inputs = prepare_inputs(&[&pts], &y).expect("inputs");
    assert_eq!(inputs.len(), 3, "O, B and C are three voxels");
    assert_eq!(inputs.coord_fixups, 1, "B's recomputed coordinate collides with C's");
    let x_of = |p: usize| inputs.coords[inputs.point_to_voxel[p] as usize][1];
    assert_eq!(x_of(0), 0);
    assert_eq!(x_of(1), k, "B goes back to its key");
    assert_eq!(x_of(2), k + 1);
    let mut c = inputs.coords.clone();
    c.sort_unstable();
    c.dedup();
    assert_eq!(c.len(), 3, "coordinates are unique");
}

/// A stage hook (progress of long CPU runs, `sptr segment`) is told of every stage as it ends,
/// in the order `cpu_stage_names` lists them, for the small and the full configs' level layouts.
#[test]
fn stage_hook_sees_every_cpu_stage_in_order() {
    use sptr::models::sphereformer::network::cpu_stage_names;
    use std::sync::{Arc, Mutex};
    let pts = semantickitti_sample();
    let mut y = small("sphereformer_semantickitti.yaml");
    for sphere_layers in [vec![1, 2], vec![2, 3], vec![]] {
        y.sphere_layers = sphere_layers.clone();
        let mut s = segmenter(&y, 3);
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        s.set_stage_hook(Some(Arc::new(move |name: &str, _| log.lock().unwrap().push(name.to_string()))));
        let r = s.segment(&[&pts]).expect("segment");
        let names = cpu_stage_names(&y);
        assert_eq!(*seen.lock().unwrap(), names, "sphere_layers {sphere_layers:?}");
        let recorded: Vec<&str> = r.times.stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(recorded, names.iter().map(|n| n.as_str()).collect::<Vec<_>>());
    }
    let full = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let names = cpu_stage_names(&full);
    assert_eq!(names.len(), 2 + 2 + 5 + 5 + 4 + 2 * 4, "{names:?}");
    assert_eq!(names[..4], ["voxelize", "input_conv", "l1.blocks", "l1.attention"]);
    assert_eq!(names[names.len() - 3..], ["l1.tail", "head", "devoxelize"]);
}
