//! Latency percentiles of a benchmark (nearest rank), the one percentile type of the benches
//! and the node benchmark.

use serde::Serialize;

use crate::bench::json::fixed;
use crate::device::percentile::percentile;

/// Latency statistics of a benchmark, ms. As JSON: `{"n", "mean_ms", "p50_ms", "p90_ms",
/// "p99_ms", "max_ms"}`, the times to 0.001 ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Percentiles {
    /// How many samples.
    pub n: usize,
    #[serde(rename = "mean_ms", serialize_with = "fixed::<3, _>")]
    pub mean: f64,
    /// The median (nearest rank: of an even count, the lower middle value).
    #[serde(rename = "p50_ms", serialize_with = "fixed::<3, _>")]
    pub p50: f64,
    #[serde(rename = "p90_ms", serialize_with = "fixed::<3, _>")]
    pub p90: f64,
    #[serde(rename = "p99_ms", serialize_with = "fixed::<3, _>")]
    pub p99: f64,
    #[serde(rename = "max_ms", serialize_with = "fixed::<3, _>")]
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (ms; [`percentile`]); `None` when empty.
    pub fn of(samples: &[f64]) -> Option<Percentiles> {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| percentile(&v, p);
        Some(Percentiles {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(50.0)?,
            p90: rank(90.0)?,
            p99: rank(99.0)?,
            max: *v.last()?,
        })
    }

    /// The median of `samples`, `NaN` (`null` in the JSON) when there are none.
    pub fn median(samples: &[f64]) -> f64 {
        Percentiles::of(samples).map_or(f64::NAN, |p| p.p50)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(|i| i as f64).collect();
        let p = Percentiles::of(&v).unwrap();
        assert_eq!((p.n, p.p50, p.p90, p.p99, p.max), (200, 100.0, 180.0, 198.0, 200.0));
        assert!((p.mean - 100.5).abs() < 1e-9);
        // the order the samples come in does not matter
        let shuffled: Vec<f64> = (0..200).map(|i| ((i * 73) % 200 + 1) as f64).collect();
        assert_eq!(Percentiles::of(&shuffled), Some(p));
    }

    #[test]
    fn no_samples_and_one_sample() {
        assert_eq!(Percentiles::of(&[]), None);
        assert!(Percentiles::median(&[]).is_nan());
        let one = Percentiles::of(&[7.0]).unwrap();
        assert_eq!((one.n, one.mean, one.p50, one.p90, one.p99, one.max), (1, 7.0, 7.0, 7.0, 7.0, 7.0));
        assert_eq!(Percentiles::median(&[4.0, 1.0, 3.0, 2.0]), 2.0, "of an even count, the lower middle value");
    }

    #[test]
    fn json_has_the_keys_in_order_to_the_microsecond() {
        let p = Percentiles::of(&[1.00049, 2.0, 3.0]).unwrap();
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"n":3,"mean_ms":2.0,"p50_ms":2.0,"p90_ms":3.0,"p99_ms":3.0,"max_ms":3.0}"#);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["n"], 3);
        let p = Percentiles::of(&[1.00049]).unwrap();
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(v["p50_ms"].as_f64(), Some(1.0), "rounded to 0.001 ms as before");
    }
}
