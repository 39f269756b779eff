//! A `sensor_msgs/Image` CDR body decoded to RGB the way the camera path decodes it.
//! Checks: the output has exactly width × height pixels and never more than the limit allows.
use sptr::msgs::cdr::{decode_message, Message};
use sptr::sensors::image::encodings::{decode_raw, DecodeLimits, RawImage};

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(Message::Image(msg)) = decode_message("sensor_msgs/msg/Image", data) else {
        return;
    };
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    if let Ok(img) = decode_raw(RawImage::from(&msg), &limits) {
        let pixels = img.width as u64 * img.height as u64;
        assert_eq!((img.width as u32, img.height as u32), (msg.width, msg.height));
        assert!(pixels <= limits.max_pixels);
        assert_eq!(img.data.len() as u64, pixels * 3);
    }
}
