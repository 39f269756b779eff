//! Latency percentiles of a benchmark (nearest rank), the one percentile type of the benches
//! and the node benchmark.

/// Latency statistics of a benchmark, ms.
#[derive(Debug, Clone, PartialEq)]
pub struct Percentiles {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (ms); `None` when empty.
    pub fn of(samples: &[f64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Percentiles {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[v.len() - 1],
        })
    }

    pub fn json(&self) -> String {
        format!(
            "{{\"n\":{},\"mean_ms\":{:.3},\"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
            self.n, self.mean, self.p50, self.p90, self.p99, self.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(|i| i as f64).collect();
        let p = Percentiles::of(&v).unwrap();
        assert_eq!(
            (p.n, p.p50, p.p90, p.p99, p.max),
            (200, 100.0, 180.0, 198.0, 200.0)
        );
        assert!((p.mean - 100.5).abs() < 1e-9);
        assert_eq!(Percentiles::of(&[]), None);
        assert_eq!(Percentiles::of(&[7.0]).unwrap().p99, 7.0);
    }
}
