//! JPEG bytes (a CompressedImage's data) decoded to RGB, and the checks the camera branch makes
//! before it hands a JPEG to nvJPEG (marker layout, stray markers in the scan data).
use sptr::sensors::image::compressed::{decode_jpeg, jpeg_size};
use sptr::sensors::image::encodings::DecodeLimits;
use sptr::sensors::image::jpeg_markers::{read_layout, stray_marker};

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    let size = jpeg_size(data, &limits);
    if let Ok(img) = decode_jpeg(data, &limits) {
        assert_eq!(size.ok(), Some((img.width, img.height)));
        assert_eq!(img.data.len(), img.width * img.height * 3);
    }
    if let Ok(layout) = read_layout(data) {
        assert!(layout.scan_data <= data.len());
        if let Some((at, code)) = stray_marker(data, layout.scan_data) {
            assert!(at >= layout.scan_data && at + 1 < data.len() && data[at] == 0xFF && data[at + 1] == code);
        }
        let _ = layout.gpu_eligibility();
    }
}
