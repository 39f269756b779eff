//! Latency percentiles. Nearest-rank on the sorted samples (the `ceil(p/100 · n)`-th smallest),
//! so every figure is one measured value and pooling shards' samples gives exactly the figure
//! one run over the same samples gives.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending), nearest rank; `None` if empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50/p90/p99/max/mean of a set of durations, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl LatencySummary {
    /// Summary of samples in nanoseconds; `None` when there are none.
    pub fn of(samples_ns: &[u64]) -> Option<LatencySummary> {
        let mut s = samples_ns.to_vec();
        s.sort_unstable();
        let ms = |v: u64| v as f64 * 1e-6;
        Some(LatencySummary {
            count: s.len(),
            p50_ms: ms(percentile(&s, 50.0)?),
            p90_ms: ms(percentile(&s, 90.0)?),
            p99_ms: ms(percentile(&s, 99.0)?),
            max_ms: ms(*s.last()?),
            mean_ms: s.iter().map(|&v| v as f64).sum::<f64>() / s.len() as f64 * 1e-6,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&s, 50.0), Some(5));
        assert_eq!(percentile(&s, 90.0), Some(9));
        assert_eq!(percentile(&s, 99.0), Some(10));
        assert_eq!(percentile(&s, 100.0), Some(10));
        assert_eq!(percentile(&[7], 1.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        let l = LatencySummary::of(&[3_000_000, 1_000_000, 2_000_000]).unwrap();
        assert_eq!((l.p50_ms, l.max_ms, l.mean_ms, l.count), (2.0, 3.0, 2.0, 3));
    }
}
