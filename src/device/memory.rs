//! Memory in use, for the leak checks of the benchmarks and the node's `/diagnostics`: the
//! process's host resident set, and the device memory in use (as JSON:
//! `crate::bench::json::MemorySamples`).

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
    #[cfg(feature = "cuda-core")]
    {
        cudarc::driver::result::mem_get_info().ok().map(|(free, total)| (total - free) as f64 / 1e6)
    }
    #[cfg(not(feature = "cuda-core"))]
    {
        None
    }
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
    fn no_device_memory_without_cuda() {
        assert_eq!(super::device_used_mb(false), None);
    }
}
