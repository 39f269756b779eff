//! A PCD file (`sptr segment cloud.pcd`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sptr::sensors::cloud_files::parse_pcd;

fuzz_target!(|data: &[u8]| {
    if let Ok(points) = parse_pcd(data) {
        let n = points.x.len();
        assert!(points.y.len() == n && points.z.len() == n && points.intensity.len() == n);
        // Every point takes at least one byte of the file (binary) or more (ASCII).
        assert!(n <= data.len(), "{n} points from {} bytes", data.len());
    }
});
