//! The LSS view transform on the CPU: the pool against a naive outer product + scatter, camera
//! masking, the weights (names, shapes, the checkpoint's grid parameters), the downsample wiring,
//! and every bad input (zero / singular intrinsics, non-finite extrinsic, an
//! image or feature size that does not match, a camera count that does not match); the tiled
//! pool's plan on the real geometries.

use crate::common::Rng;
use crate::lss_common::*;
use sptr::sensors::calib::camera::{CameraCalib, Calibration};
use sptr::models::bevfusion::lss::geometry::{depth_index, point_cells};
use sptr::models::bevfusion::lss::transform::random_tensors;
use sptr::models::bevfusion::lss::{pool, weight_specs, CameraMask, LssGeometry, LssParams, LssTransform, PREFIX};
use sptr::ops::dense::FeatureMap;
use sptr::nn::random::NamedTensors;
use sptr::nn::{ModelError, Weights};

fn rel(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn pool_equals_outer_product_and_scatter() {
    // the real seg geometry (1.76 M kept points) with 8 channels to keep the outer product small
    let cfg = seg_config();
    let params = LssParams::from_config(&cfg);
    let calib = nuscenes_calib();
    let geom = LssGeometry::build(&params, &calib).unwrap();
    let cams = params.cameras(&calib).unwrap();
    let cells = point_cells(&params, &cams);
    let (d, c) = (geom.depth_bins, 8);
    let pixels = geom.cameras * geom.pixels_per_camera();
    let (depth, context) = random_lifted(3, pixels, d, c);
    // upstream: x = depth ⊗ features per point (n, d, h, w), kept points scattered into cells
    let mut want = vec![0f64; params.grid.cells() * c];
    for (i, cell) in cells.iter().enumerate() {
        let Some(cell) = cell else { continue };
        let q = depth_index(i, d, geom.height, geom.width);
        for ch in 0..c {
            want[*cell as usize * c + ch] += depth[q] as f64 * context[(q / d) * c + ch] as f64;
        }
    }
    let got = pool(&geom, &depth, &context, c, CameraMask::ALL).unwrap();
    assert_eq!((got.n, got.h, got.w, got.c), (1, 256, 256, 8));
    let e = rel(&got.data, &want);
    eprintln!("pool vs outer product + scatter: rel err {e:.2e}, {} kept points, {} intervals", geom.kept(), geom.intervals().len());
    // f32 sequential sums of up to a few thousand terms against f64
    assert!(e < 1e-6, "rel err {e}");
    let nonzero = want.iter().filter(|v| **v != 0.0).count();
    assert!(nonzero > 10_000, "{nonzero} non-zero outputs");

    // masking camera 2 equals zeroing its depth, bit for bit
    let mut zeroed = depth.clone();
    let per_cam = geom.pixels_per_camera() * d;
    zeroed[2 * per_cam..3 * per_cam].iter_mut().for_each(|v| *v = 0.0);
    let masked = pool(&geom, &depth, &context, c, CameraMask::ALL.without(2)).unwrap();
    let zero = pool(&geom, &zeroed, &context, c, CameraMask::ALL).unwrap();
    assert_eq!(masked.data, zero.data);
    assert_ne!(masked.data, got.data, "camera 2 contributes to the full map");
    // no camera: all zero
    let none = pool(&geom, &depth, &context, c, CameraMask(0)).unwrap();
    assert!(none.data.iter().all(|v| *v == 0.0));
    // wrong sizes
    assert!(pool(&geom, &depth[1..], &context, c, CameraMask::ALL).is_err());
    assert!(pool(&geom, &depth, &context, c + 1, CameraMask::ALL).is_err());
}

fn small_transform(seed: u64) -> (LssTransform, LssGeometry) {
    let cfg = small_config();
    let w = Weights::from_tensors("random", random_tensors(&cfg, PREFIX, seed)).unwrap();
    let t = LssTransform::from_weights_exact(&cfg, w, PREFIX).unwrap();
    let geom = LssGeometry::build(&t.params, &nuscenes_calib()).unwrap();
    (t, geom)
}

fn random_features(seed: u64, n: usize, h: usize, w: usize, c: usize) -> FeatureMap {
    let mut s = Rng(seed);
    FeatureMap::new(n, h, w, c, (0..n * h * w * c).map(|_| s.sym()).collect()).unwrap()
}

#[test]
fn forward_shapes_lift_and_downsample_wiring() {
    let (t, geom) = small_transform(7);
    let x = random_features(1, 6, 8, 22, 32);
    let out = t.forward(&geom, &x, CameraMask::ALL).unwrap();
    // 64 x 64 cells, downsample 2 -> 32 x 32, 16 channels
    assert_eq!((out.n, out.h, out.w, out.c), (1, 32, 32, 16));
    assert!(out.data.iter().all(|v| v.is_finite() && *v >= 0.0), "ReLU output");
    assert!(out.data.iter().any(|v| *v > 0.0));
    // lift: depth rows are distributions, context is the depthnet's last 16 channels
    let lifted = t.lift(&x).unwrap();
    let raw = t.depthnet.forward(&x, sptr::ops::dense::Activation::None).unwrap();
    for (p, row) in lifted.depth.chunks(30).enumerate() {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "pixel {p}: depth sums to {s}");
        // softmax is monotone in the logits
        let logits = &raw.data[p * 46..p * 46 + 30];
        let (amax_l, amax_p) = (argmax(logits), argmax(row));
        assert_eq!(amax_l, amax_p);
        assert_eq!(&lifted.context[p * 16..(p + 1) * 16], &raw.data[p * 46 + 30..(p + 1) * 46]);
    }
    // downsample.0 + downsample.1 + ReLU written out from the raw tensors (BatchNorm2d eps 1e-5)
    let cfg = small_config();
    let raw_w = Weights::from_tensors("random", random_tensors(&cfg, PREFIX, 7)).unwrap();
    let get = |n: &str| raw_w.get(&format!("{PREFIX}{n}")).unwrap().data.clone();
    let bev = pool(&geom, &lifted.depth, &lifted.context, 16, CameraMask::ALL).unwrap();
    let conv = sptr::ops::dense::Conv2d::new(16, 16, 3, 3, [1, 1], [1, 1], get("downsample.0.weight"), None).unwrap();
    let y = conv.forward(&bev, sptr::ops::dense::Activation::None).unwrap();
    let (g, b, m, v) = (get("downsample.1.weight"), get("downsample.1.bias"), get("downsample.1.running_mean"), get("downsample.1.running_var"));
    let by_hand: Vec<f32> = y.data.iter().enumerate().map(|(i, &a)| {
        let ch = i % 16;
        ((a - m[ch]) / (v[ch] + 1e-5).sqrt() * g[ch] + b[ch]).max(0.0)
    }).collect();
    let folded = t.downsample[0].forward(&bev, sptr::ops::dense::Activation::Relu).unwrap();
    let err = by_hand.iter().zip(&folded.data).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(err < 1e-4, "downsample.0/1 folded vs by hand: {err}");
    assert_eq!(t.downsample[1].stride, [2, 2]);
    assert_eq!((t.downsample[0].stride, t.downsample[2].stride), ([1, 1], [1, 1]));
}

/// The error text of a result that must be an error (without printing a large Ok value).
fn err<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => panic!("accepted a bad input"),
        Err(e) => e.to_string(),
    }
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |a, i| if v[i] > v[a] { i } else { a })
}

#[test]
fn weight_names_and_checks() {
    let cfg = seg_config();
    let specs = weight_specs(&cfg, PREFIX);
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    for n in ["frustum", "dx", "bx", "nx", "depthnet.weight", "depthnet.bias", "downsample.0.weight", "downsample.4.running_var", "downsample.7.bias"] {
        assert!(names.contains(&format!("{PREFIX}{n}").as_str()), "{n}");
    }
    assert_eq!(specs.iter().find(|s| s.name.ends_with("depthnet.weight")).unwrap().shape, vec![198, 256, 1, 1]);
    assert_eq!(specs.iter().find(|s| s.name.ends_with("frustum")).unwrap().shape, vec![118, 32, 88, 3]);
    assert_eq!(specs.len(), 4 + 2 + 3 * 5);

    let cfg = small_config();
    let tensors = random_tensors(&cfg, PREFIX, 1);
    let load = |edit: &dyn Fn(&mut NamedTensors)| {
        let mut t = tensors.clone();
        edit(&mut t);
        LssTransform::from_weights_exact(&cfg, Weights::from_tensors("w.safetensors", t).unwrap(), PREFIX)
    };
    assert!(load(&|_| {}).is_ok());
    // the grid parameters may be absent (then the YAML's are used)
    let bare = load(&|t| t.retain(|(n, _, _)| !["frustum", "dx", "bx", "nx"].iter().any(|g| n.ends_with(g)))).unwrap();
    assert_eq!(bare.params, LssParams::from_config(&cfg));
    // missing, unexpected and mis-shaped tensors are listed together
    let e = load(&|t| {
        t.retain(|(n, _, _)| !n.ends_with("downsample.3.weight"));
        t.push((format!("{PREFIX}extra"), vec![1], vec![0.0]));
        let i = t.iter().position(|(n, _, _)| n.ends_with("depthnet.bias")).unwrap();
        t[i].1 = vec![45];
        t[i].2.pop();
    })
    .unwrap_err();
    match &e {
        ModelError::Mismatch { missing, unexpected, misshaped, .. } => {
            assert_eq!(missing, &vec![format!("{PREFIX}downsample.3.weight")]);
            assert_eq!(unexpected, &vec![format!("{PREFIX}extra")]);
            assert_eq!(misshaped[0].name, format!("{PREFIX}depthnet.bias"));
        }
        other => panic!("{other}"),
    }
    // grid parameters that disagree with the YAML: an error naming the tensor and the keys
    let set = |name: &'static str, i: usize, v: f32| move |t: &mut NamedTensors| {
        let k = t.iter().position(|(n, _, _)| n.ends_with(name)).unwrap();
        t[k].2[i] = v;
    };
    let e = load(&set("dx", 0, 0.3)).unwrap_err().to_string();
    assert!(e.contains("vtransform.dx[0]") && e.contains("xbound"), "{e}");
    let e = load(&set("nx", 1, 63.0)).unwrap_err().to_string();
    assert!(e.contains("vtransform.nx[1]"), "{e}");
    let e = load(&set("frustum", 3, 1.5)).unwrap_err().to_string();
    assert!(e.contains("frustum[3]") && e.contains("feature_size"), "{e}");
    // within tolerance: accepted, and the checkpoint's frustum is the one used (upstream's
    // load_state_dict replaces the module's own)
    let t = load(&set("frustum", 3, tensors.iter().find(|x| x.0.ends_with("frustum")).unwrap().2[3] + 5e-4)).unwrap();
    assert_ne!(t.params.frustum, LssParams::from_config(&cfg).frustum);
    // a bad BatchNorm variance
    assert!(load(&set("downsample.4.running_var", 0, -1.0)).is_err());
}

#[test]
fn nx_as_int64_in_a_safetensors_file() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let cfg = small_config();
    let tensors = random_tensors(&cfg, PREFIX, 2);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = tensors
        .iter()
        .map(|(n, s, v)| {
            if n.ends_with(".nx") {
                (n.clone(), s.clone(), v.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect(), Dtype::I64)
            } else {
                (n.clone(), s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect(), Dtype::F32)
            }
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes.iter().map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let file = safetensors::serialize(views, None).unwrap();
    let w = Weights::from_bytes(&file, "ckpt.safetensors").unwrap();
    assert_eq!(w.get(&format!("{PREFIX}nx")).unwrap().data, vec![64.0, 64.0, 1.0]);
    assert!(LssTransform::from_weights_exact(&cfg, w, PREFIX).is_ok());
}

#[test]
fn bad_inputs_are_errors() {
    let (t, geom) = small_transform(3);
    let ok = random_features(2, 6, 8, 22, 32);
    assert!(t.forward(&geom, &ok, CameraMask::ALL).is_ok());
    // a camera count different from the calibration's
    let e = t.forward(&geom, &random_features(2, 5, 8, 22, 32), CameraMask::ALL).unwrap_err().to_string();
    assert!(e.contains("5 camera feature maps") && e.contains("6 cameras"), "{e}");
    // features of another size than feature_size (an image that does not match image_size)
    let e = t.forward(&geom, &random_features(2, 6, 16, 44, 32), CameraMask::ALL).unwrap_err().to_string();
    assert!(e.contains("16x44") && e.contains("feature_size 8x22"), "{e}");
    // features with the wrong channel count
    assert!(t.forward(&geom, &random_features(2, 6, 8, 22, 31), CameraMask::ALL).is_err());
    // a geometry of another transform
    let other = LssGeometry::build(&LssParams::from_config(&seg_config()), &nuscenes_calib()).unwrap();
    assert!(t.forward(&other, &ok, CameraMask::ALL).is_err());

    // calibrations the geometry refuses, each with its reason
    let calib = nuscenes_calib();
    let cam = &calib.cameras[1];
    let mut k = cam.intrinsics;
    k[0][0] = 0.0;
    assert!(CameraCalib::new(&cam.name, k, cam.camera_to_lidar, 1600, 900).unwrap_err().to_string().contains("focal"));
    let mut k = cam.intrinsics;
    k[0][1] = f64::NAN;
    assert!(CameraCalib::new(&cam.name, k, cam.camera_to_lidar, 1600, 900).is_err());
    let mut e = cam.camera_to_lidar;
    e[2][3] = f64::INFINITY;
    assert!(CameraCalib::new(&cam.name, cam.intrinsics, e, 1600, 900).unwrap_err().to_string().contains("not finite"));
    // singular: a camera whose fields are set directly (bypassing CameraCalib::new) is still
    // refused by the geometry
    let mut bad = calib.clone();
    bad.cameras[4].intrinsics = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]];
    let e = err(LssGeometry::build(&t.params, &bad));
    assert!(e.contains("CAM_BACK_LEFT") && e.contains("singular"), "{e}");
    // an image smaller than the crop
    let mut small = calib.clone();
    small.cameras[0].image_height = 100; // 48 rows after the 0.48 resize, 64 needed
    let e = err(LssGeometry::build(&t.params, &small));
    assert!(e.contains("CAM_FRONT") && e.contains("too small"), "{e}");
    assert!(Calibration::new(vec![]).is_err());
}
