//! The BEVFusion seg model on CUDA ([`CudaBevSeg`]): the same stages as
//! [`BevSegModel`](crate::models::bevfusion::seg::BevSegModel), FP16 activations with FP32 accumulation.
//! The camera branch and the BEV stages are enqueued on the device's stream; the fusion model's
//! LiDAR branch runs on a host thread and a stream of its own ([`CudaDevice::fork`]), from the
//! start of the frame, beside the images' decode and the camera branch. The host waits only to
//! read the probabilities back and, in the fusion model, for the LiDAR branch's voxel counts
//! (which size its sparse tensors): those waits are on the LiDAR thread and stream, so they
//! neither wait for the camera work nor hold up its launches.
//!
//! Per frame: JPEG bytes (or decoded images) → [`CameraPreprocessCuda`] (nvJPEG on the GPU, or
//! a host decode straight into pinned memory and one upload; resize + crop + normalize in one
//! kernel) → Swin-T + FPN → view transform (geometry cached per calibration) [→ fuser with the
//! LiDAR branch's BEV map] → decoder → head → probabilities to the host. [`GpuClock`] events
//! between the stages give the per-stage GPU times the bench reports.

use crate::models::bevfusion::seg::{bev_map_from_nhwc, blank_images, check_cameras, with_blanks, lidar_stats, BevSegConfig, BevSegKind, BevSegModel, BevSegOutput, BevSegStages, Point5, StageMs};
use crate::sensors::calib::camera::Calibration;
use crate::models::bevfusion::lss::cuda::CudaLssTransform;
use crate::models::bevfusion::lss::CameraMask;
use crate::models::bevfusion::map::LidarStats;
use crate::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
use crate::sensors::image::encodings::{DecodeLimits, RgbImage};
use crate::sensors::image::compressed::JpegDecoderChoice;
use crate::sensors::image::nvjpeg::Backend;
use crate::ops::image_preprocess::cuda::{screen_jpegs, CameraPreprocessCuda, CudaCameraBatch};
use crate::sensors::image::jpeg_markers::{with_scan_checks, ScanCheckTiming, ScreenedJpeg};
use crate::models::bevfusion::camera::swin_cuda::SwinPlan;
use crate::ops::dense::conv_engine::ConvBackend;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::FeatureMap;
use crate::device::cuda::CudaDevice;
use crate::models::bevfusion::bev_stack_cuda::CudaBevStack;
use crate::models::bevfusion::lidar_encoder::cuda::CudaLidarEncoder;
use crate::models::bevfusion::head_cuda::CudaBevMaps;
use crate::models::bevfusion::seg_graph::{GraphKey, GraphStatus, MapGraph};
use cudarc::driver::CudaSlice;
use half::f16;
use crate::device::clock::GpuClock;
use crate::models::sphereformer::network::StageTimes;
use crate::device::libraries::{self, Lib};
use crate::Error;
use cudarc::cublas::CudaBlas;
use std::time::Instant;

/// The whole model on the device, with its per-frame state (preprocessing plan and staging
/// buffers, Swin window plan, geometry of the last calibration).
pub struct CudaBevSeg {
    pub config: BevSegConfig,
    blas: CudaBlas,
    preprocess: CameraPreprocessCuda,
    encoder: CudaCameraEncoder,
    plan: Option<SwinPlan>,
    vtransform: CudaLssTransform,
    lidar: Option<LidarBranch>,
    bev: CudaBevStack,
    graphs: bool,
    graph: Option<MapGraph>,
    graph_status: GraphStatus,
    /// When the scans of the frame's JPEGs are checked against their nvJPEG decode.
    scan_checks: ScanCheckTiming,
}

/// The fusion model's LiDAR encoder with the stream it runs on.
struct LidarBranch {
    /// The model's device with a stream of its own: the branch's kernels run beside the camera
    /// branch's, and its host waits (voxel counts) wait for its own work only. The branch is
    /// run from a thread of its own ([`CudaBevSeg::frame`]).
    dev: CudaDevice,
    encoder: CudaLidarEncoder,
}

/// What the LiDAR branch gives the frame: its BEV map (on the branch's stream), its
/// voxelization counts, and the clock of its stage.
struct LidarOut {
    bev: CudaFeatureMap,
    stats: LidarStats,
    clock: GpuClock,
}

impl LidarBranch {
    /// The cloud voxelized (non-finite and out-of-range points dropped and counted) and encoded
    /// to its BEV map, on the branch's stream; the host waits here (the voxel and per-level site
    /// counts that size the sparse tensors) are for this stream's work only.
    fn run(&self, cloud: Option<&[Point5]>) -> Result<LidarOut, Error> {
        let dev = &self.dev;
        let cloud = cloud.ok_or_else(|| Error::InvalidInput("the fusion model needs a LiDAR cloud".into()))?;
        let mut clock = GpuClock::start(dev)?;
        let v = self.encoder.voxelize(dev, cloud)?;
        let stats = lidar_stats(&v.stats);
        let bev = if v.len == 0 {
            let [x, y, c] = self.encoder.config().bev_shape()?;
            CudaFeatureMap::zeros(dev, 1, x, y, c)?
        } else {
            self.encoder.forward_voxels(dev, v, false)?.0
        };
        clock.mark(dev, LIDAR_STAGE.into())?;
        Ok(LidarOut { bev, stats, clock })
    }
}

/// What [`CudaBevSeg::network`] leaves on the device.
pub(crate) struct NetworkOut {
    pub camera_bev: CudaFeatureMap,
    pub fused: Option<CudaFeatureMap>,
    pub decoded: CudaFeatureMap,
    pub maps: CudaBevMaps,
}

/// The LiDAR branch's stage: GPU time on its own stream, beside the camera branch's stages
/// (the stages' times then add up to more than the frame).
const LIDAR_STAGE: &str = "lidar (beside the camera branch)";

/// Frame inputs already on the device.
struct CameraInput {
    batch: CudaCameraBatch,
    mask: CameraMask,
    masked: Vec<String>,
}

impl CudaBevSeg {
    /// Uploads a loaded model (weights FP16, biases f32); the BEV decoder's convolutions on
    /// `backend` (cuDNN falls back to im2col + cuBLAS where it has no algorithm).
    pub fn upload(dev: &CudaDevice, m: &BevSegModel, backend: ConvBackend) -> Result<Self, Error> {
        // cuBLAS and cuBLASLt of this build's CUDA major, or an error naming what was found
        libraries::require(&[Lib::Cublas, Lib::CublasLt])?;
        let blas = CudaBlas::new(dev.stream.clone()).map_err(|e| Error::Cuda(format!("cuBLAS is not usable ({e:?}): the CUDA seg model needs libcublas")))?;
        let lidar = match &m.lidar {
            Some(l) => {
                // uploaded on the branch's own stream, which orders the weights before its work
                let dev = dev.fork()?;
                let encoder = CudaLidarEncoder::upload(&dev, l)?;
                Some(LidarBranch { dev, encoder })
            }
            None => None,
        };
        // nvJPEG when the CUDA install has it (decoded straight into device memory), else
        // zune-jpeg on the host; `jpeg_decoder()` says which and why.
        let preprocess = CameraPreprocessCuda::with_decoder(dev, m.config.camera.preprocess.clone(), JpegDecoderChoice::Auto)?;
        let scan_checks = default_scan_checks(preprocess.nvjpeg_backend());
        Ok(Self {
            config: m.config.clone(),
            blas,
            preprocess,
            encoder: CudaCameraEncoder::upload(dev, &m.camera.encoder)?,
            plan: None,
            vtransform: CudaLssTransform::upload(dev, &m.camera.vtransform)?,
            lidar,
            bev: CudaBevStack::upload(dev, &m.bev, backend)?,
            graphs: false,
            graph: None,
            graph_status: GraphStatus::default(),
            scan_checks,
        })
    }

    pub fn kind(&self) -> BevSegKind {
        self.config.kind
    }

    /// Whether camera JPEGs are decoded by nvJPEG on the GPU (`forward_jpeg`); else zune-jpeg
    /// on the host.
    pub fn decodes_jpeg_on_gpu(&self) -> bool {
        self.preprocess.uses_nvjpeg()
    }

    /// The BEV decoder's convolution backend (after any fallback).
    pub fn conv_backend(&self) -> ConvBackend {
        self.bev.backend()
    }

    /// How many calibrations' geometry was built (once per calibration change).
    pub fn geometry_builds(&self) -> usize {
        self.vtransform.builds()
    }

    /// The fusion model needs a cloud, the camera-only model takes none (checked before any work).
    fn check_cloud(&self, cloud: Option<&[Point5]>) -> Result<(), Error> {
        match (self.lidar.is_some(), cloud) {
            (true, None) => Err(Error::InvalidInput("the fusion model needs a LiDAR cloud".into())),
            (false, Some(c)) if !c.is_empty() => Err(Error::InvalidInput("the camera-only model takes no LiDAR cloud".into())),
            _ => Ok(()),
        }
    }

    fn plan_for(&mut self, dev: &CudaDevice, n: usize, h: usize, w: usize) -> Result<(), Error> {
        if self.plan.as_ref().is_none_or(|p| (p.n, p.h, p.w) != (n, h, w)) {
            self.plan = Some(self.encoder.plan(dev, n, h, w)?);
        }
        Ok(())
    }

    /// Decoded images (one per calibration camera, None = masked) → the network input.
    fn camera_input(&mut self, dev: &CudaDevice, calib: &Calibration, images: &[Option<&RgbImage>]) -> Result<CameraInput, Error> {
        let (mask, masked) = check_cameras(calib, images.iter().map(|i| i.map(|i| (i.width, i.height))), self.kind() == BevSegKind::Fusion)?;
        let blanks = blank_images(calib, images);
        let all = with_blanks(images, &blanks)?;
        let batch = self.preprocess.run(dev, &all)?;
        Ok(CameraInput { batch, mask, masked })
    }

    /// The preprocessed batch of all calibration cameras → the network input, after checking
    /// that each image has its calibration's size; the cameras in `masked` (whose slot holds a
    /// stand-in image) are masked and not checked.
    fn camera_input_batch(calib: &Calibration, batch: CudaCameraBatch, masked: &[usize]) -> Result<CameraInput, Error> {
        let mut mask = CameraMask::ALL;
        let mut names = Vec::new();
        for (i, (a, c)) in batch.augs.iter().zip(&calib.cameras).enumerate() {
            if masked.contains(&i) {
                mask = mask.without(i);
                names.push(c.name.clone());
                continue;
            }
            if a.input != [c.image_width, c.image_height] {
                return Err(Error::InvalidInput(format!(
                    "camera `{}`: image is {}x{} but its calibration is for {}x{}",
                    c.name, a.input[0], a.input[1], c.image_width, c.image_height
                )));
            }
        }
        Ok(CameraInput { batch, mask, masked: names })
    }

    /// The JPEG decoder in use, in words (nvJPEG and its backend, or zune-jpeg and why).
    pub fn jpeg_decoder(&self) -> String {
        self.preprocess.jpeg_decoder()
    }

    /// One frame. The fusion model's LiDAR branch runs on a host thread and a stream of its own
    /// while this thread prepares the camera input (`camera`: the images decoded, uploaded and
    /// preprocessed, or their decode submitted; it may restart `clock`) and enqueues the camera
    /// branch; then the BEV stages [fuser →] decoder → head, probabilities back on the host. As a
    /// CUDA graph (which holds the whole network) the camera branch waits for the LiDAR branch
    /// too, which then overlaps the images' decode and preprocessing.
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        dev: &CudaDevice,
        calib: &Calibration,
        cloud: Option<&[Point5]>,
        keep: bool,
        clock: &mut GpuClock,
        camera: impl FnOnce(&mut Self, &mut GpuClock) -> Result<CameraInput, Error>,
    ) -> Result<(crate::models::bevfusion::map::BevMap, Option<BevSegStages>), Error> {
        // taken out for the frame, so the camera side may borrow the model mutably; always put back
        let branch = self.lidar.take();
        let (camera_side, lidar) = std::thread::scope(|scope| {
            let worker = branch.as_ref().map(|b| scope.spawn(|| b.run(cloud)));
            let camera_side = camera(self, clock).and_then(|cam| self.camera_side(dev, calib, cam, keep, clock));
            let lidar = worker.map(|w| w.join().unwrap_or_else(|_| Err(Error::Cuda("the LiDAR branch's thread panicked".into()))));
            (camera_side, lidar)
        });
        self.lidar = branch;
        let (CameraInput { batch, mask, masked }, camera_first) = camera_side?;
        let (lidar_bev, stats) = match lidar.transpose()? {
            Some(LidarOut { bev, stats, clock: branch_clock }) => {
                clock.add_branch(branch_clock);
                (Some(bev), Some(stats))
            }
            None => (None, None),
        };
        if let Some(branch) = &self.lidar {
            // the fuser (or the graph's input copy) reads the LiDAR BEV map
            dev.wait_for(&branch.dev)?;
        }
        let shape = [batch.n, batch.h, batch.w];
        let (probs, camera_bev, fused, decoded) = if let Some(camera_bev) = camera_first {
            let (fused, decoded, maps) = self.bev_stages(dev, &camera_bev, lidar_bev.as_ref(), Some(&mut *clock))?;
            (maps.download(dev)?, Some(camera_bev), fused, Some(decoded))
        } else if let Some(maps) = self.graph_network(dev, calib, &batch, mask, lidar_bev.as_ref(), keep)? {
            clock.mark(dev, "network (CUDA graph)".into())?;
            (maps.download(dev)?, None, None, None)
        } else {
            // the capture was refused: the whole network eagerly, after the LiDAR branch
            let out = self.network(dev, calib, &batch.data, shape, mask, lidar_bev.as_ref(), Some(&mut *clock))?;
            (out.maps.download(dev)?, Some(out.camera_bev), out.fused, Some(out.decoded))
        };
        clock.mark(dev, "to host".into())?;
        let head = crate::models::bevfusion::seg::maps_to_nhwc(&probs)?;
        let map = bev_map_from_nhwc(&head, &self.config.classes, self.config.bev.head.output_scope, masked, stats)?;
        let stages = match (keep, camera_bev, decoded) {
            (true, Some(camera_bev), Some(decoded)) => {
                let dl = |m: &CudaFeatureMap| m.download(dev);
                let input = FeatureMap::new(batch.n, batch.h, batch.w, 3, batch.to_host(dev)?)?;
                Some(BevSegStages {
                    input,
                    camera_bev: dl(&camera_bev)?,
                    lidar_bev: lidar_bev.as_ref().map(dl).transpose()?,
                    fused: fused.as_ref().map(dl).transpose()?,
                    decoder: dl(&decoded)?,
                    head,
                })
            }
            _ => None,
        };
        Ok((map, stages))
    }

    /// The network from the preprocessed images `[n, h, w]` on the device (and the LiDAR branch's
    /// BEV map in the fusion model): [`camera_branch`](Self::camera_branch), then
    /// [`bev_stages`](Self::bev_stages), enqueued on the stream without a host wait. With a
    /// clock, a mark after each stage. This is what [`MapGraph`] captures.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn network(
        &mut self,
        dev: &CudaDevice,
        calib: &Calibration,
        images: &CudaSlice<f16>,
        shape: [usize; 3],
        mask: CameraMask,
        lidar_bev: Option<&CudaFeatureMap>,
        mut clock: Option<&mut GpuClock>,
    ) -> Result<NetworkOut, Error> {
        let camera_bev = self.camera_branch(dev, calib, images, shape, mask, clock.as_deref_mut())?;
        let (fused, decoded, maps) = self.bev_stages(dev, &camera_bev, lidar_bev, clock)?;
        Ok(NetworkOut { camera_bev, fused, decoded, maps })
    }

    /// The camera input's stage mark, then the camera branch enqueued, unless the frame's
    /// network is to run as a CUDA graph (`None`: the graph holds the camera branch).
    fn camera_side(&mut self, dev: &CudaDevice, calib: &Calibration, cam: CameraInput, keep: bool, clock: &mut GpuClock) -> Result<(CameraInput, Option<CudaFeatureMap>), Error> {
        clock.mark(dev, "upload+preprocess".into())?;
        if self.graph_wanted(calib, &cam.batch, cam.mask, keep) {
            return Ok((cam, None));
        }
        let shape = [cam.batch.n, cam.batch.h, cam.batch.w];
        let camera_bev = self.camera_branch(dev, calib, &cam.batch.data, shape, cam.mask, Some(clock))?;
        Ok((cam, Some(camera_bev)))
    }

    /// Swin-T + FPN → view transform: the camera BEV map, enqueued without a host wait.
    fn camera_branch(
        &mut self,
        dev: &CudaDevice,
        calib: &Calibration,
        images: &CudaSlice<f16>,
        [n, h, w]: [usize; 3],
        mask: CameraMask,
        mut clock: Option<&mut GpuClock>,
    ) -> Result<CudaFeatureMap, Error> {
        let mut mark = |name: &str| clock.as_deref_mut().map_or(Ok(()), |c| c.mark(dev, name.into()));
        self.plan_for(dev, n, h, w)?;
        let plan = self.plan.as_ref().ok_or_else(|| Error::Cuda("Swin plan missing".into()))?;
        let stages = self.encoder.backbone(dev, plan, images)?;
        mark("backbone")?;
        let neck = self.encoder.neck(dev, &stages)?;
        drop(stages);
        mark("fpn")?;
        let feats = neck.first().ok_or_else(|| Error::InvalidInput("the camera neck gave no output".into()))?;
        let camera_bev = self.vtransform.forward(dev, &self.blas, calib, feats, mask)?;
        drop(neck);
        mark("depth+pool")?;
        Ok(camera_bev)
    }

    /// [fuser →] decoder → head from the camera BEV map (and the LiDAR branch's, which the
    /// stream must already wait for), enqueued without a host wait: the fused map (fusion model),
    /// the decoder's output and the probabilities.
    fn bev_stages(&self, dev: &CudaDevice, camera_bev: &CudaFeatureMap, lidar_bev: Option<&CudaFeatureMap>, mut clock: Option<&mut GpuClock>) -> Result<(Option<CudaFeatureMap>, CudaFeatureMap, CudaBevMaps), Error> {
        let mut mark = |name: &str| clock.as_deref_mut().map_or(Ok(()), |c| c.mark(dev, name.into()));
        if self.lidar.is_some() != lidar_bev.is_some() {
            return Err(Error::InvalidInput("the fusion model's network needs the LiDAR BEV map, the camera-only model's none".into()));
        }
        let mut inputs = vec![camera_bev];
        if let Some(l) = lidar_bev {
            inputs.push(l);
        }
        // CudaBevStack::forward's steps one by one, for the per-stage times
        let fused = match &self.bev.fuser {
            Some(f) => {
                let y = f.forward(dev, &self.blas, &inputs)?;
                mark("fuser")?;
                Some(y)
            }
            None => None,
        };
        let decoded = self.bev.decoder.forward(dev, &self.blas, fused.as_ref().unwrap_or(camera_bev))?;
        mark("decoder")?;
        let maps = self.bev.head.forward(dev, &self.blas, &decoded)?;
        mark("head")?;
        Ok((fused, decoded, maps))
    }

    /// Whether this frame's network is to be replayed as a CUDA graph: graphs on, no stages
    /// asked for, and no refused capture for its calibration, image size and mask.
    fn graph_wanted(&self, calib: &Calibration, batch: &CudaCameraBatch, mask: CameraMask, keep: bool) -> bool {
        self.graphs && !keep && !self.graph_status.refused_key.as_ref().is_some_and(|k| k.matches(calib, batch, mask))
    }

    /// Whether the network runs as a CUDA graph ([`CudaBevSeg::set_graphs`]).
    pub fn graphs(&self) -> bool {
        self.graphs
    }

    /// Turns replaying the network as a CUDA graph on or off (off by default). On, each frame
    /// copies its inputs into the graph's buffers and launches one graph, captured on the first
    /// frame of each calibration, image size and camera mask; a frame that asks for its stages
    /// runs eagerly. A capture the driver refuses is counted ([`CudaBevSeg::graph_status`]) and
    /// the frames run eagerly.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on;
        if !on {
            self.graph = None;
        }
    }

    /// When the scans of a frame's JPEGs are checked on the nvJPEG path: beside the GPU work,
    /// the frame's result dropped when a check fails, or before the decode starts (the default
    /// is [`default_scan_checks`]).
    pub fn set_jpeg_scan_checks(&mut self, when: ScanCheckTiming) {
        self.scan_checks = when;
    }

    /// When the scans of a frame's JPEGs are checked ([`CudaBevSeg::set_jpeg_scan_checks`]).
    pub fn jpeg_scan_checks(&self) -> ScanCheckTiming {
        self.scan_checks
    }

    /// Graph replays, captures and refused captures so far, with the last refusal's reason.
    pub fn graph_status(&self) -> &GraphStatus {
        &self.graph_status
    }

    /// The probabilities from the captured graph (its output, lent until the next frame),
    /// capturing it first when the frame's key differs; `None`: run the network eagerly (graphs
    /// off, stages asked for, or capture refused).
    fn graph_network(&mut self, dev: &CudaDevice, calib: &Calibration, batch: &CudaCameraBatch, mask: CameraMask, lidar_bev: Option<&CudaFeatureMap>, keep: bool) -> Result<Option<&CudaBevMaps>, Error> {
        if !self.graph_wanted(calib, batch, mask, keep) {
            return Ok(None);
        }
        if !self.graph.as_ref().is_some_and(|g| g.key.matches(calib, batch, mask)) {
            self.graph = None;
            let shape = [batch.n, batch.h, batch.w];
            let captured = MapGraph::capture(dev, calib, batch, mask, lidar_bev, |images, lidar| {
                self.network(dev, calib, images, shape, mask, lidar, None).map(|out| out.maps)
            });
            match captured {
                Ok(g) => {
                    self.graph_status.captures += 1;
                    self.graph = Some(g);
                }
                Err(e) => {
                    self.graph_status.refused += 1;
                    self.graph_status.last_refusal = Some(e.to_string());
                    self.graph_status.refused_key = Some(GraphKey::of(calib, batch, mask));
                    return Ok(None);
                }
            }
        }
        let g = self.graph.as_mut().ok_or_else(|| Error::Cuda("CUDA graph missing".into()))?;
        let maps = g.replay(dev, &batch.data, lidar_bev)?;
        self.graph_status.replays += 1;
        Ok(Some(maps))
    }

    /// One frame from decoded images (None = masked camera).
    pub fn forward_images(&mut self, dev: &CudaDevice, calib: &Calibration, images: &[Option<&RgbImage>], cloud: Option<&[Point5]>, keep_stages: bool) -> Result<BevSegOutput, Error> {
        self.check_cloud(cloud)?;
        let mut clock = GpuClock::start(dev)?;
        let (map, stages) = self.frame(dev, calib, cloud, keep_stages, &mut clock, |m, _| m.camera_input(dev, calib, images))?;
        let times = finish(clock)?;
        Ok(BevSegOutput { map, times, stages })
    }

    /// One frame from JPEG bytes on the host to probabilities on the host (the bench's unit):
    /// `decode (host)` is host wall time (the JPEGs decoded in parallel into pinned memory), the
    /// other stages GPU time between events.
    pub fn forward_jpeg(&mut self, dev: &CudaDevice, calib: &Calibration, jpegs: &[&[u8]], cloud: Option<&[Point5]>) -> Result<BevSegOutput, Error> {
        self.forward_jpeg_masked(dev, calib, jpegs, &[], cloud)
    }

    /// [`forward_jpeg`](Self::forward_jpeg) with the cameras in `masked` masked: their slots
    /// hold a stand-in JPEG (another camera's), decoded with the batch but pooled nowhere, so a
    /// frame with a stale or missing camera stays on the batched nvJPEG path. With nvJPEG the
    /// JPEGs' headers are screened first (`screen_for_gpu`: the host stage `JPEG header checks
    /// (host)`), and their scans checked beside the GPU work
    /// ([`forward_screened_jpeg_masked`](Self::forward_screened_jpeg_masked)).
    pub fn forward_jpeg_masked(&mut self, dev: &CudaDevice, calib: &Calibration, jpegs: &[&[u8]], masked: &[usize], cloud: Option<&[Point5]>) -> Result<BevSegOutput, Error> {
        self.forward_jpeg_input(dev, calib, JpegInput::Unchecked(jpegs), masked, cloud)
    }

    /// [`forward_jpeg_masked`](Self::forward_jpeg_masked) on JPEGs the caller screened (the
    /// camera branch screens each image once). With nvJPEG their scans
    /// (`ScreenedJpeg::check_scans`: every MCU there, no stray marker, which nvJPEG does not
    /// report) are checked on the host while the GPU decodes them and runs the network; a frame
    /// whose scans fail is an `InvalidInput` error naming the first bad camera, and its result
    /// is dropped. The stages `JPEG scan checks (host, beside the GPU)` (the longest camera's)
    /// and `waiting for JPEG scan checks (host)` (after the GPU work) say what they cost.
    pub fn forward_screened_jpeg_masked(&mut self, dev: &CudaDevice, calib: &Calibration, jpegs: &[ScreenedJpeg<&[u8]>], masked: &[usize], cloud: Option<&[Point5]>) -> Result<BevSegOutput, Error> {
        self.forward_jpeg_input(dev, calib, JpegInput::Screened(jpegs), masked, cloud)
    }

    fn forward_jpeg_input(&mut self, dev: &CudaDevice, calib: &Calibration, input: JpegInput<'_>, masked: &[usize], cloud: Option<&[Point5]>) -> Result<BevSegOutput, Error> {
        self.check_frame(calib, input.len(), masked, cloud)?;
        if !self.preprocess.uses_nvjpeg() {
            return self.forward_host_decoded_jpeg(dev, calib, input, masked, cloud);
        }
        let t0 = Instant::now();
        let screened_here;
        let (screened, screen_ms) = match input {
            JpegInput::Screened(s) => (s, None),
            JpegInput::Unchecked(j) => {
                screened_here = screen_jpegs(j, &DecodeLimits::default())?;
                (screened_here.as_slice(), Some(t0.elapsed().as_secs_f64() * 1e3))
            }
        };
        let (frame, checks) = with_scan_checks(self.scan_checks, screened, || -> Result<_, Error> {
            let mut submit_ms = f64::NAN;
            let mut clock = GpuClock::start(dev)?;
            let (map, stages) = self.frame(dev, calib, cloud, false, &mut clock, |m, _| {
                // nvJPEG decodes on the GPU: the decode is in the first GPU stage
                // (upload+preprocess); the host time is what submitting it took.
                let t1 = Instant::now();
                let batch = m.preprocess.run_screened_jpeg(dev, screened)?;
                submit_ms = t1.elapsed().as_secs_f64() * 1e3;
                Self::camera_input_batch(calib, batch, masked)
            })?;
            Ok((map, stages, finish(clock)?, submit_ms))
        });
        // a bad scan is the frame's cause, whatever the decode made of it
        let (map, stages, mut times, submit_ms) = frame.map_err(|(cam, e)| Error::InvalidInput(format!("camera {cam}: {e}")))??;
        let mut host = Vec::with_capacity(4);
        if let Some(ms) = screen_ms {
            host.push(("JPEG header checks (host)".to_string(), ms));
        }
        let (walk, wait) = match self.scan_checks {
            ScanCheckTiming::BesideDecode => ("JPEG scan checks (host, beside the GPU)", "waiting for JPEG scan checks (host)"),
            ScanCheckTiming::BeforeDecode => ("JPEG scan checks (host, longest camera)", "JPEG scan checks (host, before the GPU)"),
        };
        host.push((walk.to_string(), checks.longest_ms));
        host.push((wait.to_string(), checks.waited_ms));
        host.push(("decode submit (host, nvJPEG)".to_string(), submit_ms));
        times.0.splice(0..0, host);
        Ok(BevSegOutput { map, times, stages })
    }

    /// The JPEG frame with zune-jpeg decoding on the host (no nvJPEG): its decode walks the
    /// scans itself, so nothing is checked apart from it.
    fn forward_host_decoded_jpeg(&mut self, dev: &CudaDevice, calib: &Calibration, input: JpegInput<'_>, masked: &[usize], cloud: Option<&[Point5]>) -> Result<BevSegOutput, Error> {
        let limits = DecodeLimits::default();
        let mut decode_ms = f64::NAN;
        let mut clock = GpuClock::start(dev)?;
        let (map, stages) = self.frame(dev, calib, cloud, false, &mut clock, |m, clock| {
            let t0 = Instant::now();
            match input {
                JpegInput::Unchecked(j) => m.preprocess.stage_jpeg(dev, j, &limits)?,
                JpegInput::Screened(s) => m.preprocess.stage_screened_jpeg(dev, s)?,
            }
            decode_ms = t0.elapsed().as_secs_f64() * 1e3;
            // the GPU clock restarts after the host decode: its first stage is upload + preprocess
            *clock = GpuClock::start(dev)?;
            let batch = m.preprocess.upload_and_launch(dev)?;
            Self::camera_input_batch(calib, batch, masked)
        })?;
        let mut times = finish(clock)?;
        times.0.insert(0, ("decode (host)".into(), decode_ms));
        Ok(BevSegOutput { map, times, stages })
    }

    /// What every JPEG frame is checked for before any work: the cloud, at least one camera
    /// (or the LiDAR branch), one JPEG per calibrated camera.
    fn check_frame(&self, calib: &Calibration, jpegs: usize, masked: &[usize], cloud: Option<&[Point5]>) -> Result<(), Error> {
        self.check_cloud(cloud)?;
        if masked.len() >= calib.len() && self.lidar.is_none() {
            return Err(Error::InvalidInput("no camera image at all: the camera BEV would be empty; give at least one image".into()));
        }
        if jpegs != calib.len() {
            return Err(Error::InvalidInput(format!("{jpegs} JPEGs for a calibration of {} cameras", calib.len())));
        }
        Ok(())
    }
}

/// When a frame's JPEG scans are checked by default on the nvJPEG `backend`: beside the GPU
/// work on the hardware backend (the A100 / H100 / H200 JPEG engines), which was measured to
/// decode scans cut short, overwritten, zeroed or repeated without an error, leaving the stream
/// sound and the next decode's bits unchanged (tests/ops_image_preprocess.rs,
/// `nvjpeg_survives_corrupt_scan_data`); before the decode on the other backends, whose
/// behaviour on such data has not been measured.
pub fn default_scan_checks(backend: Option<Backend>) -> ScanCheckTiming {
    match backend {
        Some(Backend::Hardware) => ScanCheckTiming::BesideDecode,
        _ => ScanCheckTiming::BeforeDecode,
    }
}

/// A frame's JPEGs: as received, or screened already (`screen_for_gpu`).
#[derive(Clone, Copy)]
enum JpegInput<'a> {
    Unchecked(&'a [&'a [u8]]),
    Screened(&'a [ScreenedJpeg<&'a [u8]>]),
}

impl JpegInput<'_> {
    fn len(&self) -> usize {
        match self {
            JpegInput::Unchecked(j) => j.len(),
            JpegInput::Screened(s) => s.len(),
        }
    }
}

fn finish(clock: GpuClock) -> Result<StageMs, Error> {
    let mut t = StageTimes::default();
    clock.finish(&mut t)?;
    Ok(StageMs(t.stages.into_iter().map(|(n, d)| (n, d.as_secs_f64() * 1e3)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the backend measured to survive bad scan data decodes beside the scan checks.
    #[test]
    fn scans_are_checked_beside_the_decode_only_on_the_hardware_backend() {
        assert_eq!(default_scan_checks(Some(Backend::Hardware)), ScanCheckTiming::BesideDecode);
        for other in [Some(Backend::Default), Some(Backend::GpuHybrid), None] {
            assert_eq!(default_scan_checks(other), ScanCheckTiming::BeforeDecode, "{other:?}");
        }
    }
}
