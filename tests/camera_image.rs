//! Camera input on the CPU: `sensor_msgs/Image` encodings against known pixels, JPEG and PNG
//! `CompressedImage`s (the real nuScenes JPEGs against Pillow's decode), every bad input, and
//! BEVFusion's preprocessing (crop rule, Pillow's bicubic resize bit for bit against references
//! written by Pillow, a naive implementation, torchvision's normalization).
//!
//! References: tests/data/camera/ (tests/fixtures/make_camera_refs.py, Pillow 13 + numpy).

mod common;

use common::Rng;
use sptr::sensors::image::compressed::{decode_compressed, decode_jpeg, decode_png};
use sptr::sensors::image::encodings::{decode_raw, yuv_to_rgb, DecodeLimits, ImageError, RawImage, RgbImage};
use sptr::ops::image_preprocess::cpu::{bicubic_taps, image_aug_matrix, preprocess_cpu, resize_crop, ImageAug, ImagePreprocess, ResizeTaps};

const CAMS: [&str; 6] = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];

fn limits() -> DecodeLimits {
    DecodeLimits::default()
}

fn nuscenes_jpeg(cam: &str) -> Vec<u8> {
    let dir = common::data("nuscenes");
    let path = std::fs::read_dir(&dir)
        .expect("tests/data/nuscenes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains(&format!("__{cam}__")) && p.extension().is_some_and(|e| e == "jpg"))
        .unwrap_or_else(|| panic!("a {cam} JPEG in tests/data/nuscenes"));
    std::fs::read(path).expect("read JPEG")
}

fn png_file(rel: &str) -> RgbImage {
    let bytes = std::fs::read(common::data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    decode_png(&bytes, &limits()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A raw image's data: `rows` of pixel bytes, each padded to `step` bytes with 0xEE (which must
/// never show up in the output).
fn raw(rows: &[Vec<u8>], step: u32) -> Vec<u8> {
    let mut d = Vec::new();
    for r in rows {
        d.extend_from_slice(r);
        d.resize(d.len() + step as usize - r.len(), 0xEE);
    }
    d
}

fn decode(width: u32, height: u32, encoding: &str, step: u32, data: &[u8]) -> Result<RgbImage, ImageError> {
    decode_raw(RawImage { width, height, encoding, step, data }, &limits())
}

// The same 4 x 2 picture in every encoding: row 0 red, green, blue, white; row 1 black,
// (10, 20, 30), (200, 100, 50), (1, 2, 3).
const PICTURE: [[u8; 3]; 8] = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0], [10, 20, 30], [200, 100, 50], [1, 2, 3]];

fn expected_picture() -> RgbImage {
    RgbImage { width: 4, height: 2, data: PICTURE.iter().flatten().copied().collect() }
}

fn rows_of(f: impl Fn([u8; 3]) -> Vec<u8>) -> Vec<Vec<u8>> {
    PICTURE.chunks(4).map(|row| row.iter().flat_map(|&p| f(p)).collect()).collect()
}

#[test]
fn rgb_bgr_rgba_bgra_with_row_padding() {
    type Layout = fn([u8; 3]) -> Vec<u8>;
    let cases: [(&str, usize, Layout); 4] = [
        ("rgb8", 3, |p| p.to_vec()),
        ("bgr8", 3, |p| vec![p[2], p[1], p[0]]),
        ("rgba8", 4, |p| vec![p[0], p[1], p[2], 77]),
        ("bgra8", 4, |p| vec![p[2], p[1], p[0], 77]),
    ];
    for (enc, bpp, f) in cases {
        for pad in [0u32, 1, 5] {
            let step = 4 * bpp as u32 + pad;
            let data = raw(&rows_of(f), step);
            let img = decode(4, 2, enc, step, &data).unwrap_or_else(|e| panic!("{enc} pad {pad}: {e}"));
            assert_eq!(img, expected_picture(), "{enc} with {pad} bytes of row padding");
        }
    }
}

#[test]
fn mono8_is_copied_to_all_channels() {
    let rows = vec![vec![0u8, 17, 128, 255], vec![3, 4, 5, 6]];
    let data = raw(&rows, 7);
    let img = decode(4, 2, "mono8", 7, &data).expect("mono8");
    let want: Vec<u8> = [0u8, 17, 128, 255, 3, 4, 5, 6].iter().flat_map(|&v| [v, v, v]).collect();
    assert_eq!(img.data, want);
}

/// YUV (Y, U, V) → RGB by BT.601 limited range as OpenCV's fixed point gives it; each checked by
/// hand against R = 1.164(Y−16) + 1.596(V−128), G = 1.164(Y−16) − 0.813(V−128) − 0.391(U−128),
/// B = 1.164(Y−16) + 2.018(U−128), rounded and clamped (the float formula is within 0.6 of
/// every value; where it lands on .4-.6 the fixed point decides).
const YUV_CASES: [([u8; 3], [u8; 3]); 9] = [
    ([16, 128, 128], [0, 0, 0]),
    ([235, 128, 128], [255, 255, 255]),
    ([81, 90, 240], [254, 0, 0]),
    ([145, 54, 34], [0, 255, 1]),
    ([41, 240, 110], [0, 0, 255]),
    ([128, 128, 128], [130, 130, 130]),
    ([0, 0, 0], [0, 154, 0]),
    ([255, 255, 255], [255, 125, 255]),
    ([100, 200, 60], [0, 125, 243]),
];

#[test]
fn yuv_to_rgb_matches_bt601_values() {
    for ([y, u, v], want) in YUV_CASES {
        assert_eq!(yuv_to_rgb(y, u, v), want, "Y {y} U {u} V {v}");
    }
}

#[test]
fn uyvy_and_yuyv_share_chroma_per_pixel_pair() {
    // Two pixel pairs per row (width 4), two rows; each pair uses two of the cases' Y values with
    // one chroma, so both pixels of a pair come out of yuv_to_rgb with the same U, V.
    let pairs = [([16u8, 235], 128u8, 128u8), ([81, 145], 90, 240), ([41, 128], 240, 110), ([0, 255], 54, 34)];
    let mut want = Vec::new();
    for (ys, u, v) in pairs {
        for y in ys {
            want.extend_from_slice(&yuv_to_rgb(y, u, v));
        }
    }
    // The shared-chroma values by hand for the first two pairs (Y from the table above).
    assert_eq!(&want[..6], &[0, 0, 0, 255, 255, 255]);
    assert_eq!(&want[6..9], &[254, 0, 0]);
    let uyvy: Vec<Vec<u8>> = pairs.chunks(2).map(|r| r.iter().flat_map(|&(y, u, v)| [u, y[0], v, y[1]]).collect()).collect();
    let yuyv: Vec<Vec<u8>> = pairs.chunks(2).map(|r| r.iter().flat_map(|&(y, u, v)| [y[0], u, y[1], v]).collect()).collect();
    for (enc, rows) in [("uyvy", &uyvy), ("yuv422", &uyvy), ("yuyv", &yuyv), ("yuv422_yuy2", &yuyv)] {
        for step in [8u32, 12] {
            let img = decode(4, 2, enc, step, &raw(rows, step)).unwrap_or_else(|e| panic!("{enc}: {e}"));
            assert_eq!(img.data, want, "{enc} step {step}");
        }
    }
}

#[test]
fn raw_image_errors() {
    let d = vec![0u8; 1000];
    let e = |w, h, enc: &str, step, data: &[u8]| decode(w, h, enc, step, data).expect_err("must fail");
    assert!(matches!(e(4, 2, "rgb16", 24, &d), ImageError::UnknownEncoding(s) if s == "rgb16"));
    assert!(matches!(e(4, 2, "RGB8", 12, &d), ImageError::UnknownEncoding(_)), "names are exact, as in cv_bridge");
    assert!(matches!(e(4, 2, "bayer_rggb8", 4, &d), ImageError::UnknownEncoding(_)));
    assert!(matches!(e(0, 2, "rgb8", 12, &d), ImageError::ZeroSize { width: 0, height: 2 }));
    assert!(matches!(e(4, 0, "rgb8", 12, &d), ImageError::ZeroSize { width: 4, height: 0 }));
    assert!(matches!(e(4, 2, "rgb8", 11, &d), ImageError::StepTooSmall { step: 11, width: 4, bytes_per_pixel: 3, .. }));
    assert!(matches!(e(4, 2, "bgra8", 15, &d), ImageError::StepTooSmall { bytes_per_pixel: 4, .. }));
    assert!(matches!(e(4, 2, "rgb8", 12, &d[..23]), ImageError::DataTooShort { len: 23, height: 2, step: 12 }));
    // The last row's padding counts too (height * step, as the message definition says).
    assert!(matches!(e(4, 2, "rgb8", 14, &d[..26]), ImageError::DataTooShort { len: 26, .. }));
    assert!(matches!(e(3, 2, "uyvy", 6, &d), ImageError::OddWidth { width: 3, .. }));
    assert!(matches!(e(5, 1, "yuv422_yuy2", 10, &d), ImageError::OddWidth { width: 5, .. }));
    // The pixel limit, before anything is allocated: a header of u32::MAX x u32::MAX.
    assert!(matches!(e(u32::MAX, u32::MAX, "mono8", u32::MAX, &d), ImageError::TooLarge { .. }));
    let small = DecodeLimits { max_pixels: 7 };
    let r = decode_raw(RawImage { width: 4, height: 2, encoding: "rgb8", step: 12, data: &d }, &small);
    assert!(matches!(r, Err(ImageError::TooLarge { width: 4, height: 2, max_pixels: 7 })));
    let ok = decode_raw(RawImage { width: 4, height: 2, encoding: "rgb8", step: 12, data: &d }, &DecodeLimits { max_pixels: 8 });
    assert!(ok.is_ok(), "exactly max_pixels is allowed");
    // Every message says what was wrong.
    let msg = e(4, 2, "rgb8", 11, &d).to_string();
    assert!(msg.contains("step 11") && msg.contains("width 4"), "{msg}");
}

#[test]
fn nuscenes_jpegs_decode_close_to_pillow() {
    // Reference: Pillow's libjpeg-turbo decode (ISLOW IDCT, fancy upsampling) at every 25th pixel
    // and row. zune-jpeg's integer IDCT is a different (standard-conforming) approximation, so
    // values differ by a few levels in places: measured on these six images over all pixels max 4,
    // mean 0.078. Bounds: max 5, mean 0.15 — a wrong channel order, upsampling or colour matrix
    // moves hundreds of pixels by tens of levels.
    for cam in CAMS {
        let img = decode_compressed("jpeg", &nuscenes_jpeg(cam), &limits()).unwrap_or_else(|e| panic!("{cam}: {e}"));
        assert_eq!((img.width, img.height), (1600, 900), "{cam}");
        let refs = png_file(&format!("camera/jpeg_samples/{cam}.png"));
        assert_eq!((refs.width, refs.height), (64, 36));
        let (mut max, mut sum, mut n) = (0u8, 0u64, 0u64);
        for y in 0..refs.height {
            for x in 0..refs.width {
                let (a, b) = (img.pixel(x * 25, y * 25).expect("inside"), refs.pixel(x, y).expect("inside"));
                for c in 0..3 {
                    let d = a[c].abs_diff(b[c]);
                    max = max.max(d);
                    sum += d as u64;
                    n += 1;
                }
            }
        }
        let mean = sum as f64 / n as f64;
        eprintln!("{cam}: vs Pillow at {n} samples: max abs {max}, mean abs {mean:.4}");
        assert!(max <= 5 && mean <= 0.15, "{cam}: max {max}, mean {mean}");
    }
}

#[test]
fn grey_jpeg_is_expanded_to_rgb() {
    let jpg = std::fs::read(common::data("camera/gray.jpg")).expect("gray.jpg");
    let img = decode_jpeg(&jpg, &limits()).expect("grey JPEG");
    let refs = png_file("camera/gray.png");
    assert_eq!((img.width, img.height), (24, 16));
    for (p, r) in img.data.chunks_exact(3).zip(refs.data.chunks_exact(3)) {
        assert!(p[0] == p[1] && p[1] == p[2], "grey copied to R = G = B");
        assert!(p[0].abs_diff(r[0]) <= 2, "grey value {} vs Pillow {}", p[0], r[0]);
    }
}

fn small_jpeg() -> Vec<u8> {
    std::fs::read(common::data("camera/small.jpg")).expect("small.jpg")
}

#[test]
fn small_colour_jpeg_matches_pillow() {
    let img = decode_jpeg(&small_jpeg(), &limits()).expect("small.jpg");
    let refs = png_file("camera/small.png");
    assert_eq!((img.width, img.height), (64, 40));
    let max = img.data.iter().zip(&refs.data).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
    assert!(max <= 5, "max abs difference from Pillow {max}");
}

#[test]
fn compressed_format_strings() {
    let jpg = small_jpeg();
    let want = decode_jpeg(&jpg, &limits()).expect("jpeg");
    for f in ["jpeg", "jpg", "JPEG", "rgb8; jpeg compressed bgr8", "bgr8; jpeg compressed bgr8", "mono8; jpeg compressed mono8", "image/jpeg", ""] {
        assert_eq!(decode_compressed(f, &jpg, &limits()).unwrap_or_else(|e| panic!("`{f}`: {e}")), want, "format `{f}`");
    }
    let png = encode_png(&want, png::ColorType::Rgb, png::BitDepth::Eight);
    for f in ["png", "bgr8; png compressed bgr8", "rgb8; png compressed rgb8", ""] {
        assert_eq!(decode_compressed(f, &png, &limits()).unwrap_or_else(|e| panic!("`{f}`: {e}")), want, "format `{f}`");
    }
    // The data decides between the two: a PNG labelled jpeg still decodes.
    assert_eq!(decode_compressed("jpeg", &png, &limits()).expect("mislabelled"), want);
}

#[test]
fn compressed_errors() {
    let jpg = small_jpeg();
    let l = limits();
    assert!(matches!(decode_compressed("tiff", &jpg, &l), Err(ImageError::UnknownFormat(f)) if f == "tiff"));
    assert!(matches!(decode_compressed("16UC1; compressedDepth png", &jpg, &l), Err(ImageError::UnknownFormat(_))));
    assert!(matches!(decode_compressed("jpeg", b"GIF89a....", &l), Err(ImageError::UnknownSignature { .. })));
    assert!(matches!(decode_compressed("jpeg", &[], &l), Err(ImageError::UnknownSignature { .. })));
    // Truncated anywhere: in the headers, or in the entropy-coded data (strict mode: no grey fill).
    let sos = find_marker(&jpg, 0xDA).expect("SOS marker");
    for cut in [3, 20, 200, sos + 10, (sos + jpg.len()) / 2, jpg.len() - 10] {
        let r = decode_compressed("jpeg", &jpg[..cut], &l);
        assert!(matches!(r, Err(ImageError::Jpeg(_))), "JPEG cut at {cut} of {} bytes: {r:?}", jpg.len());
    }
    // The real camera image cut short in its scan data.
    let big = nuscenes_jpeg("CAM_BACK");
    let r = decode_compressed("jpeg", &big[..big.len() - 2000], &l);
    assert!(matches!(r, Err(ImageError::Jpeg(_))), "nuScenes JPEG cut 2000 bytes short: {r:?}");
    // Corrupt: the scan data overwritten with noise; the SOF0 sample precision changed.
    let mut rng = Rng(18);
    let mut noisy = jpg.clone();
    for b in noisy[sos + 20..].iter_mut() {
        *b = rng.next() as u8;
    }
    assert!(matches!(decode_compressed("jpeg", &noisy, &l), Err(ImageError::Jpeg(_))), "noise after SOS");
    let mut bad_sof = jpg.clone();
    let sof = find_marker(&jpg, 0xC0).expect("SOF0 marker");
    bad_sof[sof + 4] = 0; // precision 0 bits
    assert!(matches!(decode_compressed("jpeg", &bad_sof, &l), Err(ImageError::Jpeg(_))));
    // The pixel limit is checked from the header, before the image is allocated.
    let small = DecodeLimits { max_pixels: 64 * 40 - 1 };
    assert!(matches!(decode_compressed("jpeg", &jpg, &small), Err(ImageError::TooLarge { width: 64, height: 40, .. })));
    let mut huge = jpg.clone();
    huge[sof + 5..sof + 9].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]); // 65535 x 65535 declared
    assert!(matches!(decode_compressed("jpeg", &huge, &l), Err(ImageError::TooLarge { width: 65535, height: 65535, .. })));

    let img = decode_jpeg(&jpg, &l).expect("jpeg");
    let png = encode_png(&img, png::ColorType::Rgb, png::BitDepth::Eight);
    for cut in [10, 40, png.len() / 2, png.len() - 20] {
        assert!(matches!(decode_compressed("png", &png[..cut], &l), Err(ImageError::Png(_))), "PNG cut at {cut}");
    }
    let mut bad_crc = png.clone();
    let mid = png.len() / 2;
    bad_crc[mid] ^= 0x55;
    assert!(matches!(decode_compressed("png", &bad_crc, &l), Err(ImageError::Png(_))), "PNG with a flipped byte");
    assert!(matches!(decode_compressed("png", &png, &small), Err(ImageError::TooLarge { width: 64, height: 40, .. })));
    let mut huge_png = png.clone();
    huge_png[16..24].copy_from_slice(&[0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF]); // IHDR width, height
    let r = decode_compressed("png", &huge_png, &l);
    assert!(matches!(r, Err(ImageError::Png(_)) | Err(ImageError::TooLarge { .. })), "{r:?}");
}

/// Offset of the first `FF code` marker.
fn find_marker(d: &[u8], code: u8) -> Option<usize> {
    d.windows(2).position(|w| w[0] == 0xFF && w[1] == code)
}

fn encode_png(img: &RgbImage, color: png::ColorType, depth: png::BitDepth) -> Vec<u8> {
    let channels = match color {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => 1,
    };
    let bytes = if depth == png::BitDepth::Sixteen { 2 } else { 1 };
    let mut data = Vec::new();
    for p in img.data.chunks_exact(3) {
        let px: Vec<u8> = match channels {
            1 => vec![p[0]],
            2 => vec![p[0], 9],
            3 => p.to_vec(),
            _ => vec![p[0], p[1], p[2], 9],
        };
        for v in px {
            // 16-bit samples: the high byte is the value, the low byte noise the decoder drops.
            data.push(v);
            if bytes == 2 {
                data.push(0x5A);
            }
        }
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, img.width as u32, img.height as u32);
        enc.set_color(color);
        enc.set_depth(depth);
        let mut w = enc.write_header().expect("png header");
        w.write_image_data(&data).expect("png data");
    }
    out
}

#[test]
fn png_round_trips() {
    let mut rng = Rng(7);
    let img = RgbImage { width: 13, height: 5, data: (0..13 * 5 * 3).map(|_| rng.next() as u8).collect() };
    let grey = RgbImage { width: 13, height: 5, data: img.data.chunks_exact(3).flat_map(|p| [p[0]; 3]).collect() };
    let l = limits();
    for (color, depth, want) in [
        (png::ColorType::Rgb, png::BitDepth::Eight, &img),
        (png::ColorType::Rgba, png::BitDepth::Eight, &img),
        (png::ColorType::Rgb, png::BitDepth::Sixteen, &img),
        (png::ColorType::Rgba, png::BitDepth::Sixteen, &img),
        (png::ColorType::Grayscale, png::BitDepth::Eight, &grey),
        (png::ColorType::GrayscaleAlpha, png::BitDepth::Eight, &grey),
        (png::ColorType::Grayscale, png::BitDepth::Sixteen, &grey),
    ] {
        let bytes = encode_png(&img, color, depth);
        let got = decode_compressed("png", &bytes, &l).unwrap_or_else(|e| panic!("{color:?} {depth:?}: {e}"));
        assert_eq!(&got, want, "{color:?} {depth:?}");
    }
    // A palette PNG: indices into a 3-entry palette.
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, 3, 1);
        enc.set_color(png::ColorType::Indexed);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_palette(vec![1, 2, 3, 40, 50, 60, 200, 210, 220]);
        let mut w = enc.write_header().expect("header");
        w.write_image_data(&[2, 0, 1]).expect("data");
    }
    let got = decode_png(&out, &l).expect("palette PNG");
    assert_eq!(got.data, vec![200, 210, 220, 1, 2, 3, 40, 50, 60]);
}

// --- preprocessing ---------------------------------------------------------------------------

fn cfg_with(out: [usize; 2], resize: f64, bot: f64) -> ImagePreprocess {
    ImagePreprocess { out_h: out[0], out_w: out[1], resize_lim: [resize, resize], bot_pct_lim: [bot, bot], ..ImagePreprocess::bevfusion_nuscenes() }
}

#[test]
fn the_model_yaml_gives_bevfusions_settings() {
    let cfg = ImagePreprocess::load(&common::root().join("config/models/bevfusion_seg_camera.yaml")).expect("camera model YAML");
    assert_eq!(cfg, ImagePreprocess::bevfusion_nuscenes());
    assert_eq!(cfg.resize(), 0.48);
}

#[test]
fn bad_preprocessing_yaml_is_an_error() {
    let good = "image_size: [256, 704]\naugment2d:\n  resize: [[0.38, 0.55], [0.48, 0.48]]\nbot_pct_lim: [0.0, 0.0]\nimage_normalize:\n  mean: [0.485, 0.456, 0.406]\n  std: [0.229, 0.224, 0.225]\n";
    assert!(ImagePreprocess::parse(good, "t.yaml").is_ok());
    for (from, to, key) in [
        ("[256, 704]", "[0, 704]", "image_size"),
        ("[[0.38, 0.55], [0.48, 0.48]]", "[[0.48, 0.48]]", "augment2d.resize"),
        ("[[0.38, 0.55], [0.48, 0.48]]", "[[0.38, 0.55], [0.0, 0.48]]", "augment2d.resize"),
        ("bot_pct_lim: [0.0, 0.0]", "bot_pct_lim: [0.0, 1.0]", "bot_pct_lim"),
        ("std: [0.229, 0.224, 0.225]", "std: [0.229, 0.0, 0.225]", "image_normalize"),
    ] {
        let text = good.replace(from, to);
        let e = ImagePreprocess::parse(&text, "t.yaml").expect_err(to).to_string();
        assert!(e.contains(key) && e.contains("t.yaml"), "{to}: {e}");
    }
    let e = ImagePreprocess::parse("image_size: [256, 704]\n", "t.yaml").expect_err("missing keys").to_string();
    assert!(e.contains("augment2d") || e.contains("missing"), "{e}");
}

#[test]
fn crop_box_rule_for_several_sizes() {
    let cfg = ImagePreprocess::bevfusion_nuscenes();
    // (W, H) -> (newW, newH), crop [x0, y0, x1, y1]: int(W * 0.48), y0 = newH - 256,
    // x0 = int(max(0, newW - 704) / 2).
    let cases = [
        ((1600, 900), [768, 432], [32, 176, 736, 432]),
        ((1920, 1080), [921, 518], [108, 262, 812, 518]),
        ((1280, 720), [614, 345], [0, 89, 704, 345]),
        ((640, 480), [307, 230], [0, -26, 704, 230]),
        ((1600, 1200), [768, 576], [32, 320, 736, 576]),
    ];
    for ((w, h), resized, crop) in cases {
        let a = cfg.aug_for(w, h).expect("aug");
        assert_eq!(a.resized, resized, "{w} x {h}");
        assert_eq!(a.crop, crop, "{w} x {h}");
        assert_eq!(a.out, [256, 704]);
        assert_eq!(a.resize, 0.48);
    }
    // bot_pct_lim cuts the bottom: 1600 x 900 at 0.48 with mean 0.1 -> y0 = int(0.9 * 432) - 256.
    let a = cfg_with([256, 704], 0.48, 0.1).aug_for(1600, 900).expect("aug");
    assert_eq!(a.crop, [32, 132, 736, 388]);
    // The resize of the crop reads input rows 364..900 only (what the CUDA path uploads).
    let taps = ResizeTaps::new(&cfg.aug_for(1600, 900).expect("aug")).expect("taps");
    assert_eq!(taps.vertical.input_range(), (364, 900));
    assert_eq!(taps.horizontal.input_range(), (64, 1536));
    let m = image_aug_matrix(&cfg.aug_for(1600, 900).expect("aug"));
    assert_eq!(m, [[0.48, 0.0, 0.0, -32.0], [0.0, 0.48, 0.0, -176.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]);
    assert!(matches!(cfg.aug_for(2, 2), Err(ImageError::TooSmallToResize { .. })), "0.96 x 0.96 pixels left");
}

#[test]
fn bicubic_taps_are_pillows() {
    // 1600 -> 768: scale 2.0833, support 4.1667, ksize 11; output 0 centred at 1.0417 reads
    // inputs 0..6 (xmin = int(1.0417 - 4.1667 + 0.5) = int(-2.6) = -2 -> 0, xmax = int(5.71) = 5).
    let t = bicubic_taps(1600, 768, 0, 768).expect("taps");
    assert_eq!(t.ksize, 11);
    assert_eq!((t.first[0], t.count[0]), (0, 5));
    // Every row sums to 1.0 in 22-bit fixed point up to the rounding of each weight.
    for o in 0..768 {
        let s: i32 = t.coeffs[o * 11..o * 11 + t.count[o] as usize].iter().sum();
        assert!((s - (1 << 22)).abs() <= t.count[o], "output {o}: sum {s}");
    }
    // Identity resize: one weight of exactly 1.0 per output.
    let id = bicubic_taps(10, 10, 0, 10).expect("identity");
    for o in 0..10 {
        let n = id.count[o] as usize;
        let k = &id.coeffs[o * id.ksize..o * id.ksize + n];
        assert_eq!(k.iter().filter(|&&v| v != 0).count(), 1, "output {o}: {k:?}");
        assert_eq!(k[o - id.first[o] as usize], 1 << 22);
    }
    // Outside the resized axis: no taps.
    let c = bicubic_taps(100, 48, -3, 60).expect("window");
    assert!(c.count[..3].iter().all(|&n| n == 0) && c.count[51..].iter().all(|&n| n == 0));
    assert!(c.count[3..51].iter().all(|&n| n > 0));
}

#[test]
fn resize_and_crop_equal_pillow_bit_for_bit() {
    let input = png_file("camera/resize_input.png");
    assert_eq!((input.width, input.height), (320, 180));
    for (name, out, resize, bot) in
        [("small", [64, 128], 0.48, 0.0), ("up", [200, 400], 1.3, 0.0), ("border", [100, 200], 0.48, 0.0), ("bottom", [48, 96], 0.6, 0.2)]
    {
        let cfg = cfg_with(out, resize, bot);
        let aug = cfg.aug_for(320, 180).expect("aug");
        let taps = ResizeTaps::new(&aug).expect("taps");
        let got = resize_crop(&input, &aug, &taps).expect("resize");
        let want = png_file(&format!("camera/resize_{name}.png"));
        assert_eq!((want.width, want.height), (out[1], out[0]), "{name}");
        let diff = got.iter().zip(&want.data).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "{name}: {diff} of {} values differ from Pillow (crop {:?})", got.len(), aug.crop);
    }
}

#[test]
fn normalization_is_torchvisions_in_float32() {
    let text = std::fs::read_to_string(common::data("camera/normalize.txt")).expect("normalize.txt");
    let cfg = ImagePreprocess::bevfusion_nuscenes();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let v: u8 = f[0].parse().expect("value");
        for c in 0..3 {
            let want = f32::from_bits(u32::from_str_radix(f[1 + c], 16).expect("hex"));
            assert_eq!(cfg.normalize(v, c).to_bits(), want.to_bits(), "value {v} channel {c}");
            n += 1;
        }
    }
    assert_eq!(n, 768);
}

/// The naive path: the whole image resized (both passes over every pixel, Pillow's order), then
/// the crop taken pixel by pixel with black outside, then normalized.
fn naive_preprocess(img: &RgbImage, aug: &ImageAug, cfg: &ImagePreprocess) -> Vec<f32> {
    let [nw, nh] = aug.resized;
    let ht = bicubic_taps(img.width, nw, 0, nw).expect("h taps");
    let vt = bicubic_taps(img.height, nh, 0, nh).expect("v taps");
    let clip = |s: i64| (s >> 22).clamp(0, 255) as u8;
    let mut tmp = vec![0u8; img.height * nw * 3];
    for y in 0..img.height {
        for x in 0..nw {
            for c in 0..3 {
                let mut s: i64 = 1 << 21;
                for i in 0..ht.count[x] as usize {
                    s += img.data[(y * img.width + ht.first[x] as usize + i) * 3 + c] as i64 * ht.coeffs[x * ht.ksize + i] as i64;
                }
                tmp[(y * nw + x) * 3 + c] = clip(s);
            }
        }
    }
    let mut full = vec![0u8; nh * nw * 3];
    for y in 0..nh {
        for x in 0..nw {
            for c in 0..3 {
                let mut s: i64 = 1 << 21;
                for j in 0..vt.count[y] as usize {
                    s += tmp[((vt.first[y] as usize + j) * nw + x) * 3 + c] as i64 * vt.coeffs[y * vt.ksize + j] as i64;
                }
                full[(y * nw + x) * 3 + c] = clip(s);
            }
        }
    }
    let [oh, ow] = aug.out;
    let mut out = Vec::with_capacity(oh * ow * 3);
    for oy in 0..oh as i64 {
        for ox in 0..ow as i64 {
            let (x, y) = (ox + aug.crop[0], oy + aug.crop[1]);
            for c in 0..3 {
                let v = if x >= 0 && y >= 0 && (x as usize) < nw && (y as usize) < nh { full[(y as usize * nw + x as usize) * 3 + c] } else { 0 };
                out.push(cfg.normalize(v, c));
            }
        }
    }
    out
}

#[test]
fn preprocess_equals_the_naive_path_on_random_sizes() {
    let mut rng = Rng(2024);
    let mut images = Vec::new();
    // Sizes around the crop window's: smaller, larger, odd, upsampled, a single row.
    for (w, h) in [(97, 61), (240, 130), (33, 200), (301, 17), (64, 1)] {
        images.push(RgbImage { width: w, height: h, data: (0..w * h * 3).map(|_| rng.next() as u8).collect() });
    }
    for (out, resize, bot) in [([40, 72], 0.48, 0.0), ([24, 24], 1.7, 0.25), ([50, 90], 0.33, 0.05)] {
        let cfg = cfg_with(out, resize, bot);
        let usable: Vec<&RgbImage> = images.iter().filter(|i| cfg.aug_for(i.width, i.height).is_ok()).collect();
        assert!(usable.len() >= 4, "most sizes survive the resize");
        let batch = preprocess_cpu(&usable, &cfg).expect("preprocess");
        assert_eq!((batch.n, batch.h, batch.w), (usable.len(), out[0], out[1]));
        let per = out[0] * out[1] * 3;
        for (i, img) in usable.iter().enumerate() {
            let aug = cfg.aug_for(img.width, img.height).expect("aug");
            assert_eq!(batch.augs[i], aug);
            let want = naive_preprocess(img, &aug, &cfg);
            let got = &batch.data[i * per..(i + 1) * per];
            let bad = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(bad, 0, "{}x{} to {out:?} at {resize}: {bad} values differ", img.width, img.height);
        }
    }
}

#[test]
fn preprocess_of_a_nuscenes_image() {
    // One real camera end to end (all six are compared with the GPU in
    // tests/ops_image_preprocess.rs); twice in a batch, so the batch layout is checked too.
    let cfg = ImagePreprocess::bevfusion_nuscenes();
    let img = decode_jpeg(&nuscenes_jpeg("CAM_FRONT"), &limits()).expect("jpeg");
    let batch = preprocess_cpu(&[&img, &img], &cfg).expect("preprocess");
    assert_eq!((batch.n, batch.h, batch.w, batch.data.len()), (2, 256, 704, 2 * 256 * 704 * 3));
    let aug = batch.augs[0];
    assert_eq!((aug.resized, aug.crop), ([768, 432], [32, 176, 736, 432]));
    let want = naive_preprocess(&img, &aug, &cfg);
    let per = want.len();
    assert!(batch.data[..per].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(batch.data[..per], batch.data[per..]);
    let lo = (0.0 - 0.485f32) / 0.229;
    let hi = (1.0 - 0.406f32) / 0.225;
    assert!(batch.data.iter().all(|v| v.is_finite() && *v >= lo - 1e-6 && *v <= hi + 1e-6));
    let other = cfg.aug_for(1280, 720).expect("aug");
    let r = resize_crop(&img, &other, &ResizeTaps::new(&other).expect("taps"));
    assert!(matches!(r, Err(ImageError::SizeMismatch { expected: [1280, 720], got: [1600, 900] })));
}

/// The measurement behind the numbers of docs/inputs.md, on full-size Pillow output written by
/// `tests/fixtures/make_camera_refs.py --full DIR`:
/// `SPTR_PILLOW_DIR=DIR cargo test --test camera_image -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_against_pillow_full_size() {
    let Some(dir) = std::env::var_os("SPTR_PILLOW_DIR").map(std::path::PathBuf::from) else {
        panic!("set SPTR_PILLOW_DIR to the output of make_camera_refs.py --full");
    };
    let cfg = ImagePreprocess::bevfusion_nuscenes();
    let stats = |a: &[u8], b: &[u8]| {
        let (mut max, mut sum) = (0u8, 0u64);
        for (x, y) in a.iter().zip(b) {
            max = max.max(x.abs_diff(*y));
            sum += x.abs_diff(*y) as u64;
        }
        (max, sum as f64 / a.len() as f64)
    };
    for cam in CAMS {
        let pil_dec = std::fs::read(dir.join(format!("{cam}.decoded.rgb"))).expect("decoded.rgb");
        let pil_pre = std::fs::read(dir.join(format!("{cam}.pre.rgb"))).expect("pre.rgb");
        let pil_img = RgbImage { width: 1600, height: 900, data: pil_dec };
        let aug = cfg.aug_for(1600, 900).expect("aug");
        let taps = ResizeTaps::new(&aug).expect("taps");
        let ours_on_pillow = resize_crop(&pil_img, &aug, &taps).expect("resize");
        let ours_dec = decode_jpeg(&nuscenes_jpeg(cam), &limits()).expect("jpeg");
        let ours_all = resize_crop(&ours_dec, &aug, &taps).expect("resize");
        let (rmax, rmean) = stats(&ours_on_pillow, &pil_pre);
        let (dmax, dmean) = stats(&ours_dec.data, &pil_img.data);
        let (amax, amean) = stats(&ours_all, &pil_pre);
        eprintln!(
            "{cam} (0-255 units): resize of Pillow's decode vs Pillow's resize: max {rmax}, mean {rmean:.5} | \
             decode vs Pillow's decode: max {dmax}, mean {dmean:.4} | decode + resize vs Pillow's: max {amax}, mean {amean:.4}"
        );
        assert_eq!(rmax, 0, "{cam}: the resize must equal Pillow's on the same pixels");
    }
    // Upstream's network input (numpy: ToTensor + Normalize of Pillow's preprocessing) against
    // sptr's whole path from the JPEG bytes, in normalized units.
    let bytes = std::fs::read(dir.join("upstream_input_nhwc.f32")).expect("upstream_input_nhwc.f32");
    let upstream: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let imgs: Vec<RgbImage> = CAMS.iter().map(|c| decode_jpeg(&nuscenes_jpeg(c), &limits()).expect("jpeg")).collect();
    let ours = preprocess_cpu(&imgs.iter().collect::<Vec<_>>(), &cfg).expect("preprocess");
    assert_eq!(ours.data.len(), upstream.len());
    let (mut max, mut sum, mut num, mut den) = (0f32, 0f64, 0f64, 0f64);
    for (a, b) in ours.data.iter().zip(&upstream) {
        max = max.max((a - b).abs());
        sum += (a - b).abs() as f64;
        num += ((a - b) as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    eprintln!(
        "network input, sptr from the JPEGs vs upstream (Pillow): max abs {max:.5}, mean abs {:.6}, rel. L2 {:.3e}",
        sum / upstream.len() as f64,
        (num / den).sqrt()
    );
}
