//! Kernel maps on the GPU (kernels in `kernels/ops/sparse_map.cu`): the same maps as
//! `kernel_map.rs`, as neighbour tables `nbr[out * K + k]` (input row or -1), the form the conv
//! kernels read. Input sites go into an open-addressing hash of packed `[b, x, y, z]` (64-bit
//! keys, capacity a power of two at least twice the sites). Strided outputs are proposed by every
//! (input, offset), sorted with the radix sort and deduplicated, so they come out in
//! `[b, x, y, z]` order like the CPU reference; their sort keys are `[b, x, y, z]` in the mixed
//! radix of (batch count, output shape), so the sort takes as few bits as the output grid needs.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{bits_for, exclusive_scan_u32, grid_1d, radix_sort_pairs};
use crate::ops::sparse_conv::kernel_map::{conv_output_shape, ConvGeometry, MapKind};
use crate::ops::sparse_conv::tensor::SparseTensor;
use crate::Error;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Mirror of `struct MapGeom` in sparse_map.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MapGeomC {
    kernel: [i32; 3],
    stride: [i32; 3],
    padding: [i32; 3],
    dilation: [i32; 3],
    in_origin: [i32; 3],
    out_origin: [i32; 3],
    out_shape: [i32; 3],
    kv: u32,
}
// SAFETY: plain-old-data, same layout as the C struct.
unsafe impl DeviceRepr for MapGeomC {}

const THREADS: u32 = 256;
const EMPTY_KEY: u64 = u64::MAX;
/// The 16-bit packing's batch limit: sites with a batch index from here on are not hashed.
const MAX_BATCHES: usize = 65535;

/// Sites of a sparse tensor on the GPU: coordinates `[b, x, y, z]` and their hash.
pub struct CudaSites {
    pub coords: CudaSlice<i32>,
    pub len: usize,
    keys: CudaSlice<u64>,
    vals: CudaSlice<i32>,
    mask: u32,
    /// Every site's batch index is below this (65535, the packing's limit, when not known).
    batch_size: usize,
}

/// The strided-map candidates' compact sort key: `[b, q]` (q relative to the output origin) in
/// the mixed radix `((b * S0 + q0) * S1 + q1) * S2 + q2`, `S = out_shape`, with "no output" the
/// largest value `batch_size * S0 * S1 * S2`. Returns that value, or None when it does not fit
/// in 63 bits (then the candidates take the 64-bit `[b:16|x:16|y:16|z:16]` packing).
fn compact_empty_key(batch_size: usize, out_shape: [i32; 3]) -> Option<u64> {
    if out_shape.iter().any(|&s| s < 1) {
        return None;
    }
    let total = out_shape.iter().try_fold(batch_size.max(1) as u128, |acc, &s| acc.checked_mul(s as u128))?;
    u64::try_from(total).ok().filter(|&v| v < 1u64 << 63)
}

/// A kernel map on the GPU.
pub struct CudaKernelMap {
    pub kind: MapKind,
    pub kv: usize,
    pub in_count: usize,
    pub out_count: usize,
    /// Output sites (`Submanifold`: the input's; `Inverse`: the strided map's inputs), shared:
    /// a level's sites serve several maps.
    pub out: Arc<CudaSites>,
    /// `out_count * kv` input rows, -1 where no input.
    pub nbr: CudaSlice<i32>,
    /// Outputs sorted by neighbour bitmask, the order the implicit-GEMM conv walks them in; None
    /// when the kernel volume exceeds 64 (then outputs are walked in their own order) or there
    /// are no outputs.
    pub sorted: Option<MaskOrder>,
}

/// A map's outputs sorted by their neighbour bitmask's [`MaskKey`] (stable, so equal masks keep
/// output order), and the masks in that order (bit k: offset k has an input), from which a conv
/// tile takes its active offsets and which neighbours exist without reading the whole neighbour
/// table.
pub struct MaskOrder {
    pub order: CudaSlice<u32>,
    pub masks: CudaSlice<u64>,
    /// The order of the masks' bits in the sort key.
    pub key: MaskKey,
}

/// The sort key of a neighbour mask: its bits moved so that the offsets most outputs have are
/// the low bits and the rare ones the high bits. Sorted by it, outputs are grouped first by the
/// rare offsets, so a conv tile's rows share more of their offsets: on the dense cloud (×2, 0.05
/// m, subm k3) a 32-row slice then computes 1.58× the useful pairs instead of 1.66×, and a 128-row
/// tile walks 7 % fewer offsets (numpy count). Which offsets are common is a property
/// of the scene; for LiDAR voxels it is those in the ground plane (z is up) and then the nearest,
/// so offsets are ranked by (|dz|, |dx| + |dy| + |dz|, index) with d measured from the kernel's
/// centre. Ranking by counted frequency did no better (1.57×).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskKey {
    /// `to_key[k]`: the key bit of offset k.
    to_key: BitMap64,
    /// `to_mask[b]`: the offset of key bit b.
    to_mask: BitMap64,
}

/// Where each of 64 bit positions goes (`sparse_map.cu`'s `struct BitMap64`, passed by value).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BitMap64([u8; 64]);
// SAFETY: plain-old-data, same layout as the C struct.
unsafe impl DeviceRepr for BitMap64 {}

impl BitMap64 {
    fn apply(&self, bits: u64) -> u64 {
        (0..64).filter(|&b| (bits >> b) & 1 == 1).fold(0, |v, b| v | 1 << self.0[b])
    }
}

impl MaskKey {
    /// The key for a kernel of `kernel` offsets a side (at most 64 offsets; offsets past the
    /// kernel volume keep their bit).
    pub fn for_kernel(kernel: [i32; 3]) -> MaskKey {
        let kv = kernel_volume(kernel).min(MAX_MASK_KV);
        // twice the distance from the centre, so even kernels are symmetric too
        let d = |k: usize| -> [i32; 3] {
            let kk = kernel.map(|s| s.max(1) as usize);
            let r = [k / (kk[1] * kk[2]), (k / kk[2]) % kk[1], k % kk[2]];
            std::array::from_fn(|a| (2 * r[a] as i32 - (kernel[a] - 1)).abs())
        };
        let mut ranked: Vec<usize> = (0..kv).collect();
        ranked.sort_by_key(|&k| {
            let a = d(k);
            (a[2], a[0] + a[1] + a[2], k)
        });
        let MaskKey { to_key: BitMap64(mut to_key), to_mask: BitMap64(mut to_mask) } = MaskKey::IDENTITY;
        for (b, &k) in ranked.iter().enumerate() {
            to_mask[b] = k as u8;
            to_key[k] = b as u8;
        }
        MaskKey { to_key: BitMap64(to_key), to_mask: BitMap64(to_mask) }
    }

    /// Every bit kept where it is.
    pub const IDENTITY: MaskKey = {
        let mut b = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            b[i] = i as u8;
            i += 1;
        }
        MaskKey { to_key: BitMap64(b), to_mask: BitMap64(b) }
    };

    /// The sort key of `mask` (bit k: offset k).
    pub fn key(&self, mask: u64) -> u64 {
        self.to_key.apply(mask)
    }

    /// The mask of sort key `key`.
    pub fn mask(&self, key: u64) -> u64 {
        self.to_mask.apply(key)
    }
}

fn grid_u64(n: u64) -> Result<LaunchConfig, Error> {
    let blocks = n.div_ceil(THREADS as u64).max(1);
    let blocks = u32::try_from(blocks).map_err(|_| Error::InvalidInput(format!("kernel map of {n} entries is too large")))?;
    Ok(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 })
}

/// The GPU maps' 16-bit coordinate packing: every axis inside -32768..32768, < 65535 samples.
fn check_packable(origin: [i32; 3], spatial_shape: [i32; 3], batch_size: usize) -> Result<(), Error> {
    let (o, s) = (origin, spatial_shape);
    for a in 0..3 {
        if o[a] < -32768 || o[a] as i64 + s[a] as i64 > 32768 {
            return Err(Error::InvalidInput(format!(
                "GPU kernel maps pack coordinates into 16 bits: axis {a} spans {}..{}, outside -32768..32768",
                o[a],
                o[a] as i64 + s[a] as i64
            )));
        }
    }
    if batch_size >= 65535 {
        return Err(Error::InvalidInput(format!("GPU kernel maps take at most 65534 samples, got {batch_size}")));
    }
    Ok(())
}

impl CudaSites {
    /// Hashes `len` sites already on the GPU (`coords`: `len * 4`, at least 1 element).
    pub fn build(dev: &CudaDevice, coords: CudaSlice<i32>, len: usize) -> Result<CudaSites, Error> {
        CudaSites::build_batched(dev, coords, len, MAX_BATCHES)
    }

    /// [`CudaSites::build`] of sites whose batch indices are below `batch_size`.
    fn build_batched(dev: &CudaDevice, coords: CudaSlice<i32>, len: usize, batch_size: usize) -> Result<CudaSites, Error> {
        let s = &dev.stream;
        let cap = (2 * len).max(64).next_power_of_two();
        let mask = (cap - 1) as u32;
        // SAFETY (both): fill_u64 below sets every key; a value is read only at a slot whose key
        // matched, which hash_insert wrote together with it.
        let mut keys = unsafe { dev.alloc_uninit::<u64>(cap, "hash keys") }?;
        let mut vals = unsafe { dev.alloc_uninit::<i32>(cap, "hash values") }?;
        let fill = dev.function("sparse_map", "fill_u64")?;
        let insert = dev.function("sparse_map", "hash_insert")?;
        let (cap64, n32) = (cap as u64, len as u32);
        // SAFETY: argument lists match sparse_map.cu; keys/vals hold `cap` entries, coords len*4.
        unsafe {
            s.launch_builder(&fill).arg(&mut keys).arg(&cap64).arg(&EMPTY_KEY).launch(grid_u64(cap64)?).map_err(cuda_err("fill_u64"))?;
            if len > 0 {
                s.launch_builder(&insert)
                    .arg(&coords).arg(&n32).arg(&mut keys).arg(&mut vals).arg(&mask)
                    .launch(grid_1d(n32, THREADS))
                    .map_err(cuda_err("hash_insert"))?;
            }
        }
        let sites = CudaSites { coords, len, keys, vals, mask, batch_size };
        Ok(sites)
    }

    /// Hashes `len` sites already on the GPU (`coords`: `len * 4`, unique, inside `origin` +
    /// `spatial_shape`, batch indices below `batch_size`), after the packing check.
    pub fn from_device(
        dev: &CudaDevice,
        coords: CudaSlice<i32>,
        len: usize,
        origin: [i32; 3],
        spatial_shape: [i32; 3],
        batch_size: usize,
    ) -> Result<CudaSites, Error> {
        check_packable(origin, spatial_shape, batch_size)?;
        CudaSites::build_batched(dev, coords, len, batch_size)
    }

    /// Uploads and hashes the sites of a host tensor.
    pub fn upload(dev: &CudaDevice, t: &SparseTensor) -> Result<CudaSites, Error> {
        CudaSites::upload_sites(dev, t.coords(), t.origin(), t.spatial_shape())
    }

    /// Uploads and hashes sites given as coordinates (already checked, e.g. by
    /// `tensor::validate_sites`) of a tensor with `origin` and `spatial_shape`.
    pub fn upload_sites(dev: &CudaDevice, coords: &[[i32; 4]], origin: [i32; 3], spatial_shape: [i32; 3]) -> Result<CudaSites, Error> {
        let batch_size = coords.iter().map(|c| c[0].max(0) as usize + 1).max().unwrap_or(0);
        check_packable(origin, spatial_shape, batch_size)?;
        let flat: &[i32] = if coords.is_empty() { &[0; 4] } else { coords.as_flattened() };
        let d = dev.stream.clone_htod(flat).map_err(cuda_err("uploading coordinates"))?;
        CudaSites::build_batched(dev, d, coords.len(), batch_size)
    }

    /// A bound on the sites' batch indices: every one is below it (65535 when the sites were
    /// built without one, by [`CudaSites::build`]).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn coords_to_host(&self, dev: &CudaDevice) -> Result<Vec<[i32; 4]>, Error> {
        if self.len == 0 {
            return Ok(vec![]);
        }
        let v = dev.stream.clone_dtoh(&self.coords.slice(..self.len * 4)).map_err(cuda_err("reading coordinates"))?;
        Ok(v.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect())
    }
}

impl CudaKernelMap {
    pub fn nbr_to_host(&self, dev: &CudaDevice) -> Result<Vec<i32>, Error> {
        if self.out_count * self.kv == 0 {
            return Ok(vec![]);
        }
        dev.stream.clone_dtoh(&self.nbr.slice(..self.out_count * self.kv)).map_err(cuda_err("reading neighbour table"))
    }
}

/// The map's [`MaskOrder`]: computed once per map, reused by every conv on it. None for kernel
/// volumes over 64 or no outputs.
fn mask_order(dev: &CudaDevice, nbr: &CudaSlice<i32>, m: usize, kv: usize, key: MaskKey) -> Result<Option<MaskOrder>, Error> {
    if kv > MAX_MASK_KV || m == 0 {
        return Ok(None);
    }
    let s = &dev.stream;
    // SAFETY (both): nbr_masks writes all m entries of each.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(m, "mask keys") }?;
    let mut order = unsafe { dev.alloc_uninit::<u32>(m, "mask order") }?;
    let f = dev.function("sparse_map", "nbr_masks")?;
    let (m32, kv32) = (m as u32, kv as u32);
    // SAFETY: argument list matches sparse_map.cu; nbr holds m * kv, keys/order m.
    unsafe {
        s.launch_builder(&f).arg(nbr).arg(&m32).arg(&kv32).arg(&key.to_key).arg(&mut keys).arg(&mut order)
            .launch(grid_1d(m32, THREADS)).map_err(cuda_err("nbr_masks"))?;
    }
    sorted_by_mask(dev, keys, order, m, kv, key)
}

/// Largest kernel volume whose neighbour bitmask fits the u64 a map's mask order keeps.
const MAX_MASK_KV: usize = 64;

/// The mask order from unsorted sort keys (`key` of each output's mask, m entries) and `order` =
/// 0..m: both sorted by key, then the keys turned back into masks.
fn sorted_by_mask(dev: &CudaDevice, mut keys: CudaSlice<u64>, mut order: CudaSlice<u32>, m: usize, kv: usize, key: MaskKey) -> Result<Option<MaskOrder>, Error> {
    radix_sort_pairs(dev, &mut keys, &mut order, m, kv as u32)?;
    masks_of_keys(dev, keys, order, m, key)
}

/// The mask order of outputs already in key order: the keys turned back into masks.
fn masks_of_keys(dev: &CudaDevice, mut keys: CudaSlice<u64>, order: CudaSlice<u32>, m: usize, key: MaskKey) -> Result<Option<MaskOrder>, Error> {
    let f = dev.function("sparse_map", "permute_bits")?;
    let m32 = m as u32;
    // SAFETY: argument list matches sparse_map.cu; keys holds m entries.
    unsafe {
        dev.stream.launch_builder(&f).arg(&mut keys).arg(&m32).arg(&key.to_mask)
            .launch(grid_1d(m32, THREADS)).map_err(cuda_err("permute_bits"))?;
    }
    Ok(Some(MaskOrder { order, masks: keys, key }))
}

/// A neighbour table of `len` entries (at least one), all -1 (no input), for kernels that write
/// only the entries that have one.
fn table_of_none(dev: &CudaDevice, len: usize) -> Result<CudaSlice<i32>, Error> {
    let len = len.max(1);
    // SAFETY: fill_i32 sets all len entries before anything reads them.
    let mut table = unsafe { dev.alloc_uninit::<i32>(len, "neighbour table") }?;
    let fill = dev.function("sparse_map", "fill_i32")?;
    let (n, none) = (len as u64, -1i32);
    // SAFETY: argument list matches sparse_map.cu; table holds n entries, 4 a thread.
    unsafe { dev.stream.launch_builder(&fill).arg(&mut table).arg(&n).arg(&none).launch(grid_u64(n.div_ceil(4))?) }.map_err(cuda_err("fill_i32"))?;
    Ok(table)
}

fn kernel_volume(kernel: [i32; 3]) -> usize {
    kernel.iter().map(|&k| k as usize).product()
}

/// Submanifold map (odd kernel, stride 1) of `t`, whose sites `sites` were uploaded from it.
pub fn submanifold_cuda(dev: &CudaDevice, t: &SparseTensor, sites: CudaSites, kernel: [i32; 3], dilation: [i32; 3]) -> Result<CudaKernelMap, Error> {
    if sites.len != t.len() {
        return Err(Error::InvalidInput(format!("submanifold map: {} sites for a tensor of {}", sites.len, t.len())));
    }
    submanifold_cuda_sites(dev, sites, kernel, dilation)
}

/// Submanifold map of sites already on the device (e.g. a strided map's outputs).
pub fn submanifold_cuda_sites(dev: &CudaDevice, sites: impl Into<Arc<CudaSites>>, kernel: [i32; 3], dilation: [i32; 3]) -> Result<CudaKernelMap, Error> {
    let sites = sites.into();
    if kernel.iter().any(|&k| k < 1 || k % 2 == 0) || dilation.iter().any(|&d| d < 1) {
        return Err(Error::InvalidInput(format!("submanifold kernel {kernel:?} must be odd and dilation {dilation:?} >= 1")));
    }
    let kv = kernel_volume(kernel);
    let n = sites.len;
    let g = MapGeomC { kernel, dilation, stride: [1; 3], kv: kv as u32, ..Default::default() };
    // Entries without a partner keep the table's -1: submanifold_nbr writes the found pairs
    // (both ways) and the centre.
    let mut nbr = table_of_none(dev, n * kv)?;
    let f = dev.function("sparse_map", "submanifold_nbr")?;
    let n32 = n as u32;
    // The neighbour masks' sort keys come out of the table's kernel: zeroed keys it ORs into, and
    // the order 0..n it writes.
    let key = MaskKey::for_kernel(kernel);
    let mut mask_order = None;
    if n > 0 && kv <= MAX_MASK_KV {
        let masks = dev.stream.alloc_zeros::<u64>(n).map_err(cuda_err("allocating mask keys"))?;
        // SAFETY: submanifold_nbr writes order[o] for every o < n when it computes the masks.
        let order = unsafe { dev.alloc_uninit::<u32>(n, "mask order") }?;
        mask_order = Some((masks, order));
    }
    let null: u64 = 0;
    if n > 0 {
        // SAFETY: argument list matches sparse_map.cu; nbr holds n * kv entries, masks and order
        // n each (or NULL); one thread per output and offset up to the centre (kv is odd).
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&sites.coords).arg(&n32).arg(&g).arg(&sites.keys).arg(&sites.vals).arg(&sites.mask).arg(&mut nbr).arg(&key.to_key);
            match &mut mask_order {
                Some((masks, order)) => b.arg(masks).arg(order),
                None => b.arg(&null).arg(&null),
            };
            b.launch(grid_u64((n * (kv / 2 + 1)) as u64)?).map_err(cuda_err("submanifold_nbr"))?;
        }
    }
    let sorted = match mask_order {
        // A 1×1×1 map: every site has its centre and nothing else, so every key is the same
        // and the stable sort would leave submanifold_nbr's order 0..n as it is.
        Some((keys, order)) if kv == 1 => masks_of_keys(dev, keys, order, n, key)?,
        Some((keys, order)) => sorted_by_mask(dev, keys, order, n, kv, key)?,
        None => None,
    };
    Ok(CudaKernelMap { kind: MapKind::Submanifold, kv, in_count: n, out_count: n, out: sites, nbr, sorted })
}

/// Strided map (`SparseConv3d`, spconv's output rule) of `t` (sites uploaded from it).
/// Returns the map and the output tensor's spatial shape and origin.
pub fn strided_cuda(dev: &CudaDevice, t: &SparseTensor, sites: &CudaSites, g: ConvGeometry) -> Result<(CudaKernelMap, [i32; 3], [i32; 3]), Error> {
    if sites.len != t.len() {
        return Err(Error::InvalidInput(format!("strided map: {} sites for a tensor of {}", sites.len, t.len())));
    }
    strided_cuda_sites(dev, sites, t.origin(), t.spatial_shape(), g)
}

/// [`strided_cuda`] on sites already on the device, whose tensor has `origin` and `spatial_shape`.
pub fn strided_cuda_sites(
    dev: &CudaDevice,
    sites: &CudaSites,
    origin: [i32; 3],
    spatial_shape: [i32; 3],
    g: ConvGeometry,
) -> Result<(CudaKernelMap, [i32; 3], [i32; 3]), Error> {
    for (name, v, min) in [("kernel", g.kernel, 1), ("stride", g.stride, 1), ("dilation", g.dilation, 1), ("padding", g.padding, 0)] {
        if v.iter().any(|&x| x < min) {
            return Err(Error::InvalidInput(format!("strided conv: {name} {v:?} must be >= {min}")));
        }
    }
    if (0..3).any(|a| origin[a].rem_euclid(g.stride[a]) != 0) {
        return Err(Error::InvalidInput(format!("strided conv: input origin {origin:?} must be a multiple of the stride {:?}", g.stride)));
    }
    let out_shape = conv_output_shape(spatial_shape, &g);
    if out_shape.iter().any(|&v| v < 1) {
        return Err(Error::InvalidInput(format!("strided conv: empty output shape {out_shape:?}")));
    }
    let out_origin = [0, 1, 2].map(|a| origin[a].div_euclid(g.stride[a]));
    let kv = kernel_volume(g.kernel);
    let n = sites.len;
    let s = &dev.stream;
    let geom = MapGeomC {
        kernel: g.kernel,
        stride: g.stride,
        padding: g.padding,
        dilation: g.dilation,
        in_origin: origin,
        out_origin,
        out_shape,
        kv: kv as u32,
    };
    // Where the outputs' cells tile the grid (kernel = stride, dilation 1), an input reaches at
    // most one output: one candidate an input instead of one an (input, offset), the same keys
    // apart from the empty ones (the down maps of a U-Net sort an eighth of the pairs).
    let tiling = (0..3).all(|a| g.kernel[a] == g.stride[a] && g.dilation[a] == 1);
    let per_input = if tiling { 1 } else { kv };
    let total = n * per_input;
    let total32 = u32::try_from(total).map_err(|_| Error::InvalidInput(format!("strided conv: {n} sites x {per_input} candidates is too many")))?;
    // Not zeroed: the candidates kernel writes all `total` keys; the sort's values are carried
    // along and never read; unique_heads writes every head, the scan every prefix,
    // unique_coords the m outputs' rows and strided_nbr all m * kv entries.
    // SAFETY: as said.
    let mut cand = unsafe { dev.alloc_uninit::<u64>(total, "candidates") }?;
    // SAFETY: as above.
    let mut idx = unsafe { dev.alloc_uninit::<u32>(total, "candidate index") }?;
    let n32 = n as u32;
    // Compact keys in the output grid's mixed radix where they fit in 63 bits, else the packing.
    let compact = compact_empty_key(sites.batch_size, out_shape);
    let m = if total > 0 {
        let empty = match compact {
            Some(empty) => {
                let f_cand = dev.function("sparse_map", if tiling { "strided_candidates_compact_tiling" } else { "strided_candidates_compact" })?;
                let batches = u32::try_from(sites.batch_size)
                    .map_err(|_| Error::InvalidInput(format!("strided conv: batch count {} exceeds 2^32", sites.batch_size)))?;
                // SAFETY: argument list matches sparse_map.cu; cand holds `total` entries.
                unsafe {
                    s.launch_builder(&f_cand).arg(&sites.coords).arg(&n32).arg(&geom).arg(&batches).arg(&empty).arg(&mut cand)
                        .launch(grid_u64(total as u64)?).map_err(cuda_err("strided_candidates_compact"))?;
                }
                empty
            }
            None => {
                let f_cand = dev.function("sparse_map", if tiling { "strided_candidates_tiling" } else { "strided_candidates" })?;
                // SAFETY: argument list matches sparse_map.cu; cand holds `total` entries.
                unsafe {
                    s.launch_builder(&f_cand).arg(&sites.coords).arg(&n32).arg(&geom).arg(&mut cand)
                        .launch(grid_u64(total as u64)?).map_err(cuda_err("strided_candidates"))?;
                }
                EMPTY_KEY
            }
        };
        radix_sort_pairs(dev, &mut cand, &mut idx, total, bits_for(empty))?;
        // SAFETY: as above.
        let mut heads = unsafe { dev.alloc_uninit::<u32>(total, "heads") }?;
        // SAFETY: as above.
        let mut excl = unsafe { dev.alloc_uninit::<u32>(total, "output ids") }?;
        let f_heads = dev.function("sparse_map", "unique_heads")?;
        // SAFETY: as above.
        unsafe {
            s.launch_builder(&f_heads).arg(&cand).arg(&total32).arg(&empty).arg(&mut heads)
                .launch(grid_1d(total32, THREADS)).map_err(cuda_err("unique_heads"))?;
        }
        let m = exclusive_scan_u32(dev, &heads, &mut excl, total)? as usize;
        // SAFETY: as above.
        let mut out_coords = unsafe { dev.alloc_uninit::<i32>(m * 4, "output coordinates") }?;
        // SAFETY: as above; out_coords holds m * 4.
        unsafe {
            if compact.is_some() {
                let f_uc = dev.function("sparse_map", "unique_coords_compact")?;
                s.launch_builder(&f_uc).arg(&cand).arg(&heads).arg(&excl).arg(&total32).arg(&geom).arg(&mut out_coords)
                    .launch(grid_1d(total32, THREADS)).map_err(cuda_err("unique_coords_compact"))?;
            } else {
                let f_uc = dev.function("sparse_map", "unique_coords")?;
                s.launch_builder(&f_uc).arg(&cand).arg(&heads).arg(&excl).arg(&total32).arg(&mut out_coords)
                    .launch(grid_1d(total32, THREADS)).map_err(cuda_err("unique_coords"))?;
            }
        }
        Some((m, out_coords))
    } else {
        None
    };
    let (m, out_coords) = match m {
        Some(v) => v,
        None => (0, s.alloc_zeros::<i32>(4).map_err(cuda_err("alloc"))?),
    };
    // The outputs keep their inputs' batch indices.
    let out = Arc::new(CudaSites::build_batched(dev, out_coords, m, sites.batch_size)?);
    // SAFETY: as above (nothing reads it when m = 0).
    let mut nbr = unsafe { dev.alloc_uninit::<i32>(m * kv, "neighbour table") }?;
    if m > 0 {
        let f_nbr = dev.function("sparse_map", "strided_nbr")?;
        let m32 = m as u32;
        // SAFETY: as above; nbr holds m * kv.
        unsafe {
            s.launch_builder(&f_nbr)
                .arg(&out.coords).arg(&m32).arg(&geom).arg(&sites.keys).arg(&sites.vals).arg(&sites.mask).arg(&mut nbr)
                .launch(grid_u64((m * kv) as u64)?)
                .map_err(cuda_err("strided_nbr"))?;
        }
    }
    let sorted = mask_order(dev, &nbr, m, kv, MaskKey::for_kernel(g.kernel))?;
    Ok((CudaKernelMap { kind: MapKind::Strided, kv, in_count: n, out_count: m, out, nbr, sorted }, out_shape, out_origin))
}

/// The inverse of a strided map (`SparseInverseConv3d` with the same `indice_key`): outputs are
/// the strided map's input sites (`in_sites`, in their order).
pub fn inverse_cuda(dev: &CudaDevice, down: &CudaKernelMap, in_sites: impl Into<Arc<CudaSites>>) -> Result<CudaKernelMap, Error> {
    let in_sites = in_sites.into();
    if down.kind != MapKind::Strided {
        return Err(Error::InvalidInput("inverse conv needs a strided map".into()));
    }
    if in_sites.len != down.in_count {
        return Err(Error::InvalidInput(format!("inverse conv: {} sites given, the strided map has {} inputs", in_sites.len, down.in_count)));
    }
    let (kv, n, m) = (down.kv, down.in_count, down.out_count);
    let s = &dev.stream;
    let mut inv = table_of_none(dev, n * kv)?;
    let f_inv = dev.function("sparse_map", "invert_nbr")?;
    let (m32, kv32) = (m as u32, kv as u32);
    // SAFETY: argument list matches sparse_map.cu; inv holds n * kv, down.nbr m * kv.
    unsafe {
        if m * kv > 0 {
            s.launch_builder(&f_inv).arg(&down.nbr).arg(&m32).arg(&kv32).arg(&mut inv)
                .launch(grid_u64((m * kv) as u64)?).map_err(cuda_err("invert_nbr"))?;
        }
    }
    // The strided map's offsets, so its key (one exists unless it has no outputs or too many
    // offsets; then the inverse's masks are all zero or it has no mask order either).
    let key = down.sorted.as_ref().map_or(MaskKey::IDENTITY, |d| d.key);
    let sorted = mask_order(dev, &inv, n, kv, key)?;
    Ok(CudaKernelMap { kind: MapKind::Inverse, kv, in_count: m, out_count: n, out: in_sites, nbr: inv, sorted })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_key_ranks_planar_then_near_offsets_first() {
        // 3 x 3 x 3: offset k = (x * 3 + y) * 3 + z. The key's bits from low to high: the centre,
        // the in-plane axis neighbours, the in-plane diagonals, then up/down, then the rest.
        let key = MaskKey::for_kernel([3, 3, 3]);
        let want = [13, 4, 10, 16, 22, 1, 7, 19, 25, 12, 14, 3, 5, 9, 11, 15, 17, 21, 23, 0, 2, 6, 8, 18, 20, 24, 26];
        for (b, &k) in want.iter().enumerate() {
            assert_eq!(key.key(1 << k), 1 << b, "offset {k}");
            assert_eq!(key.mask(1 << b), 1 << k, "key bit {b}");
        }
        // a bijection on 64 bits, so every mask round-trips and the order of distinct masks is total
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..1000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mask = rng & ((1 << 27) - 1);
            assert_eq!(key.mask(key.key(mask)), mask);
            assert_eq!(key.key(mask).count_ones(), mask.count_ones());
        }
        // even and flat kernels: every offset is as far from the centre, or the order is by index
        assert_eq!(MaskKey::for_kernel([2, 2, 2]), MaskKey::IDENTITY);
        assert_eq!(MaskKey::for_kernel([1, 1, 1]), MaskKey::IDENTITY);
        // 5 x 5 x 5 has 125 offsets: the first 64 are ranked, and ranks stay below 64
        let big = MaskKey::for_kernel([5, 5, 5]);
        assert_eq!(big.key(1 << 62), 1 << 0, "offset 62 = (2, 2, 2) is the centre");
        assert_eq!(big.mask(big.key(u64::MAX)), u64::MAX);
    }

    #[test]
    fn compact_key_range_and_fallback() {
        // One sample, SphereFormer-like output grids: far fewer bits than the 64-bit packing.
        assert_eq!(compact_empty_key(1, [720, 720, 41]), Some(720 * 720 * 41));
        assert_eq!(bits_for(720 * 720 * 41), 25);
        assert_eq!(compact_empty_key(2, [45, 45, 3]).map(bits_for), Some(14));
        // Empty site sets count as one batch: the range stays non-empty.
        assert_eq!(compact_empty_key(0, [3, 4, 5]), Some(60));
        assert_eq!(compact_empty_key(1, [1, 1, 1]), Some(1));
        // The largest packable grid: 2^48 cells, up to 2^15 - 1 batches fit below 2^63.
        let full = [65536; 3];
        assert_eq!(compact_empty_key(32767, full), Some(32767u64 << 48));
        assert_eq!(compact_empty_key(32767, full).map(bits_for), Some(63));
        assert_eq!(compact_empty_key(32768, full), None, "2^63 does not fit in 63 bits");
        assert_eq!(compact_empty_key(MAX_BATCHES, full), None);
        // Sites built without a batch count (65535) on a typical grid still fit.
        assert_eq!(compact_empty_key(MAX_BATCHES, [2000, 2000, 100]).map(bits_for), Some(45));
        assert_eq!(compact_empty_key(1, [0, 5, 5]), None, "empty output shape");
    }
}
