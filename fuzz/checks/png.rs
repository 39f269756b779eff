//! PNG bytes (a CompressedImage's data) decoded to RGB.
use sptr::sensors::image::compressed::decode_png;
use sptr::sensors::image::encodings::DecodeLimits;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    if let Ok(img) = decode_png(data, &limits) {
        assert!((img.width * img.height) as u64 <= limits.max_pixels);
        assert_eq!(img.data.len(), img.width * img.height * 3);
    }
}
