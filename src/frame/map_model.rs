//! The BEVFusion seg model ([`BevSegModel`], or its CUDA upload) as the camera branch's
//! [`BevMapModel`]: what the node and `sptr replay` run on each frame's [`BevFrameInputs`].
//!
//! Per frame: the decoded images of the used cameras (a masked camera is `None`: the model masks
//! it, it contributes nothing to the camera BEV), the frame's calibration (every camera, in the
//! branch's camera order, which must be the model's), and for the fusion model the aggregated
//! sweeps as upstream's points `[x, y, z, intensity, time_lag]`. With no usable camera the fusion
//! model runs LiDAR-only; the camera-only model gives a per-frame error. Every error is the
//! frame's: the caller drops that frame's map, counts it and goes on.
//!
//! Weights: a safetensors file, or `random:<seed>` (deterministic untrained weights, as `sptr
//! random-weights` writes them: real timings, meaningless maps) for smoke runs and tests.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use crate::models::bevfusion::seg::{random_tensors, BevSegConfig, BevSegKind, BevSegModel, BevSegOutput, Point5};
use crate::frame::cameras::{BevFrameInputs, BevMapModel, MapGraphCounts};
use crate::sensors::calib::camera::CameraCalib;
use crate::models::bevfusion::lss::LssParams;
use crate::ops::image_preprocess::cpu::ImagePreprocess;
use crate::models::bevfusion::map::BevMap;
use crate::frame::sweeps::SweepPoints;
use crate::sensors::image::encodings::{DecodeLimits, RgbImage};
#[cfg(feature = "cuda-core")]
use crate::sensors::image::jpeg_markers::ScreenedJpeg;
use crate::nn::Weights;
use crate::Error;

/// Where the seg model's weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegWeightsSource {
    File(std::path::PathBuf),
    /// Deterministic random weights with this seed.
    Random(u64),
}

impl SegWeightsSource {
    /// A parameter value: `random:<seed>`, else a path (relative paths are the caller's to resolve).
    pub fn parse(value: &str) -> Result<Self, Error> {
        match value.strip_prefix("random:") {
            Some(seed) => seed.trim().parse::<u64>().map(SegWeightsSource::Random).map_err(|_| {
                Error::InvalidInput(format!("camera model weights `{value}`: `random:` takes a seed (an unsigned integer), e.g. random:0"))
            }),
            None if value.is_empty() => Err(Error::InvalidInput(
                "camera model weights: empty; give a safetensors file (camera.model_weights) or random:<seed> for untrained weights".into(),
            )),
            None => Ok(SegWeightsSource::File(value.into())),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SegWeightsSource::File(p) => p.display().to_string(),
            SegWeightsSource::Random(s) => format!("random weights (seed {s}, untrained)"),
        }
    }

    fn load(&self, cfg: &BevSegConfig) -> Result<Weights, Error> {
        match self {
            SegWeightsSource::File(p) => Ok(Weights::from_file(p)?),
            SegWeightsSource::Random(seed) => {
                let t = random_tensors(cfg, *seed)?;
                Ok(Weights::from_tensors(&format!("random BEVFusion seg weights (seed {seed})"), t)?)
            }
        }
    }
}

enum Backend {
    Cpu(Box<BevSegModel>),
    #[cfg(feature = "cuda-core")]
    Cuda { dev: crate::device::cuda::CudaDevice, model: Box<crate::models::bevfusion::seg_cuda::CudaBevSeg> },
}

/// The seg model behind [`BevMapModel`].
pub struct SegMapModel {
    backend: Backend,
    kind: BevSegKind,
    classes: Vec<String>,
    description: String,
    /// The last forward's stage times (ms; GPU time on CUDA).
    last_stages: Vec<(String, f64)>,
    /// Cameras whose JPEG the last forward could not decode (masked for that frame).
    decode_failures: Vec<(usize, String)>,
    /// What a camera must satisfy to be taken ([`BevMapModel::check_camera`]): the image
    /// preprocessing's resize and the LSS geometry's resize + crop.
    preprocess: ImagePreprocess,
    lss: LssParams,
}

impl SegMapModel {
    /// Loads the model YAML `config` with `weights` on the CPU, or uploads it to GPU 0 (`Cuda`).
    pub fn open(config: &Path, weights: &SegWeightsSource, device: crate::device::Device) -> Result<Self, Error> {
        let cuda = device == crate::device::Device::Cuda;
        let cfg = BevSegConfig::load(config).map_err(|e| Error::InvalidInput(format!("BEV map model {}: {e}", config.display())))?;
        let w = weights.load(&cfg)?;
        let model = BevSegModel::from_weights(&cfg, w)?;
        let device = if cuda { "cuda" } else { "cpu" };
        let description = format!("{} ({}) with {} on {device}", config.display(), cfg.kind.name(), weights.describe());
        let preprocess = model.camera.config.preprocess.clone();
        let lss = model.camera.vtransform.params.clone();
        let backend = if cuda { Self::cuda(model)? } else { Backend::Cpu(Box::new(model)) };
        Ok(SegMapModel {
            backend,
            kind: cfg.kind,
            classes: cfg.classes.clone(),
            description,
            last_stages: Vec::new(),
            decode_failures: Vec::new(),
            preprocess,
            lss,
        })
    }

    #[cfg(feature = "cuda-core")]
    fn cuda(model: BevSegModel) -> Result<Backend, Error> {
        let dev = crate::device::cuda::CudaDevice::new(0)?;
        let gpu = crate::models::bevfusion::seg_cuda::CudaBevSeg::upload(&dev, &model, crate::ops::dense::conv_engine::ConvBackend::Cudnn)?;
        Ok(Backend::Cuda { dev, model: Box::new(gpu) })
    }

    #[cfg(not(feature = "cuda-core"))]
    fn cuda(_: BevSegModel) -> Result<Backend, Error> {
        Err(Error::InvalidInput("this build has no CUDA backend for the BEV map model: rebuild with `--features cuda` or use device cpu".into()))
    }

    pub fn kind(&self) -> BevSegKind {
        self.kind
    }

    /// Runs the CUDA model's network as a CUDA graph (on) or kernel by kernel (off, the default)
    /// ([`crate::models::bevfusion::seg_graph`]). Returns false on the CPU backend, which has no
    /// graphs.
    #[cfg_attr(not(feature = "cuda-core"), allow(unused_variables))]
    pub fn set_cuda_graph(&mut self, on: bool) -> bool {
        match &mut self.backend {
            #[cfg(feature = "cuda-core")]
            Backend::Cuda { model, .. } => {
                model.set_graphs(on);
                true
            }
            Backend::Cpu(_) => false,
        }
    }

    /// `camera.cuda_graph` as the node and the replay take it: on, the network runs as a CUDA
    /// graph; on the CPU backend it is ignored, and the returned warning says so.
    pub fn apply_cuda_graph_param(&mut self, on: bool) -> Option<&'static str> {
        (on && !self.set_cuda_graph(true)).then_some("camera.cuda_graph is on, but the BEV map model runs on the CPU, which has no CUDA graphs: ignored")
    }

    /// The model's map classes, in output order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// What was loaded, for logs and diagnostics.
    pub fn description(&self) -> &str {
        &self.description
    }
}

/// Upstream's point layout of the aggregated sweeps.
pub fn sweep_points5(p: &SweepPoints) -> Vec<Point5> {
    (0..p.len()).map(|i| [p.x[i], p.y[i], p.z[i], p.intensity[i], p.time_lag[i]]).collect()
}

impl SegMapModel {
    /// A frame whose every used camera is a screened JPEG, decoded by nvJPEG in the model's
    /// first stage while the host checks its scans; a masked camera's slot holds another
    /// camera's JPEG as a stand-in (decoded, pooled nowhere). `None` when the frame does not
    /// qualify (a raw or PNG image, no camera at all, the CPU backend, nvJPEG not loaded) or when
    /// a JPEG's data turned out bad (its scan checks failed, or both decoders refused it): the
    /// caller then decodes on the host, where zune-jpeg judges each image, names the bad camera
    /// and the frame runs without it.
    #[cfg(feature = "cuda-core")]
    fn forward_all_jpeg(&mut self, inputs: &BevFrameInputs, cloud: Option<&[Point5]>) -> Option<Result<BevSegOutput, Error>> {
        let Backend::Cuda { dev, model } = &mut self.backend else { return None };
        if !model.decodes_jpeg_on_gpu() {
            return None;
        }
        let mut jpegs: Vec<Option<ScreenedJpeg<&[u8]>>> = Vec::with_capacity(inputs.images.len());
        for image in &inputs.images {
            match image {
                None => jpegs.push(None),
                Some(i) => jpegs.push(Some(i.jpeg()?.borrowed())),
            }
        }
        let stand_in = *jpegs.iter().flatten().next()?;
        let masked: Vec<usize> = (0..jpegs.len()).filter(|&i| jpegs[i].is_none()).collect();
        let all: Vec<ScreenedJpeg<&[u8]>> = jpegs.into_iter().map(|j| j.unwrap_or(stand_in)).collect();
        match model.forward_screened_jpeg_masked(dev, &inputs.calibration, &all, &masked, cloud) {
            // Bad image data (both decoders refused it): decoded again on the host below.
            Err(Error::InvalidInput(_)) => None,
            r => Some(r),
        }
    }

    #[cfg(not(feature = "cuda-core"))]
    fn forward_all_jpeg(&mut self, _: &BevFrameInputs, _: Option<&[Point5]>) -> Option<Result<BevSegOutput, Error>> {
        None
    }
}

impl BevMapModel for SegMapModel {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, Error> {
        self.decode_failures.clear();
        // The node and the pipeline bench run the model on a thread of its own (beside the LiDAR
        // path): the library calls (cuDNN, cuBLASLt, nvJPEG) need the context current there.
        #[cfg(feature = "cuda-core")]
        if let Backend::Cuda { dev, .. } = &self.backend {
            dev.ctx.bind_to_thread().map_err(|e| Error::Cuda(format!("binding the CUDA context for the BEV map model: {e:?}")))?;
        }
        if inputs.images.len() != inputs.calibration.len() {
            return Err(Error::InvalidInput(format!(
                "{} camera images for a calibration of {} cameras",
                inputs.images.len(),
                inputs.calibration.len()
            )));
        }
        let cloud = match self.kind {
            BevSegKind::Fusion => Some(sweep_points5(&inputs.points)),
            BevSegKind::Camera => None,
        };
        if let Some(out) = self.forward_all_jpeg(inputs, cloud.as_deref()) {
            let out = out?;
            self.last_stages = out.times.0;
            return Ok(out.map);
        }
        // Deferred JPEGs in a frame the batched path did not take (bad JPEG data, a raw image
        // beside them) decoded on the host; one that fails is masked and reported.
        let limits = DecodeLimits::default();
        let decoded: Vec<Option<Result<Arc<RgbImage>, String>>> =
            inputs.images.par_iter().map(|i| i.as_ref().map(|i| i.to_rgb(&limits))).collect();
        let mut rgb: Vec<Option<Arc<RgbImage>>> = Vec::with_capacity(decoded.len());
        for (i, d) in decoded.into_iter().enumerate() {
            match d {
                Some(Err(why)) => {
                    self.decode_failures.push((i, why));
                    rgb.push(None);
                }
                d => rgb.push(d.and_then(Result::ok)),
            }
        }
        let images: Vec<Option<&RgbImage>> = rgb.iter().map(|i| i.as_deref()).collect();
        let out: BevSegOutput = match &mut self.backend {
            Backend::Cpu(m) => m.forward(&inputs.calibration, &images, cloud.as_deref(), false)?,
            #[cfg(feature = "cuda-core")]
            Backend::Cuda { dev, model } => model.forward_images(dev, &inputs.calibration, &images, cloud.as_deref(), false)?,
        };
        self.last_stages = out.times.0;
        Ok(out.map)
    }

    fn last_stages(&self) -> Vec<(String, f64)> {
        self.last_stages.clone()
    }

    fn decodes_jpeg(&self) -> bool {
        match &self.backend {
            Backend::Cpu(_) => false,
            #[cfg(feature = "cuda-core")]
            Backend::Cuda { model, .. } => model.decodes_jpeg_on_gpu(),
        }
    }

    fn take_decode_failures(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.decode_failures)
    }

    fn graph_counts(&self) -> Option<MapGraphCounts> {
        match &self.backend {
            Backend::Cpu(_) => None,
            #[cfg(feature = "cuda-core")]
            Backend::Cuda { model, .. } => model.graphs().then(|| {
                let g = model.graph_status();
                MapGraphCounts { captures: g.captures, replays: g.replays, refused: g.refused, last_refusal: g.last_refusal.clone() }
            }),
        }
    }

    fn check_camera(&self, camera: &CameraCalib) -> Result<(), String> {
        let (w, h) = (camera.image_width, camera.image_height);
        self.preprocess.aug_for(w, h).map_err(|e| format!("camera `{}`: {e}", camera.name))?;
        self.lss.camera(camera).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// The node moves the model into its processing thread.
#[allow(dead_code)]
fn assert_send() {
    fn send<T: Send>() {}
    send::<SegMapModel>();
}
