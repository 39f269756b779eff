//! BEVFusion's fuser, BEV decoders and map head on the CPU against a naive composition written
//! from the upstream modules (NCHW, f64, BatchNorm applied unfolded with the configured eps,
//! deconv as a scatter, bilinear upsampling and grid sampling from their metric definitions),
//! on reduced configurations with deterministic random weights and inputs. Also: the upstream
//! `state_dict` names and shapes of the full configurations, checked loading, bad inputs.

use crate::common;
use sptr::ops::dense::FeatureMap;
use sptr::models::bevfusion::config::BevConfig;
use sptr::models::bevfusion::bev_stack::{random_tensors, random_weights, weight_specs, BevStack};
use sptr::nn::random::SplitMix;
use sptr::nn::{ModelError, Weights};
use std::collections::HashMap;

// ---------------------------------------------------------------------------------------------
// naive NCHW f64 reference
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct T {
    c: usize,
    h: usize,
    w: usize,
    v: Vec<f64>, // one image, NCHW
}

impl T {
    fn at(&self, c: usize, y: i64, x: i64) -> f64 {
        if y < 0 || x < 0 || y >= self.h as i64 || x >= self.w as i64 {
            0.0
        } else {
            self.v[(c * self.h + y as usize) * self.w + x as usize]
        }
    }
}

struct Ref<'a>(&'a HashMap<String, (Vec<usize>, Vec<f32>)>);

impl Ref<'_> {
    fn get(&self, name: &str) -> &(Vec<usize>, Vec<f32>) {
        self.0.get(name).unwrap_or_else(|| panic!("reference reads `{name}`, which the weights lack"))
    }

    fn conv(&self, x: &T, name: &str, stride: usize, pad: usize, bias: bool) -> T {
        let (s, w) = self.get(&format!("{name}.weight"));
        let (co_n, ci_n, kh, kw) = (s[0], s[1], s[2], s[3]);
        assert_eq!(ci_n, x.c, "{name}");
        let oh = (x.h + 2 * pad - kh) / stride + 1;
        let ow = (x.w + 2 * pad - kw) / stride + 1;
        let b = bias.then(|| &self.get(&format!("{name}.bias")).1);
        let mut v = vec![0f64; co_n * oh * ow];
        for co in 0..co_n {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[co] as f64);
                    for ci in 0..ci_n {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * stride + ky) as i64 - pad as i64;
                                let ix = (ox * stride + kx) as i64 - pad as i64;
                                acc += x.at(ci, iy, ix) * w[((co * ci_n + ci) * kh + ky) * kw + kx] as f64;
                            }
                        }
                    }
                    v[(co * oh + oy) * ow + ox] = acc;
                }
            }
        }
        T { c: co_n, h: oh, w: ow, v }
    }

    /// ConvTranspose2d, kernel = stride, no padding, no bias: every input pixel scatters.
    fn deconv(&self, x: &T, name: &str) -> T {
        let (s, w) = self.get(&format!("{name}.weight"));
        let (ci_n, co_n, k) = (s[0], s[1], s[2]);
        let (oh, ow) = (x.h * k, x.w * k);
        let mut v = vec![0f64; co_n * oh * ow];
        for ci in 0..ci_n {
            for iy in 0..x.h {
                for ix in 0..x.w {
                    for co in 0..co_n {
                        for ky in 0..k {
                            for kx in 0..k {
                                v[(co * oh + iy * k + ky) * ow + ix * k + kx] +=
                                    x.at(ci, iy as i64, ix as i64) * w[((ci * co_n + co) * k + ky) * k + kx] as f64;
                            }
                        }
                    }
                }
            }
        }
        T { c: co_n, h: oh, w: ow, v }
    }

    /// BatchNorm2d at inference, unfolded: (x − mean) / sqrt(var + eps) · γ + β.
    fn bn(&self, x: &T, name: &str, eps: f64) -> T {
        let g = &self.get(&format!("{name}.weight")).1;
        let b = &self.get(&format!("{name}.bias")).1;
        let m = &self.get(&format!("{name}.running_mean")).1;
        let var = &self.get(&format!("{name}.running_var")).1;
        let mut y = x.clone();
        for c in 0..x.c {
            for v in &mut y.v[c * x.h * x.w..(c + 1) * x.h * x.w] {
                *v = (*v - m[c] as f64) / (var[c] as f64 + eps).sqrt() * g[c] as f64 + b[c] as f64;
            }
        }
        y
    }

    fn cbr(&self, x: &T, conv: &str, bn: &str, stride: usize, pad: usize, eps: f64) -> T {
        relu(&self.bn(&self.conv(x, conv, stride, pad, false), bn, eps))
    }
}

fn relu(x: &T) -> T {
    T { v: x.v.iter().map(|v| v.max(0.0)).collect(), ..x.clone() }
}

fn cat(a: &T, b: &T) -> T {
    assert_eq!((a.h, a.w), (b.h, b.w));
    let mut v = a.v.clone();
    v.extend_from_slice(&b.v);
    T { c: a.c + b.c, h: a.h, w: a.w, v }
}

/// Bilinear with align_corners=True: output i samples input position i · (in − 1) / (out − 1).
fn resize_ac(x: &T, oh: usize, ow: usize) -> T {
    let pos = |o: usize, n_in: usize, n_out: usize| if n_out > 1 { o as f64 * (n_in as f64 - 1.0) / (n_out as f64 - 1.0) } else { 0.0 };
    let mut v = vec![0f64; x.c * oh * ow];
    for c in 0..x.c {
        for oy in 0..oh {
            for ox in 0..ow {
                v[(c * oh + oy) * ow + ox] = bilinear(x, c, pos(oy, x.h, oh), pos(ox, x.w, ow));
            }
        }
    }
    T { c: x.c, h: oh, w: ow, v }
}

/// Bilinear interpolation at continuous pixel position (py, px), zero outside.
fn bilinear(x: &T, c: usize, py: f64, px: f64) -> f64 {
    let (y0, x0) = (py.floor(), px.floor());
    let (ly, lx) = (py - y0, px - x0);
    let (y0, x0) = (y0 as i64, x0 as i64);
    x.at(c, y0, x0) * (1.0 - ly) * (1.0 - lx) + x.at(c, y0, x0 + 1) * (1.0 - ly) * lx + x.at(c, y0 + 1, x0) * ly * (1.0 - lx) + x.at(c, y0 + 1, x0 + 1) * ly * lx
}

/// BEVGridTransform from its metric meaning: output cell (i, j) is the point (x, y) =
/// (ox_min + (i + ½)·ox_step, oy_min + (j + ½)·oy_step); the input map's pixel (r, s) covers
/// x ∈ imin_x + [r, r + 1)·cell_x (H = x), y likewise along W; sample bilinearly between pixel
/// centres.
fn grid_transform(x: &T, inp: [[f64; 3]; 2], out: [[f64; 3]; 2]) -> T {
    let n = |s: [f64; 3]| ((s[1] - s[0]) / s[2]).round() as usize;
    let (nx, ny) = (n(out[0]), n(out[1]));
    let cell_x = (inp[0][1] - inp[0][0]) / x.h as f64;
    let cell_y = (inp[1][1] - inp[1][0]) / x.w as f64;
    let mut v = vec![0f64; x.c * nx * ny];
    for c in 0..x.c {
        for i in 0..nx {
            for j in 0..ny {
                let px = out[0][0] + (i as f64 + 0.5) * out[0][2];
                let py = out[1][0] + (j as f64 + 0.5) * out[1][2];
                let r = (px - inp[0][0]) / cell_x - 0.5;
                let s = (py - inp[1][0]) / cell_y - 0.5;
                v[(c * nx + i) * ny + j] = bilinear(x, c, r, s);
            }
        }
    }
    T { c: x.c, h: nx, w: ny, v }
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

fn to_t(m: &FeatureMap) -> T {
    assert_eq!(m.n, 1);
    T { c: m.c, h: m.h, w: m.w, v: m.to_nchw().iter().map(|&v| v as f64).collect() }
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // f32 sums of at most a few hundred O(1) products per layer, a dozen layers
        assert!((g as f64 - w).abs() <= 2e-5 * scale + 1e-6, "{what} value {i}: {g} vs {w} (scale {scale})");
    }
}

fn random_map(seed: u64, h: usize, w: usize, c: usize) -> FeatureMap {
    let mut rng = SplitMix(seed);
    FeatureMap::new(1, h, w, c, (0..h * w * c).map(|_| rng.uniform(-1.0, 1.0)).collect()).unwrap()
}

fn tensors_of(cfg: &BevConfig, seed: u64) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    random_tensors(cfg, seed).unwrap().into_iter().map(|(n, s, v)| (n, (s, v))).collect()
}

// ---------------------------------------------------------------------------------------------
// reduced configurations
// ---------------------------------------------------------------------------------------------

/// Fusion model, reduced: fuser [3, 5] → 6; SECOND 6 → [4, 8], layers [1, 2], strides [1, 2];
/// SECONDFPN → [5, 3]; head 8 channels. A 16 × 12 BEV (x 12.8 m, y 9.6 m at 0.8 m) to 24 × 8.
const SMALL_FUSION: &str = r#"
model:
  fuser: {type: ConvFuser, in_channels: [3, 5], out_channels: 6}
  decoder:
    backbone:
      type: SECOND
      in_channels: 6
      out_channels: [4, 8]
      layer_nums: [1, 2]
      layer_strides: [1, 2]
      norm_cfg: {type: BN, eps: 1.0e-3, momentum: 0.01}
      conv_cfg: {type: Conv2d, bias: false}
    neck:
      type: SECONDFPN
      in_channels: [4, 8]
      out_channels: [5, 3]
      upsample_strides: [1, 2]
      norm_cfg: {type: BN, eps: 1.0e-3, momentum: 0.01}
      upsample_cfg: {type: deconv, bias: false}
      use_conv_for_no_stride: true
  heads:
    map:
      type: BEVSegmentationHead
      in_channels: 8
      grid_transform:
        input_scope: [[-6.4, 6.4, 0.8], [-4.8, 4.8, 0.8]]
        output_scope: [[-6, 6, 0.5], [-4, 4, 1.0]]
      classes: [a, b, c]
"#;

/// Camera-only model, reduced: ResNet 4 → [[1, 6, 2], [2, 8, 2], [1, 10, 1]], LSSFPN [-1, 0]
/// → 7 ×2; the same head grid.
const SMALL_CAMERA: &str = r#"
model:
  fuser: null
  decoder:
    backbone:
      type: GeneralizedResNet
      in_channels: 4
      blocks:
        - [1, 6, 2]
        - [2, 8, 2]
        - [1, 10, 1]
    neck:
      type: LSSFPN
      in_indices: [-1, 0]
      in_channels: [10, 6]
      out_channels: 7
      scale_factor: 2
  heads:
    map:
      type: BEVSegmentationHead
      in_channels: 7
      grid_transform:
        input_scope: [[-6.4, 6.4, 0.8], [-4.8, 4.8, 0.8]]
        output_scope: [[-6, 6, 0.5], [-4, 4, 1.0]]
      classes: [a, b]
"#;

const HEAD_IN: [[f64; 3]; 2] = [[-6.4, 6.4, 0.8], [-4.8, 4.8, 0.8]];
const HEAD_OUT: [[f64; 3]; 2] = [[-6.0, 6.0, 0.5], [-4.0, 4.0, 1.0]];

fn head_ref(r: &Ref, x: &T) -> T {
    let g = grid_transform(x, HEAD_IN, HEAD_OUT);
    let y = r.cbr(&g, "heads.map.classifier.0", "heads.map.classifier.1", 1, 1, 1e-5);
    let y = r.cbr(&y, "heads.map.classifier.3", "heads.map.classifier.4", 1, 1, 1e-5);
    let l = r.conv(&y, "heads.map.classifier.6", 1, 0, true);
    T { v: l.v.iter().map(|&v| sigmoid(v)).collect(), ..l }
}

#[test]
fn fusion_stack_matches_naive_composition() {
    let cfg = BevConfig::parse(SMALL_FUSION, "small_fusion.yaml").unwrap();
    let stack = BevStack::from_weights(&cfg, random_weights(&cfg, 3).unwrap()).unwrap();
    let w = tensors_of(&cfg, 3);
    let r = Ref(&w);
    let cam = random_map(10, 16, 12, 3);
    let lidar = random_map(11, 16, 12, 5);
    let out = stack.forward(&[&cam, &lidar]).unwrap();

    // ConvFuser: camera first
    let fused = r.cbr(&cat(&to_t(&cam), &to_t(&lidar)), "fuser.0", "fuser.1", 1, 1, 1e-5);
    let got_fused = out.fused.as_ref().unwrap();
    assert_close(&got_fused.to_nchw(), &fused.v, "fuser");
    // SECOND (eps 1e-3): stage 0 stride 1 (2 convs), stage 1 stride 2 (3 convs)
    let p = "decoder.backbone.blocks";
    let s0 = r.cbr(&fused, &format!("{p}.0.0"), &format!("{p}.0.1"), 1, 1, 1e-3);
    let s0 = r.cbr(&s0, &format!("{p}.0.3"), &format!("{p}.0.4"), 1, 1, 1e-3);
    let mut s1 = r.cbr(&s0, &format!("{p}.1.0"), &format!("{p}.1.1"), 2, 1, 1e-3);
    for j in 1..=2 {
        s1 = r.cbr(&s1, &format!("{p}.1.{}", 3 * j), &format!("{p}.1.{}", 3 * j + 1), 1, 1, 1e-3);
    }
    assert_eq!((s1.h, s1.w), (8, 6));
    // SECONDFPN: conv 1x1 on stage 0, deconv k2 s2 on stage 1, concatenated
    let d0 = relu(&r.bn(&r.conv(&s0, "decoder.neck.deblocks.0.0", 1, 0, false), "decoder.neck.deblocks.0.1", 1e-3));
    let d1 = relu(&r.bn(&r.deconv(&s1, "decoder.neck.deblocks.1.0"), "decoder.neck.deblocks.1.1", 1e-3));
    let dec = cat(&d0, &d1);
    assert_close(&out.decoded.to_nchw(), &dec.v, "SECOND + SECONDFPN");
    // the head, from the reference's own decoder output
    let maps = head_ref(&r, &dec);
    assert_eq!((out.maps.classes, out.maps.x, out.maps.y), (3, 24, 8));
    assert_close(&out.maps.data, &maps.v, "head");
    // deterministic
    let again = stack.forward(&[&cam, &lidar]).unwrap();
    assert_eq!(again.maps.data, out.maps.data);
}

#[test]
fn camera_stack_matches_naive_composition() {
    let cfg = BevConfig::parse(SMALL_CAMERA, "small_camera.yaml").unwrap();
    let stack = BevStack::from_weights(&cfg, random_weights(&cfg, 4).unwrap()).unwrap();
    let w = tensors_of(&cfg, 4);
    let r = Ref(&w);
    let x = random_map(12, 16, 12, 4);
    let out = stack.forward(&[&x]).unwrap();
    assert!(out.fused.is_none());

    // BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + identity), eps 1e-5
    let block = |x: &T, p: &str, stride: usize, down: bool| -> T {
        let y = r.cbr(x, &format!("{p}.conv1"), &format!("{p}.bn1"), stride, 1, 1e-5);
        let y = r.bn(&r.conv(&y, &format!("{p}.conv2"), 1, 1, false), &format!("{p}.bn2"), 1e-5);
        let id = if down { r.bn(&r.conv(x, &format!("{p}.downsample.0"), stride, 0, false), &format!("{p}.downsample.1"), 1e-5) } else { x.clone() };
        T { v: y.v.iter().zip(&id.v).map(|(a, b)| (a + b).max(0.0)).collect(), ..y }
    };
    let p = "decoder.backbone";
    let l0 = block(&to_t(&x), &format!("{p}.0.0"), 2, true);
    let l1 = block(&l0, &format!("{p}.1.0"), 2, true);
    let l1 = block(&l1, &format!("{p}.1.1"), 1, false);
    let l2 = block(&l1, &format!("{p}.2.0"), 1, true);
    assert_eq!((l0.h, l0.w, l2.h, l2.w, l2.c), (8, 6, 4, 3, 10));
    // LSSFPN: deep (l2) upsampled align_corners to the shallow (l0) size, cat [deep, shallow]
    let up = resize_ac(&l2, l0.h, l0.w);
    let n = "decoder.neck";
    let y = r.cbr(&cat(&up, &l0), &format!("{n}.fuse.0"), &format!("{n}.fuse.1"), 1, 0, 1e-5);
    let y = r.cbr(&y, &format!("{n}.fuse.3"), &format!("{n}.fuse.4"), 1, 1, 1e-5);
    let y = resize_ac(&y, y.h * 2, y.w * 2);
    let dec = r.cbr(&y, &format!("{n}.upsample.1"), &format!("{n}.upsample.2"), 1, 1, 1e-5);
    assert_close(&out.decoded.to_nchw(), &dec.v, "GeneralizedResNet + LSSFPN");
    assert_close(&out.maps.data, &head_ref(&r, &dec).v, "head");
}

// ---------------------------------------------------------------------------------------------
// full configurations: names, shapes, loading
// ---------------------------------------------------------------------------------------------

fn repo_cfg(name: &str) -> BevConfig {
    BevConfig::load(&common::root().join("config/models").join(name)).unwrap()
}

#[test]
fn full_configurations_have_upstream_names() {
    let f = weight_specs(&repo_cfg("bevfusion_seg_fusion.yaml")).unwrap();
    let shape = |specs: &[sptr::nn::WeightSpec], n: &str| specs.iter().find(|s| s.name == n).map(|s| s.shape.clone());
    assert_eq!(shape(&f, "fuser.0.weight"), Some(vec![256, 336, 3, 3]));
    assert_eq!(shape(&f, "fuser.1.running_var"), Some(vec![256]));
    assert_eq!(shape(&f, "decoder.backbone.blocks.0.0.weight"), Some(vec![128, 256, 3, 3]));
    assert_eq!(shape(&f, "decoder.backbone.blocks.0.15.weight"), Some(vec![128, 128, 3, 3]));
    assert_eq!(shape(&f, "decoder.backbone.blocks.1.0.weight"), Some(vec![256, 128, 3, 3]));
    assert_eq!(shape(&f, "decoder.backbone.blocks.1.16.bias"), Some(vec![256]));
    assert_eq!(shape(&f, "decoder.backbone.blocks.1.18.weight"), None);
    assert_eq!(shape(&f, "decoder.neck.deblocks.0.0.weight"), Some(vec![256, 128, 1, 1]));
    assert_eq!(shape(&f, "decoder.neck.deblocks.1.0.weight"), Some(vec![256, 256, 2, 2]));
    assert_eq!(shape(&f, "heads.map.classifier.0.weight"), Some(vec![512, 512, 3, 3]));
    assert_eq!(shape(&f, "heads.map.classifier.6.weight"), Some(vec![6, 512, 1, 1]));
    assert_eq!(shape(&f, "heads.map.classifier.6.bias"), Some(vec![6]));
    assert!(f.iter().all(|s| !s.name.ends_with(".0.bias") || s.name.starts_with("heads")), "conv biases where upstream has none");
    // fuser 5 + SECOND (6 + 6) convs x 5 + deblocks 2 x 5 + head 5 + 5 + 2
    assert_eq!(f.len(), 5 + 12 * 5 + 10 + 12);

    let c = weight_specs(&repo_cfg("bevfusion_seg_camera.yaml")).unwrap();
    assert_eq!(shape(&c, "decoder.backbone.0.0.conv1.weight"), Some(vec![160, 80, 3, 3]));
    assert_eq!(shape(&c, "decoder.backbone.0.0.downsample.0.weight"), Some(vec![160, 80, 1, 1]));
    assert_eq!(shape(&c, "decoder.backbone.0.1.downsample.0.weight"), None);
    assert_eq!(shape(&c, "decoder.backbone.2.0.downsample.1.running_mean"), Some(vec![640]));
    assert_eq!(shape(&c, "decoder.backbone.2.1.bn2.weight"), Some(vec![640]));
    assert_eq!(shape(&c, "decoder.neck.fuse.0.weight"), Some(vec![256, 800, 1, 1]));
    assert_eq!(shape(&c, "decoder.neck.fuse.3.weight"), Some(vec![256, 256, 3, 3]));
    assert_eq!(shape(&c, "decoder.neck.upsample.1.weight"), Some(vec![256, 256, 3, 3]));
    assert_eq!(shape(&c, "decoder.neck.upsample.2.bias"), Some(vec![256]));
    assert_eq!(shape(&c, "heads.map.classifier.0.weight"), Some(vec![256, 256, 3, 3]));
    assert!(c.iter().all(|s| !s.name.starts_with("fuser")));
    // 6 blocks x 10 + 3 downsamples x 5 + fuse 10 + upsample 5 + head 12
    assert_eq!(c.len(), 60 + 15 + 10 + 5 + 12);
}

#[test]
fn loading_lists_every_problem() {
    let cfg = BevConfig::parse(SMALL_FUSION, "f.yaml").unwrap();
    let mut t = random_tensors(&cfg, 1).unwrap();
    t.retain(|(n, _, _)| n != "fuser.1.running_var");
    for (n, s, v) in t.iter_mut() {
        if n == "decoder.neck.deblocks.1.0.weight" {
            s.swap(0, 1); // [cout, cin, k, k]: a Conv2d's layout
            *v = vec![0.0; v.len()];
        }
    }
    t.push(("decoder.neck.extra".into(), vec![1], vec![0.0]));
    // a num_batches_tracked counter is dropped, not unexpected
    t.push(("fuser.1.num_batches_tracked".into(), vec![], vec![0.0]));
    let e = BevStack::from_weights(&cfg, Weights::from_tensors("t", t).unwrap()).unwrap_err();
    match &e {
        ModelError::Mismatch { missing, unexpected, misshaped, .. } => {
            assert_eq!(missing, &vec!["fuser.1.running_var".to_string()]);
            assert_eq!(unexpected, &vec!["decoder.neck.extra".to_string()]);
            assert_eq!(misshaped.len(), 1);
            assert_eq!(misshaped[0].name, "decoder.neck.deblocks.1.0.weight");
        }
        other => panic!("{other}"),
    }
    // the other model's weights: everything listed, nothing panics
    let cam = BevConfig::parse(SMALL_CAMERA, "c.yaml").unwrap();
    match BevStack::from_weights(&cam, random_weights(&cfg, 1).unwrap()).unwrap_err() {
        ModelError::Mismatch { missing, unexpected, .. } => {
            assert!(missing.iter().any(|n| n == "decoder.neck.fuse.0.weight"));
            assert!(unexpected.iter().any(|n| n == "fuser.0.weight"));
        }
        other => panic!("{other}"),
    }
    // a BatchNorm variance that gives no real 1/sqrt(var + eps)
    let mut t = random_tensors(&cfg, 1).unwrap();
    for (n, _, v) in t.iter_mut() {
        if n == "decoder.backbone.blocks.0.1.running_var" {
            v[0] = -1.0;
        }
    }
    let e = BevStack::from_weights(&cfg, Weights::from_tensors("t", t).unwrap()).unwrap_err().to_string();
    assert!(e.contains("decoder.backbone.blocks.0.1"), "{e}");
    // the same seed gives the same weights, another seed others
    assert_eq!(random_tensors(&cfg, 9).unwrap(), random_tensors(&cfg, 9).unwrap());
    assert_ne!(random_tensors(&cfg, 9).unwrap(), random_tensors(&cfg, 10).unwrap());
}

#[test]
fn bad_inputs_are_errors() {
    let cfg = BevConfig::parse(SMALL_FUSION, "f.yaml").unwrap();
    let stack = BevStack::from_weights(&cfg, random_weights(&cfg, 2).unwrap()).unwrap();
    let cam = random_map(1, 16, 12, 3);
    let lidar = random_map(2, 16, 12, 5);
    // swapped order, one input, sizes differ, wrong channels
    assert!(stack.forward(&[&lidar, &cam]).is_err());
    assert!(stack.forward(&[&cam]).is_err());
    assert!(stack.forward(&[&cam, &random_map(3, 16, 10, 5)]).is_err());
    assert!(stack.forward(&[&cam, &random_map(3, 16, 12, 4)]).is_err());
    let e = stack.forward(&[&lidar, &cam]).unwrap_err().to_string();
    assert!(e.contains("camera first"), "{e}");
    // decoder and head directly
    assert!(stack.decoder.forward(&random_map(4, 16, 12, 5)).is_err());
    assert!(stack.head.forward(&random_map(4, 16, 12, 7)).is_err());
    assert!(stack.decoder.forward(&FeatureMap::zeros(1, 0, 12, 6).unwrap()).is_err());
    let cam_cfg = BevConfig::parse(SMALL_CAMERA, "c.yaml").unwrap();
    let cam_stack = BevStack::from_weights(&cam_cfg, random_weights(&cam_cfg, 2).unwrap()).unwrap();
    assert!(cam_stack.forward(&[&random_map(5, 16, 12, 4), &random_map(6, 16, 12, 4)]).is_err());
    assert!(cam_stack.forward(&[&random_map(5, 16, 12, 3)]).is_err());
}

#[test]
fn flop_counts_of_the_full_models() {
    use sptr::models::bevfusion::bev_stack::part_gflop;
    // hand counts (2 FLOP per multiply-add) of the upstream layers at a 128 x 128 BEV
    let f = repo_cfg("bevfusion_seg_fusion.yaml");
    let stack = BevStack::from_weights(&f, random_weights(&f, 1).unwrap()).unwrap();
    let px = |s: f64| s * s;
    let fuser = 2.0 * px(128.0) * 256.0 * 336.0 * 9.0;
    let second = 2.0 * px(128.0) * 9.0 * (256.0 * 128.0 + 5.0 * 128.0 * 128.0) + 2.0 * px(64.0) * 9.0 * (128.0 * 256.0 + 5.0 * 256.0 * 256.0);
    let fpn = 2.0 * px(128.0) * 128.0 * 256.0 + 2.0 * px(64.0) * 256.0 * 256.0 * 4.0;
    let head = |c: f64| 2.0 * px(200.0) * (2.0 * c * c * 9.0 + c * 6.0);
    let got = part_gflop(&stack, 128);
    for (g, w) in got.iter().zip([fuser, second + fpn, head(512.0)]) {
        assert!((g - w / 1e9).abs() < 1e-9 * w, "{got:?} vs {w}");
    }
    let c = repo_cfg("bevfusion_seg_camera.yaml");
    let stack = BevStack::from_weights(&c, random_weights(&c, 1).unwrap()).unwrap();
    // layer l at side s, blocks: conv1 (cin -> c, 3x3), conv2 (c -> c), downsample 1x1 on the first
    let layer = |s: f64, cin: f64, c: f64| 2.0 * px(s) * (9.0 * cin * c + 9.0 * c * c + cin * c + 2.0 * 9.0 * c * c);
    let resnet = layer(64.0, 80.0, 160.0) + layer(32.0, 160.0, 320.0) + layer(32.0, 320.0, 640.0);
    let lss = 2.0 * px(64.0) * (800.0 * 256.0 + 9.0 * 256.0 * 256.0) + 2.0 * px(128.0) * 9.0 * 256.0 * 256.0;
    let got = part_gflop(&stack, 128);
    assert_eq!(got[0], 0.0);
    assert!((got[1] - (resnet + lss) / 1e9).abs() < 1e-6, "{got:?} vs {}", (resnet + lss) / 1e9);
    assert!((got[2] - head(256.0) / 1e9).abs() < 1e-6);
}
