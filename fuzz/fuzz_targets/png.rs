//! PNG bytes (a CompressedImage's data) decoded to RGB.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sptr::sensors::image::compressed::decode_png;
use sptr::sensors::image::encodings::DecodeLimits;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    if let Ok(img) = decode_png(data, &limits) {
        assert!((img.width * img.height) as u64 <= limits.max_pixels);
        assert_eq!(img.data.len(), img.width * img.height * 3);
    }
});
