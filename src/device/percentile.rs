//! The one percentile of the crate: every median, p90 and p99 it reports (the benches'
//! `bench::percentiles::Percentiles`, the report's `eval::latency::LatencySummary`, the CUDA
//! event medians of `CudaDevice::time_median_ms`) is taken with [`percentile`].

/// The `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending), nearest rank: the
/// `ceil(p/100 · n)`-th smallest, so every figure is one measured value and pooling samples gives
/// exactly the figure one run over the same samples gives. The median is `p = 50` (of an even
/// count, the lower of the two middle values). `None` when `sorted` is empty.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn no_samples_and_one_sample() {
        assert_eq!(percentile::<f64>(&[], 50.0), None);
        assert_eq!(percentile::<u64>(&[], 99.0), None);
        for p in [0.1, 1.0, 50.0, 90.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.0], p), Some(7.0), "p{p}");
        }
    }

    #[test]
    fn the_ceil_p_n_th_smallest_of_200() {
        let v: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&v, 50.0), Some(100));
        assert_eq!(percentile(&v, 90.0), Some(180));
        assert_eq!(percentile(&v, 99.0), Some(198));
        assert_eq!(percentile(&v, 99.9), Some(200));
        assert_eq!(percentile(&v, 100.0), Some(200));
        assert_eq!(percentile(&v, 0.1), Some(1), "the lowest rank is the smallest value");
        let f: Vec<f64> = v.iter().map(|&x| x as f64 * 0.5).collect();
        assert_eq!((percentile(&f, 50.0), percentile(&f, 90.0), percentile(&f, 99.0)), (Some(50.0), Some(90.0), Some(99.0)));
    }

    #[test]
    fn medians_of_even_counts_are_the_lower_middle_value() {
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3, 4, 5], 50.0), Some(3));
        let ten: Vec<u64> = (1..=10).collect();
        assert_eq!((percentile(&ten, 50.0), percentile(&ten, 90.0), percentile(&ten, 99.0)), (Some(5), Some(9), Some(10)));
        let twenty: Vec<u64> = (1..=20).collect();
        assert_eq!((percentile(&twenty, 50.0), percentile(&twenty, 90.0)), (Some(10), Some(18)));
    }
}
