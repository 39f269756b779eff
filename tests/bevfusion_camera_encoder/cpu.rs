//! The camera encoder on the CPU (BEVFusion's Swin-T + GeneralizedLSSFPN): configuration and
//! weight names, each op against a naive implementation written from upstream's definitions
//! (the literal rolled + masked Swin attention with padding, the patch embedding conv, the
//! original Swin patch merging with mmdet's converted weights, the neck with unfolded
//! BatchNorm), the whole encoder on a reduced configuration, and every bad input.

use crate::common;
use crate::common::{rel_err, Rng};
use sptr::models::bevfusion::camera::encoder::{buffer_specs, random_tensors, random_weights, weight_specs, CameraEncoder, CameraEncoderConfig, NamedTensors};
use sptr::cli::camera_features::preprocess_files;
use sptr::models::bevfusion::camera::swin::{StageWindows, SwinBlock};
use sptr::ops::dense::FeatureMap;
use sptr::ops::rowwise::cpu::gelu;
use sptr::nn::random::safetensors_bytes;
use sptr::nn::{ModelError, Weights};
use std::collections::HashMap;

/// A reduced encoder: 4 stages of 24·2^i channels, head dims 24/24/48/48, a 32-channel neck.
const SMALL: &str = "
model:
  encoders:
    camera:
      backbone:
        type: SwinTransformer
        embed_dims: 24
        depths: [1, 2, 2, 1]
        num_heads: [1, 2, 2, 4]
        window_size: 7
        mlp_ratio: 4
        qkv_bias: true
        qk_scale: null
        patch_norm: true
        out_indices: [1, 2, 3]
      neck:
        type: GeneralizedLSSFPN
        in_channels: [48, 96, 192]
        out_channels: 32
        start_level: 0
        num_outs: 3
        norm_cfg: {type: BN2d}
        act_cfg: {type: ReLU}
        upsample_cfg: {mode: bilinear, align_corners: false}
";

fn small() -> CameraEncoderConfig {
    CameraEncoderConfig::parse(SMALL, "small.yaml").expect("small config")
}

fn full() -> CameraEncoderConfig {
    CameraEncoderConfig::load(&common::root().join("config/models/bevfusion_seg_camera.yaml")).expect("camera config")
}

fn tensors(cfg: &CameraEncoderConfig, seed: u64) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    random_tensors(cfg, seed).expect("random").into_iter().map(|(n, s, v)| (n, (s, v))).collect()
}

fn encoder(cfg: &CameraEncoderConfig, seed: u64) -> CameraEncoder {
    CameraEncoder::from_weights(cfg, random_weights(cfg, seed).expect("random weights")).expect("encoder builds")
}

fn rand_vec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.sym() * scale).collect()
}

fn f64v(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// y = x W^T + b on rows, f64.
fn linear64(x: &[f64], w: &[f32], b: Option<&[f32]>, fin: usize, fout: usize) -> Vec<f64> {
    let n = x.len() / fin;
    let mut y = vec![0f64; n * fout];
    for r in 0..n {
        for o in 0..fout {
            let mut s = b.map_or(0.0, |b| b[o] as f64);
            for i in 0..fin {
                s += x[r * fin + i] * w[o * fin + i] as f64;
            }
            y[r * fout + o] = s;
        }
    }
    y
}

/// nn.LayerNorm over rows of `c`, f64, eps 1e-5.
fn layer_norm64(x: &[f64], g: &[f32], b: &[f32]) -> Vec<f64> {
    let c = g.len();
    let mut y = vec![0f64; x.len()];
    for (yr, xr) in y.chunks_mut(c).zip(x.chunks(c)) {
        let mean = xr.iter().sum::<f64>() / c as f64;
        let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
        for i in 0..c {
            yr[i] = (xr[i] - mean) / (var + 1e-5).sqrt() * g[i] as f64 + b[i] as f64;
        }
    }
    y
}

#[test]
fn bevfusion_camera_yaml_builds_swin_t_with_upstream_names() {
    let cfg = full();
    let b = &cfg.backbone;
    assert_eq!((b.embed_dims, b.window, b.mlp_ratio, b.patch_size, b.in_channels), (96, 7, 4, 4, 3));
    assert_eq!((b.depths.clone(), b.heads.clone(), b.out_indices.clone()), (vec![2, 2, 6, 2], vec![3, 6, 12, 24], vec![1, 2, 3]));
    assert!(b.qkv_bias && b.patch_norm && b.qk_scale.is_none());
    assert_eq!(b.out_channels(), vec![192, 384, 768]);
    assert_eq!(b.stage_sizes(256, 704), vec![[64, 176], [32, 88], [16, 44], [8, 22]]);
    let n = &cfg.neck;
    assert_eq!((n.lateral_in(0), n.lateral_in(1), n.outputs(), n.out_channels), (448, 1152, 2, 256));
    assert_eq!((n.lateral_bn_eps, n.fpn_bn_eps, n.relu, n.align_corners), (Some(1e-5), Some(1e-5), true, false));

    let specs = weight_specs(&cfg).expect("specs");
    let map: HashMap<&str, &[usize]> = specs.iter().map(|s| (s.name.as_str(), s.shape.as_slice())).collect();
    let bb = "encoders.camera.backbone.";
    for (name, shape) in [
        ("patch_embed.projection.weight", vec![96, 3, 4, 4]),
        ("patch_embed.projection.bias", vec![96]),
        ("patch_embed.norm.weight", vec![96]),
        ("stages.0.blocks.0.norm1.weight", vec![96]),
        ("stages.0.blocks.1.attn.w_msa.relative_position_bias_table", vec![169, 3]),
        ("stages.0.blocks.1.attn.w_msa.qkv.weight", vec![288, 96]),
        ("stages.0.blocks.1.attn.w_msa.qkv.bias", vec![288]),
        ("stages.2.blocks.5.attn.w_msa.proj.weight", vec![384, 384]),
        ("stages.2.blocks.5.ffn.layers.0.0.weight", vec![1536, 384]),
        ("stages.2.blocks.5.ffn.layers.1.weight", vec![384, 1536]),
        ("stages.3.blocks.1.ffn.layers.1.bias", vec![768]),
        ("stages.0.downsample.norm.weight", vec![384]),
        ("stages.2.downsample.reduction.weight", vec![768, 1536]),
        ("norm1.weight", vec![192]),
        ("norm3.bias", vec![768]),
    ] {
        assert_eq!(map.get(format!("{bb}{name}").as_str()).copied(), Some(shape.as_slice()), "{name}");
    }
    for absent in ["norm0.weight", "stages.3.downsample.reduction.weight", "stages.0.downsample.reduction.bias", "stages.0.blocks.0.attn.w_msa.relative_position_index"] {
        assert!(!map.contains_key(format!("{bb}{absent}").as_str()), "{absent} must not be a weight");
    }
    let nk = "encoders.camera.neck.";
    for (name, shape) in [
        ("lateral_convs.0.conv.weight", vec![256, 448, 1, 1]),
        ("lateral_convs.1.conv.weight", vec![256, 1152, 1, 1]),
        ("lateral_convs.1.bn.running_var", vec![256]),
        ("fpn_convs.0.conv.weight", vec![256, 256, 3, 3]),
        ("fpn_convs.1.bn.weight", vec![256]),
    ] {
        assert_eq!(map.get(format!("{nk}{name}").as_str()).copied(), Some(shape.as_slice()), "{name}");
    }
    assert!(!map.contains_key("encoders.camera.neck.lateral_convs.0.conv.bias"), "a conv before BN has no bias");
    // state_dict order: backbone first, laterals before fpn convs
    assert_eq!(specs[0].name, format!("{bb}patch_embed.projection.weight"));
    assert_eq!(specs.last().map(|s| s.name.as_str()), Some("encoders.camera.neck.fpn_convs.1.bn.running_var"));
    // timm's swin_tiny_patch4_window7_224 has 28,288,354 parameters: minus its classifier
    // (768 x 1000 + 1000) and final norm (2 x 768), plus mmdet's norm1..3 (2 x (192 + 384 + 768)).
    let backbone: usize = specs.iter().filter(|s| s.name.starts_with(bb)).map(|s| s.numel()).sum();
    assert_eq!(backbone, 28_288_354 - 769_000 - 1_536 + 2_688);
    assert_eq!(buffer_specs(&cfg).len(), 12);
}

/// The patch embedding against a direct conv (zero padding right and bottom, AdaptivePadding
/// 'corner') and LayerNorm, on images whose sides are not multiples of 4.
#[test]
fn patch_embed_matches_a_padded_conv() {
    let cfg = small();
    let enc = encoder(&cfg, 3);
    let t = tensors(&cfg, 3);
    let get = |n: &str| &t[&format!("encoders.camera.backbone.{n}")].1;
    let (w, bias, g, b) = (get("patch_embed.projection.weight"), get("patch_embed.projection.bias"), get("patch_embed.norm.weight"), get("patch_embed.norm.bias"));
    let mut rng = Rng(5);
    let (n, h, wd, e) = (2usize, 13usize, 18usize, 24usize);
    let x = rand_vec(&mut rng, n * 3 * h * wd, 2.0);
    let (got, ho, wo) = enc.backbone.patch_embed.forward(&x, n, h, wd).expect("patch embed");
    assert_eq!((ho, wo), (4, 5));
    let mut conv = vec![0f64; n * ho * wo * e];
    for bi in 0..n {
        for i in 0..ho {
            for j in 0..wo {
                for o in 0..e {
                    let mut s = bias[o] as f64;
                    for ci in 0..3 {
                        for di in 0..4 {
                            for dj in 0..4 {
                                let (y, xx) = (4 * i + di, 4 * j + dj);
                                let v = if y < h && xx < wd { x[((bi * h + y) * wd + xx) * 3 + ci] as f64 } else { 0.0 };
                                s += v * w[((o * 3 + ci) * 4 + di) * 4 + dj] as f64;
                            }
                        }
                    }
                    conv[((bi * ho + i) * wo + j) * e + o] = s;
                }
            }
        }
    }
    let want = to_f32(&layer_norm64(&conv, g, b));
    let err = rel_err(&got, &want);
    assert!(err < 1e-5, "patch embed rel err {err}");
}

/// Upstream's `ShiftWindowMSA` + `WindowMSA` spelled out: pad, roll by -shift, 7 × 7 windows,
/// q·k·scale + bias from the `double_step_seq` index, the -100 region mask on the padded size
/// (exp(-100) taken literally, f64), merge, roll back, crop, proj.
fn literal_attention(blk: &SwinBlock, table: &[f32], x: &[f32], n: usize, h: usize, w: usize) -> Vec<f64> {
    let (c, m, s, heads) = (blk.channels, blk.window, blk.shift, blk.heads);
    let d = c / heads;
    let normed = f64v(&blk.norm1.forward(x).expect("norm1"));
    let hp = h + (m - h % m) % m;
    let wp = w + (m - w % m) % m;
    // padded, then rolled: shifted[r][q] = padded[(r + s) % hp][(q + s) % wp]
    let mut shifted = vec![0f64; n * hp * wp * c];
    for b in 0..n {
        for r in 0..hp {
            for q in 0..wp {
                let (sr, sq) = ((r + s) % hp, (q + s) % wp);
                if sr < h && sq < w {
                    let src = ((b * h + sr) * w + sq) * c;
                    shifted[((b * hp + r) * wp + q) * c..][..c].copy_from_slice(&normed[src..src + c]);
                }
            }
        }
    }
    let qkv = linear64(&shifted, &blk.qkv.weight, blk.qkv.bias.as_deref(), c, 3 * c);
    // img_mask regions from the slices (0:-m), (-m:-s), (-s:)
    let region = |v: usize, len: usize| if v < len - m { 0 } else if v < len - s { 1 } else { 2 };
    let cnt = |r: usize, q: usize| if s == 0 { 0 } else { region(r, hp) * 3 + region(q, wp) };
    // relative_position_index: coords = (2m-1)·i + j, index = (coords_a + coords_b) flipped on b
    let coords: Vec<usize> = (0..m * m).map(|t| (2 * m - 1) * (t / m) + t % m).collect();
    let index = |a: usize, bb: usize| coords[a] + coords[m * m - 1 - bb];
    let scale = blk.scale as f64;
    let mut out_shifted = vec![0f64; n * hp * wp * c];
    for b in 0..n {
        for wi in 0..hp / m {
            for wj in 0..wp / m {
                let tok = |a: usize| (b * hp + wi * m + a / m) * wp + wj * m + a % m;
                for hd in 0..heads {
                    for a in 0..m * m {
                        let ta = tok(a);
                        let qa: Vec<f64> = (0..d).map(|k| qkv[ta * 3 * c + hd * d + k] * scale).collect();
                        let mut logits = vec![0f64; m * m];
                        for (bb, l) in logits.iter_mut().enumerate() {
                            let tb = tok(bb);
                            let mut v: f64 = (0..d).map(|k| qa[k] * qkv[tb * 3 * c + c + hd * d + k]).sum();
                            v += table[index(a, bb) * heads + hd] as f64;
                            let (ra, qa_) = (wi * m + a / m, wj * m + a % m);
                            let (rb, qb) = (wi * m + bb / m, wj * m + bb % m);
                            if cnt(ra, qa_) != cnt(rb, qb) {
                                v += -100.0;
                            }
                            *l = v;
                        }
                        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                        for k in 0..d {
                            let acc: f64 = (0..m * m).map(|bb| (logits[bb] - max).exp() / z * qkv[tok(bb) * 3 * c + 2 * c + hd * d + k]).sum();
                            out_shifted[ta * c + hd * d + k] = acc;
                        }
                    }
                }
            }
        }
    }
    // roll back by +s and crop: x[r][q] = shifted_out[(r - s) mod hp][(q - s) mod wp]... i.e.
    // the token at padded (r, q) was computed at rolled ((r - s) mod hp, (q - s) mod wp)
    let mut att = vec![0f64; n * h * w * c];
    for b in 0..n {
        for r in 0..h {
            for q in 0..w {
                let (rr, rq) = ((r + hp - s) % hp, (q + wp - s) % wp);
                att[((b * h + r) * w + q) * c..][..c].copy_from_slice(&out_shifted[((b * hp + rr) * wp + rq) * c..][..c]);
            }
        }
    }
    linear64(&att, &blk.proj.weight, blk.proj.bias.as_deref(), c, c)
}

/// W-MSA and SW-MSA blocks against the literal upstream algorithm on odd maps (padding right and
/// bottom, including a map smaller than one window: upstream keeps window 7 and shift 3 there),
/// two images a batch; then the whole block (residuals, FFN with exact GELU).
#[test]
fn swin_blocks_match_the_literal_rolled_and_masked_attention() {
    let cfg = small();
    let enc = encoder(&cfg, 11);
    let t = tensors(&cfg, 11);
    let mut rng = Rng(17);
    for (stage, j, h, w) in [(1usize, 0usize, 9usize, 11usize), (1, 1, 9, 11), (1, 1, 4, 5), (1, 1, 14, 21), (2, 1, 10, 8)] {
        let blk = &enc.backbone.stages[stage].blocks[j];
        assert_eq!(blk.shift, if j == 1 { 3 } else { 0 });
        let table = &t[&format!("encoders.camera.backbone.stages.{stage}.blocks.{j}.attn.w_msa.relative_position_bias_table")].1;
        let n = 2;
        let c = blk.channels;
        let x = rand_vec(&mut rng, n * h * w * c, 1.5);
        let windows = StageWindows::build(n, h, w, 7, true).expect("windows");
        let got = blk.attention(&x, n, h, w, &windows).expect("attention");
        let want = to_f32(&literal_attention(blk, table, &x, n, h, w));
        let err = rel_err(&got, &want);
        eprintln!("stage {stage} block {j} {h}x{w}: attention rel err {err:.2e}");
        assert!(err < 1e-5, "stage {stage} block {j} {h}x{w}: attention rel err {err}");

        // the block: y = x + attn; out = y + fc2(gelu(fc1(norm2(y))))
        let y: Vec<f32> = want.iter().zip(&x).map(|(a, b)| a + b).collect();
        let n2 = blk.norm2.forward(&y).expect("norm2");
        let mut hid = blk.fc1.forward(&n2).expect("fc1");
        hid.iter_mut().for_each(|v| *v = gelu(*v));
        let f = blk.fc2.forward(&hid).expect("fc2");
        let want_block: Vec<f32> = f.iter().zip(&y).map(|(a, b)| a + b).collect();
        let got_block = blk.forward(&x, n, h, w, &windows).expect("block");
        let err = rel_err(&got_block, &want_block);
        assert!(err < 1e-5, "stage {stage} block {j} {h}x{w}: block rel err {err}");
    }
}

/// A logit gap the partition cannot reproduce: upstream's exp(-100) weight of a masked key is
/// visible once the masked logit is ~83 above the unmasked ones. Documented, not hidden: with a
/// q · k of that size (here forced through the q scale) the two differ; at random-weight scale
/// they agree (previous test).
#[test]
fn masked_keys_differ_only_at_logit_gaps_beyond_80() {
    let cfg = small();
    let enc = encoder(&cfg, 11);
    let t = tensors(&cfg, 11);
    let table = &t["encoders.camera.backbone.stages.1.blocks.1.attn.w_msa.relative_position_bias_table"].1;
    let mut blk = enc.backbone.stages[1].blocks[1].clone();
    let mut rng = Rng(23);
    let (n, h, w) = (1, 14, 14);
    let x = rand_vec(&mut rng, n * h * w * blk.channels, 1.5);
    let windows = StageWindows::build(n, h, w, 7, true).expect("windows");
    blk.scale *= 400.0; // logits of several hundred
    let got = blk.attention(&x, n, h, w, &windows).expect("attention");
    let want = to_f32(&literal_attention(&blk, table, &x, n, h, w));
    let err = rel_err(&got, &want);
    eprintln!("logits x400: rel err {err:.2e}");
    assert!(err > 1e-3, "with logit gaps of hundreds the -100 mask no longer hides keys (rel err {err})");
}

/// PatchMerging in mmdet's nn.Unfold order equals the original Swin PatchMerging (cat of
/// x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]) with its weights converted the
/// way mmdet's `swin_converter` converts them (new[c·4 + q] = orig[perm[q]·C + c],
/// perm = [0, 2, 1, 3]), on an odd-sized map (zero padding right and bottom).
#[test]
fn patch_merging_equals_original_swin_with_converted_weights() {
    let cfg = small();
    let enc = encoder(&cfg, 29);
    let t = tensors(&cfg, 29);
    let pm = enc.backbone.stages[1].downsample.as_ref().expect("stage 1 merges");
    let c = pm.channels;
    let get = |n: &str| &t[&format!("encoders.camera.backbone.stages.1.downsample.{n}")].1;
    let (g_new, b_new, r_new) = (get("norm.weight"), get("norm.bias"), get("reduction.weight"));
    let perm = [0usize, 2, 1, 3];
    let mut g = vec![0f32; 4 * c];
    let mut b = vec![0f32; 4 * c];
    let mut r = vec![0f32; 2 * c * 4 * c];
    for cc in 0..c {
        for q in 0..4 {
            g[perm[q] * c + cc] = g_new[cc * 4 + q];
            b[perm[q] * c + cc] = b_new[cc * 4 + q];
            for o in 0..2 * c {
                r[o * 4 * c + perm[q] * c + cc] = r_new[o * 4 * c + cc * 4 + q];
            }
        }
    }
    let mut rng = Rng(31);
    let (n, h, w) = (2usize, 5usize, 7usize);
    let x = rand_vec(&mut rng, n * h * w * c, 1.0);
    let (ho, wo) = (3, 4);
    let mut cat = vec![0f64; n * ho * wo * 4 * c];
    let slices = [(0usize, 0usize), (1, 0), (0, 1), (1, 1)]; // x0, x1, x2, x3: (row offset, col offset)
    for bi in 0..n {
        for i in 0..ho {
            for j in 0..wo {
                for (gi, (dr, dc)) in slices.iter().enumerate() {
                    let (y, xx) = (2 * i + dr, 2 * j + dc);
                    for cc in 0..c {
                        let v = if y < h && xx < w { x[((bi * h + y) * w + xx) * c + cc] as f64 } else { 0.0 };
                        cat[((bi * ho + i) * wo + j) * 4 * c + gi * c + cc] = v;
                    }
                }
            }
        }
    }
    let want = to_f32(&linear64(&layer_norm64(&cat, &g, &b), &r, None, 4 * c, 2 * c));
    let (got, gh, gw) = pm.forward(&x, n, h, w).expect("merge");
    assert_eq!((gh, gw), (ho, wo));
    let err = rel_err(&got, &want);
    assert!(err < 1e-5, "patch merging rel err {err}");
}

/// PyTorch's bilinear source index and weight for output `o` (align_corners False), f64.
fn taps(o: usize, input: usize, output: usize) -> (usize, usize, f64) {
    let src = ((o as f64 + 0.5) * input as f64 / output as f64 - 0.5).max(0.0);
    let i0 = (src.floor() as usize).min(input - 1);
    let i1 = (i0 + 1).min(input - 1);
    (i0, i1, src - i0 as f64)
}

/// ConvModule unfolded: conv (zero padding k/2, no bias), BatchNorm with running statistics
/// (eps 1e-5), ReLU; NHWC f64.
fn conv_bn_relu(x: &[f64], n: usize, h: usize, w: usize, cin: usize, t: &HashMap<String, (Vec<usize>, Vec<f32>)>, p: &str) -> Vec<f64> {
    let (shape, wt) = &t[&format!("{p}.conv.weight")];
    let (cout, k) = (shape[0], shape[2]);
    assert_eq!(shape[1], cin);
    let bn = |s: &str| &t[&format!("{p}.bn.{s}")].1;
    let (g, b, mean, var) = (bn("weight"), bn("bias"), bn("running_mean"), bn("running_var"));
    let pad = (k / 2) as isize;
    let mut y = vec![0f64; n * h * w * cout];
    for bi in 0..n {
        for r in 0..h {
            for q in 0..w {
                for o in 0..cout {
                    let mut s = 0f64;
                    for ky in 0..k {
                        for kx in 0..k {
                            let (yy, xx) = (r as isize + ky as isize - pad, q as isize + kx as isize - pad);
                            if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                                continue;
                            }
                            for ci in 0..cin {
                                s += x[((bi * h + yy as usize) * w + xx as usize) * cin + ci] * wt[((o * cin + ci) * k + ky) * k + kx] as f64;
                            }
                        }
                    }
                    let v = (s - mean[o] as f64) / (var[o] as f64 + 1e-5).sqrt() * g[o] as f64 + b[o] as f64;
                    y[((bi * h + r) * w + q) * cout + o] = v.max(0.0);
                }
            }
        }
    }
    y
}

/// The neck against its definition: top-down from the coarsest level, upsample (bilinear,
/// align_corners False) to the finer level's size, cat [finer, upsampled], 1 × 1 ConvModule, 3 × 3
/// ConvModule; BatchNorm unfolded. Level sizes as Swin's ceil-halving gives them for odd maps.
#[test]
fn neck_matches_its_definition() {
    let cfg = small();
    let enc = encoder(&cfg, 37);
    let t = tensors(&cfg, 37);
    let mut rng = Rng(41);
    let n = 2;
    let sizes = [(7usize, 11usize, 48usize), (4, 6, 96), (2, 3, 192)];
    let inputs: Vec<FeatureMap> = sizes
        .iter()
        .map(|&(h, w, c)| FeatureMap::new(n, h, w, c, rand_vec(&mut rng, n * h * w * c, 1.0)).expect("map"))
        .collect();
    let got = enc.neck.forward(&inputs).expect("neck");
    assert_eq!(got.len(), 2);
    let mut coarse: (Vec<f64>, usize, usize, usize) = (f64v(&inputs[2].data), 2, 3, 192);
    let mut want = vec![Vec::new(); 2];
    for i in (0..2).rev() {
        let (h, w, c) = sizes[i];
        let (ref cd, ch, cw, cc) = coarse;
        let ctot = c + cc;
        let mut cat = vec![0f64; n * h * w * ctot];
        for bi in 0..n {
            for r in 0..h {
                let (y0, y1, ly) = taps(r, ch, h);
                for q in 0..w {
                    let (x0, x1, lx) = taps(q, cw, w);
                    let o = ((bi * h + r) * w + q) * ctot;
                    for k in 0..c {
                        cat[o + k] = inputs[i].data[((bi * h + r) * w + q) * c + k] as f64;
                    }
                    let px = |yy: usize, xx: usize, k: usize| cd[((bi * ch + yy) * cw + xx) * cc + k];
                    for k in 0..cc {
                        cat[o + c + k] = (1.0 - ly) * ((1.0 - lx) * px(y0, x0, k) + lx * px(y0, x1, k)) + ly * ((1.0 - lx) * px(y1, x0, k) + lx * px(y1, x1, k));
                    }
                }
            }
        }
        let lat = conv_bn_relu(&cat, n, h, w, ctot, &t, &format!("encoders.camera.neck.lateral_convs.{i}"));
        let out = conv_bn_relu(&lat, n, h, w, 32, &t, &format!("encoders.camera.neck.fpn_convs.{i}"));
        want[i] = to_f32(&out);
        coarse = (out, h, w, 32);
    }
    for i in 0..2 {
        assert_eq!((got[i].n, got[i].h, got[i].w, got[i].c), (n, sizes[i].0, sizes[i].1, 32));
        let err = rel_err(&got[i].data, &want[i]);
        assert!(err < 1e-5, "neck output {i}: rel err {err}");
    }
}

/// A smooth, image-like input: normalized RGB, NHWC, with edges and gradients (deterministic).
fn synthetic_images(n: usize, h: usize, w: usize) -> Vec<f32> {
    let mut x = vec![0f32; n * 3 * h * w];
    for b in 0..n {
        for c in 0..3 {
            for y in 0..h {
                for xx in 0..w {
                    let (fy, fx) = (y as f32 / h as f32, xx as f32 / w as f32);
                    let v = (6.0 * fx + 2.0 * c as f32 + b as f32).sin() * (4.0 * fy).cos() + if fy > 0.6 { 0.8 } else { -0.3 };
                    x[((b * h + y) * w + xx) * 3 + c] = v;
                }
            }
        }
    }
    x
}

/// The whole reduced encoder: shapes at every stage and neck output, finite, deterministic, and
/// the images of a batch independent of each other.
#[test]
fn reduced_encoder_end_to_end() {
    let cfg = small();
    let enc = encoder(&cfg, 7);
    let (h, w) = (70, 130); // neither a multiple of 4 nor of 7 · 4 at any stage
    let x = synthetic_images(2, h, w);
    let out = enc.forward_cpu(&x, 2, h, w).expect("forward");
    let sizes = cfg.backbone.stage_sizes(h, w);
    assert_eq!(sizes, vec![[18, 33], [9, 17], [5, 9], [3, 5]]);
    for (k, s) in out.stages.iter().enumerate() {
        let i = cfg.backbone.out_indices[k];
        assert_eq!((s.n, s.h, s.w, s.c), (2, sizes[i][0], sizes[i][1], cfg.backbone.channels(i)), "stage {i}");
        assert!(s.data.iter().all(|v| v.is_finite()), "stage {i} not finite");
    }
    assert_eq!(out.neck.len(), 2);
    for (k, f) in out.neck.iter().enumerate() {
        assert_eq!((f.n, f.h, f.w, f.c), (2, sizes[k + 1][0], sizes[k + 1][1], 32));
        assert!(f.data.iter().all(|v| v.is_finite()));
        let std = (f.data.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / f.data.len() as f64).sqrt();
        assert!(std > 0.05 && std < 20.0, "neck {k}: rms {std} is not a sane activation scale");
    }
    let again = enc.forward_cpu(&x, 2, h, w).expect("forward");
    assert_eq!(out.neck[0].data, again.neck[0].data, "deterministic");
    // image 1 alone gives image 1's rows of the batch
    let one = enc.forward_cpu(&x[3 * h * w..], 1, h, w).expect("forward one");
    let half = out.neck[0].data.len() / 2;
    assert!(rel_err(&one.neck[0].data, &out.neck[0].data[half..]) < 1e-6);
}

/// The nuScenes CAM_FRONT JPEG of tests/data/nuscenes, decoded and preprocessed as BEVFusion's
/// camera YAML says (1600 x 900 -> resize 0.48 -> crop 256 x 704, normalized): NHWC.
fn nuscenes_front() -> Vec<f32> {
    let dir = common::data("nuscenes");
    let jpg = std::fs::read_dir(&dir)
        .expect("tests/data/nuscenes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains("__CAM_FRONT__"))
        .expect("the CAM_FRONT JPEG");
    let (x, n, h, w) = preprocess_files(&[jpg], &common::root().join("config/models/bevfusion_seg_camera.yaml")).expect("preprocess");
    assert_eq!((n, h, w), (1, 256, 704));
    x
}

/// The reduced encoder on a real camera image at BEVFusion's input size: every stage and neck
/// output at upstream's sizes (stride 8: 32 x 88, the view transform's grid), finite, at a sane
/// scale, deterministic.
#[test]
fn reduced_encoder_on_a_nuscenes_image() {
    let cfg = small();
    let enc = encoder(&cfg, 19);
    let x = nuscenes_front();
    let out = enc.forward_cpu(&x, 1, 256, 704).expect("forward");
    let shapes: Vec<_> = out.stages.iter().map(|m| (m.h, m.w, m.c)).collect();
    assert_eq!(shapes, vec![(32, 88, 48), (16, 44, 96), (8, 22, 192)]);
    let neck: Vec<_> = out.neck.iter().map(|m| (m.h, m.w, m.c)).collect();
    assert_eq!(neck, vec![(32, 88, 32), (16, 44, 32)]);
    for m in out.stages.iter().chain(&out.neck) {
        assert!(m.data.iter().all(|v| v.is_finite()));
        let rms = (m.data.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / m.data.len() as f64).sqrt();
        assert!(rms > 0.05 && rms < 20.0, "rms {rms} is not a sane activation scale");
    }
    // the picture shows: the neck's response differs between the image's top and bottom rows
    let row_mean = |r: usize| out.neck[0].data[r * 88 * 32..(r + 1) * 88 * 32].iter().map(|&v| v as f64).sum::<f64>();
    assert!((row_mean(2) - row_mean(29)).abs() > 1e-3, "rows of a real image give different features");
    assert_eq!(enc.forward_cpu(&x, 1, 256, 704).expect("forward").neck[0].data, out.neck[0].data, "deterministic");
}

fn with(cfg: &CameraEncoderConfig, seed: u64, f: impl FnOnce(&mut NamedTensors)) -> Result<CameraEncoder, ModelError> {
    let mut t = random_tensors(cfg, seed).expect("random");
    f(&mut t);
    CameraEncoder::from_weights(cfg, Weights::from_tensors("edited.safetensors", t)?)
}

#[test]
fn bad_weights_are_listed() {
    let cfg = small();
    let qkv = "encoders.camera.backbone.stages.0.blocks.0.attn.w_msa.qkv.weight";
    let gone = "encoders.camera.neck.fpn_convs.1.bn.running_mean";
    let e = with(&cfg, 1, |t| {
        for (name, shape, data) in t.iter_mut() {
            if name == qkv {
                *shape = vec![72, 25];
                data.extend(vec![0.0; 72]);
            }
        }
        t.retain(|(n, _, _)| n != gone);
        t.push(("encoders.camera.backbone.head.fc.weight".into(), vec![2], vec![0.0, 1.0]));
    })
    .expect_err("mismatch");
    match &e {
        ModelError::Mismatch { missing, unexpected, misshaped, .. } => {
            assert_eq!(missing, &vec![gone.to_string()]);
            assert_eq!(unexpected, &vec!["encoders.camera.backbone.head.fc.weight".to_string()]);
            assert_eq!(misshaped.len(), 1);
            assert_eq!((misshaped[0].name.as_str(), misshaped[0].expected.clone(), misshaped[0].found.clone()), (qkv, vec![72, 24], vec![72, 25]));
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("edited.safetensors") && text.contains(gone) && text.contains(qkv), "{text}");

    // another model's file: SphereFormer's weights
    let sf = sptr::models::sphereformer::config::ModelConfig::load(&common::root().join("config/models/sphereformer_nuscenes.yaml")).expect("sf config");
    let other = sptr::models::sphereformer::random::random_weights(&sf.yaml, 0).expect("sphereformer weights");
    match CameraEncoder::from_weights(&cfg, other) {
        Err(ModelError::Mismatch { missing, unexpected, .. }) => {
            assert_eq!(missing.len(), weight_specs(&cfg).expect("specs").len());
            assert!(unexpected.iter().any(|n| n.starts_with("unet.")));
        }
        other => panic!("SphereFormer weights must not load: {other:?}"),
    }

    // a BatchNorm variance that cannot be folded
    let e = with(&cfg, 1, |t| {
        for (name, _, data) in t.iter_mut() {
            if name == "encoders.camera.neck.lateral_convs.0.bn.running_var" {
                data[3] = -1.0;
            }
        }
    })
    .expect_err("negative variance");
    assert!(e.to_string().contains("lateral_convs.0.bn.running_var"), "{e}");
}

/// Upstream's checkpoint layout: a `module.` prefix, F16 tensors, int64 relative_position_index
/// buffers and num_batches_tracked counters all load; an index for another window does not.
#[test]
fn checkpoint_buffers_prefix_and_half_precision() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let cfg = small();
    let t = random_tensors(&cfg, 5).expect("random");
    let reference = CameraEncoder::from_weights(&cfg, Weights::from_tensors("ref", t.clone()).expect("w")).expect("builds");

    let bufs = buffer_specs(&cfg);
    let index_bytes = |vals: &[f32]| -> Vec<u8> { vals.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect() };
    let make = |index: &[f32], shape: Vec<usize>| -> Vec<u8> {
        let halves: Vec<Vec<u8>> = t.iter().map(|(_, _, v)| v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()).collect();
        let ib = index_bytes(index);
        let counter = 7i64.to_le_bytes().to_vec();
        let mut views: Vec<(String, TensorView)> = t
            .iter()
            .zip(&halves)
            .map(|((n, s, _), b)| (format!("module.{n}"), TensorView::new(Dtype::F16, s.clone(), b).expect("view")))
            .collect();
        for (spec, _) in &bufs {
            views.push((format!("module.{}", spec.name), TensorView::new(Dtype::I64, shape.clone(), &ib).expect("index view")));
        }
        views.push(("module.encoders.camera.neck.fpn_convs.0.bn.num_batches_tracked".into(), TensorView::new(Dtype::I64, vec![], &counter).expect("counter")));
        safetensors::serialize(views, None).expect("serialize")
    };
    let index = bufs[0].1.clone();
    assert_eq!((index[0], index[48], index[48 * 49]), (84.0, 0.0, 168.0), "(dr + 6) * 13 + (dc + 6) for dr, dc = 0, -6, +6");
    let bytes = make(&index, vec![49, 49]);
    let w = Weights::from_bytes(&bytes, "ckpt.safetensors").expect("reads");
    let enc = CameraEncoder::from_weights(&cfg, w).expect("a checkpoint with buffers loads");
    let x = synthetic_images(1, 40, 56);
    let a = enc.forward_cpu(&x, 1, 40, 56).expect("fwd");
    let b = reference.forward_cpu(&x, 1, 40, 56).expect("fwd");
    // F16 weights: relative error of a few 1e-4 through the network
    let err = rel_err(&a.neck[0].data, &b.neck[0].data);
    assert!(err < 5e-3, "f16 weights rel err {err}");

    let mut wrong = index.clone();
    wrong.swap(0, 1);
    let e = CameraEncoder::from_weights(&cfg, Weights::from_bytes(&make(&wrong, vec![49, 49]), "w.safetensors").expect("reads")).expect_err("wrong index");
    assert!(e.to_string().contains("relative_position_index") && e.to_string().contains("window"), "{e}");
    let e = CameraEncoder::from_weights(&cfg, Weights::from_bytes(&make(&index[..48 * 49], vec![48, 49]), "w.safetensors").expect("reads"))
        .expect_err("mis-shaped index");
    match e {
        ModelError::Mismatch { misshaped, missing, unexpected, .. } => {
            assert!(missing.is_empty() && unexpected.is_empty());
            assert_eq!(misshaped.len(), bufs.len());
            assert_eq!(misshaped[0].found, vec![48, 49]);
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // a float file round trip through our writer
    let refs: Vec<(&str, &[usize], &[f32])> = t.iter().map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice())).collect();
    let bytes = safetensors_bytes(&refs).expect("bytes");
    let enc = CameraEncoder::from_weights(&cfg, Weights::from_bytes(&bytes, "f32").expect("reads")).expect("loads");
    let c = enc.forward_cpu(&x, 1, 40, 56).expect("fwd");
    assert_eq!(c.neck[0].data, b.neck[0].data);
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let bad = |from: &str, to: &str| {
        let text = SMALL.replace(from, to);
        assert_ne!(text, SMALL, "the edit {from} -> {to} applies");
        CameraEncoderConfig::parse(&text, "bad.yaml").expect_err(to).to_string()
    };
    let e = bad("num_heads: [1, 2, 2, 4]", "num_heads: [1, 5, 2, 4]");
    assert!(e.contains("num_heads") && e.contains("48 channels"), "{e}");
    let e = bad("num_heads: [1, 2, 2, 4]", "num_heads: [1, 2, 2]");
    assert!(e.contains("num_heads"), "{e}");
    let e = bad("in_channels: [48, 96, 192]", "in_channels: [48, 96, 190]");
    assert!(e.contains("in_channels") && e.contains("[48, 96, 192]"), "{e}");
    let e = bad("out_indices: [1, 2, 3]", "out_indices: [2, 1]");
    assert!(e.contains("out_indices"), "{e}");
    let e = bad("out_indices: [1, 2, 3]", "out_indices: [1, 2, 4]");
    assert!(e.contains("out_indices"), "{e}");
    let e = bad("window_size: 7", "window_size: 0");
    assert!(e.contains("window_size"), "{e}");
    let e = bad("mlp_ratio: 4", "mlp_ratio: 4.5");
    assert!(e.contains("mlp_ratio"), "{e}");
    let e = bad("type: SwinTransformer", "type: ResNet");
    assert!(e.contains("SwinTransformer"), "{e}");
    let e = bad("qk_scale: null", "qk_scale: null\n        window_sizes: 7");
    assert!(e.contains("window_sizes"), "unknown keys are named: {e}");
    let e = bad("start_level: 0", "start_level: 1");
    assert!(e.contains("start_level"), "{e}");
    let e = bad("mode: bilinear", "mode: nearest");
    assert!(e.contains("nearest"), "{e}");
    let e = bad("{type: ReLU}", "{type: GELU}");
    assert!(e.contains("act_cfg"), "{e}");
    let e = bad("      neck:", "      necks:");
    assert!(e.contains("model.encoders.camera.neck"), "{e}");
    // training-only upstream keys are accepted
    let ok = SMALL.replace("qk_scale: null", "qk_scale: null\n        drop_path_rate: 0.3\n        with_cp: false\n        convert_weights: true\n        init_cfg: {type: Pretrained, checkpoint: x.pth}");
    CameraEncoderConfig::parse(&ok, "ok.yaml").expect("upstream's training keys are ignored");

    let cfg = small();
    let enc = encoder(&cfg, 2);
    assert!(enc.forward_cpu(&[0.0; 3 * 8 * 8 - 1], 1, 8, 8).is_err(), "short input");
    assert!(enc.forward_cpu(&[], 0, 8, 8).is_err(), "no images");
    assert!(enc.forward_cpu(&[], 1, 0, 8).is_err(), "zero height");
    let maps = vec![FeatureMap::zeros(1, 4, 4, 48).expect("map"), FeatureMap::zeros(1, 2, 2, 96).expect("map")];
    assert!(enc.neck.forward(&maps).is_err(), "two inputs for three levels");
}
