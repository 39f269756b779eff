//! The view transform on CUDA (kernels in `kernels/models/bevfusion/bev_pool.cu`): geometry per calibration built
//! on the GPU (a kernel computing every point's cell in f64 exactly as the CPU reference, the
//! project's radix sort, cell offsets by binary search), the depth softmax of the depthnet's
//! cuBLAS GEMM, and the fused pool over the work items of the calibration's [`PoolPlan`] (a BEV
//! cell, or a chunk of a long one whose partial sums a second pass adds): one warp slice an item,
//! or, for a plan with spans at 80 channels (measured beside it, not the default), a warp a span
//! of up to 16 items on tensor cores. FP16 inputs, FP32 sums, no atomics: deterministic. Then
//! the downsample convs (`ops::dense::cuda`).
//!
//! Pool memory traffic per frame (the DRAM floor `sptr bench bevpool` reports): depth
//! N·H·W·D halves, context N·H·W·C halves, the table (kept u32 and 4 u32 a work item), the
//! output cells·C halves, the split cells' FP32 partials twice; nothing of size N·D·H·W·C is
//! ever formed.

use crate::models::bevfusion::lss::geometry::{LssGeometry, LssParams};
use crate::models::bevfusion::lss::pool_plan::{PoolOrder, PoolPlan, DEFAULT_BAND_POINTS, DEFAULT_CHUNK_POINTS};
use crate::models::bevfusion::lss::transform::{CameraMask, LssTransform};
use crate::sensors::calib::camera::Calibration;
use crate::device::range::{RangeFlags, RangeSlot};
use crate::device::range_guard::{LayerId, LayerNames};
use crate::ops::dense::cuda::{CudaConv2d, CudaFeatureMap};
use crate::ops::dense::Activation;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{grid_1d, radix_sort_pairs};
use crate::Error;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
const WARPS_PER_BLOCK: u32 = THREADS / 32;

/// Mirror of `struct LssGrid` in bev_pool.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GridC {
    lower: [f64; 3],
    dx: [f64; 3],
    nx: [u32; 3],
    depth_bins: u32,
    height: u32,
    width: u32,
    cells: u32,
    pad: u32,
}
// SAFETY: plain-old-data, the C struct's layout (6 doubles, then 8 u32: 80 bytes, no padding).
unsafe impl DeviceRepr for GridC {}

/// The frustum on the GPU (`[D, fH, fW, 3]` f32), uploaded once per transform.
pub fn upload_frustum(dev: &CudaDevice, params: &LssParams) -> Result<CudaSlice<f32>, Error> {
    dev.stream.clone_htod(&params.frustum.data).map_err(cuda_err("uploading the frustum"))
}

/// One calibration's table on the GPU (the layout of [`LssGeometry`]): `order` holds `points`
/// entries of which the first `cell_start[cells]` are the kept points.
pub struct CudaLssGeometry {
    pub cameras: usize,
    pub depth_bins: usize,
    pub height: usize,
    pub width: usize,
    pub grid: crate::models::bevfusion::lss::config::BevGrid,
    pub points: usize,
    pub cell_start: CudaSlice<u32>,
    /// `cell_start` on the host, read back once: the pool plans are made from it.
    pub host_cell_start: Vec<u32>,
    pub order: CudaSlice<u32>,
    /// The pool's work items (made with [`DEFAULT_CHUNK_POINTS`] and [`DEFAULT_BAND_POINTS`]).
    pub plan: CudaPoolPlan,
    /// The pool's division of point indices by `depth_bins` (every index is below 2^31).
    pub divisor: PoolDivisor,
}

/// A [`PoolPlan`] on the GPU, with its host copy.
pub struct CudaPoolPlan {
    pub host: PoolPlan,
    items: CudaSlice<u32>,
    merges: Option<CudaSlice<u32>>,
    /// The spans and the span list (the point order regrouped by span, each entry tagged with
    /// its item's row) where the tensor-core pool can run this plan.
    spans: Option<SpanList>,
}

/// The tensor-core pool's spans on the GPU (four u32 each) and their list.
struct SpanList {
    spans: CudaSlice<u32>,
    list: CudaSlice<u32>,
}

/// Point indices the span list can tag with a row (`SPAN_POINT_MASK` in bev_pool.cu).
const SPAN_POINT_LIMIT: usize = 1 << 28;

impl CudaPoolPlan {
    /// The plan of `geom` with items of at most `chunk_points` points, launched longest first.
    /// The geometry carries the default plan (banded, [`DEFAULT_BAND_POINTS`]); these are for
    /// measuring and for checking what the plan changes.
    pub fn build(dev: &CudaDevice, geom: &CudaLssGeometry, chunk_points: u32) -> Result<Self, Error> {
        Self::upload(dev, geom.points, &geom.order, PoolPlan::build(&geom.host_cell_start, chunk_points)?)
    }

    /// [`CudaPoolPlan::build`] with the cells launched in `order`.
    pub fn build_ordered(dev: &CudaDevice, geom: &CudaLssGeometry, chunk_points: u32, order: PoolOrder) -> Result<Self, Error> {
        Self::upload(dev, geom.points, &geom.order, PoolPlan::build_ordered(&geom.host_cell_start, chunk_points, order)?)
    }

    /// `host` (made from `geom`'s cell offsets) on the GPU: with spans
    /// (`PoolPlan::with_span_points`) the pool runs on tensor cores where the channels allow,
    /// without them on the slice kernel.
    pub fn from_host(dev: &CudaDevice, geom: &CudaLssGeometry, host: PoolPlan) -> Result<Self, Error> {
        if host.items.len() < geom.cells() {
            return Err(Error::InvalidInput(format!("CUDA pool plan: {} items for a geometry of {} cells", host.items.len(), geom.cells())));
        }
        Self::upload(dev, geom.points, &geom.order, host)
    }

    /// Whether the pool runs this plan on tensor cores (at 80 channels).
    pub fn has_spans(&self) -> bool {
        self.spans.is_some()
    }

    /// Uploads `host`; with spans, and point indices (below `points`) that the span list can
    /// tag, also builds the span list from the sorted point `order`.
    fn upload(dev: &CudaDevice, points: usize, order: &CudaSlice<u32>, host: PoolPlan) -> Result<Self, Error> {
        let s = &dev.stream;
        let items = s.clone_htod(&host.item_words()).map_err(cuda_err("uploading the pool plan's items"))?;
        let merges = if host.merges.is_empty() {
            None
        } else {
            Some(s.clone_htod(&host.merge_words()).map_err(cuda_err("uploading the pool plan's merges"))?)
        };
        let spans = if host.spans.is_empty() || points > SPAN_POINT_LIMIT {
            None
        } else {
            let listed = host.spans.last().map_or(0, |l| (l.list_begin + l.points) as usize);
            if listed > order.len() {
                return Err(Error::InvalidInput(format!("CUDA pool plan: its spans list {listed} points, the geometry orders {}", order.len())));
            }
            let spans = s.clone_htod(&host.span_words()).map_err(cuda_err("uploading the pool plan's spans"))?;
            // SAFETY: lss_pool_span_list writes every entry: the spans tile [0, listed).
            let mut list = unsafe { dev.alloc_uninit::<u32>(listed.max(1), "the pool's span list") }?;
            let f = dev.function("bev_pool", "lss_pool_span_list")?;
            let n_spans = host.spans.len() as u32;
            // SAFETY: matches bev_pool.cu; the spans name items of `items` and list ranges inside
            // `list`, the items point ranges inside `order` (all made from the same cell offsets).
            unsafe { s.launch_builder(&f).arg(order).arg(&items).arg(&spans).arg(&n_spans).arg(&mut list).launch(warp_grid(n_spans)) }
                .map_err(cuda_err("lss_pool_span_list"))?;
            Some(SpanList { spans, list })
        };
        Ok(Self { host, items, merges, spans })
    }
}

/// One warp a unit, [`WARPS_PER_BLOCK`] warps a block.
fn warp_grid(n: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (n.div_ceil(WARPS_PER_BLOCK).max(1), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

impl CudaLssGeometry {
    /// Copies the table back (synchronises): equal to the CPU's [`LssGeometry`] for the same
    /// calibration, entry for entry.
    pub fn download(&self, dev: &CudaDevice) -> Result<LssGeometry, Error> {
        let cell_start = dev.stream.clone_dtoh(&self.cell_start).map_err(cuda_err("reading cell offsets"))?;
        let kept = cell_start.last().copied().unwrap_or(0) as usize;
        let order = if kept == 0 {
            Vec::new()
        } else {
            dev.stream.clone_dtoh(&self.order.slice(0..kept)).map_err(cuda_err("reading the point order"))?
        };
        Ok(LssGeometry {
            cameras: self.cameras,
            depth_bins: self.depth_bins,
            height: self.height,
            width: self.width,
            grid: self.grid,
            cell_start,
            order,
        })
    }

    pub fn cells(&self) -> usize {
        self.grid.cells()
    }
}

/// Builds the table of `calib` on the GPU and the pool's plan from it (one read-back of the cell
/// offsets, once per calibration; errors for calibrations the CPU path refuses too).
pub fn build_geometry_cuda(dev: &CudaDevice, params: &LssParams, frustum: &CudaSlice<f32>, calib: &Calibration) -> Result<CudaLssGeometry, Error> {
    let cams = params.cameras(calib)?;
    let points = params.points(cams.len())?;
    // the pool divides point indices by D as a multiply and a shift, exact below 2^31
    if points >= 1 << 31 {
        return Err(Error::InvalidInput(format!(
            "CUDA geometry: {} cameras x frustum {:?} is {points} points, over the 2^31 the CUDA pool takes; use fewer cameras, depth bins or smaller feature maps",
            cams.len(),
            params.frustum.shape()
        )));
    }
    let f = &params.frustum;
    if frustum.len() != f.data.len() {
        return Err(Error::InvalidInput(format!("geometry: the GPU frustum holds {} values, the parameters {}", frustum.len(), f.data.len())));
    }
    let cells = params.grid.cells();
    let mut host = Vec::with_capacity(cams.len() * 24);
    for c in &cams {
        host.extend_from_slice(&c.post_trans);
        host.extend(c.inv_post_rot.iter().flatten());
        host.extend(c.combine.iter().flatten());
        host.extend_from_slice(&c.trans);
    }
    let s = &dev.stream;
    let cam_buf = s.clone_htod(&host).map_err(cuda_err("uploading camera geometry"))?;
    let g = &params.grid;
    let grid = GridC {
        lower: g.lower(),
        dx: g.dx.map(|v| v as f64),
        nx: g.nx.map(|v| v as u32),
        depth_bins: f.depth_bins as u32,
        height: f.height as u32,
        width: f.width as u32,
        cells: cells as u32,
        pad: 0,
    };
    let n32 = points as u32;
    // SAFETY: lss_geometry writes every one of the `points` keys and values.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(points.max(1), "geometry keys") }?;
    // SAFETY: as above.
    let mut order = unsafe { dev.alloc_uninit::<u32>(points.max(1), "the point order") }?;
    let f_geom = dev.function("bev_pool", "lss_geometry")?;
    // SAFETY: matches bev_pool.cu; frustum holds D*H*W*3 floats, cam_buf 24 doubles a camera,
    // keys and order `points` entries.
    unsafe { s.launch_builder(&f_geom).arg(frustum).arg(&cam_buf).arg(&grid).arg(&n32).arg(&mut keys).arg(&mut order).launch(grid_1d(n32, THREADS)) }
        .map_err(cuda_err("lss_geometry"))?;
    // keys are cells (< cells) or the outside marker `cells`
    let bits = 64 - (cells as u64).leading_zeros();
    radix_sort_pairs(dev, &mut keys, &mut order, points, bits)?;
    let mut cell_start = s.alloc_zeros::<u32>(cells + 1).map_err(cuda_err("allocating cell offsets"))?;
    let f_starts = dev.function("bev_pool", "lss_cell_starts")?;
    let c32 = cells as u32;
    // SAFETY: matches bev_pool.cu; keys hold `points` sorted entries, cell_start cells + 1.
    unsafe { s.launch_builder(&f_starts).arg(&keys).arg(&n32).arg(&c32).arg(&mut cell_start).launch(grid_1d(c32 + 1, THREADS)) }
        .map_err(cuda_err("lss_cell_starts"))?;
    let host_cell_start = s.clone_dtoh(&cell_start).map_err(cuda_err("reading cell offsets for the pool plan"))?;
    let launch = PoolOrder::banded(&params.grid, DEFAULT_BAND_POINTS);
    let plan = CudaPoolPlan::upload(dev, points, &order, PoolPlan::build_ordered(&host_cell_start, DEFAULT_CHUNK_POINTS, launch)?)?;
    Ok(CudaLssGeometry {
        cameras: cams.len(),
        depth_bins: f.depth_bins,
        height: f.height,
        width: f.width,
        grid: params.grid,
        points,
        cell_start,
        host_cell_start,
        order,
        plan,
        divisor: PoolDivisor::new(f.depth_bins as u32),
    })
}

/// The lifted tensors of one frame on the GPU: depth `[N, H, W, D]` and context `[N, H, W, C]`,
/// FP16.
pub struct CudaLifted {
    pub cameras: usize,
    pub height: usize,
    pub width: usize,
    pub depth_bins: usize,
    pub channels: usize,
    pub depth: CudaSlice<f16>,
    pub context: CudaSlice<f16>,
}

/// The pool on the GPU: `[1, nx, ny, nz · C]` FP16 (see `kernels/models/bevfusion/bev_pool.cu`).
pub fn pool_cuda(
    dev: &CudaDevice,
    geom: &CudaLssGeometry,
    depth: &CudaSlice<f16>,
    context: &CudaSlice<f16>,
    channels: usize,
    mask: CameraMask,
) -> Result<CudaFeatureMap, Error> {
    pool_cuda_planned(dev, geom, &geom.plan, depth, context, channels, mask, None)
}

/// [`pool_cuda`] with the work items of `plan` (made for `geom`; the geometry's own is
/// `geom.plan`) and the FP16 range guard ([`crate::device::range_guard`]) of the pooled sums
/// reporting into `range`.
#[allow(clippy::too_many_arguments)]
pub fn pool_cuda_planned(
    dev: &CudaDevice,
    geom: &CudaLssGeometry,
    plan: &CudaPoolPlan,
    depth: &CudaSlice<f16>,
    context: &CudaSlice<f16>,
    channels: usize,
    mask: CameraMask,
    range: Option<RangeSlot<'_>>,
) -> Result<CudaFeatureMap, Error> {
    let pixels = geom.cameras * geom.height * geom.width;
    if channels == 0 || channels % 8 != 0 || channels > 256 {
        return Err(Error::InvalidInput(format!("CUDA pool: {channels} channels; it needs a multiple of 8 up to 256")));
    }
    // the kernel indexes the context with 32-bit offsets
    if (pixels * channels) as u64 >= 1 << 32 {
        return Err(Error::InvalidInput(format!(
            "CUDA pool: {pixels} pixels x {channels} channels is over 2^32 context values; use fewer cameras or smaller feature maps"
        )));
    }
    if depth.len() < pixels * geom.depth_bins || context.len() < pixels * channels {
        return Err(Error::InvalidInput(format!(
            "CUDA pool: depth holds {} and context {} values for {} cameras x {}x{} pixels x ({} bins, {channels} channels)",
            depth.len(),
            context.len(),
            geom.cameras,
            geom.height,
            geom.width,
            geom.depth_bins
        )));
    }
    let [nx, ny, nz] = geom.grid.nx;
    let cells = geom.cells();
    let n_items = plan.host.items.len();
    if n_items < cells {
        return Err(Error::InvalidInput(format!("CUDA pool: a plan of {n_items} items for a geometry of {cells} cells")));
    }
    // every cell is written (zeros where empty): no memset
    // SAFETY: lss_pool_items and lss_pool_merge write all cells * channels halves.
    let data = unsafe { dev.alloc_uninit::<f16>(cells * channels, "the BEV map") }?;
    let mut out = CudaFeatureMap::from_slice(1, nx, ny, nz * channels, data)?;
    // SAFETY: every slot is written by its item before lss_pool_merge reads it.
    let mut partial = unsafe { dev.alloc_uninit::<f32>((plan.host.slots as usize * channels).max(1), "the pool's partial sums") }?;
    let div = geom.divisor;
    let (items32, ch32) = (n_items as u32, channels as u32);
    let per_cam = (geom.height * geom.width * geom.depth_bins) as u32;
    match &plan.spans {
        // C = 80 (the BEVFusion camera branch) on tensor cores
        Some(sp) if channels == 80 => {
            let kernel = "lss_pool_spans_c80";
            let f = dev.function("bev_pool", kernel)?;
            let n_spans = plan.host.spans.len() as u32;
            let cfg = LaunchConfig { grid_dim: (n_spans.div_ceil(SPAN_WARPS).max(1), 1, 1), block_dim: (SPAN_WARPS * 32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches bev_pool.cu; the span list holds the plan's points tagged by row
            // (point indices < 2^28, checked when it was built), the spans name items of the
            // plan, whose cells < cells and slots < plan.slots; depth/context hold the sizes
            // checked above, out cells * C halves, partial slots * C floats; the range slot's
            // layer lies in its flags.
            unsafe {
                let mut b = dev.stream.launch_builder(&f);
                b.arg(depth)
                    .arg(context)
                    .arg(&sp.list)
                    .arg(&sp.spans)
                    .arg(&n_spans)
                    .arg(&plan.items)
                    .arg(&div.magic)
                    .arg(&div.shift)
                    .arg(&per_cam)
                    .arg(&mask.0)
                    .arg(&mut out.data)
                    .arg(&mut partial);
                RangeSlot::push(range.as_ref(), &mut b);
                b.launch(cfg)
            }
            .map_err(cuda_err(kernel))?;
        }
        _ => pool_slices(dev, geom, plan, depth, context, ch32, items32, per_cam, mask, &mut out, &mut partial, range.as_ref())?,
    }
    if let Some(merges) = &plan.merges {
        let f = dev.function("bev_pool", "lss_pool_merge")?;
        let n_merges = plan.host.merges.len() as u32;
        // SAFETY: matches bev_pool.cu; merges name cells < cells and slot runs inside partial.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&partial).arg(merges).arg(&n_merges).arg(&ch32).arg(&mut out.data);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(warp_grid(n_merges))
        }
        .map_err(cuda_err("lss_pool_merge"))?;
    }
    Ok(out)
}

/// Warps a block of the tensor-core pool (`SPAN_WARPS` in bev_pool.cu).
const SPAN_WARPS: u32 = 4;

/// Pass 1 on the slice kernel (any channel count; sizes checked by the caller).
#[allow(clippy::too_many_arguments)]
fn pool_slices(
    dev: &CudaDevice,
    geom: &CudaLssGeometry,
    plan: &CudaPoolPlan,
    depth: &CudaSlice<f16>,
    context: &CudaSlice<f16>,
    ch32: u32,
    items32: u32,
    per_cam: u32,
    mask: CameraMask,
    out: &mut CudaFeatureMap,
    partial: &mut CudaSlice<f32>,
    range: Option<&RangeSlot<'_>>,
) -> Result<(), Error> {
    let div = geom.divisor;
    // C = 80 (the BEVFusion camera branch) has a kernel with the row's chunks known at compile time
    let kernel = if ch32 == 80 { "lss_pool_items_c80" } else { "lss_pool_items" };
    let f = dev.function("bev_pool", kernel)?;
    // SAFETY: matches bev_pool.cu; order/cell_start come from build_geometry_cuda for this
    // geometry and the plan's items from its cell offsets (points < kept, cells < cells, slots
    // < plan.slots), depth/context hold the sizes checked by the caller, out cells * C halves,
    // partial slots * C floats; the range slot's layer lies in its flags.
    unsafe {
        let mut b = dev.stream.launch_builder(&f);
        b.arg(depth)
            .arg(context)
            .arg(&geom.order)
            .arg(&plan.items)
            .arg(&items32)
            .arg(&div.magic)
            .arg(&div.shift)
            .arg(&ch32)
            .arg(&per_cam)
            .arg(&mask.0)
            .arg(&mut out.data)
            .arg(partial);
        RangeSlot::push(range, &mut b);
        // each warp pools as many items as the 8-channel chunks of a row fit in its 32 lanes
        let items_per_warp = 32 / (ch32 / 8);
        b.launch(warp_grid(items32.div_ceil(items_per_warp)))
    }
    .map_err(cuda_err(kernel))?;
    Ok(())
}

/// Division by a constant `d` (1 ≤ d < 2^31) as the pool does it: `q / d = (q · magic) >> shift`
/// for every `q < 2^31`, with `l = ceil(log2 d)`, `magic = ceil(2^(31 + l) / d)` and `shift =
/// 31 + l`. Exact: `magic · d − 2^(31 + l)` is below `d ≤ 2^l`, so the error term `q` times it stays
/// below `2^(31 + l)` (the round-up method of Granlund and Montgomery); `magic < 2^32` because
/// `d > 2^(l − 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolDivisor {
    pub magic: u32,
    pub shift: u32,
}

impl PoolDivisor {
    pub fn new(d: u32) -> Self {
        let d = d.max(1);
        let l = 32 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d = 1
        let magic = (1u64 << (31 + l)).div_ceil(d as u64);
        Self { magic: magic as u32, shift: 31 + l }
    }

    /// `q / d` as the kernel computes it (`q < 2^31`).
    pub fn divide(self, q: u32) -> u32 {
        ((q as u64 * self.magic as u64) >> self.shift) as u32
    }
}

/// [`LssTransform`] on the GPU, with its geometry cache.
pub struct CudaLssTransform {
    params: LssParams,
    in_channels: usize,
    frustum: CudaSlice<f32>,
    depthnet: CudaConv2d,
    downsample: Vec<CudaConv2d>,
    geometry: Option<(Calibration, CudaLssGeometry)>,
    builds: usize,
    ids: LssIds,
}

/// The view transform's guarded layers (see [`CudaLssTransform::upload_named`]).
struct LssIds {
    /// `encoders.camera.vtransform.depthnet`: the depth softmax and the context.
    lift: LayerId,
    /// `encoders.camera.vtransform.bev_pool`: the pooled BEV features (upstream's `bev_pool`
    /// function; no module of its own).
    pool: LayerId,
    /// `encoders.camera.vtransform.downsample.{0,3,6}`: each conv with its folded BN.
    downsample: Vec<LayerId>,
}

impl CudaLssTransform {
    pub fn upload(dev: &CudaDevice, t: &LssTransform) -> Result<Self, Error> {
        Self::upload_named(dev, t, &mut LayerNames::new())
    }

    /// [`CudaLssTransform::upload`], registering its guarded layers in `names` in execution
    /// order: `encoders.camera.vtransform.depthnet` (depth softmax and context), `.bev_pool`
    /// (the pooled features), `.downsample.{0,3,6}` (conv + BN + ReLU). A BEV model registers them
    /// after the camera encoder's, so one report covers both.
    pub fn upload_named(dev: &CudaDevice, t: &LssTransform, names: &mut LayerNames) -> Result<Self, Error> {
        let p = "encoders.camera.vtransform";
        let lift = names.add(format!("{p}.depthnet"));
        let pool = names.add(format!("{p}.bev_pool"));
        let downsample = (0..t.downsample.len()).map(|i| names.add(format!("{p}.downsample.{}", 3 * i))).collect();
        let ids = LssIds { lift, pool, downsample };
        let c = t.params.cfg.channels();
        if c % 8 != 0 || c > 256 {
            return Err(Error::InvalidInput(format!("CUDA view transform: out_channels {c} must be a multiple of 8 up to 256")));
        }
        Ok(Self {
            params: t.params.clone(),
            in_channels: t.depthnet.cin,
            frustum: upload_frustum(dev, &t.params)?,
            depthnet: CudaConv2d::upload(dev, &t.depthnet)?,
            downsample: t.downsample.iter().map(|k| CudaConv2d::upload(dev, k)).collect::<Result<_, _>>()?,
            geometry: None,
            builds: 0,
            ids,
        })
    }

    pub fn params(&self) -> &LssParams {
        &self.params
    }

    /// Builds the geometry when `calib` differs from the cached one (exact comparison); a failed
    /// build keeps the previous geometry. Returns whether it was rebuilt.
    pub fn ensure_geometry(&mut self, dev: &CudaDevice, calib: &Calibration) -> Result<bool, Error> {
        if self.geometry.as_ref().is_some_and(|(c, _)| c == calib) {
            return Ok(false);
        }
        let g = build_geometry_cuda(dev, &self.params, &self.frustum, calib)?;
        self.geometry = Some((calib.clone(), g));
        self.builds += 1;
        Ok(true)
    }

    /// The cached geometry (after [`CudaLssTransform::ensure_geometry`]).
    pub fn geometry(&self) -> Option<&CudaLssGeometry> {
        self.geometry.as_ref().map(|(_, g)| g)
    }

    /// How many geometries were built.
    pub fn builds(&self) -> usize {
        self.builds
    }

    /// depthnet (cuBLAS GEMM over pixels) + depth softmax.
    pub fn lift(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap) -> Result<CudaLifted, Error> {
        self.lift_guarded(dev, blas, x, None)
    }

    /// [`CudaLssTransform::lift`] with the FP16 range guard of depth and context reporting into
    /// `flags` (made for the `names` given to [`CudaLssTransform::upload_named`]).
    pub fn lift_guarded(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap, flags: Option<&RangeFlags>) -> Result<CudaLifted, Error> {
        let range = flags.map(|f| f.slot(self.ids.lift)).transpose()?;
        let (d, c) = (self.params.frustum.depth_bins, self.params.cfg.channels());
        let (acc, _, _) = self.depthnet.forward_acc(dev, blas, x)?;
        let pixels = x.pixels();
        let s = &dev.stream;
        // SAFETY: lss_lift writes every pixel's D and C values.
        let mut depth = unsafe { dev.alloc_uninit::<f16>((pixels * d).max(1), "depth") }?;
        // SAFETY: as above.
        let mut context = unsafe { dev.alloc_uninit::<f16>((pixels * c).max(1), "context") }?;
        if pixels > 0 {
            let f = dev.function("bev_pool", "lss_lift")?;
            let (p32, d32, c32) = (
                u32::try_from(pixels).map_err(|_| Error::InvalidInput(format!("lift: {pixels} pixels")))?,
                d as u32,
                c as u32,
            );
            let cfg = LaunchConfig { grid_dim: (p32.div_ceil(WARPS_PER_BLOCK), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches bev_pool.cu; acc holds pixels * (D + C) floats, bias D + C, depth
            // and context pixels * D and pixels * C halves; the range slot's layer lies in its
            // flags.
            unsafe {
                let mut b = s.launch_builder(&f);
                b.arg(&acc).arg(self.depthnet.bias()).arg(&p32).arg(&d32).arg(&c32).arg(&mut depth).arg(&mut context);
                RangeSlot::push(range.as_ref(), &mut b);
                b.launch(cfg)
            }
            .map_err(cuda_err("lss_lift"))?;
        }
        Ok(CudaLifted { cameras: x.n, height: x.h, width: x.w, depth_bins: d, channels: c, depth, context })
    }

    /// geometry (cached per calibration) → lift → pool → downsample: `[1, nx / s, ny / s, nz · C]`.
    pub fn forward(&mut self, dev: &CudaDevice, blas: &CudaBlas, calib: &Calibration, x: &CudaFeatureMap, mask: CameraMask) -> Result<CudaFeatureMap, Error> {
        self.forward_guarded(dev, blas, calib, x, mask, None)
    }

    /// [`CudaLssTransform::forward`] with the FP16 range guard reporting into `flags` (made for
    /// the `names` given to [`CudaLssTransform::upload_named`]).
    pub fn forward_guarded(
        &mut self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        calib: &Calibration,
        x: &CudaFeatureMap,
        mask: CameraMask,
        flags: Option<&RangeFlags>,
    ) -> Result<CudaFeatureMap, Error> {
        self.ensure_geometry(dev, calib)?;
        let f = &self.params.frustum;
        if (x.h, x.w) != (f.height, f.width) {
            return Err(Error::InvalidInput(format!(
                "camera features are {}x{} but the view transform expects feature_size {}x{} \
                 (image_size / 8 of the encoder): the image or the encoder does not match the model YAML",
                x.h, x.w, f.height, f.width
            )));
        }
        if x.c != self.in_channels {
            return Err(Error::InvalidInput(format!("camera features have {} channels, the depthnet takes {}", x.c, self.in_channels)));
        }
        if x.n != calib.len() {
            return Err(Error::InvalidInput(format!("{} camera feature maps for a calibration of {} cameras", x.n, calib.len())));
        }
        let lifted = self.lift_guarded(dev, blas, x, flags)?;
        let geom = self.geometry().ok_or_else(|| Error::InvalidInput("no geometry".into()))?;
        let slot = |id: LayerId| flags.map(|f| f.slot(id)).transpose();
        let mut bev = pool_cuda_planned(dev, geom, &geom.plan, &lifted.depth, &lifted.context, lifted.channels, mask, slot(self.ids.pool)?)?;
        for (conv, &id) in self.downsample.iter().zip(&self.ids.downsample) {
            bev = conv.forward_guarded(dev, blas, &bev, Activation::Relu, slot(id)?)?;
        }
        Ok(bev)
    }
}

#[cfg(test)]
mod tests {
    use super::PoolDivisor;

    #[test]
    fn the_pool_divisor_divides_exactly_below_two_to_the_31() {
        let top = (1u32 << 31) - 1;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let divisors = (1..=2048u32).chain([59, 118, 4095, 4097, 65_535, 65_537, 1 << 20, (1 << 20) + 1, top / 3, top - 1, top]);
        for d in divisors {
            let div = PoolDivisor::new(d);
            // around multiples of d (where a rounding error would show first), the ends, and random
            let mut qs = vec![0u32, 1, top, top - 1, top - d + 1];
            for k in [1u64, 2, 3, 1000, (top / d) as u64 - 1, (top / d) as u64] {
                let m = k * d as u64;
                qs.extend([m.saturating_sub(1), m, m + 1].into_iter().filter(|&q| q <= top as u64).map(|q| q as u32));
            }
            qs.extend((0..64).map(|_| (next() % (top as u64 + 1)) as u32));
            for q in qs {
                assert_eq!(div.divide(q), q / d, "q {q} / d {d} with {div:?}");
            }
        }
        assert_eq!(PoolDivisor::new(1), PoolDivisor { magic: 1 << 31, shift: 31 });
        assert_eq!(PoolDivisor::new(118).divide(118 * 7 + 117), 7);
    }
}
