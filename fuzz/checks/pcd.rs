//! A PCD file (`sptr segment cloud.pcd`).
use sptr::sensors::cloud_files::parse_pcd;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    if let Ok(points) = parse_pcd(data) {
        let n = points.x.len();
        assert!(points.y.len() == n && points.z.len() == n && points.intensity.len() == n);
        // Every point takes at least one byte of the file (binary) or more (ASCII).
        assert!(n <= data.len(), "{n} points from {} bytes", data.len());
    }
}
