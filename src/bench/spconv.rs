//! `sptr bench spconv`: sparse-conv timings on real voxels, JSON rows. The workload:
//! SubM k3 at C = 32, 64, 128, 256 with the kernel map cached and with the map
//! built in the call, and strided k2 s2 32->64, 64->128, 128->256, on a voxelized batch.

use crate::bench::json::{fixed, line};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::ops::sparse_conv::cpu::WeightLayout;
use crate::ops::sparse_conv::cuda::{conv_cuda, conv_cuda_split, ConvAlgo, CudaConvWeights, TILED_VARIANTS, WGMMA_VARIANTS};
use crate::ops::sparse_conv::kernel_map::ConvGeometry;
use crate::ops::sparse_conv::kernel_map_cuda::{strided_cuda, submanifold_cuda, CudaSites};
use crate::ops::sparse_conv::tensor::SparseTensor;
use crate::Error;
use half::f16;
use serde::Serialize;

/// One timed case. As JSON: the fields in this order (no `bench` key: `scripts/gpu_parity.sh`
/// picks the rows out of a log as the lines that start with `{"case"`), `ms` to 0.0001 and
/// `useful_tflops` to 0.01.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub case: String,
    pub sites_in: usize,
    pub sites_out: usize,
    pub cin: usize,
    pub cout: usize,
    /// Median, CUDA events, ms.
    #[serde(serialize_with = "fixed::<4, _>")]
    pub ms: f64,
    /// Multiply-adds over the map's real pairs, over `ms`: useful TFLOP/s.
    #[serde(rename = "useful_tflops", serialize_with = "fixed::<2, _>")]
    pub tflops: f64,
}

impl BenchRow {
    pub fn json(&self) -> String {
        line(self)
    }
}

/// Deterministic pseudo-random values in [-a, a] (splitmix64), for features and weights.
pub(crate) fn values(n: usize, a: f32, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
        })
        .collect()
}

fn pairs(dev: &CudaDevice, nbr: &cudarc::driver::CudaSlice<i32>, len: usize) -> Result<usize, Error> {
    if len == 0 {
        return Ok(0);
    }
    let v = dev.stream.clone_dtoh(&nbr.slice(..len)).map_err(cuda_err("reading the neighbour table"))?;
    Ok(v.iter().filter(|&&i| i >= 0).count())
}

/// Runs the workload on `coords` (`[b, x, y, z]`, non-negative, within `shape`).
pub fn bench_spconv(dev: &CudaDevice, name: &str, coords: Vec<[i32; 4]>, shape: [i32; 3], iters: usize) -> Result<Vec<BenchRow>, Error> {
    let n = coords.len();
    let geometry = SparseTensor::new(coords, vec![0.0; n], 1, shape)?;
    let s = &dev.stream;
    let mut rows = Vec::new();
    let sites = CudaSites::upload(dev, &geometry)?;
    let coords_dev = sites.coords.clone();
    let subm = submanifold_cuda(dev, &geometry, sites, [3; 3], [1; 3])?;
    let subm_pairs = pairs(dev, &subm.nbr, n * 27)?;
    for c in [32usize, 64, 128, 256] {
        let x16: Vec<f16> = values(n * c, 1.0, 1).into_iter().map(f16::from_f32).collect();
        let x = s.clone_htod(&x16).map_err(cuda_err("uploading features"))?;
        let w = CudaConvWeights::upload(dev, &values(27 * c * c, 0.05, 2), WeightLayout::Krsc, 27, c, c, None)?;
        let flops = 2.0 * subm_pairs as f64 * (c * c) as f64;
        let ms = dev.time_median_ms(3, iters, || conv_cuda(dev, &x, &subm, &w, None, None).map(|_| ()))?;
        rows.push(BenchRow { case: format!("{name}/subm_k3_map_cached"), sites_in: n, sites_out: n, cin: c, cout: c, ms, tflops: flops / ms / 1e9 });
        // The other kernels on the same map, to choose the default from measurements.
        let fixed = [ConvAlgo::ImplicitGemm, ConvAlgo::ImplicitGemm32, ConvAlgo::ImplicitGemmPipe, ConvAlgo::ImplicitGemmPipe32, ConvAlgo::Direct, ConvAlgo::FmaTiled];
        let wgmma = WGMMA_VARIANTS.iter().filter(|v| w.wgmma_ready() && c % v.cols as usize == 0).map(|v| v.algo());
        for algo in fixed.into_iter().chain(TILED_VARIANTS.iter().map(|v| v.algo())).chain(wgmma) {
            let ms = dev.time_median_ms(3, iters, || conv_cuda_split(dev, &x, &subm, &w, None, None, algo, None, None).map(|_| ()))?;
            rows.push(BenchRow { case: format!("{name}/subm_k3_map_cached/{algo:?}"), sites_in: n, sites_out: n, cin: c, cout: c, ms, tflops: flops / ms / 1e9 });
        }
        let ms = dev.time_median_ms(3, iters, || {
            let fresh = s.clone_dtod(&coords_dev).map_err(cuda_err("copying coordinates"))?;
            let sites = CudaSites::build(dev, fresh, n)?;
            let map = submanifold_cuda(dev, &geometry, sites, [3; 3], [1; 3])?;
            conv_cuda(dev, &x, &map, &w, None, None).map(|_| ())
        })?;
        rows.push(BenchRow { case: format!("{name}/subm_k3_map_in_call"), sites_in: n, sites_out: n, cin: c, cout: c, ms, tflops: flops / ms / 1e9 });
    }
    let g = ConvGeometry { kernel: [2; 3], stride: [2; 3], padding: [0; 3], dilation: [1; 3] };
    let in_sites = CudaSites::upload(dev, &geometry)?;
    let (down, _, _) = strided_cuda(dev, &geometry, &in_sites, g)?;
    let down_pairs = pairs(dev, &down.nbr, down.out_count * 8)?;
    for (cin, cout) in [(32usize, 64usize), (64, 128), (128, 256)] {
        let x16: Vec<f16> = values(n * cin, 1.0, 3).into_iter().map(f16::from_f32).collect();
        let x = s.clone_htod(&x16).map_err(cuda_err("uploading features"))?;
        let w = CudaConvWeights::upload(dev, &values(8 * cin * cout, 0.05, 4), WeightLayout::Krsc, 8, cin, cout, None)?;
        let ms = dev.time_median_ms(3, iters, || conv_cuda(dev, &x, &down, &w, None, None).map(|_| ()))?;
        let flops = 2.0 * down_pairs as f64 * (cin * cout) as f64;
        rows.push(BenchRow { case: format!("{name}/strided_k2s2_map_cached"), sites_in: n, sites_out: down.out_count, cin, cout, ms, tflops: flops / ms / 1e9 });
        let ms = dev.time_median_ms(3, iters, || {
            let (map, _, _) = strided_cuda(dev, &geometry, &in_sites, g)?;
            conv_cuda(dev, &x, &map, &w, None, None).map(|_| ())
        })?;
        rows.push(BenchRow { case: format!("{name}/strided_k2s2_map_in_call"), sites_in: n, sites_out: down.out_count, cin, cout, ms, tflops: flops / ms / 1e9 });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row parses back with its keys in the order the line has always had them, `case` first.
    #[test]
    fn the_row_is_json_with_its_keys_in_order() {
        let row = BenchRow { case: "dense/subm_k3_map_cached".into(), sites_in: 100, sites_out: 100, cin: 32, cout: 32, ms: 0.0123456, tflops: 12.3456 };
        let text = row.json();
        assert!(text.starts_with(r#"{"case":"dense/subm_k3_map_cached","#), "{text}");
        let v = crate::bench::json::parse_row(&text, &["case", "sites_in", "sites_out", "cin", "cout", "ms", "useful_tflops"]);
        assert_eq!((v["ms"].as_f64(), v["useful_tflops"].as_f64()), (Some(0.0123), Some(12.35)));
    }
}
