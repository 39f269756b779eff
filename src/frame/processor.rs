//! The perception node's work on one frame, without ROS: a `PointCloud2` body in, the labeled
//! cloud body and the BEV grids out, with per-stage times. The node (`ros::node`) wraps it in
//! messages; `sptr bench pipeline` runs it alone (no ROS) to time the same path on any host.
//!
//! Steps: the point count declared by the header against `voxelization.max_points` (before
//! anything is allocated), decode ([`crate::msgs::cloud::decode_into`], points with a NaN/Inf x, y, z or
//! intensity dropped),
//! [`Segmenter::segment`] (voxelize, network, devoxelize), the BEV grids
//! ([`crate::ops::label_grid::cpu`]: on the GPU when the device is CUDA), the labeled cloud
//! ([`crate::msgs::cloud::encode_labeled`]).
//!
//! The device is chosen in one place, [`Processor::open`].

use std::path::Path;
use std::time::{Duration, Instant};

use crate::ops::label_grid::cpu::{label_grid_cpu, BevGridParams, BevGrids};
use crate::msgs::cloud;
use crate::msgs::cloud::{CloudBuf, CloudView, DecodeReport};
use crate::device::Device;
use crate::frame::params::OverflowPolicy;
use crate::models::sphereformer::config::ModelYaml;
use crate::device::range_guard::RangeReport;
use crate::nn::weights::Weights;
use crate::models::sphereformer::segmenter::{Segmentation, Segmenter, UNLABELED};
use crate::ops::voxelize::cpu::VoxelStats;
use crate::{Error, Points};

/// `class_id` of a point without a class (no voxel: non-finite, out of range, past
/// `max_voxels`); its probability is 0. Also the "no data" value of the mono8 BEV image.
pub const NO_CLASS: u8 = 255;

/// Why a frame gave no output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The PointCloud2 cannot be decoded (truncated data, zero point_step, missing x/y/z, ...).
    Malformed,
    /// Zero points (width or height 0).
    Empty,
    /// Every point has a NaN/Inf coordinate or intensity.
    NoFinitePoints,
    /// More points than the model YAML's `voxelization.max_points`.
    TooManyPoints,
    /// Processing failed on the CPU (a bug or an input the model cannot take).
    ProcessingError,
    /// A CUDA error (the `on_cuda_error` parameter says what happens next).
    DeviceError,
    /// The network's activations left the FP16 range (or were NaN/inf on the CPU) and
    /// `on_overflow` is `drop`: the labels would be plausible-looking garbage.
    Overflow,
}

impl Reject {
    pub const ALL: [Reject; 7] = [
        Reject::Malformed,
        Reject::Empty,
        Reject::NoFinitePoints,
        Reject::TooManyPoints,
        Reject::ProcessingError,
        Reject::DeviceError,
        Reject::Overflow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::Empty => "empty",
            Reject::NoFinitePoints => "no_finite_points",
            Reject::TooManyPoints => "too_many_points",
            Reject::ProcessingError => "processing_error",
            Reject::DeviceError => "device_error",
            Reject::Overflow => "overflow",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The reason for a library error met while processing.
    pub fn of_error(e: &Error) -> Reject {
        match e {
            Error::Cuda(_) | Error::KernelCompile(_) => Reject::DeviceError,
            _ => Reject::ProcessingError,
        }
    }
}

/// A rejected frame: the reason and what exactly was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub why: Reject,
    pub detail: String,
}

impl Rejected {
    fn new(why: Reject, detail: impl Into<String>) -> Self {
        Rejected {
            why,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.why.name(), self.detail)
    }
}

/// Stages [`FrameOutput::stages`] reports, in order (the node publishes each on
/// `~/debug/stage_ms/<name>`).
pub const STAGES: [&str; 6] = [
    "decode",
    "voxelize",
    "network",
    "devoxelize",
    "bev",
    "encode",
];

/// What one frame gives.
#[derive(Debug, Clone)]
pub struct FrameOutput {
    /// The labeled cloud's body (see [`crate::msgs::cloud::encode_labeled`]): one point per finite input point.
    pub cloud: CloudBuf,
    pub grids: BevGrids,
    /// Voxels the network ran on.
    pub voxels: usize,
    pub voxel_stats: VoxelStats,
    /// Input points (declared by the message) and points kept by decoding (finite x, y, z and
    /// intensity); the difference was dropped as NaN/Inf.
    pub points_in: usize,
    pub points_kept: usize,
    /// The cloud had an intensity field. Without one the network saw intensity 0 for every
    /// point (the model was trained with intensity): the node and replay count such clouds and
    /// say so.
    pub has_intensity: bool,
    /// Wall time of each of [`STAGES`], ms.
    pub stages: [f64; STAGES.len()],
    /// Sum of the stages, ms.
    pub total_ms: f64,
    /// The network's FP16 range guard: empty when every activation was in range. Not empty
    /// only under `on_overflow: zero_probability` (under `drop` the frame is rejected): the cloud
    /// then has probability 0 everywhere and the BEV grids are unknown.
    pub range: RangeReport,
    /// `precision: auto`: the FP16 pass's range report when this frame was computed again in
    /// BF16 (its outputs are the BF16 ones, `range` is the BF16 pass's).
    pub recomputed_from: Option<RangeReport>,
}

/// The node's count of frames whose activations left the FP16 range, for `/diagnostics`: every
/// such frame is an ERROR there, whatever `on_overflow` did with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverflowStats {
    /// Frames out of range, dropped or published with probability 0.
    pub frames: u64,
    /// Of those, the ones dropped (`on_overflow: drop`).
    pub dropped: u64,
    /// The last one's flagged layers ([`RangeReport::summary`]).
    pub last: Option<String>,
}

impl OverflowStats {
    /// A frame rejected with [`Reject::Overflow`] (its detail is [`overflow_detail`]).
    pub fn dropped(&mut self, r: &Rejected) {
        if r.why == Reject::Overflow {
            self.frames += 1;
            self.dropped += 1;
            self.last = Some(r.detail.clone());
        }
    }

    /// A frame published: counted when its range report is not clean (`zero_probability`).
    pub fn published(&mut self, range: &RangeReport) {
        if !range.is_clean() {
            self.frames += 1;
            self.last = Some(overflow_detail(range));
        }
    }

    /// The ERROR message of a diagnostics report after `new` more such frames (None for 0).
    pub fn diagnostic(&self, new: u64, policy: OverflowPolicy) -> Option<String> {
        if new == 0 {
            return None;
        }
        let what = match policy {
            OverflowPolicy::Drop => "not published (on_overflow: drop)",
            OverflowPolicy::ZeroProbability => "published with probability 0 (on_overflow: zero_probability)",
        };
        Some(format!(
            "{new} frame(s) out of the FP16 range, {what}; last: {}",
            self.last.as_deref().unwrap_or("?")
        ))
    }
}

/// The text a frame out of range is reported with (logs, reject reasons, replay's report).
pub fn overflow_detail(range: &RangeReport) -> String {
    format!(
        "the network's activations left the FP16 range (NaN/inf on the CPU), so its labels cannot be trusted: {}",
        range.summary(3)
    )
}

/// The network (the `Segmenter` runs it on the CPU or the GPU it was moved to).
enum Model {
    Net(Segmenter),
}

/// Where the BEV grids are computed.
enum Bev {
    Cpu,
    #[cfg(feature = "cuda-core")]
    Cuda(crate::device::cuda::CudaDevice),
}

/// The model, the BEV grid and the reusable buffers of one frame processor.
pub struct Processor {
    model: Model,
    bev_backend: Bev,
    bev: BevGridParams,
    max_points: usize,
    device_name: String,
    /// What a frame out of the FP16 range gives (the node's `on_overflow`).
    on_overflow: OverflowPolicy,
    /// The range report of the last frame that reached the network.
    last_range: RangeReport,
    // Reused per frame.
    points: Points,
    class_id: Vec<u8>,
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The BEV grid parameters of the node: range, resolution and obstacle classes from its
/// parameters, classes and palette from the model.
pub fn bev_params(
    model: &ModelYaml,
    range: [f64; 4],
    resolution: f64,
    obstacle_classes: &[u8],
) -> BevGridParams {
    BevGridParams {
        range,
        resolution,
        classes: model.classes,
        obstacle_classes: obstacle_classes.to_vec(),
        palette: model.palette.clone(),
    }
}

impl Processor {
    /// Loads the weights and opens the device. Errors are for the user, naming what to fix:
    /// missing or mismatched weights, a device that cannot be used.
    ///
    /// The device choice, in one place:
    /// - `cpu`: the network and the BEV grids on the CPU.
    /// - `cuda`: the network (`Segmenter::into_device`) and the BEV grids
    ///   (`ops::label_grid::cuda`) on GPU 0. A GPU that cannot be used fails here with a
    ///   message rather than silently running on the CPU (a latency budget sized for the GPU
    ///   would be missed by a factor of a hundred).
    pub fn open(
        device: Device,
        model: &ModelYaml,
        weights: &Path,
        bev: BevGridParams,
    ) -> Result<Processor, String> {
        if device == Device::Cuda {
            // The device first: a missing GPU is the message a user needs, not the weights'.
            Self::check_cuda()?;
        }
        let w = Weights::from_file(weights).map_err(|e| {
            format!("parameter `model.weights`: {e}; give the safetensors file exported from the upstream checkpoint (docs/cli.md: weights)")
        })?;
        Self::with_weights(device, model, w, bev).map_err(|e| {
            if e.starts_with("parameter `model.weights`") {
                e.replacen("the weights", &weights.display().to_string(), 1)
            } else {
                e
            }
        })
    }

    /// [`open`](Self::open) with weights already loaded (e.g. random ones for a benchmark).
    pub fn with_weights(
        device: Device,
        model: &ModelYaml,
        weights: Weights,
        bev: BevGridParams,
    ) -> Result<Processor, String> {
        bev.validate().map_err(|e| {
            format!("parameters `bev.range`/`bev.resolution`/`bev.obstacle_classes` do not fit the model: {e}")
        })?;
        let load = || -> Result<Segmenter, String> {
            Segmenter::new(model.clone(), weights).map_err(|e| {
                format!(
                    "parameter `model.weights`: the weights do not fit the model YAML (`model.config`): {e}; \
                     use weights exported for this configuration, or the model YAML they were trained with"
                )
            })
        };
        let (model_rt, bev_backend, device_name) = match device {
            Device::Cpu => (Model::Net(load()?), Bev::Cpu, "cpu".to_string()),
            #[cfg(feature = "cuda-core")]
            Device::Cuda => {
                let (bev, name) = open_cuda()?;
                (cuda_model(load)?, bev, name)
            }
            #[cfg(not(feature = "cuda-core"))]
            Device::Cuda => return Err(cuda_unavailable()),
        };
        Ok(Processor {
            model: model_rt,
            bev_backend,
            bev,
            max_points: model.voxelization.max_points,
            device_name,
            on_overflow: OverflowPolicy::default(),
            last_range: RangeReport::default(),
            points: Points::default(),
            class_id: Vec::new(),
        })
    }

    #[cfg(feature = "cuda-core")]
    fn check_cuda() -> Result<(), String> {
        open_cuda().map(|_| ())
    }
    #[cfg(not(feature = "cuda-core"))]
    fn check_cuda() -> Result<(), String> {
        Err(cuda_unavailable())
    }

    /// `cpu`, or `cuda:0 (<name>, sm_XY)`.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn bev_params(&self) -> &BevGridParams {
        &self.bev
    }

    /// What a frame whose activations leave the FP16 range gives (default `drop`: rejected
    /// with [`Reject::Overflow`]).
    pub fn set_on_overflow(&mut self, policy: OverflowPolicy) {
        self.on_overflow = policy;
    }

    pub fn on_overflow(&self) -> OverflowPolicy {
        self.on_overflow
    }

    /// The FP16 range report of the last frame [`process`](Self::process) ran the network on
    /// (empty: in range, or the frame never reached the network); a frame rejected with
    /// [`Reject::Overflow`] leaves its flagged layers here.
    pub fn last_range(&self) -> &RangeReport {
        &self.last_range
    }

    /// One LiDAR frame on its own: [`decode`](Self::decode) into the processor's buffer, then
    /// [`process_decoded`](Self::process_decoded). A rejected frame leaves nothing behind: the
    /// next one starts clean. A frame with cameras goes through
    /// [`FrameProcessor`](crate::frame::frame_processor::FrameProcessor), which decodes once for both paths.
    pub fn process(&mut self, view: &CloudView) -> Result<FrameOutput, Rejected> {
        self.start_frame();
        let mut points = std::mem::take(&mut self.points);
        let t = Instant::now();
        let out = self.decode(view, &mut points).and_then(|report| self.process_decoded(&points, report, ms(t.elapsed())));
        self.points = points;
        out
    }

    /// A new frame: the last one's range report is forgotten (a frame rejected before the
    /// network leaves an empty report).
    pub fn start_frame(&mut self) {
        self.last_range = RangeReport::default();
    }

    /// The cloud's points into `points` (reused), with the checks every frame gets first: too
    /// many points for the model, a malformed body, no points, no finite point.
    pub fn decode(&self, view: &CloudView, points: &mut Points) -> Result<DecodeReport, Rejected> {
        let declared = (view.width as u64).saturating_mul(view.height as u64);
        if declared > self.max_points as u64 {
            return Err(Rejected::new(
                Reject::TooManyPoints,
                format!(
                    "{declared} points ({} x {}) exceed the model's voxelization.max_points {}",
                    view.width, view.height, self.max_points
                ),
            ));
        }
        let report = match cloud::decode_into(view, points) {
            Ok(r) => r,
            Err(e) => {
                *points = Points::default();
                return Err(Rejected::new(Reject::Malformed, e.to_string()));
            }
        };
        if report.total == 0 {
            return Err(Rejected::new(
                Reject::Empty,
                format!(
                    "the cloud has no points (width {}, height {})",
                    view.width, view.height
                ),
            ));
        }
        if report.kept == 0 {
            return Err(Rejected::new(
                Reject::NoFinitePoints,
                format!(
                    "all {} points have a NaN or infinite x, y, z or intensity",
                    report.total
                ),
            ));
        }
        Ok(report)
    }

    /// The LiDAR path on decoded points: network, labels, BEV grids, the labeled cloud's body.
    /// `decode_ms` is the decode stage's time, reported with the others.
    pub fn process_decoded(&mut self, points: &Points, report: DecodeReport, decode_ms: f64) -> Result<FrameOutput, Rejected> {
        self.last_range = RangeReport::default();
        let mut stages = [0.0; STAGES.len()];
        stages[0] = decode_ms;
        let mut seg = self
            .segment(points)
            .map_err(|e| Rejected::new(Reject::of_error(&e), e.to_string()))?;
        let range = std::mem::take(&mut seg.range);
        self.last_range = range.clone();
        if !range.is_clean() {
            match self.on_overflow {
                OverflowPolicy::Drop => {
                    return Err(Rejected::new(Reject::Overflow, overflow_detail(&range)))
                }
                OverflowPolicy::ZeroProbability => seg.probs.fill(0.0),
            }
        }
        let network: Duration = seg
            .times
            .stages
            .iter()
            .filter(|(n, _)| n != "voxelize" && n != "devoxelize")
            .map(|(_, d)| *d)
            .sum();
        stages[1] = seg.times.get("voxelize").map_or(0.0, ms);
        stages[2] = ms(network);
        stages[3] = seg.times.get("devoxelize").map_or(0.0, ms);

        let t = Instant::now();
        self.class_id.clear();
        self.class_id
            .extend(seg.labels.iter().map(|&l| class_u8(l)));
        let grids = if range.is_clean() {
            self.grids(points, &seg.probs)
        } else {
            // every cell unknown: the grid of no points
            label_grid_cpu(&[], &[], &[], &[], &self.bev)
        }
        .map_err(|e| Rejected::new(Reject::of_error(&e), format!("BEV grid: {e}")))?;
        stages[4] = ms(t.elapsed());

        let t = Instant::now();
        let cloud =
            cloud::encode_labeled(points, &self.class_id, &seg.probs).map_err(|e| {
                Rejected::new(
                    Reject::ProcessingError,
                    format!("encoding the labeled cloud: {e}"),
                )
            })?;
        stages[5] = ms(t.elapsed());
        Ok(FrameOutput {
            cloud,
            grids,
            voxels: seg.voxels,
            voxel_stats: seg.voxel_stats,
            points_in: report.total,
            points_kept: report.kept,
            has_intensity: points.has_intensity,
            total_ms: stages.iter().sum(),
            stages,
            range,
            recomputed_from: seg.recomputed_from.take(),
        })
    }

    fn segment(&self, points: &Points) -> Result<Segmentation, Error> {
        match &self.model {
            Model::Net(s) => s.segment(&[points]),
        }
    }

    fn grids(&self, p: &Points, probs: &[f32]) -> Result<BevGrids, Error> {
        match &self.bev_backend {
            Bev::Cpu => label_grid_cpu(&p.x, &p.y, &self.class_id, probs, &self.bev),
            #[cfg(feature = "cuda-core")]
            Bev::Cuda(dev) => {
                use crate::device::cuda::cuda_err;
                let s = &dev.stream;
                let x = s.clone_htod(&p.x).map_err(cuda_err("BEV: uploading x"))?;
                let y = s.clone_htod(&p.y).map_err(cuda_err("BEV: uploading y"))?;
                let c = s
                    .clone_htod(&self.class_id)
                    .map_err(cuda_err("BEV: uploading class ids"))?;
                let pr = s
                    .clone_htod(probs)
                    .map_err(cuda_err("BEV: uploading probabilities"))?;
                crate::ops::label_grid::cuda::label_grid_cuda(
                    dev,
                    &x,
                    &y,
                    &c,
                    &pr,
                    p.len(),
                    &self.bev,
                )
            }
        }
    }
}

/// The GPU for the BEV grids (device 0), on a stream of the greatest priority as the LiDAR
/// network's (the LiDAR path goes first where the BEV map model runs beside it).
#[cfg(feature = "cuda-core")]
fn open_cuda() -> Result<(Bev, String), String> {
    use crate::device::cuda::CudaDevice;
    let d = CudaDevice::new_high_priority(0).map_err(|e| {
        format!("parameter `device` is `cuda` but the GPU cannot be used: {e}; set `device: cpu` (launch argument device:=cpu) to run on the CPU")
    })?;
    let name = format!("cuda:0 ({}, sm_{}{})", d.name, d.arch.major, d.arch.minor);
    Ok((Bev::Cuda(d), name))
}

/// The network on CUDA: the segmenter loaded on the CPU (weights checked there), then uploaded.
#[cfg(feature = "cuda-core")]
fn cuda_model(cpu: impl FnOnce() -> Result<Segmenter, String>) -> Result<Model, String> {
    let seg = cpu()?.into_device(Device::Cuda).map_err(|e| {
        format!("parameter `device` is `cuda` but the network cannot run on the GPU: {e}; set `device: cpu` (launch argument device:=cpu) to run on the CPU")
    })?;
    Ok(Model::Net(seg))
}

/// The message for `device: cuda` in a build without CUDA support (see [`Processor::open`]).
#[cfg(not(feature = "cuda-core"))]
fn cuda_unavailable() -> String {
    "parameter `device` is `cuda` but this build has no CUDA support (cargo feature `cuda`); rebuild with it, \
     or set `device: cpu` (launch argument device:=cpu, or `-p device:=cpu`) to run on the CPU"
        .to_string()
}

/// A segmentation label as the labeled cloud's uint8 `class_id` ([`NO_CLASS`] for none).
pub fn class_u8(label: u32) -> u8 {
    if label == UNLABELED {
        return NO_CLASS;
    }
    u8::try_from(label)
        .ok()
        .filter(|&c| c != NO_CLASS)
        .unwrap_or(NO_CLASS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_ids_fit_uint8_and_unlabeled_is_255() {
        assert_eq!(class_u8(0), 0);
        assert_eq!(class_u8(15), 15);
        assert_eq!(class_u8(UNLABELED), NO_CLASS);
        assert_eq!(class_u8(300), NO_CLASS);
        assert_eq!(class_u8(255), NO_CLASS);
    }

    #[test]
    fn overflow_stats_count_dropped_and_published_frames() {
        use crate::device::range_guard::LayerNames;
        let mut names = LayerNames::new();
        names.add("input");
        names.add("unet.blocks.block0.conv_branch.2");
        let report = names.report(&[0, crate::device::range_guard::RANGE_SATURATED]);
        let mut st = OverflowStats::default();
        assert_eq!(st.diagnostic(0, OverflowPolicy::Drop), None);
        // other rejects and clean frames are not counted
        st.dropped(&Rejected::new(Reject::Malformed, "truncated"));
        st.published(&RangeReport::default());
        assert_eq!(st, OverflowStats::default());
        st.dropped(&Rejected::new(Reject::Overflow, overflow_detail(&report)));
        st.published(&report);
        assert_eq!((st.frames, st.dropped), (2, 1));
        let last = st.last.clone().unwrap();
        assert!(last.contains("unet.blocks.block0.conv_branch.2 (overflow)"), "{last}");
        let m = st.diagnostic(2, OverflowPolicy::ZeroProbability).unwrap();
        assert!(m.starts_with("2 frame(s) out of the FP16 range") && m.contains("zero_probability") && m.contains("conv_branch.2"), "{m}");
        assert!(st.diagnostic(1, OverflowPolicy::Drop).unwrap().contains("not published"));
        assert_eq!(Reject::Overflow.name(), "overflow");
        assert_eq!(Reject::of_error(&Error::InvalidInput("x".into())), Reject::ProcessingError);
    }

    #[test]
    fn cuda_errors_are_device_errors() {
        assert_eq!(
            Reject::of_error(&Error::Cuda("illegal address".into())),
            Reject::DeviceError
        );
        assert_eq!(
            Reject::of_error(&Error::InvalidInput("x".into())),
            Reject::ProcessingError
        );
        for (i, r) in Reject::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
