//! JPEG bytes (a CompressedImage's data) decoded to RGB.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sptr::camera::compressed::{decode_jpeg, jpeg_size};
use sptr::camera::image::DecodeLimits;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    let size = jpeg_size(data, &limits);
    if let Ok(img) = decode_jpeg(data, &limits) {
        assert_eq!(size.ok(), Some((img.width, img.height)));
        assert_eq!(img.data.len(), img.width * img.height * 3);
    }
});
