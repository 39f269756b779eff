//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root, for every fixture and config a test reads: `$SPTR_ROOT` when set, else
/// the tree the test binary sits in (test binaries shipped to a GPU host run from another
/// directory than they were built in), else the crate directory at build time
/// ([`sptr::repo_root`], one rule for the tests and the library's own).
pub fn root() -> PathBuf {
    sptr::repo_root()
}

/// Path of a file under tests/data.
pub fn data(rel: &str) -> PathBuf {
    root().join("tests/data").join(rel)
}

/// The path of the nuScenes LiDAR sweep committed under tests/data/nuscenes (`.pcd.bin`, five
/// float columns).
pub fn nuscenes_sweep_path() -> PathBuf {
    std::fs::read_dir(data("nuscenes"))
        .expect("tests/data/nuscenes exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".pcd.bin"))
        .expect("a .pcd.bin sweep in tests/data/nuscenes")
}

/// [`nuscenes_sweep_path`] as a command-line argument.
pub fn nuscenes_sweep_arg() -> String {
    nuscenes_sweep_path().display().to_string()
}

/// The nuScenes LiDAR sweep committed under tests/data/nuscenes.
pub fn nuscenes_sweep() -> sptr::Points {
    sptr::Points::read_bin(&nuscenes_sweep_path(), 5).expect("nuScenes sweep reads")
}

/// The SemanticKITTI scan committed under tests/data/semantickitti (x, y, z, remission).
pub fn semantickitti_sample() -> sptr::Points {
    sptr::Points::read_bin(&data("semantickitti/000000.bin"), 4).expect("kitti sample reads")
}

/// The SphereFormer model YAML `config/models/NAME`.
pub fn sphereformer_yaml(name: &str) -> sptr::models::sphereformer::config::ModelYaml {
    sptr::models::sphereformer::config::ModelConfig::load(&root().join("config/models").join(name)).expect("model yaml").yaml
}

/// The nuScenes SphereFormer narrowed to a fast network for a debug build (m 16, three levels of
/// 16 / 32 / 48 channels, one block, 0.2 m voxels), written to `dir/small_nuscenes.yaml`; its
/// path, as the CLI takes it.
pub fn small_nuscenes_model(dir: &Path) -> String {
    let text = std::fs::read_to_string(root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let small = text
        .replace("voxel_size: [0.1, 0.1, 0.1]", "voxel_size: [0.2, 0.2, 0.2]")
        .replace("\nm: 32\n", "\nm: 16\n")
        .replace("block_reps: 2", "block_reps: 1")
        .replace("layers: [32, 64, 128, 256, 256]", "layers: [16, 32, 48]")
        .replace("sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [1, 2]");
    assert_ne!(small, text, "the nuScenes model YAML changed: update small_nuscenes_model");
    let path = dir.join("small_nuscenes.yaml");
    std::fs::write(&path, small).unwrap();
    path.display().to_string()
}

/// Deterministic splitmix64 generator: fixed seeds, no dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    pub fn next(&mut self) -> u64 {
        self.next_u64()
    }
    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        (lo as f64 + (hi as f64 - lo as f64) * self.unit()) as f32
    }
    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f32 {
        (self.unit() * 2.0 - 1.0) as f32
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// A copy of `p` rotated by `deg` degrees about z.
pub fn rotated_z(p: &sptr::Points, deg: f32) -> sptr::Points {
    let (s, c) = deg.to_radians().sin_cos();
    let mut q = p.clone();
    for i in 0..p.len() {
        q.x[i] = c * p.x[i] - s * p.y[i];
        q.y[i] = s * p.x[i] + c * p.y[i];
    }
    q
}

/// A value rounded to FP16 and back (what the GPU stores).
pub fn fp16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// A random `n x h x w x c` feature map, values in [-1, 1) rounded to FP16: what the GPU and the
/// CPU reference both read exactly.
pub fn random_fp16_map(rng: &mut Rng, n: usize, h: usize, w: usize, c: usize) -> sptr::ops::dense::FeatureMap {
    sptr::ops::dense::FeatureMap::new(n, h, w, c, (0..n * h * w * c).map(|_| fp16(rng.sym())).collect()).unwrap()
}

/// Index of the largest value of `row` (the first of equal ones).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// A file of little-endian float32 values (the parity references' raw arrays).
pub fn read_f32_le(p: &Path) -> Vec<f32> {
    let b = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A file of little-endian int32 values (the parity references' raw arrays).
pub fn read_i32_le(p: &Path) -> Vec<i32> {
    let b = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Whether GPU tests must run (`SPTR_REQUIRE_GPU=1`): then a missing GPU fails instead of skipping.
pub fn gpu_required() -> bool {
    std::env::var("SPTR_REQUIRE_GPU")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// The GPU for a CUDA test, or None (the test then reports itself skipped); with
/// SPTR_REQUIRE_GPU=1 a missing GPU panics instead.
#[cfg(feature = "cuda-core")]
pub fn gpu(test: &str) -> Option<sptr::device::cuda::CudaDevice> {
    match sptr::device::cuda::CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) if gpu_required() => panic!("{test}: SPTR_REQUIRE_GPU=1 but no usable GPU: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: no GPU ({e})");
            None
        }
    }
}

/// ‖a − b‖ / ‖b‖ over all elements (‖a − b‖ when b is all zero).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_err: lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// A cloud on which SphereFormer's recomputed voxel coordinates collide (the SemanticKITTI
/// config: float64 keys, scan-min origin, 0.05 m voxels), built from the arithmetic the
/// preprocessing documents, not from its code: point O fixes the origin; point B lies just below
/// a voxel boundary in float64 (key k on x) but its float32 offset from the origin rounds onto the
/// boundary, so `floor(f32(x - o) / f32(0.05))` is k + 1; point C lies inside voxel k + 1. B's
/// voxel must go back to its key (one fix-up). Returns the cloud and B's key on x.
pub fn coordinate_collision_cloud() -> (sptr::Points, i32) {
    let o = [-10.000_001f32, -10.0, -2.0];
    let vs32 = 0.05f32;
    let vs64 = vs32 as f64;
    // Walk f32 values up from 20 m until the two roundings disagree (deterministic).
    let mut x = 20.0f32;
    let (bx, k) = loop {
        let d = x as f64 - o[0] as f64;
        let key = (d / vs64).floor();
        let rec = ((d as f32) / vs32).floor();
        if rec as f64 == key + 1.0 {
            break (x, key as i32);
        }
        x = f32::from_bits(x.to_bits() + 1);
        assert!(x < 60.0, "no collision case below 60 m");
    };
    let cx = (o[0] as f64 + (k as f64 + 1.5) * vs64) as f32;
    let pts = [o[0], o[1], o[2], 1.0, bx, o[1], o[2], 2.0, cx, o[1], o[2], 3.0];
    (sptr::Points::from_interleaved(&pts, 4).expect("points"), k)
}

/// The `sptr` CLI under test: `$SPTR_EXE` when set (test binaries shipped to a GPU host, where
/// the build's target directory does not exist; scripts/gpu_suite.sh sets it), else the one
/// cargo built.
pub fn sptr_exe() -> PathBuf {
    std::env::var_os("SPTR_EXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sptr")))
}

/// Copies the safetensors file `src` to `dst` with value `index` of the F32 tensor `tensor` set to
/// `value` (a corrupt checkpoint for the load-time checks).
pub fn with_value(src: &Path, dst: &Path, tensor: &str, index: usize, value: f32) {
    use safetensors::tensor::TensorView;
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
        st.iter().map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    let t = owned.iter_mut().find(|t| t.0 == tensor).unwrap_or_else(|| panic!("{}: no tensor `{tensor}`", src.display()));
    assert_eq!(t.1, safetensors::Dtype::F32, "{tensor}");
    t.3[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
    let views: Vec<(String, TensorView)> = owned.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(dst, safetensors::serialize(views, None).unwrap()).unwrap();
}
