//! Window attention on CUDA (kernels in `kernels/ops/attention.cu`, exact float steps, and
//! `kernels/ops/attention_core.cu`, the attention itself): the same functions as the CPU reference in
//! `cpu.rs`, `partition.rs` and `sphere.rs`, on FP16 q/k/v with FP32 accumulation.
//!
//! Partition: per-axis bounds → mixed-radix window key per voxel → stable radix sort of
//! (key, voxel) over just the bits the keys need → run heads → scan = window of every sorted
//! position, window offsets, largest window. Two small reads to the host per partition (the
//! bounds; the window count with the largest window), and a level reads its two partitions'
//! together (one buffer holds both partitions' values); nothing per pair is ever stored.
//!
//! Attention: windows below [`TILED_MIN_WINDOW`] voxels (and every window without contextual RPE)
//! get four lanes per (query, head), each walking a quarter of the keys of its window with an
//! online softmax (merged by shuffles), RPE table rows computed from packed quantized positions. Larger windows with contextual RPE (the
//! spherical ones) get the window-tiled kernel on tensor cores: keys staged in shared memory,
//! Q K^T and P V as MMAs, the RPE terms factored into per-query and per-key-tile values and
//! per-query histograms for the value table (see attention_core.cu).
//!
//! q, k, v and the output are FP16, BF16 or FP32 ([`crate::device::storage`]): the attention
//! entry points are generic over the element type [`Store`] (`QkvView` defaults to FP16), which
//! picks attention_core's build (FP32's has the per-query kernels only).

use crate::ops::attention::cpu::HeadSlice;
use crate::ops::attention::partition::Partition;
use crate::ops::attention::rpe::RpeGeometry;
use crate::ops::attention::sphere::{cubic_heads, SphereLevel};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{bits_for, exclusive_scan_u32_async, grid_1d, radix_sort_pairs};
use crate::device::range::RangeSlot;
use crate::device::storage::{Storage, Store};
use crate::Error;
use cudarc::driver::{CudaSlice, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
/// `attn_bounds` strides over the voxels with at most this many blocks (one global atomic per
/// bound and block).
const BOUNDS_MAX_BLOCKS: u32 = 264;
const ATTN_THREADS: u32 = 128;
/// Lanes per query of the per-query kernel (QUERY_LANES in attention_core.cu).
const QUERY_LANES: usize = 4;
/// Queries and keys per tile of the tiled kernel, its threads (4 warps of 16 queries) and the
/// columns of its key-bin histograms (TQ, TK, TILED_THREADS, HIST_TILES * 8 in
/// attention_core.cu).
const TILED_QUERIES: u32 = 64;
const TILED_KEYS: usize = 32;
const TILED_THREADS: u32 = 128;
const TILED_HIST_BINS: usize = 32;
/// Windows of at least this many voxels take the tiled kernel (contextual RPE, head_dim 16 or
/// 32). Below it a tile's per-key and per-query RPE precomputation costs more than it saves.
pub const TILED_MIN_WINDOW: usize = 32;
/// Shared memory one tiled block may use (H100: 227 KB per block; at SphereFormer's L = 24 a
/// block takes ~50-70 KB).
const TILED_MAX_SMEM: usize = 200 * 1024;

/// Mirror of `struct WindowGrid` in attention.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct WindowGridC {
    window: [f32; 3],
    start: [f32; 3],
    cells: [u64; 3],
    batch_min: u32,
    shift: u32,
    n: u32,
}
// SAFETY: plain-old-data, same layout as the C struct.
unsafe impl DeviceRepr for WindowGridC {}

/// Mirror of `struct RpeGeom`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RpeGeomC {
    min: [f32; 3],
    window: [f32; 3],
    quant: [f32; 3],
    a: f32,
    grid_length: i32,
    rows: i32,
    shift: u32,
    split: u32,
    n: u32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for RpeGeomC {}

/// Mirror of `struct AttnParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnParamsC {
    ld: u32,
    out_ld: u32,
    head0: u32,
    heads_b: u32,
    n: u32,
    grid_length: i32,
    rows: i32,
    split: u32,
    a: f32,
    win_h: i32,
    win_w: i32,
    tiled_min: u32,
    key_splits: u32,
    items_cap: u32,
    k_off: u32,
    v_off: u32,
    q_scale: f32,
    in_layer: u32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnParamsC {}

fn n_u32(n: usize, what: &str) -> Result<u32, Error> {
    u32::try_from(n).map_err(|_| Error::InvalidInput(format!("{what}: {n} voxels exceed 2^32 - 1")))
}

/// A window partition on the device (the varlen layout the attention kernel reads).
pub struct CudaPartition {
    /// Sorted position → voxel, `n`.
    pub order: CudaSlice<u32>,
    /// Sorted position → window, `n`.
    pub win_of: CudaSlice<u32>,
    /// Window → first sorted position, `windows + 1`.
    pub offsets: CudaSlice<u32>,
    pub n: usize,
    pub windows: usize,
    /// Voxels in the largest window.
    pub n_max: usize,
    /// Per-axis minimum of the positions (the grid start, also the RPE minimum).
    pub min: [f32; 3],
    /// The tiled kernel's work list, built on first use and kept: a level's windows serve every
    /// attention block of the level.
    tiled_items: std::cell::OnceCell<TiledItems>,
}

impl CudaPartition {
    /// A partition from its device buffers (see the fields).
    pub fn new(order: CudaSlice<u32>, win_of: CudaSlice<u32>, offsets: CudaSlice<u32>, n: usize, windows: usize, n_max: usize, min: [f32; 3]) -> Self {
        CudaPartition { order, win_of, offsets, n, windows, n_max, min, tiled_items: std::cell::OnceCell::new() }
    }

    /// The kept work list of the tiled kernel, built now if this is its first use; None when it
    /// was kept for another smallest window size (tests and benchmarks vary it).
    fn kept_tiled_items(&self, dev: &CudaDevice, tiled_min: usize) -> Result<Option<&TiledItems>, Error> {
        if self.tiled_items.get().is_none() {
            let items = tiled_work_items(dev, self, tiled_min)?;
            let _ = self.tiled_items.set(items);
        }
        Ok(self.tiled_items.get().filter(|i| i.tiled_min == tiled_min))
    }

    /// Copies the partition back (for tests and statistics).
    pub fn to_host(&self, dev: &CudaDevice) -> Result<Partition, Error> {
        if self.n == 0 {
            return Ok(Partition::default());
        }
        let s = &dev.stream;
        let order = s.clone_dtoh(&self.order.slice(..self.n)).map_err(cuda_err("reading the window order"))?;
        let offsets = s
            .clone_dtoh(&self.offsets.slice(..self.windows + 1))
            .map_err(cuda_err("reading the window offsets"))?;
        Ok(Partition { order, offsets })
    }
}

/// Groups `n` voxels with positions `pos` (`[n, 3]`) and batch indices into windows, exactly as
/// [`crate::ops::attention::partition::window_partition`] does (same groups; windows in the same order).
pub fn window_partition_cuda(
    dev: &CudaDevice,
    pos: &CudaSlice<f32>,
    batch: &CudaSlice<i32>,
    n: usize,
    window: [f32; 3],
    shift: bool,
) -> Result<CudaPartition, Error> {
    check_partition_inputs(pos, batch, n, window)?;
    if n == 0 {
        return empty_partition(dev);
    }
    let mut meta = dev.stream.clone_htod(&PARTITION_META_INIT).map_err(cuda_err("uploading partition bounds"))?;
    launch_bounds(dev, pos, batch, n, &mut meta.slice_mut(..))?;
    let b = read_meta(dev, &meta)?;
    let pending = launch_windows(dev, pos, batch, n, window, shift, &b, &mut meta.slice_mut(..))?;
    Ok(pending.finish(&read_meta(dev, &meta)?))
}

/// A partition with no voxels.
fn empty_partition(dev: &CudaDevice) -> Result<CudaPartition, Error> {
    let one = || dev.stream.alloc_zeros::<u32>(1).map_err(cuda_err("allocating an empty partition"));
    Ok(CudaPartition::new(one()?, one()?, one()?, 0, 0, 0, [0.0; 3]))
}

/// A partition's small values on the device: the bounds of [`launch_bounds`] (order_f32 min x,
/// y, z, max x, y, z, then the batch indices' min and max), then the window count and the
/// largest window of [`launch_windows`]. Uploaded with these initial values (the minima at their
/// largest, the rest zero) so that the kernels need no memset; a level's two partitions share one
/// upload and one read of each step's values.
const PARTITION_META_LEN: usize = 10;
const PARTITION_META_INIT: [u32; PARTITION_META_LEN] = [u32::MAX, u32::MAX, u32::MAX, 0, 0, 0, u32::MAX, 0, 0, 0];
/// Where the window count and the largest window start in a partition's values.
const PARTITION_COUNTS: usize = 8;

/// The window must be finite and positive, and the positions and batch indices cover `n` voxels.
fn check_partition_inputs(pos: &CudaSlice<f32>, batch: &CudaSlice<i32>, n: usize, window: [f32; 3]) -> Result<(), Error> {
    if window.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(Error::InvalidInput(format!("window partition: window {window:?} must be finite and > 0")));
    }
    n_u32(n, "window partition")?;
    if n > 0 && (pos.len() < n * 3 || batch.len() < n) {
        return Err(Error::InvalidInput(format!(
            "window partition: {} position values and {} batch indices for {n} voxels",
            pos.len(),
            batch.len()
        )));
    }
    Ok(())
}

/// Step one of a lone partition of `n > 0` voxels (inputs checked by
/// [`check_partition_inputs`]), enqueued only: per-axis bounds of the positions and of the batch
/// indices into `meta`'s first eight values (a partition's values, see [`PARTITION_META_LEN`]).
/// A SphereFormer level takes both partitions' bounds from [`sphere_and_bounds`] instead.
fn launch_bounds(dev: &CudaDevice, pos: &CudaSlice<f32>, batch: &CudaSlice<i32>, n: usize, meta: &mut CudaViewMut<'_, u32>) -> Result<(), Error> {
    let n32 = n_u32(n, "window partition")?;
    let f_bounds = dev.function("attention", "attn_bounds")?;
    // SAFETY: pos holds n*3 floats, batch n ints, meta at least 8 u32; signature matches.
    unsafe {
        let mut cfg = grid_1d(n32, THREADS);
        cfg.grid_dim.0 = cfg.grid_dim.0.min(BOUNDS_MAX_BLOCKS);  // grid-stride kernel
        dev.stream.launch_builder(&f_bounds).arg(pos).arg(batch).arg(&n32).arg(meta).launch(cfg).map_err(cuda_err("attn_bounds"))?;
    }
    Ok(())
}

/// A SphereFormer level's first step for `n > 0` voxels, enqueued only: the spherical
/// coordinates of `xyz` (returned, as [`cart2sphere_cuda`]) and the bounds of both partitions
/// into their values (as [`launch_bounds`] over `xyz` and over the spherical coordinates), in one
/// launch instead of three.
fn sphere_and_bounds(
    dev: &CudaDevice,
    xyz: &CudaSlice<f32>,
    batch: &CudaSlice<i32>,
    n: usize,
    cubic_meta: &mut CudaViewMut<'_, u32>,
    sphere_meta: &mut CudaViewMut<'_, u32>,
) -> Result<CudaSlice<f32>, Error> {
    let n32 = n_u32(n, "window partition")?;
    // SAFETY: attn_sphere_and_bounds writes all n rows.
    let mut sphere = unsafe { dev.alloc_uninit::<f32>(n * 3, "sphere positions") }?;
    let f = dev.function("attention", "attn_sphere_and_bounds")?;
    // SAFETY: xyz and sphere hold n*3 floats, batch n ints (checked by check_partition_inputs),
    // both metas at least 8 u32; signature matches.
    unsafe {
        let mut cfg = grid_1d(n32, THREADS);
        cfg.grid_dim.0 = cfg.grid_dim.0.min(BOUNDS_MAX_BLOCKS);  // grid-stride kernel
        dev.stream
            .launch_builder(&f)
            .arg(xyz).arg(batch).arg(&n32).arg(&mut sphere).arg(cubic_meta).arg(sphere_meta)
            .launch(cfg)
            .map_err(cuda_err("attn_sphere_and_bounds"))?;
    }
    Ok(sphere)
}

/// Partition values (one partition's or a level's two) on the host: waits for the GPU.
fn read_meta(dev: &CudaDevice, meta: &CudaSlice<u32>) -> Result<Vec<u32>, Error> {
    dev.stream.clone_dtoh(meta).map_err(cuda_err("reading partition bounds and counts"))
}

/// A partition whose window count and largest window are still on the device.
struct PendingPartition {
    order: CudaSlice<u32>,
    win_of: CudaSlice<u32>,
    /// `n + 1` window offsets.
    offsets: CudaSlice<u32>,
    n: usize,
    min: [f32; 3],
}

impl PendingPartition {
    /// The partition, given its values read back after [`launch_windows`].
    fn finish(self, meta: &[u32]) -> CudaPartition {
        let (windows, n_max) = (meta[PARTITION_COUNTS] as usize, meta[PARTITION_COUNTS + 1] as usize);
        CudaPartition::new(self.order, self.win_of, self.offsets, self.n, windows, n_max, self.min)
    }
}

/// Step two, enqueued only: window keys from the bounds `b` (read back), the stable sort, run
/// heads, the scan, window offsets (allocated for the most windows there can be, `n`) and the
/// count and largest window into `meta`'s values 8 and 9 (uploaded as zeros).
#[allow(clippy::too_many_arguments)]
fn launch_windows(
    dev: &CudaDevice,
    pos: &CudaSlice<f32>,
    batch: &CudaSlice<i32>,
    n: usize,
    window: [f32; 3],
    shift: bool,
    b: &[u32],
    meta: &mut CudaViewMut<'_, u32>,
) -> Result<PendingPartition, Error> {
    let s = &dev.stream;
    let n32 = n_u32(n, "window partition")?;
    let unorder = |o: u32| f32::from_bits(if o & 0x8000_0000 != 0 { o & 0x7fff_ffff } else { !o });
    let min = [unorder(b[0]), unorder(b[1]), unorder(b[2])];
    let max = [unorder(b[3]), unorder(b[4]), unorder(b[5])];
    if min.iter().chain(max.iter()).any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput("window partition: a position is not finite".into()));
    }
    if (b[6] as i32) < 0 {
        return Err(Error::InvalidInput(format!("window partition: negative batch index {}", b[6] as i32)));
    }
    let mut cells = [0u64; 3];
    let mut total: u128 = (b[7] - b[6]) as u128 + 1;
    for a in 0..3 {
        let top = if shift { max[a] + 0.5 * window[a] } else { max[a] };
        cells[a] = ((top - min[a]) / window[a]) as u64 + 1;
        total *= cells[a] as u128;
    }
    if total > u64::MAX as u128 / 2 {
        return Err(Error::InvalidInput(format!(
            "window partition: {total} window cells over the positions' extent; the window {window:?} is too small for them"
        )));
    }
    let bits = bits_for((total - 1) as u64);
    let grid = WindowGridC { window, start: min, cells, batch_min: b[6], shift: shift as u32, n: n32 };
    // Not zeroed (a memset a buffer, ten partitions a frame): attn_window_keys writes every
    // key and value, attn_window_heads every flag, the scan every prefix, attn_window_offsets
    // every window id, each for all n positions before anything reads them. The offsets past
    // the last window and the counts are read as zeros: those stay zeroed.
    // SAFETY: as said; n > 0.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(n, "window keys") }?;
    // SAFETY: as above.
    let mut order = unsafe { dev.alloc_uninit::<u32>(n, "the window order") }?;
    let f_keys = dev.function("attention", "attn_window_keys")?;
    // SAFETY: buffers hold n entries; signature matches.
    unsafe {
        s.launch_builder(&f_keys).arg(pos).arg(batch).arg(&grid).arg(&mut keys).arg(&mut order).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_window_keys"))?;
    }
    radix_sort_pairs(dev, &mut keys, &mut order, n, bits)?;
    // SAFETY: as above.
    let mut flags = unsafe { dev.alloc_uninit::<u32>(n, "window heads") }?;
    let f_heads = dev.function("attention", "attn_window_heads")?;
    // SAFETY: as above.
    unsafe {
        s.launch_builder(&f_heads).arg(&keys).arg(&n32).arg(&mut flags).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_window_heads"))?;
    }
    // SAFETY: as above.
    let mut excl = unsafe { dev.alloc_uninit::<u32>(n, "the window scan") }?;
    let (sums, ntiles) = exclusive_scan_u32_async(dev, &flags, &mut excl, n)?;
    // SAFETY: as above.
    let mut win_of = unsafe { dev.alloc_uninit::<u32>(n, "window ids") }?;
    let mut offsets = s.alloc_zeros::<u32>(n + 1).map_err(cuda_err("allocating window offsets"))?;
    let f_offs = dev.function("attention", "attn_window_offsets")?;
    let f_nmax = dev.function("attention", "attn_window_nmax")?;
    let nt32 = ntiles as u32;
    let mut counts = meta.slice_mut(PARTITION_COUNTS..PARTITION_META_LEN);
    // SAFETY: flags/excl/win_of hold n entries, offsets n + 1 (≥ windows + 1), sums ntiles + 1,
    // counts 2.
    unsafe {
        s.launch_builder(&f_offs).arg(&flags).arg(&excl).arg(&n32).arg(&mut win_of).arg(&mut offsets).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_window_offsets"))?;
        s.launch_builder(&f_nmax).arg(&offsets).arg(&sums).arg(&nt32).arg(&n32).arg(&mut counts).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_window_nmax"))?;
    }
    Ok(PendingPartition { order, win_of, offsets, n, min })
}

/// SphereFormer's `cart2sphere` of `[n, 3]` positions.
pub fn cart2sphere_cuda(dev: &CudaDevice, xyz: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<f32>, Error> {
    let n32 = n_u32(n, "cart2sphere")?;
    let s = &dev.stream;
    // SAFETY: attn_cart2sphere writes all n rows (nothing reads the buffer when n = 0).
    let mut out = unsafe { dev.alloc_uninit::<f32>(n * 3, "sphere positions") }?;
    if n == 0 {
        return Ok(out);
    }
    let f = dev.function("attention", "attn_cart2sphere")?;
    // SAFETY: xyz and out hold n*3 floats.
    unsafe {
        s.launch_builder(&f).arg(xyz).arg(&n32).arg(&mut out).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_cart2sphere"))?;
    }
    Ok(out)
}

/// SphereFormer's `exponential_split(d, a)` of every distance in `d`, as the attention kernels
/// compute it per pair (the exponent of x away from powers of two), and on the logf path alone,
/// as `[kernels, logf path]` pairs (for tests against each other and against
/// [`crate::ops::attention::rpe::exponential_split`]).
pub fn exponential_split_cuda(dev: &CudaDevice, d: &[f32], a: f32) -> Result<Vec<[i32; 2]>, Error> {
    let n32 = n_u32(d.len(), "exponential split")?;
    if d.is_empty() {
        return Ok(vec![]);
    }
    let s = &dev.stream;
    let dd = s.clone_htod(d).map_err(cuda_err("uploading distances"))?;
    let mut out = s.alloc_zeros::<i32>(2 * d.len()).map_err(cuda_err("allocating split indices"))?;
    let f = dev.function("attention_core", "attn_exponential_split")?;
    // SAFETY: dd and out hold n entries.
    unsafe {
        s.launch_builder(&f).arg(&dd).arg(&n32).arg(&a).arg(&mut out).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_exponential_split"))?;
    }
    let flat = s.clone_dtoh(&out).map_err(cuda_err("reading split indices"))?;
    Ok(flat.chunks_exact(2).map(|p| [p[0], p[1]]).collect())
}

/// Packed quantized in-window positions (10 bits per axis) under `geometry`.
pub fn rpe_quantize_cuda(dev: &CudaDevice, pos: &CudaSlice<f32>, n: usize, geometry: &RpeGeometry) -> Result<CudaSlice<u32>, Error> {
    if geometry.grid_length > 1024 {
        return Err(Error::InvalidInput(format!(
            "RPE: quant grid length {} exceeds the CUDA kernel's 1024",
            geometry.grid_length
        )));
    }
    let n32 = n_u32(n, "RPE quantize")?;
    let s = &dev.stream;
    // SAFETY: attn_rpe_quantize writes all n entries (nothing reads the buffer when n = 0).
    let mut quant = unsafe { dev.alloc_uninit::<u32>(n, "quantized positions") }?;
    if n == 0 {
        return Ok(quant);
    }
    let g = RpeGeomC {
        min: geometry.min,
        window: geometry.window,
        quant: geometry.quant,
        a: geometry.radial_split.unwrap_or(0.0),
        grid_length: geometry.grid_length,
        rows: geometry.table_rows() as i32,
        shift: geometry.shift as u32,
        split: geometry.radial_split.is_some() as u32,
        n: n32,
    };
    let f = dev.function("attention", "attn_rpe_quantize")?;
    // SAFETY: pos holds n*3 floats, quant n u32.
    unsafe {
        s.launch_builder(&f).arg(pos).arg(&g).arg(&mut quant).launch(grid_1d(n32, THREADS)).map_err(cuda_err("attn_rpe_quantize"))?;
    }
    Ok(quant)
}

/// q, k, v as rows of FP16 buffers: voxel `i`, head `h` starts at `i * ld + h * head_dim` (so a
/// packed qkv Linear output `[N, 3, H, D]` is three views with offsets… or three buffers).
#[derive(Clone, Copy)]
pub struct QkvView<'a, S: Store = f16> {
    pub q: &'a CudaSlice<S>,
    pub k: &'a CudaSlice<S>,
    pub v: &'a CudaSlice<S>,
    /// Elements between consecutive voxel rows.
    pub ld: usize,
}

/// Contextual RPE on the device: the geometry, packed quantized positions (from
/// [`rpe_quantize_cuda`] with the same geometry), the positions (their column 2 is the radius the
/// radial split reads) and the tables `[rows, 3, heads.count, head_dim]` (f32).
#[derive(Clone, Copy)]
pub struct CudaContextual<'a> {
    pub geometry: RpeGeometry,
    pub quant: &'a CudaSlice<u32>,
    pub positions: &'a CudaSlice<f32>,
    pub tables: [&'a CudaSlice<f32>; 3],
}

/// 2-D relative position bias: packed `(row << 16) | col` per token and a `[heads.count,
/// (2h - 1)(2w - 1)]` table.
#[derive(Clone, Copy)]
pub struct CudaBias2d<'a> {
    pub window: [i32; 2],
    pub rc_packed: &'a CudaSlice<u32>,
    pub table: &'a CudaSlice<f32>,
    /// Which kernel runs the windows ([`Bias2dKernel`]).
    pub kernel: Bias2dKernel,
}

impl CudaBias2d<'_> {
    /// Entries of one head's table: (2h - 1)(2w - 1).
    pub fn table_len(&self) -> usize {
        ((2 * self.window[0] - 1) * (2 * self.window[1] - 1)).max(0) as usize
    }

    /// The kernel that runs these windows in `storage` ([`Bias2dKernel::effective`]).
    pub fn kernel_for(&self, storage: Storage, n_max: usize) -> Bias2dKernel {
        self.kernel.effective(storage, n_max, self.table_len())
    }

    /// The table is `[heads, table_len]` for a window of at least 1 × 1, and the packed
    /// positions cover `n` tokens.
    fn check(&self, heads: usize, n: usize, what: &str) -> Result<(), Error> {
        let tl = self.table_len();
        if self.window[0] < 1 || self.window[1] < 1 || self.table.len() != heads * tl || self.rc_packed.len() < n {
            return Err(Error::InvalidInput(format!("{what}: 2-D bias table must be [{heads}, {tl}] for window {:?}", self.window)));
        }
        Ok(())
    }
}

/// A whole-window kernel's launch: a block of `threads` per (window, head).
fn whole_window_config(part: &CudaPartition, heads: usize, threads: u32) -> Result<LaunchConfig, Error> {
    let windows = u32::try_from(part.windows).map_err(|_| Error::InvalidInput(format!("window attention: {} windows exceed 2^32", part.windows)))?;
    Ok(LaunchConfig { grid_dim: (windows, heads as u32, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

/// The kernels of 2-D window attention (attention_core.cu), one of which runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bias2dKernel {
    /// `attn_bias2d_d*`: 4 lanes a query, each query's keys read from global memory (any window).
    PerQuery,
    /// `attn_bias2d_win_d*`: a block per window and head, keys and values staged in shared
    /// memory, one thread a query, every product in FP32.
    WholeWindow,
    /// `attn_bias2d_win_tc_d*`: a block of 4 warps per window and head, q·kᵀ and p·v on tensor
    /// cores (FP32 accumulation, the probabilities rounded to the stored type once). In FP32
    /// storage, which has no tensor-core kernels, [`Bias2dKernel::WholeWindow`] runs instead.
    TensorCores,
}

impl Bias2dKernel {
    /// The kernel a call gets: the whole-window kernels only when every window has at most
    /// [`WIN_MAX_TOKENS`] tokens and the table at most [`WIN_MAX_TABLE`] entries (else the
    /// per-query kernel), tensor cores only in a storage that has them.
    pub fn effective(self, storage: Storage, n_max: usize, table_len: usize) -> Bias2dKernel {
        let fits = n_max <= WIN_MAX_TOKENS && table_len <= WIN_MAX_TABLE;
        match self {
            _ if !fits => Bias2dKernel::PerQuery,
            Bias2dKernel::TensorCores if !storage.tensor_cores() => Bias2dKernel::WholeWindow,
            k => k,
        }
    }

    /// The name `SPTR_SWIN_ATTN` and the bench use.
    pub fn name(self) -> &'static str {
        match self {
            Bias2dKernel::PerQuery => "perquery",
            Bias2dKernel::WholeWindow => "window",
            Bias2dKernel::TensorCores => "tensor",
        }
    }

    /// The kernel a name selects (see [`Bias2dKernel::name`]).
    pub fn from_name(name: &str) -> Option<Bias2dKernel> {
        [Bias2dKernel::PerQuery, Bias2dKernel::WholeWindow, Bias2dKernel::TensorCores].into_iter().find(|k| k.name() == name)
    }
}

/// The whole-window 2-D kernels' limits (attention_core.cu's WIN_MAX_TOKENS / WIN_MAX_TABLE);
/// the FP32 one's block has WIN_MAX_TOKENS threads, the tensor-core one's WIN_TC_THREADS.
pub const WIN_MAX_TOKENS: usize = 64;
pub const WIN_MAX_TABLE: usize = 256;
const WIN_TC_THREADS: u32 = 128;

#[derive(Clone, Copy)]
pub enum CudaTerm<'a> {
    None,
    Contextual(CudaContextual<'a>),
    Bias2d(CudaBias2d<'a>),
}

/// Window attention over `heads` (a slice of the row's heads), written into those heads of `out`
/// (rows of `out_ld` elements). The CUDA counterpart of [`crate::ops::attention::cpu::window_attention_into`].
pub fn window_attention_cuda<S: Store>(
    dev: &CudaDevice,
    qkv: QkvView<'_, S>,
    heads: HeadSlice,
    part: &CudaPartition,
    term: CudaTerm,
    out: &mut CudaSlice<S>,
    out_ld: usize,
) -> Result<(), Error> {
    window_attention_cuda_split(dev, qkv, heads, part, term, out, out_ld, TILED_MIN_WINDOW, None)
}

/// Shared memory (bytes) of one tiled block for `geometry` and head_dim `d`, when the tiled
/// kernel can serve it: contextual RPE whose unsplit axes' quantized coordinates stay within the
/// kernel's `L + 1` histogram bins (`floor(window / quant) <= L`, true for SphereFormer's
/// geometries) and `L + 1 <= 32`. Mirrors `TiledLayout` in attention_core.cu.
fn tiled_smem_bytes(geometry: &RpeGeometry, d: usize) -> Option<usize> {
    if d != 16 && d != 32 {
        return None;
    }
    let l = geometry.grid_length as usize;
    let split = geometry.radial_split.is_some();
    let unsplit = if split { 2 } else { 3 };
    let fits = l < TILED_HIST_BINS && (0..unsplit).all(|a| (geometry.window[a] / geometry.quant[a]).floor() <= l as f32);
    let rows = geometry.table_rows();
    let (tq, tk) = (TILED_QUERIES as usize, TILED_KEYS);
    let per_query = unsplit * (l + 1) + if split { rows } else { 0 };
    let kt_len = (tk * ((3 * rows) | 1)).max(tq * (d + 2));
    let table = 3 * rows * d;
    let floats = (table + tq * (per_query | 1) + if split { tq * (rows | 1) } else { 0 } + kt_len + 2 * tk).next_multiple_of(4);
    let halves = tk * (d + 8) + d * (tk + 8);
    let bytes = floats * 4 + halves * 2;
    (fits && bytes <= TILED_MAX_SMEM).then_some(bytes)
}

/// The tiled kernel's work list on the device: `[count][window; cap][query chunk; cap]`.
struct TiledItems {
    list: CudaSlice<u32>,
    /// An upper bound on the count, known without reading it back: the grid's width.
    cap: u32,
    /// The smallest window it lists.
    tiled_min: usize,
}

/// One work item per (tiled window, query chunk of `TILED_QUERIES`), built on the device. A grid
/// of windows x the largest window's chunks would be mostly blocks with nothing to do, and each
/// of them still claims the kernel's ~75 KB of shared memory before it can exit.
fn tiled_work_items(dev: &CudaDevice, part: &CudaPartition, tiled_min: usize) -> Result<TiledItems, Error> {
    let s = &dev.stream;
    let (n, windows) = (part.n, part.windows.max(1));
    // Σ over tiled windows of ceil(size / TQ) ≤ n / TQ + (number of tiled windows)
    let cap = n.div_ceil(TILED_QUERIES as usize) + windows.min(n / tiled_min) + 1;
    let cap32 = u32::try_from(cap).map_err(|_| Error::InvalidInput(format!("window attention: {n} voxels are too many")))?;
    let w32 = windows as u32;
    // Not zeroed: attn_tiled_chunks writes every window's chunks, the scan every start,
    // attn_tiled_items the count and the items below it, the only ones the kernel reads.
    // SAFETY: as said.
    let mut chunks = unsafe { dev.alloc_uninit::<u32>(windows, "tiled chunks") }?;
    // SAFETY: as above.
    let mut start = unsafe { dev.alloc_uninit::<u32>(windows, "tiled item starts") }?;
    // SAFETY: as above.
    let mut list = unsafe { dev.alloc_uninit::<u32>(1 + 2 * cap, "the tiled work list") }?;
    let f_chunks = dev.function("attention_core", "attn_tiled_chunks")?;
    let f_items = dev.function("attention_core", "attn_tiled_items")?;
    let tmin = u32::try_from(tiled_min).unwrap_or(u32::MAX);
    // SAFETY: offsets holds windows + 1 entries, chunks/start windows, list 1 + 2 cap (the items
    // fit: their count is at most cap, see above).
    unsafe {
        s.launch_builder(&f_chunks).arg(&part.offsets).arg(&w32).arg(&tmin).arg(&mut chunks).launch(grid_1d(w32, THREADS)).map_err(cuda_err("attn_tiled_chunks"))?;
    }
    let (sums, ntiles) = exclusive_scan_u32_async(dev, &chunks, &mut start, windows)?;
    let nt32 = ntiles as u32;
    // SAFETY: as above; sums holds ntiles + 1 entries.
    unsafe {
        s.launch_builder(&f_items)
            .arg(&chunks).arg(&start).arg(&sums).arg(&nt32).arg(&w32).arg(&cap32).arg(&mut list)
            .launch(grid_1d(w32, THREADS))
            .map_err(cuda_err("attn_tiled_items"))?;
    }
    Ok(TiledItems { list, cap: cap32, tiled_min })
}

/// Blocks the tiled kernel should have in flight before splitting keys pays: a few per SM of the
/// largest GPUs it runs on (132 SMs on an H100).
const TILED_TARGET_BLOCKS: usize = 4 * 132;
/// At most this many key splits, and each split at least this many keys.
const MAX_KEY_SPLITS: usize = 8;
const MIN_KEYS_PER_SPLIT: usize = 2 * TILED_KEYS;

/// How many slices to cut each tiled window's keys into. With few voxels and large windows (the
/// deep levels of a sparse sweep) one block per (window, query chunk, head) leaves most of the GPU
/// idle while each block walks thousands of keys; splitting the keys multiplies the blocks and
/// divides the walk, at the cost of one merge pass.
fn auto_key_splits(n: usize, n_max: usize, heads: usize) -> usize {
    let blocks = n.div_ceil(TILED_QUERIES as usize).max(1) * heads.max(1);
    let by_blocks = TILED_TARGET_BLOCKS.div_ceil(blocks);
    let by_keys = (n_max / MIN_KEYS_PER_SPLIT).max(1);
    by_blocks.min(by_keys).clamp(1, MAX_KEY_SPLITS)
}

/// [`window_attention_cuda`] with the window size from which the tiled kernel takes over
/// (`usize::MAX`: never; 1: every window) and its key splits (`None`: chosen from the partition's
/// size, see `auto_key_splits`) — for tests and benchmarks of both kernels and the split path.
#[allow(clippy::too_many_arguments)]
pub fn window_attention_cuda_split<S: Store>(
    dev: &CudaDevice,
    qkv: QkvView<'_, S>,
    heads: HeadSlice,
    part: &CudaPartition,
    term: CudaTerm,
    out: &mut CudaSlice<S>,
    out_ld: usize,
    tiled_min: usize,
    key_splits: Option<usize>,
) -> Result<(), Error> {
    window_attention_cuda_guarded(dev, qkv, heads, part, term, out, out_ld, tiled_min, key_splits, None)
}

/// [`window_attention_cuda_split`] with the FP16 range guard of the output reporting into
/// `range` ([`crate::device::range_guard`]; `None`: not guarded).
#[allow(clippy::too_many_arguments)]
pub fn window_attention_cuda_guarded<S: Store>(
    dev: &CudaDevice,
    qkv: QkvView<'_, S>,
    heads: HeadSlice,
    part: &CudaPartition,
    term: CudaTerm,
    out: &mut CudaSlice<S>,
    out_ld: usize,
    tiled_min: usize,
    key_splits: Option<usize>,
    range: Option<RangeSlot<'_>>,
) -> Result<(), Error> {
    let range = range.as_ref();
    let n = part.n;
    if heads.head_dim == 0 || heads.count == 0 || heads.first + heads.count > heads.heads {
        return Err(Error::InvalidInput(format!("window attention: bad head slice {heads:?}")));
    }
    let d = heads.head_dim;
    if n == 0 {
        return Ok(());
    }
    let row_end = (heads.first + heads.count) * d;
    let need = (n - 1) * qkv.ld + row_end;
    if qkv.ld < row_end || qkv.q.len() < need || qkv.k.len() < need || qkv.v.len() < need {
        return Err(Error::InvalidInput(format!(
            "window attention: q/k/v buffers of {}/{}/{} halves with row stride {} are too small for {n} voxels x {} heads x {d}",
            qkv.q.len(),
            qkv.k.len(),
            qkv.v.len(),
            qkv.ld,
            heads.heads
        )));
    }
    if out_ld < row_end || out.len() < (n - 1) * out_ld + row_end {
        return Err(Error::InvalidInput(format!("window attention: output of {} halves too small", out.len())));
    }
    if !qkv.ld.is_multiple_of(8) || !out_ld.is_multiple_of(2) {
        return Err(Error::InvalidInput(format!(
            "window attention: row strides must be multiples of 8 halves (16-byte loads); got {} and {out_ld}",
            qkv.ld
        )));
    }
    let mode = match term {
        CudaTerm::None => "plain",
        CudaTerm::Contextual(_) => "ctx",
        CudaTerm::Bias2d(_) => "bias2d",
    };
    let name: &'static str = match (mode, d) {
        ("plain", 16) => "attn_plain_d16",
        ("plain", 32) => "attn_plain_d32",
        ("plain", 64) => "attn_plain_d64",
        ("ctx", 16) => "attn_ctx_d16",
        ("ctx", 32) => "attn_ctx_d32",
        ("ctx", 64) => "attn_ctx_d64",
        ("bias2d", 16) => "attn_bias2d_d16",
        ("bias2d", 32) => "attn_bias2d_d32",
        ("bias2d", 64) => "attn_bias2d_d64",
        _ => {
            return Err(Error::InvalidInput(format!(
                "window attention on CUDA supports head_dim 16, 32 and 64, not {d}"
            )))
        }
    };
    let mut p = AttnParamsC {
        ld: qkv.ld as u32,
        out_ld: out_ld as u32,
        head0: heads.first as u32,
        heads_b: heads.count as u32,
        n: n as u32,
        tiled_min: u32::MAX,
        key_splits: 1,
        ..Default::default()
    };
    // Unused buffer slots get `order` (any valid device pointer; the kernel never reads them).
    // The float buffer slots are (positions, tq, tk, tv); a mode leaves some unused.
    let (quant, floats): (&CudaSlice<u32>, [Option<&CudaSlice<f32>>; 4]) =
        match term {
            CudaTerm::None => (&part.order, [None; 4]),
            CudaTerm::Contextual(c) => {
                let rows = c.geometry.table_rows();
                let want = rows * 3 * heads.count * d;
                if c.tables.iter().any(|t| t.len() != want) || c.quant.len() < n || c.positions.len() < 3 * n {
                    return Err(Error::InvalidInput(format!(
                        "window attention: RPE tables must be [{rows}, 3, {}, {d}] = {want} floats and positions/quant cover {n} voxels",
                        heads.count
                    )));
                }
                p.grid_length = c.geometry.grid_length;
                p.rows = rows as i32;
                p.split = c.geometry.radial_split.is_some() as u32;
                p.a = c.geometry.radial_split.unwrap_or(0.0);
                (c.quant, [Some(c.positions), Some(c.tables[0]), Some(c.tables[1]), Some(c.tables[2])])
            }
            CudaTerm::Bias2d(b) => {
                b.check(heads.count, n, "window attention")?;
                p.win_h = b.window[0];
                p.win_w = b.window[1];
                (b.rc_packed, [None, Some(b.table), None, None])
            }
        };
    // The tiled kernel takes the windows of at least `tiled_min` voxels when it can serve them
    // (on tensor cores: not in FP32, whose build has the per-query kernels only).
    let tiled = match term {
        CudaTerm::Contextual(c) if S::STORAGE.tensor_cores() && part.n_max >= tiled_min.max(1) => tiled_smem_bytes(&c.geometry, d),
        _ => None,
    };
    if tiled.is_some() {
        p.tiled_min = u32::try_from(tiled_min.max(1)).unwrap_or(u32::MAX);
    }
    // 2-D windows small enough for a whole-window kernel: one block per (window, head).
    if let CudaTerm::Bias2d(b) = term {
        let (name, threads) = match (b.kernel_for(S::STORAGE, part.n_max), d) {
            (Bias2dKernel::PerQuery, _) => ("", 0),
            (Bias2dKernel::WholeWindow, 16) => ("attn_bias2d_win_d16", WIN_MAX_TOKENS as u32),
            (Bias2dKernel::WholeWindow, 32) => ("attn_bias2d_win_d32", WIN_MAX_TOKENS as u32),
            (Bias2dKernel::WholeWindow, _) => ("attn_bias2d_win_d64", WIN_MAX_TOKENS as u32),
            (Bias2dKernel::TensorCores, 16) => ("attn_bias2d_win_tc_d16", WIN_TC_THREADS),
            (Bias2dKernel::TensorCores, 32) => ("attn_bias2d_win_tc_d32", WIN_TC_THREADS),
            (Bias2dKernel::TensorCores, _) => ("attn_bias2d_win_tc_d64", WIN_TC_THREADS),
        };
        if threads > 0 {
            let cfg = whole_window_config(part, heads.count, threads)?;
            return launch_attention(dev, name, cfg, qkv, out, None, None, part, quant, floats, &p, range);
        }
    }
    // QUERY_LANES lanes per query (attention_core.cu)
    let lanes = u32::try_from(n * QUERY_LANES).map_err(|_| Error::InvalidInput(format!("window attention: {n} voxels exceed 2^30")))?;
    let cfg = LaunchConfig {
        grid_dim: (lanes.div_ceil(ATTN_THREADS), heads.count as u32, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_attention(dev, name, cfg, qkv, out, None, None, part, quant, floats, &p, range)?;
    let Some(smem) = tiled else { return Ok(()) };
    let splits = key_splits.unwrap_or_else(|| auto_key_splits(n, part.n_max, heads.count)).clamp(1, MAX_KEY_SPLITS);
    p.key_splits = splits as u32;
    let split_axis = matches!(term, CudaTerm::Contextual(c) if c.geometry.radial_split.is_some());
    let name = match (split_axis, d) {
        (false, 16) => "attn_ctx_tiled_d16",
        (false, _) => "attn_ctx_tiled_d32",
        (true, 16) => "attn_ctx_tiled_split_d16",
        (true, _) => "attn_ctx_tiled_split_d32",
    };
    dev.function_with_shared_in(S::STORAGE, "attention_core", name, smem)?;  // launch_attention launches it
    let tmin = tiled_min.max(1);
    let fresh;
    let items = match part.kept_tiled_items(dev, tmin)? {
        Some(kept) => kept,
        None => {
            fresh = tiled_work_items(dev, part, tmin)?;
            &fresh
        }
    };
    p.items_cap = items.cap;
    let cfg = LaunchConfig {
        grid_dim: (items.cap, p.key_splits, heads.count as u32),
        block_dim: (TILED_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    if splits == 1 {
        // the grid covers every work item (blocks past the list's count return), shared memory as computed
        return launch_attention(dev, name, cfg, qkv, out, None, Some(&items.list), part, quant, floats, &p, range);
    }
    // [splits][n][heads][d + 2] partials, then the merge writes the tiled windows' rows
    // SAFETY: every split writes the partials of every position of each tiled window (an empty
    // key slice leaves a zero sum), the only ones attn_tiled_merge reads.
    let mut partial = unsafe { dev.alloc_uninit::<f32>(splits * n * heads.count * (d + 2), "the key-split partials") }?;
    launch_attention(dev, name, cfg, qkv, out, Some(&mut partial), Some(&items.list), part, quant, floats, &p, range)?;
    let merge = dev.function_in(S::STORAGE, "attention_core", "attn_tiled_merge")?;
    let total = u32::try_from(n * heads.count).map_err(|_| Error::InvalidInput(format!("window attention: {n} voxels x {} heads exceed 2^32", heads.count)))?;
    let d32 = d as u32;
    // SAFETY: partial holds splits * n * heads * (d + 2) floats, written for every position of a
    // tiled window; order/win_of hold n entries, offsets windows + 1; out was checked above; the
    // range slot's layer lies in its flags.
    unsafe {
        let mut b = dev.stream.launch_builder(&merge);
        b.arg(&partial).arg(&part.order).arg(&part.win_of).arg(&part.offsets).arg(&p).arg(&d32).arg(out);
        RangeSlot::push(range, &mut b);
        b.launch(grid_1d(total, THREADS))
    }
    .map_err(cuda_err("attn_tiled_merge"))?;
    Ok(())
}

/// 2-D window attention straight from one qkv Linear's output `y` (`[n, 3 * channels]`, rows of
/// q, k, v, each `heads.heads * heads.head_dim` = `channels` wide) on the tensor-core whole-window
/// kernel: q is multiplied by `q_scale` and rounded to the stored type as it is staged, as a
/// split kernel storing q, k and v apart would do first, so the output has the same bits as
/// splitting then calling [`window_attention_cuda_guarded`] with [`Bias2dKernel::TensorCores`].
/// `in_range` guards the qkv values read (each once: every row lies in one window) and the scaled
/// q; `out_range` the output. Both guards share one flags buffer, or neither is given.
/// An error when this kernel cannot serve the call (FP32 storage, a window over
/// [`WIN_MAX_TOKENS`] tokens, a table over [`WIN_MAX_TABLE`] entries): split and call
/// [`window_attention_cuda_guarded`] instead.
#[allow(clippy::too_many_arguments)]
pub fn window_attention_packed_qkv_cuda<S: Store>(
    dev: &CudaDevice,
    y: &CudaSlice<S>,
    q_scale: f32,
    heads: HeadSlice,
    part: &CudaPartition,
    bias: CudaBias2d,
    out: &mut CudaSlice<S>,
    out_ld: usize,
    in_range: Option<RangeSlot<'_>>,
    out_range: Option<RangeSlot<'_>>,
) -> Result<(), Error> {
    let d = heads.head_dim;
    let c = heads.heads * d;
    if Bias2dKernel::TensorCores.effective(S::STORAGE, part.n_max, bias.table_len()) != Bias2dKernel::TensorCores {
        return Err(Error::InvalidInput(format!(
            "packed-qkv window attention needs tensor-core storage, windows of at most {WIN_MAX_TOKENS} tokens and a table of at most {WIN_MAX_TABLE} entries ({:?}, {} tokens, {} entries)",
            S::STORAGE,
            part.n_max,
            bias.table_len()
        )));
    }
    let name = match d {
        16 => "attn_bias2d_win_tc_packed_d16",
        32 => "attn_bias2d_win_tc_packed_d32",
        64 => "attn_bias2d_win_tc_packed_d64",
        _ => return Err(Error::InvalidInput(format!("packed-qkv window attention supports head_dim 16, 32 and 64, not {d}"))),
    };
    if heads.count == 0 || heads.first + heads.count > heads.heads {
        return Err(Error::InvalidInput(format!("packed-qkv window attention: bad head slice {heads:?}")));
    }
    let n = part.n;
    if n == 0 {
        return Ok(());
    }
    if y.len() < n * 3 * c || out_ld < c || out.len() < (n - 1) * out_ld + c {
        return Err(Error::InvalidInput(format!(
            "packed-qkv window attention: qkv of {} values or output of {} with row stride {out_ld} too small for {n} rows of 3 x {c}",
            y.len(),
            out.len()
        )));
    }
    bias.check(heads.count, n, "packed-qkv window attention")?;
    let in_layer = match (&in_range, &out_range) {
        (None, None) => 0,
        (Some(i), Some(o)) if i.shares_flags(o) => i.layer(),
        _ => return Err(Error::InvalidInput("packed-qkv window attention: guard both the qkv input and the output in one flags buffer, or neither".into())),
    };
    let p = AttnParamsC {
        ld: (3 * c) as u32,
        out_ld: out_ld as u32,
        head0: heads.first as u32,
        heads_b: heads.count as u32,
        n: n as u32,
        tiled_min: u32::MAX,
        key_splits: 1,
        win_h: bias.window[0],
        win_w: bias.window[1],
        k_off: c as u32,
        v_off: (2 * c) as u32,
        q_scale,
        in_layer,
        ..Default::default()
    };
    let cfg = whole_window_config(part, heads.count, WIN_TC_THREADS)?;
    let qkv = QkvView { q: y, k: y, v: y, ld: 3 * c };
    launch_attention(dev, name, cfg, qkv, out, None, None, part, bias.rc_packed, [None, Some(bias.table), None, None], &p, out_range.as_ref())
}

/// Launches one of attention_core.cu's kernels (all take ATTN_PARAMS). Unused float slots get the
/// order buffer: a valid device pointer that the kernel never dereferences in that mode.
#[allow(clippy::too_many_arguments)]
fn launch_attention<S: Store>(
    dev: &CudaDevice,
    name: &'static str,
    cfg: LaunchConfig,
    qkv: QkvView<'_, S>,
    out: &mut CudaSlice<S>,
    partial: Option<&mut CudaSlice<f32>>,
    items: Option<&CudaSlice<u32>>,
    part: &CudaPartition,
    quant: &CudaSlice<u32>,
    floats: [Option<&CudaSlice<f32>>; 4],
    p: &AttnParamsC,
    range: Option<&RangeSlot<'_>>,
) -> Result<(), Error> {
    let f = dev.function_in(S::STORAGE, "attention_core", name)?;
    let mut b = dev.stream.launch_builder(&f);
    b.arg(qkv.q).arg(qkv.k).arg(qkv.v).arg(out).arg(&part.order).arg(&part.win_of).arg(&part.offsets).arg(quant);
    for t in floats {
        match t {
            Some(x) => b.arg(x),
            None => b.arg(&part.order),
        };
    }
    match partial {
        Some(x) => b.arg(x),
        None => b.arg(&part.order),
    };
    match items {
        Some(x) => b.arg(x),
        None => b.arg(&part.order),
    };
    b.arg(p);
    RangeSlot::push(range, &mut b);
    // SAFETY: argument list matches ATTN_PARAMS; the caller checked every buffer's size; the
    // range slot's layer lies in its flags.
    unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
    Ok(())
}

/// One level's partitions and RPE inputs on the device (built once, reused by every block of the
/// level).
pub struct CudaSphereWindows {
    pub cubic: CudaPartition,
    pub sphere: CudaPartition,
    /// Voxels.
    pub n: usize,
    pub sphere_pos: CudaSlice<f32>,
    pub cubic_quant: CudaSlice<u32>,
    pub sphere_quant: CudaSlice<u32>,
    pub cubic_rpe: RpeGeometry,
    pub sphere_rpe: RpeGeometry,
}

impl CudaSphereWindows {
    /// `xyz`: `[n, 3]` f32 positions (metres), `batch`: `[n]`.
    pub fn build(dev: &CudaDevice, xyz: &CudaSlice<f32>, batch: &CudaSlice<i32>, n: usize, level: &SphereLevel) -> Result<Self, Error> {
        // the spherical coordinates have the positions' length, so both checks read `xyz`
        check_partition_inputs(xyz, batch, n, level.cubic_window)?;
        check_partition_inputs(xyz, batch, n, level.sphere_window)?;
        let (sphere_pos, cubic, sphere) = if n == 0 {
            (cart2sphere_cuda(dev, xyz, n)?, empty_partition(dev)?, empty_partition(dev)?)
        } else {
            // Both partitions step by step, their values in one buffer: the level uploads once
            // and waits for the GPU twice (bounds, then counts), reading both partitions' each
            // time. The spherical coordinates and both partitions' bounds come from one launch.
            const L: usize = PARTITION_META_LEN;
            let init: Vec<u32> = [PARTITION_META_INIT; 2].concat();
            let mut meta = dev.stream.clone_htod(&init).map_err(cuda_err("uploading partition bounds"))?;
            let sphere_pos = {
                let (mut cubic_meta, mut sphere_meta) = meta.split_at_mut(L);
                sphere_and_bounds(dev, xyz, batch, n, &mut cubic_meta, &mut sphere_meta)?
            };
            let b = read_meta(dev, &meta)?;
            let (cubic, sphere) = {
                let (mut cubic_meta, mut sphere_meta) = meta.split_at_mut(L);
                let cubic = launch_windows(dev, xyz, batch, n, level.cubic_window, level.shift, &b[..L], &mut cubic_meta)?;
                let sphere = launch_windows(dev, &sphere_pos, batch, n, level.sphere_window, level.shift, &b[L..], &mut sphere_meta)?;
                (cubic, sphere)
            };
            let c = read_meta(dev, &meta)?;
            (sphere_pos, cubic.finish(&c[..L]), sphere.finish(&c[L..]))
        };
        let geometry = |min, window, quant, l, split| RpeGeometry { min, window, quant, shift: level.shift, grid_length: l, radial_split: split };
        let cubic_rpe = geometry(cubic.min, level.cubic_window, level.cubic_quant, level.cubic_grid_length, None);
        let sphere_rpe = geometry(sphere.min, level.sphere_window, level.sphere_quant, level.sphere_grid_length, Some(level.a));
        let cubic_quant = rpe_quantize_cuda(dev, xyz, n, &cubic_rpe)?;
        let sphere_quant = rpe_quantize_cuda(dev, &sphere_pos, n, &sphere_rpe)?;
        Ok(Self { cubic, sphere, n, sphere_pos, cubic_quant, sphere_quant, cubic_rpe, sphere_rpe })
    }
}

/// Both branches' RPE tables on the device, `[q, k, v]` each.
pub struct CudaSphereTables {
    pub cubic: [CudaSlice<f32>; 3],
    pub sphere: [CudaSlice<f32>; 3],
}

impl CudaSphereTables {
    pub fn upload(dev: &CudaDevice, cubic: [&[f32]; 3], sphere: [&[f32]; 3]) -> Result<Self, Error> {
        let s = &dev.stream;
        let up = |t: &[f32]| s.clone_htod(t).map_err(cuda_err("uploading RPE tables"));
        Ok(Self {
            cubic: [up(cubic[0])?, up(cubic[1])?, up(cubic[2])?],
            sphere: [up(sphere[0])?, up(sphere[1])?, up(sphere[2])?],
        })
    }
}

/// SphereFormer's attention core on CUDA: heads `[0, heads / 2)` on cubic windows of `xyz`, the
/// rest on spherical windows; output rows `[n, heads * head_dim]` in `out`.
#[allow(clippy::too_many_arguments)]
pub fn sphere_attention_cuda<S: Store>(
    dev: &CudaDevice,
    qkv: QkvView<'_, S>,
    heads: usize,
    head_dim: usize,
    xyz: &CudaSlice<f32>,
    windows: &CudaSphereWindows,
    tables: &CudaSphereTables,
    out: &mut CudaSlice<S>,
) -> Result<(), Error> {
    sphere_attention_cuda_guarded(dev, qkv, heads, head_dim, xyz, windows, tables, out, None)
}

/// [`sphere_attention_cuda`] with the FP16 range guard of the output reporting into `range`.
#[allow(clippy::too_many_arguments)]
pub fn sphere_attention_cuda_guarded<S: Store>(
    dev: &CudaDevice,
    qkv: QkvView<'_, S>,
    heads: usize,
    head_dim: usize,
    xyz: &CudaSlice<f32>,
    windows: &CudaSphereWindows,
    tables: &CudaSphereTables,
    out: &mut CudaSlice<S>,
    range: Option<RangeSlot<'_>>,
) -> Result<(), Error> {
    let hc = cubic_heads(heads);
    let out_ld = heads * head_dim;
    if hc > 0 {
        let term = CudaTerm::Contextual(CudaContextual {
            geometry: windows.cubic_rpe,
            quant: &windows.cubic_quant,
            positions: xyz,
            tables: [&tables.cubic[0], &tables.cubic[1], &tables.cubic[2]],
        });
        let slice = HeadSlice { heads, head_dim, first: 0, count: hc };
        window_attention_cuda_guarded(dev, qkv, slice, &windows.cubic, term, out, out_ld, TILED_MIN_WINDOW, None, range)?;
    }
    let term = CudaTerm::Contextual(CudaContextual {
        geometry: windows.sphere_rpe,
        quant: &windows.sphere_quant,
        positions: &windows.sphere_pos,
        tables: [&tables.sphere[0], &tables.sphere[1], &tables.sphere[2]],
    });
    let slice = HeadSlice { heads, head_dim, first: hc, count: heads - hc };
    window_attention_cuda_guarded(dev, qkv, slice, &windows.sphere, term, out, out_ld, TILED_MIN_WINDOW, None, range)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_2d_kernel_falls_back_where_it_cannot_run() {
        use Bias2dKernel::*;
        let swin = (49, 169);
        for k in [PerQuery, WholeWindow, TensorCores] {
            assert_eq!(k.effective(Storage::Fp16, swin.0, swin.1), k, "Swin-T's windows fit every kernel");
            assert_eq!(Bias2dKernel::from_name(k.name()), Some(k));
        }
        assert_eq!(TensorCores.effective(Storage::Bf16, swin.0, swin.1), TensorCores);
        assert_eq!(TensorCores.effective(Storage::Fp32, swin.0, swin.1), WholeWindow, "FP32 has no tensor-core kernels");
        assert_eq!(TensorCores.effective(Storage::Fp16, WIN_MAX_TOKENS + 1, 169), PerQuery, "a window over 64 tokens");
        assert_eq!(WholeWindow.effective(Storage::Fp16, 49, WIN_MAX_TABLE + 1), PerQuery, "a table over 256 entries");
        assert_eq!(TensorCores.effective(Storage::Fp16, WIN_MAX_TOKENS, WIN_MAX_TABLE), TensorCores, "the limits are inclusive");
        assert_eq!(Bias2dKernel::from_name("fast"), None);
    }
}
