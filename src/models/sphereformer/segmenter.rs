//! A frame in, labels out: points → SphereFormer's preprocessing → the network → every point's
//! class and probability, with per-stage timings. Everything runs on the CPU or (feature `cuda`)
//! on a GPU: there, preprocessing, the network, the arg-max and the map back to points stay on the
//! device, and only the points go up and the per-point labels and probabilities come back.
//!
//! Every input point gets an entry. A point that has no voxel (NaN/Inf coordinates, dropped as
//! out of range, beyond the grid, or in a voxel past `max_voxels`) gets [`UNLABELED`] and
//! probability 0. A batch whose points all lack a voxel, zero points included, is not an error:
//! every point (possibly none) is `UNLABELED` and the network does not run.

#[cfg(feature = "cuda-core")]
use super::precision;
use crate::device::Device;
use crate::models::sphereformer::config::ModelYaml;
use crate::models::sphereformer::preprocess::{prepare_inputs, NetworkInputs};
use crate::device::range_guard::RangeReport;
use crate::models::sphereformer::network::{SphereFormer, StageHook, StageTimes};
use crate::nn::weights::Weights;
use crate::ops::voxelize::cpu::{sample_offsets, VoxelStats};
use crate::{Error, Points};
use rayon::prelude::*;
use std::time::Instant;

/// Class id of a point that got no voxel (never a real class: ids are `0..classes`, ≤ 255).
pub const UNLABELED: u32 = u32::MAX;

/// One batch's result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Segmentation {
    /// Per input point (samples concatenated in order): class id in `0..classes` or [`UNLABELED`].
    pub labels: Vec<u32>,
    /// Softmax probability of that class (0 for unlabeled points).
    pub probs: Vec<f32>,
    /// Start of each sample in `labels`/`probs`, plus the total.
    pub offsets: Vec<usize>,
    /// Voxels the network ran on.
    pub voxels: usize,
    pub voxel_stats: VoxelStats,
    /// Voxels whose coordinate collided and was resolved (see `models::sphereformer::preprocess`).
    pub coord_fixups: usize,
    /// `voxelize`, the network's stages (`input_conv`, `l<k>.blocks`, `l<k>.attention`,
    /// `l<k>.down`, `l<k>.up`, `l<k>.tail`, `head`), `devoxelize`. On CUDA the kernel-map builds
    /// are stages of their own (`input_map`, `l<k>.map`) and the network's stage times are GPU
    /// times between CUDA events (no host synchronisation per stage).
    pub times: StageTimes,
    /// The FP16 range guard ([`crate::device::range_guard`]): the layers whose activations left FP16's
    /// range (CUDA) or were not finite (CPU). Not clean: the labels are not to be trusted.
    /// In BF16 and FP32 the limit is the format's (only inf and NaN, in practice).
    pub range: RangeReport,
    /// What the published labels were computed in on CUDA (`None`: on the CPU, in f32).
    pub storage: Option<crate::device::storage::Storage>,
    /// Precision `auto`: this frame's FP16 pass was flagged (this report), so the frame was
    /// computed again in FP32 and `range`/`labels` are the FP32 pass's. Its stage times follow
    /// the FP16 pass's, named `recompute.<stage>`.
    pub recomputed_from: Option<RangeReport>,
}

impl Segmentation {
    /// Every point of `clouds` unlabeled (probability 0), before the network's results are in.
    fn unlabeled(clouds: &[&Points], voxels: usize, voxel_stats: VoxelStats, coord_fixups: usize, times: StageTimes) -> Self {
        let offsets = sample_offsets(clouds);
        let n_points = offsets.last().copied().unwrap_or(0);
        Segmentation {
            labels: vec![UNLABELED; n_points],
            probs: vec![0.0; n_points],
            offsets,
            voxels,
            voxel_stats,
            coord_fixups,
            times,
            range: RangeReport::default(),
            storage: None,
            recomputed_from: None,
        }
    }

    /// Labels of sample `b`.
    pub fn sample_labels(&self, b: usize) -> Option<&[u32]> {
        Some(&self.labels[*self.offsets.get(b)?..*self.offsets.get(b + 1)?])
    }
}

/// A loaded model and its configuration, on the CPU or on a CUDA device.
#[derive(Clone)]
pub struct Segmenter {
    cfg: ModelYaml,
    model: SphereFormer,
    /// Told of each stage as it ends (see [`Segmenter::set_stage_hook`]).
    stage_hook: Option<StageHook>,
    #[cfg(feature = "cuda-core")]
    cuda: Option<std::sync::Arc<CudaBackend>>,
}

/// The network uploaded to a device, in the model's precision.
#[cfg(feature = "cuda-core")]
struct CudaBackend {
    dev: crate::device::cuda::CudaDevice,
    nets: precision::PrecisionNets,
}

impl std::fmt::Debug for Segmenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segmenter").field("device", &self.device()).field("classes", &self.model.classes()).finish()
    }
}

impl Segmenter {
    /// Builds the network from `weights` on the CPU (checked against the config: one error lists
    /// every missing, unexpected and mis-shaped tensor).
    pub fn new(cfg: ModelYaml, weights: Weights) -> Result<Self, Error> {
        let model = SphereFormer::from_weights(&cfg, weights)?;
        Ok(Self {
            cfg,
            model,
            stage_hook: None,
            #[cfg(feature = "cuda-core")]
            cuda: None,
        })
    }

    /// [`Segmenter::new`] on `device`: `Cuda` uploads the network to GPU 0 in the config's
    /// `precision` and fails with the reason when there is no usable GPU (no driver, no device,
    /// no NVRTC or cuBLAS) or when this build has no CUDA support.
    pub fn on_device(cfg: ModelYaml, weights: Weights, device: Device) -> Result<Self, Error> {
        Self::new(cfg, weights)?.into_device(device)
    }

    /// This CPU segmenter moved to `device` (`Cuda`: uploaded to GPU 0; see [`Segmenter::on_device`]).
    pub fn into_device(self, device: Device) -> Result<Self, Error> {
        match device {
            Device::Cpu => Ok(self),
            Device::Cuda => self.to_cuda(),
        }
    }

    /// On a stream of the greatest priority: where the node's BEV map model runs beside it, the
    /// GPU starts the LiDAR network's work first.
    #[cfg(feature = "cuda-core")]
    fn to_cuda(mut self) -> Result<Self, Error> {
        let dev = crate::device::cuda::CudaDevice::new_high_priority(0)?;
        let nets = precision::PrecisionNets::upload(&dev, &self.model, self.cfg.precision)?;
        self.cuda = Some(std::sync::Arc::new(CudaBackend { dev, nets }));
        Ok(self)
    }

    /// Where the CUDA network's precision stands (`None` on the CPU): the setting, what the next
    /// frame is computed in, and how many frames `auto` computed again in FP32.
    #[cfg(feature = "cuda-core")]
    pub fn precision_status(&self) -> Option<precision::PrecisionStatus> {
        self.cuda.as_ref().map(|c| c.nets.status())
    }

    #[cfg(not(feature = "cuda-core"))]
    fn to_cuda(self) -> Result<Self, Error> {
        Err(Error::Cuda("this build has no CUDA support: rebuild with `--features cuda`, or use the CPU".into()))
    }

    /// The GPU the network runs on, if it does.
    #[cfg(feature = "cuda-core")]
    pub fn cuda_device(&self) -> Option<&crate::device::cuda::CudaDevice> {
        self.cuda.as_ref().map(|c| &c.dev)
    }

    /// Where the network runs.
    pub fn device(&self) -> Device {
        #[cfg(feature = "cuda-core")]
        if self.cuda.is_some() {
            return Device::Cuda;
        }
        Device::Cpu
    }

    /// Loads a model YAML and a safetensors file.
    pub fn from_files(model_yaml: &std::path::Path, weights: &std::path::Path) -> Result<Self, Error> {
        let cfg = crate::models::sphereformer::config::ModelConfig::load(model_yaml)?.yaml;
        Self::new(cfg, Weights::from_file(weights)?)
    }

    pub fn config(&self) -> &ModelYaml {
        &self.cfg
    }

    /// Sets the CUDA precision ([`crate::device::storage::Precision`]) the next
    /// [`Segmenter::into_device`] uploads in, overriding the model YAML's. An error on a
    /// segmenter already on CUDA (its networks are uploaded: make a new one).
    pub fn set_precision(&mut self, precision: crate::device::storage::Precision) -> Result<(), Error> {
        if self.device() == Device::Cuda {
            return Err(Error::InvalidInput("set the precision before moving the model to CUDA".into()));
        }
        self.cfg.precision = precision;
        Ok(())
    }

    /// A function told of each stage of every later [`Segmenter::segment`] as it ends (name,
    /// wall time; on the CPU in the order of [`crate::models::sphereformer::network::cpu_stage_names`]),
    /// e.g. progress lines for long CPU runs ([`progress`]). `None` removes it.
    pub fn set_stage_hook(&mut self, hook: Option<StageHook>) {
        self.stage_hook = hook;
    }
    pub fn model(&self) -> &SphereFormer {
        &self.model
    }

    /// Segments a batch of clouds (see the module docs for points without a voxel).
    pub fn segment(&self, clouds: &[&Points]) -> Result<Segmentation, Error> {
        #[cfg(feature = "cuda-core")]
        if let Some(c) = &self.cuda {
            return self.segment_cuda(c, clouds);
        }
        let mut times = StageTimes { hook: self.stage_hook.clone(), ..Default::default() };
        let start = Instant::now();
        let inputs = prepare_inputs(clouds, &self.cfg)?;
        times.record("voxelize", start);
        let mut out = Segmentation::unlabeled(clouds, inputs.len(), inputs.stats, inputs.coord_fixups, times);
        if inputs.is_empty() {
            return Ok(out);
        }
        let (logits, range) = self.run_network_checked(&inputs, &mut out.times)?;
        out.range = range;
        let start = Instant::now();
        let per_voxel = argmax_softmax(&logits, self.model.classes());
        devoxelize(&inputs.point_to_voxel, &per_voxel, &mut out.labels, &mut out.probs);
        out.times.record("devoxelize", start);
        Ok(out)
    }

    /// [`Segmenter::segment`] with every step on the GPU, in the model's precision (`auto`: a
    /// frame whose FP16 pass is flagged is computed again in FP32, see [`precision`]).
    #[cfg(feature = "cuda-core")]
    fn segment_cuda(&self, c: &CudaBackend, clouds: &[&Points]) -> Result<Segmentation, Error> {
        use crate::device::storage::Storage;
        let run = |storage: Storage| match storage {
            Storage::Fp16 => self.segment_cuda_in(&c.dev, c.nets.fp16()?, clouds),
            Storage::Bf16 => self.segment_cuda_in(&c.dev, c.nets.bf16()?, clouds),
            Storage::Fp32 => self.segment_cuda_in(&c.dev, c.nets.fp32()?, clouds),
        };
        let storage = c.nets.storage();
        let out = run(storage)?;
        let Some((wide, first)) = c.nets.recompute(storage, !out.range.is_clean()) else { return Ok(out) };
        if first {
            let wide_name = wide.name().to_uppercase();
            eprintln!(
                "sptr: precision auto: the FP16 forward left FP16's range ({}); this frame is computed again in {wide_name} \
                 and the model stays on {wide_name} from now on",
                out.range.summary(3)
            );
        }
        let mut again = run(wide)?;
        let mut times = out.times;
        times.stages.extend(again.times.stages.drain(..).map(|(name, d)| (format!("recompute.{name}"), d)));
        again.times = times;
        again.recomputed_from = Some(out.range);
        Ok(again)
    }

    /// One forward of the GPU path on `net` (FP16, BF16 or FP32).
    #[cfg(feature = "cuda-core")]
    fn segment_cuda_in<S: crate::device::storage::Store>(
        &self,
        dev: &crate::device::cuda::CudaDevice,
        net: &crate::models::sphereformer::network::cuda::CudaSphereFormer<S>,
        clouds: &[&Points],
    ) -> Result<Segmentation, Error> {
        use crate::models::sphereformer::preprocess::cuda::{labels_to_points_cuda, prepare_inputs_cuda};
        use crate::device::clock::GpuClock;
        let mut times = StageTimes::default();
        let start = Instant::now();
        let inputs = prepare_inputs_cuda(dev, clouds, &self.cfg)?;
        times.record("voxelize", start);
        let mut out = Segmentation::unlabeled(clouds, inputs.len, inputs.stats, inputs.coord_fixups, times);
        out.storage = Some(S::STORAGE);
        if inputs.is_empty() {
            return Ok(out);
        }
        let mut clock = GpuClock::start(dev)?;
        let (logits, point_map, range) = net.forward_prepared(dev, inputs, &mut clock)?;
        let (labels, probs) = labels_to_points_cuda(dev, &logits, &point_map, self.model.classes(), UNLABELED)?;
        // the flags' copy was enqueued before the labels', which are on the host now
        out.range = range.finish(net.layer_names())?;
        // devoxelize: arg-max, the map back to points and the copy of the labels to the host.
        clock.mark(dev, "devoxelize".into())?;
        clock.finish(&mut out.times)?;
        out.labels = labels;
        out.probs = probs;
        Ok(out)
    }

    /// Voxel logits `[voxels, classes]` for prepared inputs, on this segmenter's device (without
    /// the range guard's report: [`Segmenter::run_network_checked`]).
    pub fn run_network(&self, inputs: &NetworkInputs, times: &mut StageTimes) -> Result<Vec<f32>, Error> {
        self.run_network_checked(inputs, times).map(|(logits, _)| logits)
    }

    /// [`Segmenter::run_network`] and the FP16 range guard's report of the forward.
    pub fn run_network_checked(&self, inputs: &NetworkInputs, times: &mut StageTimes) -> Result<(Vec<f32>, RangeReport), Error> {
        #[cfg(feature = "cuda-core")]
        if let Some(c) = &self.cuda {
            use crate::device::storage::Storage;
            let run = |storage: Storage, times: &mut StageTimes| {
                let (i, s) = (inputs, inputs.spatial_shape);
                match storage {
                    Storage::Fp16 => c.nets.fp16()?.forward(&c.dev, &i.coords, &i.feats, &i.xyz, &i.batch, s, times),
                    Storage::Bf16 => c.nets.bf16()?.forward(&c.dev, &i.coords, &i.feats, &i.xyz, &i.batch, s, times),
                    Storage::Fp32 => c.nets.fp32()?.forward(&c.dev, &i.coords, &i.feats, &i.xyz, &i.batch, s, times),
                }
            };
            let storage = c.nets.storage();
            let (logits, range) = run(storage, times)?;
            // precision auto: a flagged FP16 forward is computed again in FP32 (see segment)
            return match c.nets.recompute(storage, !range.is_clean()) {
                Some((wide, _)) => run(wide, times),
                None => Ok((logits, range)),
            };
        }
        self.model.forward_cpu_checked(&inputs.coords, &inputs.feats, &inputs.xyz, &inputs.batch, inputs.spatial_shape, times)
    }
}

/// Per row of `[N, classes]` logits: arg-max (first one on ties, as `torch.max`) and its softmax
/// probability `1 / Σ exp(l - l_max)` (f64).
pub fn argmax_softmax(logits: &[f32], classes: usize) -> Vec<(u32, f32)> {
    logits
        .par_chunks(classes.max(1))
        .map(|row| {
            let mut best = 0usize;
            for (c, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = c;
                }
            }
            let max = row[best] as f64;
            let denom: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            (best as u32, (1.0 / denom) as f32)
        })
        .collect()
}

/// Every point takes its voxel's label and probability; points without a voxel keep
/// [`UNLABELED`] / 0.
fn devoxelize(point_to_voxel: &[i32], per_voxel: &[(u32, f32)], labels: &mut [u32], probs: &mut [f32]) {
    labels.par_iter_mut().zip(probs.par_iter_mut()).zip(point_to_voxel.par_iter()).for_each(|((l, p), &v)| {
        if let Some(&(c, pr)) = usize::try_from(v).ok().and_then(|v| per_voxel.get(v)) {
            *l = c;
            *p = pr;
        }
    });
}
