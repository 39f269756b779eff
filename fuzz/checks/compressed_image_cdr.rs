//! A `sensor_msgs/CompressedImage` CDR body (JPEG or PNG inside) decoded to RGB.
use sptr::msgs::cdr::{decode_message, Message};
use sptr::sensors::image::compressed::decode_compressed;
use sptr::sensors::image::encodings::DecodeLimits;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(Message::CompressedImage(msg)) = decode_message("sensor_msgs/msg/CompressedImage", data) else {
        return;
    };
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    if let Ok(img) = decode_compressed(&msg.format, &msg.data, &limits) {
        let pixels = img.width as u64 * img.height as u64;
        assert!(pixels > 0 && pixels <= limits.max_pixels);
        assert_eq!(img.data.len() as u64, pixels * 3);
    }
}
