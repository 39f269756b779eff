//! A KITTI / nuScenes `.bin` cloud (rows of little-endian float32); the first byte picks the
//! stride the user would pass with `--stride`.
use sptr::msgs::points::Points;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Some((&stride, body)) = data.split_first() else {
        return;
    };
    if let Ok(points) = Points::parse_bin(body, stride as usize, "fuzz.bin") {
        assert_eq!(points.x.len() * stride as usize * 4, body.len());
    }
}
