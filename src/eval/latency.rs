//! Latency percentiles of a report: nearest rank on the sorted samples
//! ([`crate::device::percentile::percentile`], the one percentile of the crate), so every figure is one
//! measured value and pooling shards' samples gives exactly the figure one run over the same
//! samples gives.

use serde::{Deserialize, Serialize};

use crate::device::percentile::percentile;

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
        let l = LatencySummary::of(&[3_000_000, 1_000_000, 2_000_000]).unwrap();
        assert_eq!((l.p50_ms, l.max_ms, l.mean_ms, l.count), (2.0, 3.0, 2.0, 3));
    }
}
