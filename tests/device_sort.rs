//! The GPU radix sort (`radix_sort_pairs`: one launch up to `SMALL_SORT_CAPACITY` pairs, the
//! multi-pass path above) against a stable CPU sort: same keys, same value order among equal
//! keys. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

mod common;

use common::{gpu, Rng};
use sptr::device::cuda::CudaDevice;
use sptr::device::primitives::{radix_sort_pairs, SMALL_SORT_CAPACITY};

const CAP: usize = SMALL_SORT_CAPACITY;
const SIZES: [usize; 12] = [0, 1, 2, 31, 255, 256, 257, CAP - 1, CAP, CAP + 1, 100_000, 700_001];
const BITS: [u32; 7] = [1, 7, 8, 9, 27, 40, 64];

fn below(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// `n` keys below `2^bits`: uniform, or (`few`) drawn from at most 3 values (0, the largest and
/// one random), so most keys have many equals.
fn keys_for(rng: &mut Rng, n: usize, bits: u32, few: bool) -> Vec<u64> {
    let max = below(bits);
    let pool = [0, max, rng.next_u64() & max];
    (0..n).map(|_| if few { pool[rng.below(3)] } else { rng.next_u64() & max }).collect()
}

/// Sorts on the GPU and compares with `sort_by_key` (stable). Values are a random permutation of
/// `0..n`, so a value out of input order among equal keys shows.
fn check(dev: &CudaDevice, rng: &mut Rng, n: usize, bits: u32, few: bool) {
    let keys = keys_for(rng, n, bits, few);
    let mut vals: Vec<u32> = (0..n as u32).collect();
    rng.shuffle(&mut vals);
    let s = &dev.stream;
    // At least one element: n = 0 still gets real buffers.
    let mut dk = s.clone_htod(&if n == 0 { vec![0] } else { keys.clone() }).unwrap();
    let mut dv = s.clone_htod(&if n == 0 { vec![0] } else { vals.clone() }).unwrap();
    radix_sort_pairs(dev, &mut dk, &mut dv, n, bits).unwrap();
    if n == 0 {
        dev.synchronize().unwrap();
        return;
    }
    let gk = s.clone_dtoh(&dk.slice(..n)).unwrap();
    let gv = s.clone_dtoh(&dv.slice(..n)).unwrap();
    let mut pairs: Vec<(u64, u32)> = keys.iter().copied().zip(vals.iter().copied()).collect();
    pairs.sort_by_key(|p| p.0);
    let case = format!("n={n} bits={bits} few={few}");
    let first = gk.iter().zip(&pairs).position(|(g, p)| *g != p.0);
    assert!(first.is_none(), "{case}: keys differ first at {first:?}");
    let first = gv.iter().zip(&pairs).position(|(g, p)| *g != p.1);
    assert!(first.is_none(), "{case}: values (stability) differ first at {first:?}");
}

#[test]
fn cuda_sort_matches_stable_cpu_sort() {
    let Some(dev) = gpu("cuda_sort_matches_stable_cpu_sort") else { return };
    let mut rng = Rng(20_240_611);
    for n in SIZES {
        for bits in BITS {
            check(&dev, &mut rng, n, bits, false);
            check(&dev, &mut rng, n, bits, true);
        }
    }
}

#[test]
fn cuda_sort_all_equal_keys_keeps_input_order() {
    let Some(dev) = gpu("cuda_sort_all_equal_keys_keeps_input_order") else { return };
    let s = &dev.stream;
    for n in [2usize, 300, CAP, CAP + 1, 100_000] {
        for (bits, key) in [(8u32, 0xa5u64), (64, u64::MAX), (27, 0)] {
            let mut dk = s.clone_htod(&vec![key; n]).unwrap();
            let vals: Vec<u32> = (0..n as u32).rev().collect();
            let mut dv = s.clone_htod(&vals).unwrap();
            radix_sort_pairs(&dev, &mut dk, &mut dv, n, bits).unwrap();
            assert_eq!(s.clone_dtoh(&dv.slice(..n)).unwrap(), vals, "n={n} bits={bits}: order of equal keys");
            assert!(s.clone_dtoh(&dk.slice(..n)).unwrap().iter().all(|&k| k == key), "n={n} bits={bits}: keys");
        }
    }
}

#[test]
fn cuda_sort_of_a_prefix_leaves_the_rest() {
    let Some(dev) = gpu("cuda_sort_of_a_prefix_leaves_the_rest") else { return };
    let mut rng = Rng(77);
    let s = &dev.stream;
    // Buffers longer than n (callers may sort the first n of a larger allocation): the first n
    // come back sorted.
    for n in [100usize, CAP, CAP + 500] {
        let keys = keys_for(&mut rng, n + 1000, 20, false);
        let vals: Vec<u32> = (0..(n + 1000) as u32).collect();
        let mut dk = s.clone_htod(&keys).unwrap();
        let mut dv = s.clone_htod(&vals).unwrap();
        radix_sort_pairs(&dev, &mut dk, &mut dv, n, 20).unwrap();
        let mut expect: Vec<u32> = vals[..n].to_vec();
        expect.sort_by_key(|&i| keys[i as usize]);
        assert_eq!(s.clone_dtoh(&dv.slice(..n)).unwrap(), expect, "n={n}: values");
        let ek: Vec<u64> = expect.iter().map(|&i| keys[i as usize]).collect();
        assert_eq!(s.clone_dtoh(&dk.slice(..n)).unwrap(), ek, "n={n}: keys");
    }
}

/// Timings, not a check: one launch vs the multi-pass path on either side of the capacity.
#[test]
fn cuda_sort_timings() {
    let Some(dev) = gpu("cuda_sort_timings") else { return };
    let mut rng = Rng(5);
    for (n, bits) in [(500usize, 27u32), (2000, 27), (CAP, 27), (CAP + 1, 27), (CAP, 64), (CAP + 1, 64), (20_000, 64), (320_000, 27), (320_000, 64)] {
        let keys = keys_for(&mut rng, n, bits, false);
        let vals: Vec<u32> = (0..n as u32).collect();
        let s = &dev.stream;
        let unsorted = s.clone_htod(&keys).unwrap();
        let mut dk = s.clone_htod(&keys).unwrap();
        let mut dv = s.clone_htod(&vals).unwrap();
        let ms = dev
            .time_median_ms(3, 20, || {
                s.memcpy_dtod(&unsorted, &mut dk).map_err(|e| sptr::Error::Cuda(format!("{e:?}")))?;
                radix_sort_pairs(&dev, &mut dk, &mut dv, n, bits)
            })
            .unwrap();
        let path = if n <= CAP { "one launch" } else { "one sweep a pass" };
        eprintln!("sort n={n} bits={bits} ({path}): cuda {ms:.3} ms (includes a {n}-key device copy)");
    }
}
