//! `sensor_msgs/CompressedImage` → RGB8: JPEG (zune-jpeg) and PNG (the `png` crate).
//!
//! The `format` field comes in several spellings: `jpeg` / `png` (ROS 1 image_transport),
//! `"rgb8; jpeg compressed bgr8"` / `"bgr8; png compressed bgr8"` (ROS 2 compressed_image_transport:
//! the raw encoding, then the codec, then what OpenCV encoded; the JPEG/PNG bytes themselves hold
//! ordinary colour in either case), `jpg`, `image/jpeg`, or empty. The format only has to name a
//! codec sptr knows (or be empty); the data's own signature then decides between JPEG and PNG, so
//! a publisher that mislabels one as the other still works. `compressedDepth` (16-bit depth PNG
//! behind a private header) is not an image for the camera network and is refused.
//!
//! Sizes are checked against [`DecodeLimits`] from the header, before the decoder allocates the
//! image. A corrupt or truncated stream is an error, never a partly grey image: zune-jpeg runs in
//! strict mode, and before it decodes, `jpeg_scan::check_scan_data` walks every scan to its last
//! MCU, since zune-jpeg fills the MCUs left without an error when a file cut short ends in a
//! marker (an end-of-image marker appended, say).
//!
//! Why zune-jpeg (measured on the six 1600 × 900 nuScenes JPEGs, 4:2:0, one thread): 3.2 ms per
//! image against 5.0 ms for jpeg-decoder and 3.7 ms for Pillow's libjpeg-turbo 3.2 (SIMD); both
//! Rust decoders differ from libjpeg-turbo's ISLOW IDCT in the last bits (zune-jpeg: max 4,
//! mean 0.078 per channel in 0-255 units; jpeg-decoder: max 3, mean 0.060). It is image-rs's JPEG
//! decoder today, pure Rust, and reads the header before it allocates.
//! docs/inputs.md, "Camera images".

use crate::sensors::image::encodings::{check_size, DecodeLimits, ImageError, RgbImage};
use crate::sensors::image::jpeg_scan::check_scan_data;
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

/// The codecs a `CompressedImage` may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Jpeg,
    Png,
}

const JPEG_SIGNATURE: &[u8] = &[0xFF, 0xD8, 0xFF];
const PNG_SIGNATURE: &[u8] = &[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// Which JPEG decoder the CUDA camera input uses (`ops::image_preprocess::cuda`; the CPU path always
/// uses zune-jpeg). `auto`: nvJPEG when the library loads and a backend starts, else zune-jpeg
/// (and the preprocessor says why); `nvjpeg`: nvJPEG or an error; `cpu`: zune-jpeg.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JpegDecoderChoice {
    #[default]
    Auto,
    Nvjpeg,
    Cpu,
}

impl std::str::FromStr for JpegDecoderChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(JpegDecoderChoice::Auto),
            "nvjpeg" => Ok(JpegDecoderChoice::Nvjpeg),
            "cpu" | "zune" | "zune-jpeg" => Ok(JpegDecoderChoice::Cpu),
            _ => Err(format!("JPEG decoder `{s}` is not known: use auto, nvjpeg or cpu")),
        }
    }
}

impl std::fmt::Display for JpegDecoderChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JpegDecoderChoice::Auto => "auto",
            JpegDecoderChoice::Nvjpeg => "nvjpeg",
            JpegDecoderChoice::Cpu => "cpu",
        })
    }
}

/// Checks that `format` names JPEG or PNG (or nothing); what it names does not override the data.
pub fn check_format(format: &str) -> Result<(), ImageError> {
    let f = format.to_ascii_lowercase();
    let known = f.trim().is_empty() || f.contains("jpeg") || f.contains("jpg") || f.contains("png");
    if f.contains("compresseddepth") || !known {
        return Err(ImageError::UnknownFormat(format.to_string()));
    }
    Ok(())
}

/// Which codec the bytes are, from their signature.
pub fn sniff(format: &str, data: &[u8]) -> Result<Codec, ImageError> {
    if data.starts_with(JPEG_SIGNATURE) {
        Ok(Codec::Jpeg)
    } else if data.starts_with(PNG_SIGNATURE) {
        Ok(Codec::Png)
    } else {
        Err(ImageError::UnknownSignature { format: format.to_string(), head: data.iter().take(8).copied().collect() })
    }
}

/// Decodes a `sensor_msgs/CompressedImage` (its `format` and `data`) into RGB8.
pub fn decode_compressed(format: &str, data: &[u8], limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    check_format(format)?;
    match sniff(format, data)? {
        Codec::Jpeg => decode_jpeg(data, limits),
        Codec::Png => decode_png(data, limits),
    }
}

/// The width and height a JPEG's header declares, checked against `limits`.
pub fn jpeg_size(data: &[u8], limits: &DecodeLimits) -> Result<(usize, usize), ImageError> {
    let mut dec = jpeg_decoder(data, ColorSpace::RGB);
    dec.decode_headers().map_err(|e| ImageError::Jpeg(e.to_string()))?;
    let (w, h) = dec.dimensions().ok_or_else(|| ImageError::Jpeg("no frame header".into()))?;
    check_size(w as u64, h as u64, limits)
}

fn jpeg_decoder(data: &[u8], out: ColorSpace) -> zune_jpeg::JpegDecoder<ZCursor<&[u8]>> {
    // zune's per-side limits are opened to JPEG's 16-bit maximum: the pixel count is what
    // `check_size` bounds, between the header and the decode.
    let side = u16::MAX as usize;
    let opts = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(side)
        .set_max_height(side)
        .jpeg_set_out_colorspace(out);
    zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(data), opts)
}

/// Decodes a JPEG into RGB8 (grey JPEGs are copied to R = G = B).
pub fn decode_jpeg(data: &[u8], limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    let (w, h) = jpeg_size(data, limits)?;
    let mut out = RgbImage::zeroed(w, h);
    decode_jpeg_into(data, (w, h), &mut out.data)?;
    Ok(out)
}

/// Decodes a JPEG of size `size` (from [`jpeg_size`]) into `out` (`w * h * 3` bytes, RGB8,
/// row-major): lets a caller decode straight into a buffer of its own (e.g. pinned memory). Every
/// host decode goes through here, so here the scans are checked whole first.
pub fn decode_jpeg_into(data: &[u8], size: (usize, usize), out: &mut [u8]) -> Result<(), ImageError> {
    let (w, h) = size;
    let need = w * h * 3;
    if out.len() != need {
        return Err(ImageError::Jpeg(format!("output buffer holds {} bytes, the {w} x {h} image needs {need}", out.len())));
    }
    let mut probe = jpeg_decoder(data, ColorSpace::RGB);
    probe.decode_headers().map_err(|e| ImageError::Jpeg(e.to_string()))?;
    if probe.dimensions() != Some((w, h)) {
        return Err(ImageError::Jpeg(format!("header says {:?}, the caller expected {w} x {h}", probe.dimensions())));
    }
    check_scan_data(data).map_err(|e| ImageError::Jpeg(e.to_string()))?;
    let grey = probe.input_colorspace() == Some(ColorSpace::Luma);
    if !grey {
        return probe.decode_into(out).map_err(|e| ImageError::Jpeg(e.to_string()));
    }
    // One channel decoded, then spread from the end so the buffer can be reused in place.
    let mut dec = jpeg_decoder(data, ColorSpace::Luma);
    dec.decode_into(&mut out[..w * h]).map_err(|e| ImageError::Jpeg(e.to_string()))?;
    for i in (0..w * h).rev() {
        let v = out[i];
        out[3 * i..3 * i + 3].copy_from_slice(&[v, v, v]);
    }
    Ok(())
}

/// Decodes a PNG (any colour type and bit depth) into RGB8: palettes expanded, 16-bit samples
/// reduced to their high byte, alpha dropped, grey copied to R = G = B.
pub fn decode_png(data: &[u8], limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    let err = |e: png::DecodingError| ImageError::Png(e.to_string());
    let mut dec = png::Decoder::new(std::io::Cursor::new(data));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let info = dec.read_header_info().map_err(err)?;
    let (w, h) = check_size(info.width as u64, info.height as u64, limits)?;
    // The decoder's own allocation budget (metadata chunks, row buffers): the crate's default
    // 64 MiB plus the expanded image, so a large allowed image is not refused by it.
    dec.set_limits(png::Limits { bytes: (64usize << 20).saturating_add(w.saturating_mul(h).saturating_mul(8)) });
    let mut reader = dec.read_info().map_err(err)?;
    let size = reader.output_buffer_size().ok_or_else(|| ImageError::Png("image too large for this machine".into()))?;
    let mut buf = vec![0u8; size];
    let frame = reader.next_frame(&mut buf).map_err(err)?;
    if frame.bit_depth != png::BitDepth::Eight {
        return Err(ImageError::Png(format!("unexpected bit depth {:?} after expansion", frame.bit_depth)));
    }
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err(ImageError::Png("palette not expanded".into())),
    };
    let mut out = RgbImage::zeroed(w, h);
    for y in 0..h {
        let src = &buf[y * frame.line_size..y * frame.line_size + w * channels];
        let dst = &mut out.data[y * w * 3..(y + 1) * w * 3];
        for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(channels)) {
            let px = if channels < 3 { [s[0], s[0], s[0]] } else { [s[0], s[1], s[2]] };
            d.copy_from_slice(&px);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_data(rel: &str) -> Vec<u8> {
        std::fs::read(crate::repo_root().join("tests/data").join(rel)).unwrap()
    }

    /// CAM_FRONT's JPEG cut to its first 78,718 bytes (60 %) and given an end-of-image marker.
    fn cut_front_jpeg() -> Vec<u8> {
        let dir = crate::repo_root().join("tests/data/nuscenes");
        let front = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains("__CAM_FRONT__"))
            .unwrap();
        let mut d = std::fs::read(front).unwrap();
        d.truncate(78_718);
        d.extend_from_slice(&[0xFF, 0xD9]);
        d
    }

    #[test]
    fn a_jpeg_cut_short_with_its_end_marker_appended_is_an_error_naming_the_cut() {
        let cut = cut_front_jpeg();
        let limits = DecodeLimits::default();
        let through_compressed = decode_compressed("rgb8; jpeg compressed bgr8", &cut, &limits).map(|_| ());
        let through_jpeg = decode_jpeg(&cut, &limits).map(|_| ());
        let mut out = vec![0u8; 1600 * 900 * 3];
        let into_buffer = decode_jpeg_into(&cut, (1600, 900), &mut out);
        for r in [through_compressed, through_jpeg, into_buffer] {
            let Err(ImageError::Jpeg(why)) = r else { panic!("{r:?}") };
            assert!(why.starts_with("scan data ends at MCU ") && why.contains(" of 5,700 (row "), "{why}");
            assert!(why.contains("at byte 78,718 where an end-of-image marker follows: the file was cut short"), "{why}");
        }
        // zune-jpeg by itself decodes it without an error (the missing MCUs filled): the scan
        // walk is what refuses it. Should this start failing, zune-jpeg refuses such files
        // itself; the walk still stands for nvJPEG.
        assert!(jpeg_decoder(&cut, ColorSpace::RGB).decode().is_ok());
    }

    #[test]
    fn a_progressive_jpeg_without_its_last_scans_is_an_error() {
        let d = test_data("camera/scan_progressive_420.jpg");
        let limits = DecodeLimits::default();
        assert!(decode_jpeg(&d, &limits).is_ok());
        let last_scan = d.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
        let mut cut = d[..last_scan].to_vec();
        cut.extend_from_slice(&[0xFF, 0xD9]);
        let r = decode_jpeg(&cut, &limits).map(|img| (img.width, img.height));
        let Err(ImageError::Jpeg(why)) = &r else { panic!("{r:?}") };
        assert!(why.contains("refined only down to bit 1") && why.contains("the file was cut short"), "{why}");
    }

    #[test]
    fn whole_jpegs_of_every_coding_still_decode() {
        let limits = DecodeLimits::default();
        for name in ["small.jpg", "gray.jpg", "progressive.jpg", "scan_restart_rows_420.jpg", "scan_restart_blocks_444.jpg",
            "scan_progressive_restart_422.jpg", "scan_gray.jpg", "scan_gray_progressive.jpg"]
        {
            let img = decode_jpeg(&test_data(&format!("camera/{name}")), &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(img.width > 0 && img.height > 0, "{name}");
        }
    }
}
