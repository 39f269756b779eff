//! CUDA BEV label grids (kernels in `kernels/ops/label_grid.cu`); same grids as `label_grid_cpu`.

use crate::ops::label_grid::cpu::{BevGridParams, BevGrids};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::grid_1d;
use crate::Error;
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

/// Mirror of `struct BevGridParams` in kernels/ops/label_grid.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct BevGridParamsC {
    xmin: f32,
    ymin: f32,
    resolution: f32,
    width: u32,
    height: u32,
    classes: u32,
}
// SAFETY: plain-old-data, same layout as the C struct.
unsafe impl DeviceRepr for BevGridParamsC {}

/// BEV grids from labeled points already on the GPU (`n` points). Returns them on the host,
/// the form the publishers need.
pub fn label_grid_cuda(
    dev: &CudaDevice,
    x: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    class_id: &CudaSlice<u8>,
    prob: &CudaSlice<f32>,
    n: usize,
    p: &BevGridParams,
) -> Result<BevGrids, Error> {
    p.validate()?;
    if x.len() < n || y.len() < n || class_id.len() < n || prob.len() < n {
        return Err(Error::InvalidInput(format!("BEV grid: input buffers hold fewer than {n} points")));
    }
    let n32 = u32::try_from(n).map_err(|_| Error::InvalidInput(format!("BEV grid: {n} points, at most 2^32-1")))?;
    let (w, h, k) = (p.width(), p.height(), p.classes);
    let cells = w * h;
    let s = &dev.stream;
    let gp = BevGridParamsC {
        xmin: p.range[0] as f32,
        ymin: p.range[1] as f32,
        resolution: p.resolution as f32,
        width: w as u32,
        height: h as u32,
        classes: k as u32,
    };
    let mut votes = s.alloc_zeros::<u64>(cells * k).map_err(cuda_err("BEV: allocating votes"))?;
    let bits = s.clone_htod(&p.obstacle_bits()).map_err(cuda_err("BEV: uploading obstacle classes"))?;
    let palette: Vec<u8> = p.palette.iter().flatten().copied().collect();
    let palette = s.clone_htod(&palette).map_err(cuda_err("BEV: uploading palette"))?;
    let mut labels = s.alloc_zeros::<u8>(cells).map_err(cuda_err("BEV: allocating labels"))?;
    let mut rgb = s.alloc_zeros::<u8>(cells * 3).map_err(cuda_err("BEV: allocating colours"))?;
    let mut occ = s.alloc_zeros::<i8>(cells).map_err(cuda_err("BEV: allocating occupancy"))?;
    let f_vote = dev.function("bev_grid", "bev_vote")?;
    let f_fin = dev.function("bev_grid", "bev_finalize")?;
    // SAFETY: argument lists match kernels/ops/label_grid.cu; buffers hold n points / cells (* k, * 3) entries.
    unsafe {
        if n32 > 0 {
            s.launch_builder(&f_vote)
                .arg(x).arg(y).arg(class_id).arg(prob).arg(&n32).arg(&gp).arg(&mut votes)
                .launch(grid_1d(n32, 256))
                .map_err(cuda_err("bev_vote"))?;
        }
        s.launch_builder(&f_fin)
            .arg(&votes).arg(&gp).arg(&bits).arg(&palette).arg(&mut labels).arg(&mut rgb).arg(&mut occ)
            .launch(grid_1d(cells as u32, 256))
            .map_err(cuda_err("bev_finalize"))?;
    }
    Ok(BevGrids {
        width: w,
        height: h,
        labels: s.clone_dtoh(&labels).map_err(cuda_err("BEV: reading labels"))?,
        rgb: s.clone_dtoh(&rgb).map_err(cuda_err("BEV: reading colours"))?,
        occupancy: s.clone_dtoh(&occ).map_err(cuda_err("BEV: reading occupancy"))?,
    })
}
