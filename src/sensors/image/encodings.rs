//! Camera images as RGB8: `sensor_msgs/Image` buffers of the common encodings decoded into one
//! row-major RGB layout ([`RgbImage`]), with every malformed message a typed [`ImageError`].
//!
//! Encodings (names as in ROS 2 `sensor_msgs/image_encodings.hpp`):
//!
//! | encoding | bytes per pixel | layout |
//! | --- | --- | --- |
//! | `rgb8` | 3 | R G B |
//! | `bgr8` | 3 | B G R |
//! | `rgba8` | 4 | R G B A (alpha dropped) |
//! | `bgra8` | 4 | B G R A (alpha dropped) |
//! | `mono8` | 1 | Y, copied to R = G = B |
//! | `uyvy`, `yuv422` (its older name) | 2 | U Y0 V Y1 per pixel pair |
//! | `yuyv`, `yuv422_yuy2` (its older name) | 2 | Y0 U Y1 V per pixel pair |
//!
//! YUV 4:2:2 → RGB is what `cv_bridge` does (OpenCV's `COLOR_YUV2RGB_UYVY` / `_YUY2`): BT.601
//! limited range in 20-bit fixed point, `y = max(Y − 16, 0) · 1.164`, the chroma pair shared by
//! both pixels of the pair, each channel `(y + c·(U|V − 128) + 2^19) >> 20` saturated to 0..255,
//! with OpenCV's integer coefficients ([`yuv_to_rgb`]). Rows are `step` bytes apart (padding
//! ignored); `is_bigendian` does not matter for 8-bit encodings.

use thiserror::Error;

/// An 8-bit RGB image, row-major, `data.len() == width * height * 3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl RgbImage {
    /// A black image. Callers check sizes first (see [`check_size`]).
    pub fn zeroed(width: usize, height: usize) -> RgbImage {
        RgbImage { width, height, data: vec![0; width * height * 3] }
    }

    /// Pixel `(x, y)` as `[r, g, b]`; `None` outside the image.
    pub fn pixel(&self, x: usize, y: usize) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = (y * self.width + x) * 3;
        Some([self.data[i], self.data[i + 1], self.data[i + 2]])
    }
}

/// Limits applied to every image before any buffer of its size is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest `width * height` accepted.
    pub max_pixels: u64,
}

/// 16 megapixels (4096 × 4096): above every automotive camera in use (8.3 MP for 4K), and a bound
/// on the memory one corrupt or hostile header can ask for (48 MB of RGB).
pub const DEFAULT_MAX_PIXELS: u64 = 1 << 24;

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits { max_pixels: DEFAULT_MAX_PIXELS }
    }
}

/// Why an image could not be decoded. Every variant names what was wrong.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ImageError {
    #[error("image encoding `{0}` is not supported: use rgb8, bgr8, rgba8, bgra8, mono8, uyvy (yuv422) or yuyv (yuv422_yuy2)")]
    UnknownEncoding(String),
    #[error("image has zero size ({width} x {height})")]
    ZeroSize { width: u64, height: u64 },
    #[error("image of {width} x {height} pixels is larger than the limit of {max_pixels} pixels (raise the decode limit `max_pixels` if the camera really is this large)")]
    TooLarge { width: u64, height: u64, max_pixels: u64 },
    #[error("image step {step} is smaller than width {width} x {bytes_per_pixel} bytes per pixel ({encoding})")]
    StepTooSmall { step: u64, width: u64, bytes_per_pixel: u64, encoding: String },
    #[error("image data has {len} bytes, fewer than height {height} x step {step}")]
    DataTooShort { len: u64, height: u64, step: u64 },
    #[error("{encoding} image has odd width {width}: YUV 4:2:2 stores pixels in pairs")]
    OddWidth { width: u64, encoding: String },
    #[error("compressed image format `{0}` is not supported: use jpeg or png")]
    UnknownFormat(String),
    #[error("compressed image data is neither JPEG nor PNG (format `{format}`, first bytes {head:02x?})")]
    UnknownSignature { format: String, head: Vec<u8> },
    #[error("corrupt or truncated JPEG: {0}")]
    Jpeg(String),
    #[error("corrupt or truncated PNG: {0}")]
    Png(String),
    #[error("image of {width} x {height} pixels resized by {resize} has no pixels left")]
    TooSmallToResize { width: u64, height: u64, resize: f64 },
    #[error("resizing {in_size} pixels to {out_size}: the filter's weights exceed the 8-bit fixed-point range")]
    UnsupportedResize { in_size: u64, out_size: u64 },
    #[error("network input size {h} x {w} must have sides in 1..={max}")]
    BadOutputSize { h: usize, w: usize, max: usize },
    #[error("image is {got:?} (width, height), but its preprocessing was planned for {expected:?}")]
    SizeMismatch { expected: [usize; 2], got: [usize; 2] },
}

impl From<ImageError> for crate::Error {
    fn from(e: ImageError) -> Self {
        crate::Error::InvalidInput(e.to_string())
    }
}

/// The `sensor_msgs/Image` encodings sptr reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Rgb8,
    Bgr8,
    Rgba8,
    Bgra8,
    Mono8,
    /// U Y0 V Y1 (`uyvy`, formerly `yuv422`).
    Uyvy,
    /// Y0 U Y1 V (`yuyv`, formerly `yuv422_yuy2`).
    Yuyv,
}

impl Encoding {
    /// The encoding named `s` (exact ROS names, as `cv_bridge` compares them).
    pub fn parse(s: &str) -> Result<Encoding, ImageError> {
        Ok(match s {
            "rgb8" => Encoding::Rgb8,
            "bgr8" => Encoding::Bgr8,
            "rgba8" => Encoding::Rgba8,
            "bgra8" => Encoding::Bgra8,
            "mono8" => Encoding::Mono8,
            "uyvy" | "yuv422" => Encoding::Uyvy,
            "yuyv" | "yuv422_yuy2" => Encoding::Yuyv,
            other => return Err(ImageError::UnknownEncoding(other.to_string())),
        })
    }

    pub fn bytes_per_pixel(self) -> usize {
        match self {
            Encoding::Rgb8 | Encoding::Bgr8 => 3,
            Encoding::Rgba8 | Encoding::Bgra8 => 4,
            Encoding::Mono8 => 1,
            Encoding::Uyvy | Encoding::Yuyv => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Rgb8 => "rgb8",
            Encoding::Bgr8 => "bgr8",
            Encoding::Rgba8 => "rgba8",
            Encoding::Bgra8 => "bgra8",
            Encoding::Mono8 => "mono8",
            Encoding::Uyvy => "uyvy",
            Encoding::Yuyv => "yuyv",
        }
    }
}

/// Checks a width and height against zero and `limits` (before anything of that size exists);
/// returns them as `usize`.
pub fn check_size(width: u64, height: u64, limits: &DecodeLimits) -> Result<(usize, usize), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSize { width, height });
    }
    let too_large = ImageError::TooLarge { width, height, max_pixels: limits.max_pixels };
    let pixels = width.checked_mul(height).ok_or_else(|| too_large.clone())?;
    if pixels > limits.max_pixels {
        return Err(too_large);
    }
    // The product fits in u64 and under max_pixels; a usize of 32 bits could still not hold the
    // RGB byte count, which the same error covers.
    let bytes = usize::try_from(pixels).ok().and_then(|p| p.checked_mul(3));
    match (usize::try_from(width), usize::try_from(height), bytes) {
        (Ok(w), Ok(h), Some(_)) => Ok((w, h)),
        _ => Err(too_large),
    }
}

/// A `sensor_msgs/Image`'s fields that describe its pixels.
#[derive(Debug, Clone, Copy)]
pub struct RawImage<'a> {
    pub width: u32,
    pub height: u32,
    pub encoding: &'a str,
    pub step: u32,
    pub data: &'a [u8],
}

impl<'a> From<&'a crate::msgs::cdr::Image> for RawImage<'a> {
    fn from(m: &'a crate::msgs::cdr::Image) -> Self {
        RawImage { width: m.width, height: m.height, encoding: &m.encoding, step: m.step, data: &m.data }
    }
}

/// Decodes a `sensor_msgs/Image` into RGB8. Checks, in order: the encoding, zero size, the pixel
/// limit, an odd width for YUV 4:2:2, `step` against the row's bytes, and the data length
/// against `height * step`.
pub fn decode_raw(img: RawImage<'_>, limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    let enc = Encoding::parse(img.encoding)?;
    let (w, h) = check_size(img.width as u64, img.height as u64, limits)?;
    if matches!(enc, Encoding::Uyvy | Encoding::Yuyv) && w % 2 == 1 {
        return Err(ImageError::OddWidth { width: w as u64, encoding: img.encoding.to_string() });
    }
    let bpp = enc.bytes_per_pixel();
    let step = img.step as usize;
    // Compared in u64: exact whatever the target's usize.
    let row_bytes = w as u64 * bpp as u64;
    if (step as u64) < row_bytes {
        return Err(ImageError::StepTooSmall {
            step: step as u64,
            width: w as u64,
            bytes_per_pixel: bpp as u64,
            encoding: img.encoding.to_string(),
        });
    }
    let need = h as u64 * step as u64;
    if (img.data.len() as u64) < need {
        return Err(ImageError::DataTooShort { len: img.data.len() as u64, height: h as u64, step: step as u64 });
    }
    let row_bytes = row_bytes as usize;
    let mut out = RgbImage::zeroed(w, h);
    for (y, dst) in out.data.chunks_exact_mut(w * 3).enumerate() {
        let src = &img.data[y * step..y * step + row_bytes];
        convert_row(enc, src, dst);
    }
    Ok(out)
}

/// One row of `enc` pixels into RGB8 (`dst` holds `width * 3` bytes, `src` the row's pixels).
fn convert_row(enc: Encoding, src: &[u8], dst: &mut [u8]) {
    match enc {
        Encoding::Rgb8 => dst.copy_from_slice(src),
        Encoding::Bgr8 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                d.copy_from_slice(&[s[2], s[1], s[0]]);
            }
        }
        Encoding::Rgba8 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
        Encoding::Bgra8 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                d.copy_from_slice(&[s[2], s[1], s[0]]);
            }
        }
        Encoding::Mono8 => {
            for (d, &s) in dst.chunks_exact_mut(3).zip(src) {
                d.copy_from_slice(&[s, s, s]);
            }
        }
        Encoding::Uyvy | Encoding::Yuyv => {
            for (d, s) in dst.chunks_exact_mut(6).zip(src.chunks_exact(4)) {
                let (y0, u, y1, v) = match enc {
                    Encoding::Uyvy => (s[1], s[0], s[3], s[2]),
                    _ => (s[0], s[1], s[2], s[3]),
                };
                d[..3].copy_from_slice(&yuv_to_rgb(y0, u, v));
                d[3..].copy_from_slice(&yuv_to_rgb(y1, u, v));
            }
        }
    }
}

// OpenCV's BT.601 (limited range) YUV → RGB coefficients, 20-bit fixed point: 1.164, 1.596,
// −0.813, −0.391, 2.018 times 2^20, as cv_bridge's YUV 4:2:2 conversion uses them.
const YUV_SHIFT: i32 = 20;
const CY: i32 = 1_220_542;
const CVR: i32 = 1_673_527;
const CVG: i32 = -852_492;
const CUG: i32 = -409_993;
const CUB: i32 = 2_116_026;

/// One pixel's BT.601 YUV (limited range) as RGB8, bit for bit as OpenCV computes it.
pub fn yuv_to_rgb(y: u8, u: u8, v: u8) -> [u8; 3] {
    let (u, v) = (u as i32 - 128, v as i32 - 128);
    let half = 1 << (YUV_SHIFT - 1);
    let yy = (y as i32 - 16).max(0) * CY;
    // Largest magnitude: 239 * CY + 127 * CUB < 2^31, so i32 is exact; `>>` floors like OpenCV's.
    let sat = |x: i32| (x >> YUV_SHIFT).clamp(0, 255) as u8;
    [sat(yy + half + CVR * v), sat(yy + half + CVG * v + CUG * u), sat(yy + half + CUB * u)]
}
