//! The camera preprocessing on the GPU: the same function as [`preprocess_cpu`](crate::ops::image_preprocess::cpu::preprocess_cpu)
//! (resize, crop, normalize; module docs there), output in FP16 NHWC, one kernel for all cameras
//! (`kernels/ops/image_preprocess.cu`).
//!
//! Only RGB8 bytes cross the bus, and of each image only the rows its resize reads (for
//! 1600 × 900 → 256 × 704 rows 364..900, 60 % of the image). Images are staged in one pinned host
//! buffer and copied asynchronously; [`CameraPreprocessCuda::run_jpeg`] decodes the JPEGs straight
//! into that buffer (no copy on the host). The tap tables and per-camera descriptors are built once
//! per set of image sizes and stay on the device while the sizes do.
//!
//! JPEGs on nvJPEG ([`CameraPreprocessCuda::with_decoder`], `sensors::image::nvjpeg`): the JPEG bytes are
//! copied into pinned memory, decoded by nvJPEG straight into a device buffer that holds every
//! camera's whole image (RGB8 interleaved), and the same kernel reads them there: no pixel
//! crosses the bus. A JPEG nvJPEG does not take (progressive, grey, CMYK, ...:
//! `sensors::image::jpeg_markers`, refused by the library, or called corrupt by it) is decoded by
//! zune-jpeg on the host and its rows uploaded into its place in that buffer, so zune-jpeg's strict
//! mode judges corrupt data on both paths; [`CameraPreprocessCuda::jpeg_stats`] counts them.
//! nvJPEG is handed only JPEGs whose headers passed `jpeg_markers::screen_for_gpu` (sizes within
//! the limits, an end-of-image marker after the scan). [`CameraPreprocessCuda::run_jpeg`] checks
//! the scans before too (`jpeg_markers::check_before_gpu`: scan data that ends before the last MCU,
//! whatever marker follows, or holds a stray marker), as `compressed::decode_jpeg_into` refuses
//! it on the CPU path; [`CameraPreprocessCuda::run_screened_jpeg`] leaves them to its caller,
//! which checks them beside the GPU work and uses the result only if they passed.

use crate::sensors::image::compressed::{decode_jpeg_into, jpeg_size, JpegDecoderChoice};
use crate::sensors::image::encodings::{DecodeLimits, ImageError, RgbImage};
use crate::sensors::image::jpeg_markers::{check_before_gpu, screen_for_gpu, GpuEligibility, ScreenedJpeg};
use crate::sensors::image::nvjpeg::{Backend, DecodeTarget, ImageOutcome, NvjpegDecoder};
use crate::ops::image_preprocess::cpu::{ImageAug, ImagePreprocess, ResizeTaps};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtrMut, LaunchConfig, PinnedHostSlice, PushKernelArg};
use half::f16;
use rayon::prelude::*;

/// Each JPEG through `check_before_gpu` (the cameras in parallel: the scan walk and the search
/// for stray markers read every byte), as screened JPEGs whose scans passed too; the error names
/// the first bad camera.
pub fn check_jpegs<'a>(jpegs: &[&'a [u8]], limits: &DecodeLimits) -> Result<Vec<ScreenedJpeg<&'a [u8]>>, Error> {
    jpegs
        .par_iter()
        .enumerate()
        .map(|(i, j)| check_before_gpu(*j, limits).map(|c| *c.screened()).map_err(|e| Error::InvalidInput(format!("camera {i}: {e}"))))
        .collect()
}

/// Each JPEG through `screen_for_gpu` (headers only: microseconds); the error names the first
/// bad camera. Their scans are still to be checked ([`ScreenedJpeg::check_scans`]).
pub fn screen_jpegs<'a>(jpegs: &[&'a [u8]], limits: &DecodeLimits) -> Result<Vec<ScreenedJpeg<&'a [u8]>>, Error> {
    jpegs
        .iter()
        .enumerate()
        .map(|(i, j)| screen_for_gpu(*j, limits).map_err(|e| Error::InvalidInput(format!("camera {i}: {e}"))))
        .collect()
}

/// Words per camera descriptor (`kernels/ops/image_preprocess.cu`).
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
    /// Whole images on the device (the nvJPEG path): each camera's first byte, the total, and
    /// descriptors pointing there (row 0 of each image at its offset).
    full_offset: Vec<usize>,
    full_bytes: usize,
    cams_full: CudaSlice<i64>,
}

/// Which images of the last frame nvJPEG decoded, and which went to zune-jpeg and why; with
/// totals over the preprocessor's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JpegStats {
    /// Cameras of the last frame decoded by nvJPEG.
    pub gpu: Vec<usize>,
    /// Cameras of the last frame decoded by zune-jpeg, with the reason.
    pub cpu_fallback: Vec<(usize, String)>,
    pub gpu_total: usize,
    pub cpu_fallback_total: usize,
}

/// The JPEG decoder in use.
enum JpegPath {
    /// zune-jpeg into the pinned staging buffer; `why` says why nvJPEG is not used when `auto`
    /// asked for it.
    Cpu { why: Option<String> },
    Nvjpeg(Box<NvjpegDecoder>),
}

/// The GPU camera preprocessor; keeps its plan, staging and upload buffers between frames.
pub struct CameraPreprocessCuda {
    cfg: ImagePreprocess,
    plan: Option<Plan>,
    staging: Option<PinnedHostSlice<u8>>,
    src: Option<CudaSlice<u8>>,
    /// Recorded after the last upload: the staging buffer may be rewritten once it has passed.
    uploaded: Option<CudaEvent>,
    jpeg: JpegPath,
    /// The nvJPEG path's whole decoded images (`Plan::full_offset`).
    decoded: Option<CudaSlice<u8>>,
    /// The nvJPEG path's copy of the frame's JPEG bytes (pinned: nvJPEG may read it after its
    /// call returns; rewritten only after `uploaded` has passed).
    bitstreams: Option<PinnedHostSlice<u8>>,
    stats: JpegStats,
}

fn image_err(e: ImageError) -> Error {
    e.into()
}

impl CameraPreprocessCuda {
    /// A preprocessor whose JPEGs are decoded by zune-jpeg on the host.
    pub fn new(cfg: ImagePreprocess) -> CameraPreprocessCuda {
        Self::with_path(cfg, JpegPath::Cpu { why: None })
    }

    fn with_path(cfg: ImagePreprocess, jpeg: JpegPath) -> CameraPreprocessCuda {
        CameraPreprocessCuda { cfg, plan: None, staging: None, src: None, uploaded: None, jpeg, decoded: None, bitstreams: None, stats: JpegStats::default() }
    }

    /// A preprocessor with the JPEG decoder `choice` ([`JpegDecoderChoice`]). `Nvjpeg` is an
    /// error when nvJPEG cannot be used; `Auto` then falls back to zune-jpeg and
    /// [`CameraPreprocessCuda::jpeg_decoder`] says why.
    pub fn with_decoder(dev: &CudaDevice, cfg: ImagePreprocess, choice: JpegDecoderChoice) -> Result<CameraPreprocessCuda, Error> {
        let path = match choice {
            JpegDecoderChoice::Cpu => JpegPath::Cpu { why: None },
            JpegDecoderChoice::Nvjpeg => JpegPath::Nvjpeg(Box::new(NvjpegDecoder::new(dev)?)),
            JpegDecoderChoice::Auto => match NvjpegDecoder::new(dev) {
                Ok(d) => JpegPath::Nvjpeg(Box::new(d)),
                Err(e) => JpegPath::Cpu { why: Some(e.to_string()) },
            },
        };
        Ok(Self::with_path(cfg, path))
    }

    /// Whether JPEGs go to nvJPEG.
    pub fn uses_nvjpeg(&self) -> bool {
        matches!(self.jpeg, JpegPath::Nvjpeg(_))
    }

    /// The JPEG decoder in words: `"nvJPEG 13.0.0 hardware, interpolated chroma"`,
    /// `"zune-jpeg"`, or `"zune-jpeg (nvJPEG not used: <why>)"`.
    pub fn jpeg_decoder(&self) -> String {
        match &self.jpeg {
            JpegPath::Nvjpeg(d) => d.describe(),
            JpegPath::Cpu { why: None } => "zune-jpeg".into(),
            JpegPath::Cpu { why: Some(w) } => format!("zune-jpeg (nvJPEG not used: {w})"),
        }
    }

    /// The nvJPEG backend in use (None on the zune-jpeg path).
    pub fn nvjpeg_backend(&self) -> Option<Backend> {
        match &self.jpeg {
            JpegPath::Nvjpeg(d) => Some(d.backend()),
            JpegPath::Cpu { .. } => None,
        }
    }

    /// Whether nvJPEG upsamples chroma with interpolation (None on the zune-jpeg path).
    pub fn nvjpeg_interpolated_chroma(&self) -> Option<bool> {
        match &self.jpeg {
            JpegPath::Nvjpeg(d) => Some(d.interpolated_chroma()),
            JpegPath::Cpu { .. } => None,
        }
    }

    /// Which decoder took which image ([`JpegStats`]).
    pub fn jpeg_stats(&self) -> &JpegStats {
        &self.stats
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

    /// JPEG files (any sizes) → the network input on the GPU, decoded by the decoder chosen at
    /// construction (module docs). Errors name the camera whose JPEG is bad.
    pub fn run_jpeg(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], limits: &DecodeLimits) -> Result<CudaCameraBatch, Error> {
        if self.uses_nvjpeg() {
            let checked = check_jpegs(jpegs, limits)?;
            return self.run_screened_nvjpeg(dev, &checked);
        }
        self.stage_jpeg(dev, jpegs, limits)?;
        self.launch_host_decoded(dev)
    }

    /// [`run_jpeg`](Self::run_jpeg) on screened JPEGs (`jpeg_markers::screen_for_gpu`): nvJPEG
    /// is handed them as they are, and the caller uses the result only once their scans passed
    /// [`ScreenedJpeg::check_scans`] (or checked them before: [`check_jpegs`]); zune-jpeg decodes
    /// them at the screened sizes (its decode walks the scans itself).
    pub fn run_screened_jpeg(&mut self, dev: &CudaDevice, jpegs: &[ScreenedJpeg<&[u8]>]) -> Result<CudaCameraBatch, Error> {
        if self.uses_nvjpeg() {
            return self.run_screened_nvjpeg(dev, jpegs);
        }
        self.stage_screened_jpeg(dev, jpegs)?;
        self.launch_host_decoded(dev)
    }

    /// The device half after zune-jpeg staged every image (no image went to nvJPEG).
    fn launch_host_decoded(&mut self, dev: &CudaDevice) -> Result<CudaCameraBatch, Error> {
        let out = self.upload_and_launch(dev)?;
        self.stats.gpu.clear();
        self.stats.cpu_fallback.clear();
        Ok(out)
    }

    /// The host half of the zune-jpeg path of [`run_jpeg`](Self::run_jpeg): the JPEGs decoded in
    /// parallel straight into the staging buffer; [`upload_and_launch`](Self::upload_and_launch)
    /// then does the device half (so a caller can time the two apart).
    pub fn stage_jpeg(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], limits: &DecodeLimits) -> Result<(), Error> {
        let mut sizes = Vec::with_capacity(jpegs.len());
        for (i, j) in jpegs.iter().enumerate() {
            let (w, h) = jpeg_size(j, limits).map_err(|e| Error::InvalidInput(format!("camera {i}: {e}")))?;
            sizes.push([w, h]);
        }
        self.stage_sized(dev, jpegs, &sizes)
    }

    /// [`stage_jpeg`](Self::stage_jpeg) on screened JPEGs, at their screened sizes.
    pub fn stage_screened_jpeg(&mut self, dev: &CudaDevice, jpegs: &[ScreenedJpeg<&[u8]>]) -> Result<(), Error> {
        let bytes: Vec<&[u8]> = jpegs.iter().map(|j| j.bytes()).collect();
        let sizes: Vec<[usize; 2]> = jpegs.iter().map(|j| j.size().into()).collect();
        self.stage_sized(dev, &bytes, &sizes)
    }

    /// [`stage_jpeg`](Self::stage_jpeg) with each JPEG's size known (`jpeg_size` within the limits).
    fn stage_sized(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], sizes: &[[usize; 2]]) -> Result<(), Error> {
        self.prepare(dev, sizes)?;
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

    /// nvJPEG into the device buffer of whole images; zune-jpeg for what it does not take.
    fn run_screened_nvjpeg(&mut self, dev: &CudaDevice, screened: &[ScreenedJpeg<&[u8]>]) -> Result<CudaCameraBatch, Error> {
        let jpegs: Vec<&[u8]> = screened.iter().map(|c| c.bytes()).collect();
        let jpegs = jpegs.as_slice();
        let sizes: Vec<[usize; 2]> = screened.iter().map(|c| c.size().into()).collect();
        let eligible: Vec<GpuEligibility> = screened.iter().map(|c| c.gpu_eligibility()).collect();
        self.prepare(dev, &sizes)?;
        let plan = self.plan.as_ref().ok_or_else(|| Error::Cuda("camera preprocessing plan missing".into()))?;
        if self.decoded.as_ref().is_none_or(|d| d.len() < plan.full_bytes) {
            self.decoded = None;
            self.decoded = Some(dev.stream.alloc_zeros::<u8>(plan.full_bytes).map_err(cuda_err("allocating decoded camera images"))?);
        }
        // The frame's eligible JPEGs, back to back in pinned memory (`prepare` waited for the
        // previous frame's `uploaded` event, recorded after its decode).
        let gpu_idx: Vec<usize> = (0..jpegs.len()).filter(|&i| eligible[i] == GpuEligibility::Eligible).collect();
        let total: usize = gpu_idx.iter().map(|&i| jpegs[i].len()).sum();
        if self.bitstreams.as_ref().is_none_or(|b| b.len() < total.max(1)) {
            self.bitstreams = None;
            // SAFETY: page-locked host memory, written below before nvJPEG reads it.
            let b = unsafe { dev.ctx.alloc_pinned_with_flags::<u8>(total.max(1), 0) }.map_err(cuda_err("allocating pinned memory for JPEG bytes"))?;
            self.bitstreams = Some(b);
        }
        let (Some(bits), Some(decoded), JpegPath::Nvjpeg(dec)) = (self.bitstreams.as_mut(), self.decoded.as_mut(), &mut self.jpeg) else {
            return Err(Error::Cuda("nvJPEG buffers missing".into()));
        };
        let host_bits = bits.as_mut_slice().map_err(cuda_err("mapping the JPEG byte buffer"))?;
        let mut at = Vec::with_capacity(gpu_idx.len());
        let mut o = 0usize;
        for &i in &gpu_idx {
            host_bits[o..o + jpegs[i].len()].copy_from_slice(jpegs[i]);
            at.push(o);
            o += jpegs[i].len();
        }
        let mut outcomes = Vec::new();
        if !gpu_idx.is_empty() {
            let (base, sync) = decoded.device_ptr_mut(&dev.stream);
            let targets: Vec<DecodeTarget<'_>> = gpu_idx
                .iter()
                .zip(&at)
                .map(|(&i, &o)| DecodeTarget { jpeg: &host_bits[o..o + jpegs[i].len()], dst: base + plan.full_offset[i] as u64, pitch: sizes[i][0] * 3 })
                .collect();
            let r = dec.decode(dev, &targets);
            drop(sync);
            if r.is_err() {
                // nvJPEG may still read the JPEG bytes: the next frame waits for this event.
                let ev = dev.ctx.new_event(None).map_err(cuda_err("creating the camera upload event"))?;
                ev.record(&dev.stream).map_err(cuda_err("recording the camera upload event"))?;
                self.uploaded = Some(ev);
            }
            outcomes = r?;
        }
        // What nvJPEG did not take goes to zune-jpeg.
        let mut cpu: Vec<(usize, String)> = (0..jpegs.len()).filter(|&i| eligible[i] != GpuEligibility::Eligible).map(|i| (i, eligible[i].reason())).collect();
        let mut gpu = Vec::with_capacity(gpu_idx.len());
        for (&i, oc) in gpu_idx.iter().zip(&outcomes) {
            match oc {
                ImageOutcome::Decoded => gpu.push(i),
                ImageOutcome::Unsupported(why) => cpu.push((i, format!("nvJPEG: {why}"))),
                // zune-jpeg (strict) is the judge of corrupt data on both paths: it names the
                // camera if the JPEG is bad, and decodes it if nvJPEG was only stricter. Its
                // upload is ordered after whatever nvJPEG enqueued for the image.
                ImageOutcome::Corrupt(why) => cpu.push((i, format!("nvJPEG: {why}"))),
            }
        }
        cpu.sort();
        let result = self.decode_fallbacks(dev, jpegs, &cpu);
        // Recorded whether or not the frame failed: nvJPEG may still read the JPEG bytes.
        let ev = dev.ctx.new_event(None).map_err(cuda_err("creating the camera upload event"))?;
        ev.record(&dev.stream).map_err(cuda_err("recording the camera upload event"))?;
        self.uploaded = Some(ev);
        result?;
        self.stats.gpu_total += gpu.len();
        self.stats.cpu_fallback_total += cpu.len();
        self.stats.gpu = gpu;
        self.stats.cpu_fallback = cpu;
        let plan = self.plan.as_ref().ok_or_else(|| Error::Cuda("camera preprocessing plan missing".into()))?;
        let decoded = self.decoded.as_ref().ok_or_else(|| Error::Cuda("decoded camera images missing".into()))?;
        self.launch_from(dev, decoded, &plan.cams_full)
    }

    /// zune-jpeg for the cameras in `cpu` (in parallel, into the staging buffer), then their
    /// rows the resize reads uploaded into their places in the whole-image buffer.
    fn decode_fallbacks(&mut self, dev: &CudaDevice, jpegs: &[&[u8]], cpu: &[(usize, String)]) -> Result<(), Error> {
        if cpu.is_empty() {
            return Ok(());
        }
        let (Some(plan), Some(staging), Some(decoded)) = (self.plan.as_ref(), self.staging.as_mut(), self.decoded.as_mut()) else {
            return Err(Error::Cuda("camera buffers missing".into()));
        };
        let host = staging.as_mut_slice().map_err(cuda_err("mapping the camera staging buffer"))?;
        let parts = split_parts(&mut host[..plan.host_bytes], &plan.host_offset);
        let mut todo: Vec<(usize, &mut [u8])> = parts.into_iter().enumerate().filter(|(i, _)| cpu.iter().any(|c| c.0 == *i)).collect();
        let results: Vec<Result<(), Error>> = todo
            .par_iter_mut()
            .map(|(i, dst)| {
                let s = plan.sizes[*i];
                decode_jpeg_into(jpegs[*i], (s[0], s[1]), dst).map_err(|e| Error::InvalidInput(format!("camera {i}: {e}")))
            })
            .collect();
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
        drop(todo);
        let host = staging.as_slice().map_err(cuda_err("mapping the camera staging buffer"))?;
        for &(i, _) in cpu {
            let row = plan.sizes[i][0] * 3;
            let (r0, r1) = plan.rows[i];
            let len = (r1 - r0) * row;
            if len == 0 {
                continue;
            }
            let from = plan.host_offset[i] + r0 * row;
            let to = plan.full_offset[i] + r0 * row;
            let mut dst = decoded.slice_mut(to..to + len);
            s_memcpy(dev, &host[from..from + len], &mut dst)?;
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
        let (Some(plan), Some(src)) = (self.plan.as_ref(), self.src.as_ref()) else {
            return Err(Error::InvalidInput("camera preprocessing launched before any images were uploaded".into()));
        };
        self.launch_from(dev, src, &plan.cams)
    }

    /// Runs the kernel on images in `src` described by `cams` (the upload layout or the
    /// whole-image layout of the plan).
    fn launch_from(&self, dev: &CudaDevice, src: &CudaSlice<u8>, cams: &CudaSlice<i64>) -> Result<CudaCameraBatch, Error> {
        let s = &dev.stream;
        let Some(plan) = self.plan.as_ref() else {
            return Err(Error::InvalidInput("camera preprocessing launched before any images were planned".into()));
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
        // SAFETY: matches image_preprocess.cu: `cams` (plan.cams with `src` the upload buffer, or
        // plan.cams_full with `src` the whole-image buffer of at least full_bytes) holds n
        // descriptors whose offsets point at each camera's rows in `src` and its taps in `tables`
        // (make_plan), every tap reads rows inside the uploaded range and columns inside the
        // image (bicubic_taps clamps them to the axis); `out` holds n * oh * ow * 3 values;
        // n <= 65535 (make_plan).
        unsafe {
            s.launch_builder(&f)
                .arg(src)
                .arg(cams)
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
    let (mut full_offset, mut full_bytes, mut cams_full) = (vec![], 0usize, Vec::with_capacity(sizes.len() * DESC_WORDS));
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
        // Whole images, each starting 256-byte aligned (nvJPEG writes rows from there).
        full_offset.push(full_bytes);
        cams_full.extend_from_slice(&[full_bytes as i64, row as i64, 0, h_at as i64, taps.horizontal.ksize as i64, v_at as i64, taps.vertical.ksize as i64, 0]);
        full_bytes += (w * h * 3).div_ceil(256) * 256;
        host_bytes += w * h * 3;
        // At least one byte per camera so every camera's offset lies inside the buffer.
        dev_bytes += ((r1 - r0) * row).max(1);
        augs.push(aug);
    }
    let s = &dev.stream;
    let cams = s.clone_htod(&cams).map_err(cuda_err("uploading camera descriptors"))?;
    let tables = s.clone_htod(&tables).map_err(cuda_err("uploading resize taps"))?;
    let cams_full = s.clone_htod(&cams_full).map_err(cuda_err("uploading camera descriptors"))?;
    Ok(Plan { sizes: sizes.to_vec(), augs, host_offset, rows, dev_offset, host_bytes, dev_bytes, cams, tables, full_offset, full_bytes: full_bytes.max(1), cams_full })
}

/// An asynchronous host → device copy from page-locked memory (the `uploaded` event guards the
/// source until it is done).
fn s_memcpy(dev: &CudaDevice, src: &[u8], dst: &mut cudarc::driver::CudaViewMut<'_, u8>) -> Result<(), Error> {
    dev.stream.memcpy_htod(src, dst).map_err(cuda_err("uploading camera images"))
}
