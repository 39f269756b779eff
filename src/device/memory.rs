//! Memory in use, for the leak checks of the benchmarks and the node's `/diagnostics`: the
//! process's host resident set, and the device memory in use.

/// This process's host resident set size, MB (Linux `/proc/self/statm`; `None` elsewhere).
pub fn host_rss_mb() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0 / 1e6)
}

/// Device memory in use on the whole device (total − free), MB; `None` without CUDA or when the
/// calling thread has no current CUDA context (call it from the thread that runs the model).
pub fn device_used_mb(cuda: bool) -> Option<f64> {
    if !cuda {
        return None;
    }
    #[cfg(feature = "cuda")]
    {
        cudarc::driver::result::mem_get_info().ok().map(|(free, total)| (total - free) as f64 / 1e6)
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// Memory samples as JSON: `{"samples":[[when, MB], ...],"first":..,"last":..,"max":..}` (MB to
/// 0.1), or `null` without samples. `when` is a frame index or a time, as the caller counts.
pub fn samples_json<T: std::fmt::Display>(samples: &[(T, f64)]) -> String {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return "null".into() };
    let max = samples.iter().map(|s| s.1).fold(f64::MIN, f64::max);
    let list: Vec<String> = samples.iter().map(|(w, v)| format!("[{w},{v:.1}]")).collect();
    format!("{{\"samples\":[{}],\"first\":{:.1},\"last\":{:.1},\"max\":{max:.1}}}", list.join(","), first.1, last.1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_rss_counts_touched_memory() {
        if !cfg!(target_os = "linux") {
            return;
        }
        // 64 MB written page by page is resident while `block` lives, whatever other test
        // threads allocate or free meanwhile.
        let block = vec![1u8; 64 << 20];
        let rss = super::host_rss_mb().expect("/proc/self/statm");
        assert!(block.iter().step_by(4096).all(|&b| b == 1));
        assert!(rss >= 64.0 * 1.048, "RSS {rss:.1} MB with 64 MiB touched");
    }

    #[test]
    fn samples_json_reports_first_last_max() {
        assert_eq!(super::samples_json::<usize>(&[]), "null");
        assert_eq!(
            super::samples_json(&[(0, 10.0), (50, 12.5), (99, 11.0)]),
            "{\"samples\":[[0,10.0],[50,12.5],[99,11.0]],\"first\":10.0,\"last\":11.0,\"max\":12.5}"
        );
        assert_eq!(super::samples_json(&[(0.3, 1394.0), (1.3, 1427.6)]), "{\"samples\":[[0.3,1394.0],[1.3,1427.6]],\"first\":1394.0,\"last\":1427.6,\"max\":1427.6}");
    }

    #[test]
    fn no_device_memory_without_cuda() {
        assert_eq!(super::device_used_mb(false), None);
    }
}
