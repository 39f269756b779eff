//! The camera preprocessing on the GPU: the same function as [`preprocess_cpu`](super::preprocess::preprocess_cpu)
//! (resize, crop, normalize; module docs there), output in FP16 NHWC, one kernel for all cameras
//! (`kernels/image_preprocess.cu`).
//!
//! Only RGB8 bytes cross the bus, and of each image only the rows its resize reads (for
//! 1600 × 900 → 256 × 704 rows 364..900, 60 % of the image). Images are staged in one pinned host
//! buffer and copied asynchronously; [`CameraPreprocessCuda::run_jpeg`] decodes the JPEGs straight
//! into that buffer (no copy on the host). The tap tables and per-camera descriptors are built once
//! per set of image sizes and stay on the device while the sizes do.

use super::compressed::{decode_jpeg_into, jpeg_size};
use super::image::{DecodeLimits, ImageError, RgbImage};
use super::preprocess::{ImageAug, ImagePreprocess, ResizeTaps};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};
use half::f16;
use rayon::prelude::*;

/// Words per camera descriptor (`kernels/image_preprocess.cu`).
const DESC_WORDS: usize = 8;
const BLOCK: (u32, u32) = (32, 8);

/// Preprocessed camera images on the GPU: `n × h × w × 3` FP16, NHWC.
pub struct CudaCameraBatch {
    pub data: CudaSlice<f16>,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// Each camera's resize and crop (for geometry).
    pub augs: Vec<ImageAug>,
}

impl CudaCameraBatch {
    /// The values copied back, widened to f32.
    pub fn to_host(&self, dev: &CudaDevice) -> Result<Vec<f32>, Error> {
        let v = dev.stream.clone_dtoh(&self.data).map_err(cuda_err("reading preprocessed images"))?;
        Ok(v.iter().map(|h| h.to_f32()).collect())
    }
}

/// What is planned for one list of image sizes.
struct Plan {
    sizes: Vec<[usize; 2]>,
    augs: Vec<ImageAug>,
    /// Per camera: its bytes in the staging buffer (the whole image) ...
    host_offset: Vec<usize>,
    /// ... the rows `[r0, r1)` uploaded, and where they go on the device.
    rows: Vec<(usize, usize)>,
    dev_offset: Vec<usize>,
    host_bytes: usize,
    dev_bytes: usize,
    cams: CudaSlice<i64>,
    tables: CudaSlice<i32>,
}

/// The GPU camera preprocessor; keeps its plan, staging and upload buffers between frames.
pub struct CameraPreprocessCuda {
    cfg: ImagePreprocess,
    plan: Option<Plan>,
    staging: Option<PinnedHostSlice<u8>>,
    src: Option<CudaSlice<u8>>,
    /// Recorded after the last upload: the staging buffer may be rewritten once it has passed.
    uploaded: Option<CudaEvent>,
}

fn image_err(e: ImageError) -> Error {
    e.into()
}

impl CameraPreprocessCuda {
    pub fn new(cfg: ImagePreprocess) -> CameraPreprocessCuda {
        CameraPreprocessCuda { cfg, plan: None, staging: None, src: None, uploaded: None }
    }

    pub fn config(&self) -> &ImagePreprocess {
        &self.cfg
    }

    /// Bytes one frame uploads for the current image sizes (0 before the first frame).
    pub fn upload_bytes(&self) -> usize {
        self.plan.as_ref().map_or(0, |p| p.rows.iter().zip(&p.sizes).map(|(&(r0, r1), s)| (r1 - r0) * s[0] * 3).sum())
    }

    /// Decoded images (any sizes) → the network input on the GPU.
    pub fn run(&mut self, dev: &CudaDevice, images: &[&RgbImage]) -> Result<CudaCameraBatch, Error> {
        let sizes: Vec<[usize; 2]> = images.iter().map(|i| [i.width, i.height]).collect();
        for img in images {
            if img.data.len() != img.width * img.height * 3 {
                return Err(Error::InvalidInput(format!(
                    "RGB image of {} x {} holds {} bytes, not {}",
                    img.width,
                    img.height,
                    img.data.len(),
                    img.width * img.height * 3
                )));
            }
        }
        self.prepare(dev, &sizes)?;
        let plan = self.plan.as_ref().ok_or_else(|| Error::Cuda("camera preprocessing plan missing".into()))?;
        let staging = self.staging.as_mut().ok_or_else(|| Error::Cuda("camera staging buffer missing".into()))?;
        let host = staging.as_mut_slice().map_err(cuda_err("mapping the camera staging buffer"))?;
        // Each camera's uploaded rows into its part of the staging buffer, cameras in parallel.
        let mut parts = split_parts(&mut host[..plan.host_bytes], &plan.host_offset);
        parts.par_iter_mut().zip(images.par_iter()).zip(plan.rows.par_iter()).for_each(|((dst, img), &(r0, r1))| {
            let row = img.width * 3;
            dst[r0 * row..r1 * row].copy_from_slice(&img.data[r0 * row..r1 * row]);
        });
        self.upload_and_launch(dev)
    }

    /// JPEG files (any sizes) → decoded in parallel straight into the staging buffer → the
    /// network input on the GPU. Errors name the camera whose JPEG is bad.
    pub fn run_jpeg(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], limits: &DecodeLimits) -> Result<CudaCameraBatch, Error> {
        self.stage_jpeg(dev, jpegs, limits)?;
        self.upload_and_launch(dev)
    }

    /// The host half of [`run_jpeg`](Self::run_jpeg): the JPEGs decoded into the staging buffer;
    /// [`upload_and_launch`](Self::upload_and_launch) then does the device half (so a caller can
    /// time the two apart).
    pub fn stage_jpeg(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], limits: &DecodeLimits) -> Result<(), Error> {
        let mut sizes = Vec::with_capacity(jpegs.len());
        for (i, j) in jpegs.iter().enumerate() {
            let (w, h) = jpeg_size(j, limits).map_err(|e| Error::InvalidInput(format!("camera {i}: {e}")))?;
            sizes.push([w, h]);
        }
        self.prepare(dev, &sizes)?;
        let plan = self.plan.as_ref().ok_or_else(|| Error::Cuda("camera preprocessing plan missing".into()))?;
        let staging = self.staging.as_mut().ok_or_else(|| Error::Cuda("camera staging buffer missing".into()))?;
        let host = staging.as_mut_slice().map_err(cuda_err("mapping the camera staging buffer"))?;
        let mut parts = split_parts(&mut host[..plan.host_bytes], &plan.host_offset);
        let results: Vec<Result<(), ImageError>> = parts
            .par_iter_mut()
            .zip(jpegs.par_iter())
            .zip(plan.sizes.par_iter())
            .map(|((dst, j), s)| decode_jpeg_into(j, (s[0], s[1]), dst))
            .collect();
        for (i, r) in results.into_iter().enumerate() {
            r.map_err(|e| Error::InvalidInput(format!("camera {i}: {e}")))?;
        }
        Ok(())
    }

    /// Makes the plan, staging and device buffers fit `sizes`, and waits until the staging
    /// buffer is free (its last upload done).
    fn prepare(&mut self, dev: &CudaDevice, sizes: &[[usize; 2]]) -> Result<(), Error> {
        if sizes.is_empty() {
            return Err(Error::InvalidInput("camera preprocessing needs at least one image".into()));
        }
        if let Some(ev) = self.uploaded.take() {
            ev.synchronize().map_err(cuda_err("waiting for the previous camera upload"))?;
        }
        if self.plan.as_ref().map(|p| p.sizes.as_slice()) != Some(sizes) {
            self.plan = None;
            let plan = make_plan(dev, &self.cfg, sizes)?;
            if self.staging.as_ref().is_none_or(|s| s.len() < plan.host_bytes) {
                self.staging = None;
                // SAFETY: page-locked host memory of `host_bytes`, written before it is read.
                // Not write-combined: the JPEG decoder reads back what it writes.
                let s = unsafe { dev.ctx.alloc_pinned_with_flags::<u8>(plan.host_bytes, 0) }
                    .map_err(cuda_err("allocating pinned memory for camera images"))?;
                self.staging = Some(s);
            }
            if self.src.as_ref().is_none_or(|s| s.len() < plan.dev_bytes) {
                self.src = None;
                self.src = Some(dev.stream.alloc_zeros::<u8>(plan.dev_bytes).map_err(cuda_err("allocating camera image upload"))?);
            }
            self.plan = Some(plan);
        }
        Ok(())
    }

    /// Copies each camera's rows from the staging buffer and runs the kernel.
    pub fn upload_and_launch(&mut self, dev: &CudaDevice) -> Result<CudaCameraBatch, Error> {
        self.upload(dev)?;
        self.launch(dev)
    }

    /// Copies each camera's uploaded rows from the staging buffer to the device (asynchronous);
    /// public for the benchmark, which times it alone on what the last call staged.
    pub fn upload(&mut self, dev: &CudaDevice) -> Result<(), Error> {
        let s = &dev.stream;
        let (Some(plan), Some(staging), Some(src)) = (self.plan.as_ref(), self.staging.as_ref(), self.src.as_mut()) else {
            return Err(Error::InvalidInput("camera upload before any images were staged".into()));
        };
        if let Some(ev) = self.uploaded.take() {
            ev.synchronize().map_err(cuda_err("waiting for the previous camera upload"))?;
        }
        let host = staging.as_slice().map_err(cuda_err("mapping the camera staging buffer"))?;
        for i in 0..plan.sizes.len() {
            let row = plan.sizes[i][0] * 3;
            let (r0, r1) = plan.rows[i];
            let from = plan.host_offset[i] + r0 * row;
            let len = (r1 - r0) * row;
            if len == 0 {
                continue;
            }
            let mut dst = src.slice_mut(plan.dev_offset[i]..plan.dev_offset[i] + len);
            // A plain slice of page-locked memory: the driver copies it asynchronously; the
            // `uploaded` event below keeps the host from rewriting it before the copy is done.
            s.memcpy_htod(&host[from..from + len], &mut dst).map_err(cuda_err("uploading camera images"))?;
        }
        let ev = dev.ctx.new_event(None).map_err(cuda_err("creating the camera upload event"))?;
        ev.record(s).map_err(cuda_err("recording the camera upload event"))?;
        self.uploaded = Some(ev);
        Ok(())
    }

    /// Runs the kernel on the uploaded rows; public for the benchmark.
    pub fn launch(&self, dev: &CudaDevice) -> Result<CudaCameraBatch, Error> {
        let s = &dev.stream;
        let (Some(plan), Some(src)) = (self.plan.as_ref(), self.src.as_ref()) else {
            return Err(Error::InvalidInput("camera preprocessing launched before any images were uploaded".into()));
        };
        let (n, oh, ow) = (plan.sizes.len(), self.cfg.out_h, self.cfg.out_w);
        let mut out = s.alloc_zeros::<f16>(n * oh * ow * 3).map_err(cuda_err("allocating preprocessed images"))?;
        let f = dev.function("image_preprocess", "camera_resize_normalize")?;
        let (oh32, ow32) = (oh as u32, ow as u32);
        let (m, sd) = (self.cfg.mean, self.cfg.std);
        let cfg = LaunchConfig {
            grid_dim: (ow32.div_ceil(BLOCK.0), oh32.div_ceil(BLOCK.1), n as u32),
            block_dim: (BLOCK.0, BLOCK.1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches image_preprocess.cu: `cams` holds n descriptors whose offsets point at
        // each camera's uploaded rows in `src` and its taps in `tables` (make_plan), every tap
        // reads rows inside the uploaded range and columns inside the image (bicubic_taps clamps
        // them to the axis); `out` holds n * oh * ow * 3 values; n <= 65535 (make_plan).
        unsafe {
            s.launch_builder(&f)
                .arg(src)
                .arg(&plan.cams)
                .arg(&plan.tables)
                .arg(&oh32)
                .arg(&ow32)
                .arg(&m[0]).arg(&m[1]).arg(&m[2])
                .arg(&sd[0]).arg(&sd[1]).arg(&sd[2])
                .arg(&mut out)
                .launch(cfg)
                .map_err(cuda_err("camera_resize_normalize"))?;
        }
        Ok(CudaCameraBatch { data: out, n, h: oh, w: ow, augs: plan.augs.clone() })
    }
}

/// `buf` cut at `offsets` (ascending; the last part runs to the end).
fn split_parts<'a>(mut buf: &'a mut [u8], offsets: &[usize]) -> Vec<&'a mut [u8]> {
    let mut parts = Vec::with_capacity(offsets.len());
    for i in 0..offsets.len() {
        let end = offsets.get(i + 1).map_or(buf.len(), |&o| o - offsets[i]);
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(end);
        parts.push(head);
        buf = tail;
    }
    parts
}

/// The resize/crop of every camera, its tap tables and descriptors on the device, and the
/// buffer layout.
fn make_plan(dev: &CudaDevice, cfg: &ImagePreprocess, sizes: &[[usize; 2]]) -> Result<Plan, Error> {
    cfg.check().map_err(image_err)?;
    if sizes.len() > u16::MAX as usize {
        return Err(Error::InvalidInput(format!("{} camera images in one batch (at most 65535)", sizes.len())));
    }
    let mut augs = Vec::with_capacity(sizes.len());
    let mut tables: Vec<i32> = Vec::new();
    let mut cams: Vec<i64> = Vec::with_capacity(sizes.len() * DESC_WORDS);
    let (mut host_offset, mut rows, mut dev_offset) = (vec![], vec![], vec![]);
    let (mut host_bytes, mut dev_bytes) = (0usize, 0usize);
    for &[w, h] in sizes {
        let aug = cfg.aug_for(w, h).map_err(image_err)?;
        let taps = ResizeTaps::new(&aug).map_err(image_err)?;
        let (r0, r1) = taps.vertical.input_range();
        let row = w * 3;
        host_offset.push(host_bytes);
        dev_offset.push(dev_bytes);
        rows.push((r0, r1));
        let h_at = tables.len();
        for axis in [&taps.horizontal, &taps.vertical] {
            tables.extend_from_slice(&axis.first);
            tables.extend_from_slice(&axis.count);
            tables.extend_from_slice(&axis.coeffs);
        }
        let v_at = h_at + taps.horizontal.len() * (2 + taps.horizontal.ksize);
        cams.extend_from_slice(&[
            dev_bytes as i64,
            row as i64,
            r0 as i64,
            h_at as i64,
            taps.horizontal.ksize as i64,
            v_at as i64,
            taps.vertical.ksize as i64,
            0,
        ]);
        host_bytes += w * h * 3;
        // At least one byte per camera so every camera's offset lies inside the buffer.
        dev_bytes += ((r1 - r0) * row).max(1);
        augs.push(aug);
    }
    let s = &dev.stream;
    let cams = s.clone_htod(&cams).map_err(cuda_err("uploading camera descriptors"))?;
    let tables = s.clone_htod(&tables).map_err(cuda_err("uploading resize taps"))?;
    Ok(Plan { sizes: sizes.to_vec(), augs, host_offset, rows, dev_offset, host_bytes, dev_bytes, cams, tables })
}
