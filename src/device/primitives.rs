//! Device-wide building blocks on CUDA (kernels in `kernels/device/scan_sort.cu`): exclusive scan of
//! u32 and a stable LSD radix sort of (u64 key, u32 value) pairs over the low `bits` of the key:
//! one launch for up to [`SMALL_SORT_CAPACITY`] pairs, else one launch counting every pass's
//! digits and one "one sweep" launch per 8-bit pass (decoupled look-back, no host round trip).

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

const SCAN_THREADS: u32 = 1024;
const SCAN_TILE: u32 = SCAN_THREADS * 4;
/// Up to this many tiles (32,768 values) one block scans them one after another
/// (`scan_serial_tiles`, one launch); more take the three passes.
const SERIAL_SCAN_TILES: u32 = 8;
const RADIX_THREADS: u32 = 256;
const RADIX_TILE: u32 = RADIX_THREADS * 8;
const RADIX_BINS: u32 = 256;
/// scan_sort.cu's RADIX_COUNTS: digit counts of up to 8 passes, then a tile counter per pass.
const RADIX_COUNTS: usize = 8 * RADIX_BINS as usize + 8;
/// `radix_digit_counts` strides over the keys with at most this many blocks.
const COUNT_BLOCKS_MAX: u32 = 256;
/// `radix_sort_small`: one block of up to 1024 threads, 8 items a thread, 256 items a warp.
const SMALL_SORT_WARP_ITEMS: u32 = 32 * 8;
/// Shared memory of `radix_sort_small` per warp: 256 digit counts and 256 exchange words.
const SMALL_SORT_WARP_SMEM: u32 = 2 * 256 * 4;

/// The most pairs [`radix_sort_pairs`] sorts in one launch (one block, every pass in shared
/// memory); larger sorts take one launch a pass plus one.
pub const SMALL_SORT_CAPACITY: usize = 8192;

pub(crate) fn grid_1d(n: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.div_ceil(threads).max(1), 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

fn len_u32(n: usize, what: &str) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| Error::InvalidInput(format!("{what}: {n} elements, at most 2^32-1")))
}

/// `output[i] = sum(input[..i])` for `i < n`; returns the total (one value read back, so this
/// synchronises the stream).
pub fn exclusive_scan_u32(
    dev: &CudaDevice,
    input: &CudaSlice<u32>,
    output: &mut CudaSlice<u32>,
    n: usize,
) -> Result<u32, Error> {
    let (sums, ntiles) = exclusive_scan_u32_async(dev, input, output, n)?;
    let total = dev.stream.clone_dtoh(&sums.slice(ntiles..)).map_err(cuda_err("scan: reading the total"))?;
    Ok(total[0])
}

/// [`exclusive_scan_u32`] without reading the total back (no host synchronisation). Returns the
/// tile-sum buffer and the index of its entry holding the total (the tile count of the three
/// passes; 1 where one block scanned the input).
pub fn exclusive_scan_u32_async(
    dev: &CudaDevice,
    input: &CudaSlice<u32>,
    output: &mut CudaSlice<u32>,
    n: usize,
) -> Result<(CudaSlice<u32>, usize), Error> {
    let n32 = len_u32(n, "scan")?;
    let ntiles = n32.div_ceil(SCAN_TILE).max(1);
    let s = &dev.stream;
    // SAFETY: the scan writes every tile's sum and the total (entry ntiles) before reading them.
    let mut sums = unsafe { dev.alloc_uninit::<u32>(ntiles as usize + 1, "scan tile sums") }?;
    let f_sums = dev.function("scan_sort", "scan_tile_sums")?;
    let f_offs = dev.function("scan_sort", "scan_tile_offsets")?;
    let f_scan = dev.function("scan_sort", "scan_tiles")?;
    let tiles = LaunchConfig { grid_dim: (ntiles, 1, 1), block_dim: (SCAN_THREADS, 1, 1), shared_mem_bytes: 0 };
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (SCAN_THREADS, 1, 1), shared_mem_bytes: 0 };
    if ntiles == 1 {
        let f_one = dev.function("scan_sort", "scan_single_tile")?;
        // SAFETY: matches the kernel; input/output hold >= n elements (n <= one tile), sums 2.
        unsafe { s.launch_builder(&f_one).arg(input).arg(output).arg(&mut sums).arg(&n32).launch(one) }.map_err(cuda_err("scan_single_tile"))?;
        return Ok((sums, 1));
    }
    if ntiles <= SERIAL_SCAN_TILES {
        let f_serial = dev.function("scan_sort", "scan_serial_tiles")?;
        // SAFETY: matches the kernel; input/output hold >= n elements, sums >= 2 (ntiles + 1).
        unsafe { s.launch_builder(&f_serial).arg(input).arg(output).arg(&mut sums).arg(&n32).arg(&ntiles).launch(one) }
            .map_err(cuda_err("scan_serial_tiles"))?;
        // its sums are a single tile's: the total at entry 1
        return Ok((sums, 1));
    }
    // SAFETY: argument lists match the kernels' signatures; input/output hold >= n elements,
    // sums ntiles + 1.
    unsafe {
        s.launch_builder(&f_sums).arg(input).arg(&mut sums).arg(&n32).launch(tiles).map_err(cuda_err("scan_tile_sums"))?;
        s.launch_builder(&f_offs).arg(&mut sums).arg(&ntiles).launch(one).map_err(cuda_err("scan_tile_offsets"))?;
        s.launch_builder(&f_scan).arg(input).arg(output).arg(&sums).arg(&n32).launch(tiles).map_err(cuda_err("scan_tiles"))?;
    }
    Ok((sums, ntiles as usize))
}

/// Stable sort of `(keys[i], vals[i])`, `i < n`, by the low `bits` bits of the key (8 bits a
/// pass). Keys must be below `2^bits`. Sorts in place (the buffers may be swapped with scratch).
/// Up to [`SMALL_SORT_CAPACITY`] pairs take one launch (same passes, same result); more take
/// `1 + ceil(bits / 8)` launches.
pub fn radix_sort_pairs(
    dev: &CudaDevice,
    keys: &mut CudaSlice<u64>,
    vals: &mut CudaSlice<u32>,
    n: usize,
    bits: u32,
) -> Result<(), Error> {
    let n32 = len_u32(n, "sort")?;
    if n32 <= 1 || bits == 0 {
        return Ok(());
    }
    if n <= SMALL_SORT_CAPACITY {
        return radix_sort_small(dev, keys, vals, n32, bits.min(64));
    }
    let s = &dev.stream;
    let ntiles = n32.div_ceil(RADIX_TILE);
    let passes = bits.min(64).div_ceil(8);
    // SAFETY: the scratch is never read before written: every pass writes all n positions (it
    // scatters a permutation) before the next reads them, so it need not be zeroed.
    let mut keys_alt = unsafe { dev.alloc_uninit::<u64>(n, "sort scratch keys") }?;
    // SAFETY: as above.
    let mut vals_alt = unsafe { dev.alloc_uninit::<u32>(n, "sort scratch values") }?;
    // The passes' look-back status (ntiles * 256 words), then every pass's digit counts and one
    // tile counter a pass (scan_sort.cu: RADIX_COUNTS): one zeroed buffer, since a memset costs
    // the host about as much as a launch.
    let status_words = ntiles as usize * RADIX_BINS as usize;
    let mut zeroed = s.alloc_zeros::<u64>(status_words + RADIX_COUNTS.div_ceil(2)).map_err(cuda_err("sort: allocating digit counts and look-back status"))?;
    let (mut status, mut counts_words) = zeroed.split_at_mut(status_words);
    // SAFETY: RADIX_COUNTS u32 fit in the RADIX_COUNTS / 2 (rounded up) u64 after the status.
    let mut counts = unsafe { counts_words.transmute_mut::<u32>(RADIX_COUNTS) }
        .ok_or_else(|| Error::Cuda("sort: the digit counts do not fit their buffer".into()))?;
    let f_counts = dev.function("scan_sort", "radix_digit_counts")?;
    let f_pass = dev.function("scan_sort", "radix_onesweep")?;
    let count_blocks = ntiles.min(COUNT_BLOCKS_MAX);
    let cfg_counts = LaunchConfig { grid_dim: (count_blocks, 1, 1), block_dim: (RADIX_THREADS, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: matches the kernel; keys hold >= n elements, counts RADIX_COUNTS words.
    unsafe { s.launch_builder(&f_counts).arg(&*keys).arg(&n32).arg(&passes).arg(&mut counts).launch(cfg_counts) }
        .map_err(cuda_err("radix_digit_counts"))?;
    let cfg = LaunchConfig { grid_dim: (ntiles, 1, 1), block_dim: (RADIX_THREADS, 1, 1), shared_mem_bytes: 0 };
    for pass in 0..passes {
        // SAFETY: matches the kernel; keys/vals/alt hold >= n elements, counts RADIX_COUNTS
        // words, status ntiles * 256 (both zeroed above).
        unsafe {
            s.launch_builder(&f_pass)
                .arg(&*keys)
                .arg(&*vals)
                .arg(&mut keys_alt)
                .arg(&mut vals_alt)
                .arg(&n32)
                .arg(&pass)
                .arg(&mut counts)
                .arg(&mut status)
                .launch(cfg)
                .map_err(cuda_err("radix_onesweep"))?;
        }
        std::mem::swap(keys, &mut keys_alt);
        std::mem::swap(vals, &mut vals_alt);
    }
    Ok(())
}

/// [`radix_sort_pairs`] of `2 <= n <= SMALL_SORT_CAPACITY` pairs in one launch: one block of
/// one warp per 256 pairs, in place.
fn radix_sort_small(dev: &CudaDevice, keys: &mut CudaSlice<u64>, vals: &mut CudaSlice<u32>, n: u32, bits: u32) -> Result<(), Error> {
    if keys.len() < n as usize || vals.len() < n as usize {
        return Err(Error::InvalidInput(format!("sort: {n} pairs, but {} keys and {} values", keys.len(), vals.len())));
    }
    let warps = n.div_ceil(SMALL_SORT_WARP_ITEMS);
    let smem = warps * SMALL_SORT_WARP_SMEM;
    // up to 64 KB at capacity (every target GPU allows 99 KB or more)
    let f = dev.function_with_shared("scan_sort", "radix_sort_small", smem as usize)?;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (warps * 32, 1, 1), shared_mem_bytes: smem };
    // SAFETY: matches the kernel's signature; keys/vals hold >= n elements (checked above), the
    // block has n.div_ceil(256) warps and the shared memory they need.
    unsafe { dev.stream.launch_builder(&f).arg(&mut *keys).arg(&mut *vals).arg(&n).arg(&bits).launch(cfg) }
        .map_err(cuda_err("radix_sort_small"))?;
    Ok(())
}

/// Number of bits needed to hold every value up to and including `max`.
pub fn bits_for(max: u64) -> u32 {
    64 - max.leading_zeros()
}
