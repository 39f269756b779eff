//! The camera branch's per-frame inputs, shared by the node and replay: camera messages, their
//! CameraInfos and TF in; for each LiDAR cloud a [`BevFrameInputs`] out (the synchronised,
//! decoded images, which cameras are masked and why, the calibration of this frame and whether it
//! changed, the aggregated LiDAR sweeps), ready for the BEV map model's forward
//! ([`BevMapModel`]: the one place where the model plugs in).
//!
//! A camera is masked out of a frame for the first of: no image / image too old or too new
//! ([`crate::frame::sync`]), uncalibrated ([`crate::sensors::calib::rig`]), an image that cannot be decoded (wrong
//! encoding, truncated data, corrupt JPEG/PNG), an image whose size differs from its
//! CameraInfo's, a CameraInfo whose lens distortion the pinhole model cannot take
//! ([`crate::sensors::calib::rig`]), and a camera the map model cannot take ([`BevMapModel::check_camera`]: e.g.
//! an image its resize + crop does not fit). Every mask is counted per camera with its reason;
//! nothing waits and nothing panics on a bad message, and one camera's problem never costs the
//! other cameras their part of the map. A camera image used by two frames (cameras slower than
//! the LiDAR) is decoded once: the decode is kept with the message it came from, never keyed by
//! the stamp alone (a driver that re-stamps, or a bag edited by a tool, can give two different
//! images one stamp).
//!
//! For a model that decodes JPEGs itself (nvJPEG on CUDA, [`BevMapModel::decodes_jpeg`]) the
//! branch only screens a JPEG's headers (sizes, limits, an end-of-image marker:
//! `jpeg_markers::screen_for_gpu`) and hands over the bytes ([`FrameImage::Jpeg`]); the model
//! checks the scan data beside its GPU work, and what it then cannot use (a scan cut short or
//! garbled, data both decoders refuse) comes back through [`CameraBranch::decode_failed`], so it
//! is counted like a decode error here.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::msgs::cdr::{CameraInfo, CompressedImage, Image, TfMessage};
use crate::sensors::calib::camera::{CameraCalib, Calibration};
use crate::sensors::calib::file::CalibrationFile;
use crate::models::bevfusion::lss::CameraMask;
use crate::models::bevfusion::map::BevMap;
use crate::sensors::calib::rig::{placeholder_camera, CalibrationRig, CameraCalibState, PLACEHOLDER_SIZE};
use crate::frame::sweeps::{SweepBuffer, SweepPoints};
use crate::frame::sync::{CameraCounts, CameraSync, CameraUse};
use crate::sensors::calib::tf::TfBuffer;
use crate::sensors::image::compressed::{check_format, decode_compressed, sniff, Codec};
use crate::sensors::image::jpeg_markers::{screen_for_gpu, ScreenedJpeg};
use crate::sensors::image::encodings::{decode_raw, DecodeLimits, RawImage, RgbImage};
use crate::{Error, Points};

/// A camera message as received.
#[derive(Debug, Clone, PartialEq)]
pub enum CameraImage {
    Raw(Image),
    Compressed(CompressedImage),
}

impl CameraImage {
    pub fn stamp_ns(&self) -> i64 {
        match self {
            CameraImage::Raw(m) => m.header.stamp.as_nanos(),
            CameraImage::Compressed(m) => m.header.stamp.as_nanos(),
        }
    }

    /// RGB8 pixels, or why not.
    pub fn decode(&self, limits: &DecodeLimits) -> Result<RgbImage, String> {
        match self {
            CameraImage::Raw(m) => decode_raw(RawImage::from(m), limits),
            CameraImage::Compressed(m) => decode_compressed(&m.format, &m.data, limits),
        }
        .map_err(|e| e.to_string())
    }

    /// For a JPEG `CompressedImage`: the message screened the way a GPU decoder relies on
    /// (format, limits, and `jpeg_markers::screen_for_gpu`: every marker segment read up to the
    /// first scan, the frame header agreeing with the decoder's, an end-of-image marker after
    /// the scan data); the scans are the model's to check. `None` for anything else (raw, PNG).
    pub fn screen_jpeg(self: &Arc<Self>, limits: &DecodeLimits) -> Option<Result<ScreenedJpeg<JpegMessage>, String>> {
        let CameraImage::Compressed(m) = self.as_ref() else { return None };
        if check_format(&m.format).is_err() || !matches!(sniff(&m.format, &m.data), Ok(Codec::Jpeg)) {
            return None;
        }
        Some(screen_for_gpu(JpegMessage(Arc::clone(self)), limits).map_err(|e| e.to_string()))
    }
}

/// A compressed camera message, shared, as the bytes of its JPEG (what
/// [`CameraImage::screen_jpeg`] screened; it makes these from compressed messages only).
#[derive(Debug, Clone)]
pub struct JpegMessage(Arc<CameraImage>);

impl AsRef<[u8]> for JpegMessage {
    fn as_ref(&self) -> &[u8] {
        match self.0.as_ref() {
            CameraImage::Compressed(m) => &m.data,
            // never made from a raw image; no bytes pass no check
            CameraImage::Raw(_) => &[],
        }
    }
}

/// A used camera's image as the map model gets it.
#[derive(Debug, Clone)]
pub enum FrameImage {
    /// Decoded on the host.
    Rgb(Arc<RgbImage>),
    /// A JPEG left for a model that decodes JPEG itself on the GPU
    /// ([`BevMapModel::decodes_jpeg`]), screened here once ([`CameraImage::screen_jpeg`]); its
    /// size is its calibration's.
    Jpeg(ScreenedJpeg<JpegMessage>),
}

impl FrameImage {
    pub fn size(&self) -> (usize, usize) {
        match self {
            FrameImage::Rgb(i) => (i.width, i.height),
            FrameImage::Jpeg(j) => j.size(),
        }
    }

    /// A deferred image's screened JPEG.
    pub fn jpeg(&self) -> Option<&ScreenedJpeg<JpegMessage>> {
        match self {
            FrameImage::Jpeg(j) => Some(j),
            FrameImage::Rgb(_) => None,
        }
    }

    /// RGB8 pixels: the decoded image, or a deferred JPEG decoded now on the host.
    pub fn to_rgb(&self, limits: &DecodeLimits) -> Result<Arc<RgbImage>, String> {
        match self {
            FrameImage::Rgb(i) => Ok(Arc::clone(i)),
            FrameImage::Jpeg(j) => j.source().0.decode(limits).map(Arc::new),
        }
    }
}

/// Why a camera is out of a frame (or that it is in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CameraStatus {
    Used,
    /// No image yet.
    Missing,
    /// Its image is older than the cloud by more than `max_camera_lidar_delay`.
    Stale,
    /// Its image is newer than the cloud by more than `max_camera_lidar_delay`.
    Ahead,
    Uncalibrated,
    DecodeError,
    SizeMismatch,
    /// Its CameraInfo (intrinsics from `K`) has lens distortion beyond `camera.max_distortion`:
    /// the model's geometry is a pinhole's, so only rectified images can be used.
    Distorted,
    /// The map model cannot take this camera (e.g. its image is too small for the model's
    /// resize + crop): [`BevMapModel::check_camera`].
    UnsupportedSize,
}

/// How many [`CameraStatus`] values there are.
pub const CAMERA_STATUSES: usize = 9;

impl CameraStatus {
    pub const ALL: [CameraStatus; CAMERA_STATUSES] = [
        CameraStatus::Used,
        CameraStatus::Missing,
        CameraStatus::Stale,
        CameraStatus::Ahead,
        CameraStatus::Uncalibrated,
        CameraStatus::DecodeError,
        CameraStatus::SizeMismatch,
        CameraStatus::Distorted,
        CameraStatus::UnsupportedSize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CameraStatus::Used => "used",
            CameraStatus::Missing => "missing",
            CameraStatus::Stale => "stale",
            CameraStatus::Ahead => "ahead",
            CameraStatus::Uncalibrated => "uncalibrated",
            CameraStatus::DecodeError => "decode_error",
            CameraStatus::SizeMismatch => "size_mismatch",
            CameraStatus::Distorted => "distorted",
            CameraStatus::UnsupportedSize => "unsupported_size",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One camera in one frame.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraReport {
    pub status: CameraStatus,
    /// Cloud stamp − image stamp, when it has an image.
    pub age_ns: Option<i64>,
    /// What was wrong (masked cameras other than missing/stale/ahead).
    pub detail: Option<String>,
}

/// Per camera, over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CameraStats {
    /// Frames per [`CameraStatus`] (index = `CameraStatus as usize`).
    pub frames: [u64; CAMERA_STATUSES],
    /// Invalid CameraInfo messages (ignored; the previous intrinsics stay).
    pub camera_info_errors: u64,
    pub last_age_ns: Option<i64>,
    /// The last problem (decode error, bad CameraInfo, uncalibrated reason).
    pub last_problem: Option<String>,
    /// The calibration state of the last frame.
    pub calibration: String,
}

impl CameraStats {
    pub fn count(&self, s: CameraStatus) -> u64 {
        self.frames[s.index()]
    }

    /// Frames this camera was masked out of.
    pub fn masked(&self) -> u64 {
        self.frames.iter().sum::<u64>() - self.count(CameraStatus::Used)
    }
}

/// Everything the BEV map model's forward takes for one LiDAR cloud.
#[derive(Debug, Clone)]
pub struct BevFrameInputs {
    pub stamp_ns: i64,
    /// The cloud's frame: the calibration's and the sweeps' frame.
    pub lidar_frame: String,
    /// Every camera, in camera order (masked ones hold a placeholder or their last calibration).
    pub calibration: Calibration,
    /// The calibration differs from the previous frame's (the geometry cache rebuilds).
    pub calibration_changed: bool,
    /// Cameras to pool (bit n = camera n).
    pub mask: CameraMask,
    /// Per camera: the image of a used camera (decoded, or a screened JPEG for a model that
    /// decodes JPEG itself), `None` for a masked one.
    pub images: Vec<Option<FrameImage>>,
    pub cameras: Vec<CameraReport>,
    /// The fusion model's LiDAR input (`lidar.sweeps` clouds with the time lag).
    pub points: SweepPoints,
    /// Stage times, ms: `camera_sync` (sync + calibration), `camera_decode`, `sweeps`.
    pub stages: [(&'static str, f64); 3],
}

impl BevFrameInputs {
    /// Cameras used.
    pub fn used(&self) -> usize {
        self.cameras.iter().filter(|c| c.status == CameraStatus::Used).count()
    }
}

/// How the BEV map model's CUDA graph has fared so far (`camera.cuda_graph`): graphs captured,
/// frames replayed, captures the driver refused (those frames ran kernel by kernel) and why the
/// last one was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapGraphCounts {
    pub captures: usize,
    pub replays: usize,
    pub refused: usize,
    pub last_refusal: Option<String>,
}

/// The integration point of the BEV map model: its forward on one frame's inputs. With no
/// usable camera (`inputs.mask` empty) a fusion model runs LiDAR-only (camera BEV zero).
pub trait BevMapModel {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, Error>;

    /// The last forward's stage times `(name, ms)`, for the latency tables (none by default).
    fn last_stages(&self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// Whether the model decodes JPEGs itself (nvJPEG): the branch then only checks their
    /// headers and hands the bytes over ([`FrameImage::Jpeg`]).
    fn decodes_jpeg(&self) -> bool {
        false
    }

    /// The CUDA graph's counts while the model runs as one (`None`: kernel by kernel, or no
    /// graphs on this backend).
    fn graph_counts(&self) -> Option<MapGraphCounts> {
        None
    }

    /// Cameras whose deferred JPEG the last forward could not decode `(camera, why)`: the model
    /// masked them for that frame; the caller reports them with [`CameraBranch::decode_failed`].
    fn take_decode_failures(&mut self) -> Vec<(usize, String)> {
        Vec::new()
    }

    /// Whether the model can take a camera calibrated as `camera` (its raw image size, its
    /// intrinsics): `Err(why)` masks the camera as `unsupported_size` for the frame, and the
    /// others still make the map ([`CameraBranch::run_model`]).
    fn check_camera(&self, _camera: &CameraCalib) -> Result<(), String> {
        Ok(())
    }
}

/// The branch's settings.
#[derive(Debug, Clone)]
pub struct BranchConfig {
    pub names: Vec<String>,
    /// Per camera: intrinsics from CameraInfo `P` (rectified) instead of `K`.
    pub use_projection: Vec<bool>,
    pub max_camera_lidar_delay_s: f64,
    pub sweeps: usize,
    pub odom_frame: String,
    pub calibration_file: Option<CalibrationFile>,
    /// The largest |d| of a CameraInfo read through `K` that still counts as undistorted
    /// (`camera.max_distortion`; [`crate::sensors::calib::rig::distortion_problem`]).
    pub max_distortion: f64,
}

/// A decoded (or screened) image with the message it came from, so a second frame using the same
/// message does not decode again. Keyed by the message itself (`Arc` identity), never by its
/// stamp: two different images may carry one stamp.
type Decoded = Option<(Arc<CameraImage>, Result<FrameImage, String>)>;

/// The camera branch's state between frames.
pub struct CameraBranch {
    sync: CameraSync<Arc<CameraImage>>,
    rig: CalibrationRig,
    tf: TfBuffer,
    sweeps: SweepBuffer,
    odom_frame: String,
    decoded: Vec<Decoded>,
    stats: Vec<CameraStats>,
    limits: DecodeLimits,
    /// JPEGs are left to the map model ([`BevMapModel::decodes_jpeg`]).
    defer_jpeg: bool,
    tf_errors: u64,
    last_tf_error: Option<String>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl CameraBranch {
    pub fn new(cfg: BranchConfig) -> Result<Self, Error> {
        let rig = CalibrationRig::new(&cfg.names, &cfg.use_projection, cfg.calibration_file, cfg.max_distortion)?;
        let d = cfg.max_camera_lidar_delay_s;
        if !(d.is_finite() && d >= 0.0) {
            return Err(Error::InvalidInput(format!("max_camera_lidar_delay {d} must be zero or positive")));
        }
        Ok(CameraBranch {
            sync: CameraSync::new(&cfg.names, d),
            rig,
            tf: TfBuffer::new(),
            sweeps: SweepBuffer::new(cfg.sweeps),
            odom_frame: cfg.odom_frame,
            decoded: vec![None; cfg.names.len()],
            stats: vec![CameraStats::default(); cfg.names.len()],
            limits: DecodeLimits::default(),
            defer_jpeg: false,
            tf_errors: 0,
            last_tf_error: None,
        })
    }

    pub fn names(&self) -> &[String] {
        self.sync.names()
    }

    /// Leaves JPEGs to a map model that decodes them itself (nvJPEG): frames then carry
    /// [`FrameImage::Jpeg`] for them, screened but not decoded.
    pub fn set_defer_jpeg(&mut self, defer: bool) {
        if defer != self.defer_jpeg {
            self.decoded.iter_mut().for_each(|d| *d = None);
        }
        self.defer_jpeg = defer;
    }

    /// `model`'s forward on a frame's `inputs`: first the cameras the model cannot take are
    /// masked ([`CameraBranch::mask_unsupported`]), then after the forward the cameras whose JPEG
    /// it could not decode are reported as decode errors in `inputs` and the counts
    /// ([`CameraBranch::decode_failed`]), whether the forward succeeded or not. Returns the map
    /// and those cameras `(camera, why)`, for the caller's log. The node, replay and the pipeline
    /// bench run the model through here.
    pub fn run_model<M: BevMapModel + ?Sized>(
        &mut self,
        model: &mut M,
        inputs: &mut BevFrameInputs,
    ) -> (Result<BevMap, Error>, Vec<(usize, String)>) {
        self.mask_unsupported(model, inputs);
        let map = model.forward(inputs);
        let failures = model.take_decode_failures();
        for (cam, why) in &failures {
            self.decode_failed(inputs, *cam, why);
        }
        (map, failures)
    }

    /// The cameras of `inputs` that `model` cannot take ([`BevMapModel::check_camera`]): a used
    /// one is masked as `unsupported_size` for the frame and counted; the calibration entry of
    /// every such camera, used or not, becomes a stand-in the model takes (a nominal pinhole of a
    /// supported camera's size, pooled nowhere), so the model's geometry of the whole frame does
    /// not fail on one camera and the other cameras still make the map.
    pub fn mask_unsupported<M: BevMapModel + ?Sized>(&mut self, model: &M, inputs: &mut BevFrameInputs) {
        // Every frame, without allocating while every camera is taken (the check is a few
        // small matrix products per camera); the verdicts are collected only when one fails.
        if inputs.calibration.cameras.iter().all(|c| model.check_camera(c).is_ok()) {
            return;
        }
        let verdicts: Vec<Result<(), String>> = inputs.calibration.cameras.iter().map(|c| model.check_camera(c)).collect();
        let stand_in_size = inputs
            .calibration
            .cameras
            .iter()
            .zip(&verdicts)
            .find(|(_, v)| v.is_ok())
            .map(|(c, _)| (c.image_width, c.image_height))
            .or_else(|| {
                let fallback = placeholder_camera("stand-in", PLACEHOLDER_SIZE);
                model.check_camera(&fallback).is_ok().then_some(PLACEHOLDER_SIZE)
            });
        for (cam, verdict) in verdicts.into_iter().enumerate() {
            let Err(why) = verdict else { continue };
            self.mask_camera(inputs, cam, CameraStatus::UnsupportedSize, &why);
            if let (Some(size), Some(c)) = (stand_in_size, inputs.calibration.cameras.get_mut(cam)) {
                *c = placeholder_camera(&c.name, size);
            }
        }
    }

    /// Camera `cam`'s image in `inputs` could not be decoded by the map model (`why`): the
    /// camera is reported as a decode error for that frame instead of used.
    pub fn decode_failed(&mut self, inputs: &mut BevFrameInputs, cam: usize, why: &str) {
        self.mask_camera(inputs, cam, CameraStatus::DecodeError, why);
    }

    /// Camera `cam`, used in `inputs`, is masked out of that frame as `status` (`why`): out of
    /// the mask, its image dropped, and counted as `status` instead of used. A camera that was
    /// not used stays as it was.
    fn mask_camera(&mut self, inputs: &mut BevFrameInputs, cam: usize, status: CameraStatus, why: &str) {
        let Some(rep) = inputs.cameras.get_mut(cam) else { return };
        if rep.status != CameraStatus::Used {
            return;
        }
        rep.status = status;
        rep.detail = Some(why.to_string());
        inputs.mask = inputs.mask.without(cam);
        if let Some(img) = inputs.images.get_mut(cam) {
            *img = None;
        }
        if let Some(s) = self.stats.get_mut(cam) {
            s.frames[CameraStatus::Used.index()] = s.frames[CameraStatus::Used.index()].saturating_sub(1);
            s.frames[status.index()] += 1;
            s.last_problem = Some(format!("{}: {why}", status.name()));
        }
    }

    /// Camera `cam`'s new image. Returns false for an unknown camera index.
    pub fn on_image(&mut self, cam: usize, img: CameraImage) -> bool {
        let stamp = img.stamp_ns();
        self.sync.put(cam, stamp, Arc::new(img))
    }

    /// Camera `cam`'s CameraInfo; an invalid one is counted, kept as the camera's last problem
    /// and returned as the error (the previous intrinsics stay).
    pub fn on_camera_info(&mut self, cam: usize, info: &CameraInfo) -> Result<(), Error> {
        let r = self.rig.set_camera_info(cam, info);
        if let (Err(e), Some(s)) = (&r, self.stats.get_mut(cam)) {
            s.camera_info_errors += 1;
            s.last_problem = Some(format!("CameraInfo: {e}"));
        }
        r
    }

    /// A `/tf` (`is_static` false) or `/tf_static` message; bad transforms are skipped, counted
    /// and returned.
    pub fn on_tf(&mut self, msg: &TfMessage, is_static: bool) -> Vec<String> {
        let errors = self.tf.add_message(msg, is_static);
        if let Some(e) = errors.last() {
            self.tf_errors += errors.len() as u64;
            self.last_tf_error = Some(e.clone());
        }
        errors
    }

    /// The TF buffer (for lookups elsewhere, and tests).
    pub fn tf(&self) -> &TfBuffer {
        &self.tf
    }

    /// The inputs of the frame of a cloud stamped `stamp_ns` in `lidar_frame` with `points`
    /// (which are kept as this frame's sweep).
    pub fn frame(&mut self, stamp_ns: i64, lidar_frame: &str, points: &Points) -> BevFrameInputs {
        let t = Instant::now();
        let rig = self.rig.resolve(lidar_frame, &self.tf);
        let synced = self.sync.frame(stamp_ns);
        let n = synced.cameras.len();
        let mut reports: Vec<CameraReport> = Vec::with_capacity(n);
        let mut to_decode: Vec<(usize, Arc<CameraImage>)> = Vec::new();
        for (i, ((u, item), state)) in synced.cameras.iter().zip(&rig.states).enumerate() {
            let age_ns = u.age_ns();
            let (status, detail) = match (u, state) {
                (CameraUse::Missing, _) => (CameraStatus::Missing, None),
                (CameraUse::Stale { .. }, _) => (CameraStatus::Stale, None),
                (CameraUse::Ahead { .. }, _) => (CameraStatus::Ahead, None),
                (CameraUse::Used { .. }, CameraCalibState::Uncalibrated(why)) => (CameraStatus::Uncalibrated, Some(why.clone())),
                (CameraUse::Used { .. }, CameraCalibState::Distorted(why)) => (CameraStatus::Distorted, Some(why.clone())),
                (CameraUse::Used { .. }, CameraCalibState::Ready { .. }) => {
                    if let Some(img) = item {
                        to_decode.push((i, Arc::clone(img)));
                    }
                    (CameraStatus::Used, None)
                }
            };
            reports.push(CameraReport { status, age_ns, detail });
        }
        drop(synced);
        let sync_ms = ms(t);

        // Decode what is not decoded yet (in parallel), then check sizes.
        let t = Instant::now();
        let limits = self.limits;
        let todo: Vec<(usize, Arc<CameraImage>)> = to_decode
            .into_iter()
            .filter(|(i, img)| !matches!(&self.decoded[*i], Some((done, _)) if Arc::ptr_eq(done, img)))
            .collect();
        let defer = self.defer_jpeg;
        let fresh: Vec<(usize, Arc<CameraImage>, Result<FrameImage, String>)> = todo
            .into_par_iter()
            .map(|(i, img)| {
                // screened only when it is left to the model: a decode here reads the headers itself
                let screened = if defer { img.screen_jpeg(&limits) } else { None };
                let r = match screened {
                    Some(screened) => screened.map(FrameImage::Jpeg),
                    None => img.decode(&limits).map(|d| FrameImage::Rgb(Arc::new(d))),
                };
                (i, img, r)
            })
            .collect();
        for (i, img, r) in fresh {
            self.decoded[i] = Some((img, r));
        }
        let mut images: Vec<Option<FrameImage>> = vec![None; n];
        for (i, rep) in reports.iter_mut().enumerate() {
            if rep.status != CameraStatus::Used {
                continue;
            }
            match &self.decoded[i] {
                Some((_, Ok(img))) => {
                    let c = &rig.calibration.cameras[i];
                    let (w, h) = img.size();
                    if (w, h) != (c.image_width, c.image_height) {
                        rep.status = CameraStatus::SizeMismatch;
                        rep.detail = Some(format!(
                            "image is {w} x {h} but its calibration (CameraInfo) says {} x {}",
                            c.image_width, c.image_height
                        ));
                    } else {
                        images[i] = Some(img.clone());
                    }
                }
                Some((_, Err(e))) => {
                    rep.status = CameraStatus::DecodeError;
                    rep.detail = Some(e.clone());
                }
                None => {
                    rep.status = CameraStatus::DecodeError;
                    rep.detail = Some("image was not decoded".into());
                }
            }
        }
        let decode_ms = ms(t);

        let t = Instant::now();
        let pose = if lidar_frame.is_empty() { None } else { self.tf.lookup(&self.odom_frame, lidar_frame).ok() };
        self.sweeps.push(stamp_ns, points.clone(), pose);
        let sweep_points = self.sweeps.aggregate().unwrap_or_else(|_| {
            // a singular ego pose: the current cloud alone
            let mut one = SweepBuffer::new(1);
            one.push(stamp_ns, points.clone(), None);
            one.aggregate().unwrap_or_default()
        });
        let sweeps_ms = ms(t);

        let mut mask = 0u32;
        for (i, (rep, state)) in reports.iter().zip(&rig.states).enumerate() {
            let s = &mut self.stats[i];
            s.frames[rep.status.index()] += 1;
            if rep.age_ns.is_some() {
                s.last_age_ns = rep.age_ns;
            }
            if let Some(d) = &rep.detail {
                s.last_problem = Some(format!("{}: {d}", rep.status.name()));
            }
            s.calibration = state.describe();
            if rep.status == CameraStatus::Used && i < 32 {
                mask |= 1 << i;
            }
        }
        BevFrameInputs {
            stamp_ns,
            lidar_frame: lidar_frame.to_string(),
            calibration: rig.calibration,
            calibration_changed: rig.changed,
            mask: CameraMask(mask),
            images,
            cameras: reports,
            points: sweep_points,
            stages: [("camera_sync", sync_ms), ("camera_decode", decode_ms), ("sweeps", sweeps_ms)],
        }
    }

    /// Per camera statistics, in camera order.
    pub fn stats(&self) -> &[CameraStats] {
        &self.stats
    }

    /// Per camera synchronisation counts (including images replaced before any frame used them).
    pub fn sync_counts(&self) -> &[CameraCounts] {
        self.sync.counts()
    }

    /// Calibration changes since the first frame.
    pub fn calibration_changes(&self) -> u64 {
        self.rig.changes()
    }

    /// Bad TF transforms skipped, and the last one.
    pub fn tf_errors(&self) -> (u64, Option<&str>) {
        (self.tf_errors, self.last_tf_error.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cdr::{Header, Time, TransformStamped};

    fn root() -> std::path::PathBuf {
        crate::repo_root()
    }

    fn header(ns: i64, frame: &str) -> Header {
        Header { stamp: Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }, frame_id: frame.into() }
    }

    fn rgb(ns: i64, w: u32, h: u32) -> CameraImage {
        CameraImage::Raw(Image { header: header(ns, "cam"), height: h, width: w, encoding: "rgb8".into(), is_bigendian: 0, step: 3 * w, data: vec![9; (3 * w * h) as usize] })
    }

    fn info(frame: &str, w: u32, h: u32) -> CameraInfo {
        let mut c = CameraInfo { header: header(0, frame), width: w, height: h, ..Default::default() };
        c.k = [100.0, 0.0, w as f64 / 2.0, 0.0, 100.0, h as f64 / 2.0, 0.0, 0.0, 1.0];
        c
    }

    fn tf(parent: &str, child: &str, x: f64) -> TfMessage {
        TfMessage {
            transforms: vec![TransformStamped { header: header(0, parent), child_frame_id: child.into(), translation: [x, 0.0, 0.0], rotation: [-0.5, 0.5, -0.5, 0.5] }],
        }
    }

    fn branch(n: usize) -> CameraBranch {
        CameraBranch::new(BranchConfig {
            names: (0..n).map(|i| format!("C{i}")).collect(),
            use_projection: vec![false; n],
            max_camera_lidar_delay_s: 0.12,
            sweeps: 1,
            odom_frame: "odom".into(),
            calibration_file: None,
            max_distortion: 1e-3,
        })
        .unwrap()
    }

    const MS: i64 = 1_000_000;

    /// Every reason a camera is masked, each counted; the good camera is used with its age;
    /// a bad image is decoded once and a calibration change on /tf_static is seen next frame.
    #[test]
    fn masks_and_counts_every_reason() {
        let mut b = branch(6);
        let t = 10_000 * MS;
        let lidar = TfMessage {
            transforms: vec![TransformStamped { header: header(0, "base_link"), child_frame_id: "lidar".into(), translation: [0.0; 3], rotation: [0.0, 0.0, 0.0, 1.0] }],
        };
        assert!(b.on_tf(&lidar, true).is_empty());
        for i in 0..6 {
            let f = format!("cam{i}");
            if i != 3 {
                assert!(b.on_tf(&tf("base_link", &f, 1.0), true).is_empty());
            }
            b.on_camera_info(i, &info(&f, 8, 6)).unwrap();
        }
        // bad CameraInfo: counted, previous intrinsics kept
        assert!(b.on_camera_info(0, &info("cam0", 0, 6)).is_err());
        b.on_image(0, rgb(t - 20 * MS, 8, 6)); // used
        b.on_image(1, rgb(t - 200 * MS, 8, 6)); // stale
        // 2: missing
        b.on_image(3, rgb(t, 8, 6)); // no TF for cam3: uncalibrated
        b.on_image(4, CameraImage::Compressed(CompressedImage { header: header(t, "cam4"), format: "jpeg".into(), data: vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 16] })); // corrupt
        b.on_image(5, rgb(t, 10, 6)); // size mismatch
        let pts = Points { x: vec![1.0], y: vec![2.0], z: vec![3.0], intensity: vec![4.0], has_intensity: true, ring: None, time: None };
        let f = b.frame(t, "lidar", &pts);
        let status: Vec<&str> = f.cameras.iter().map(|c| c.status.name()).collect();
        assert_eq!(status, ["used", "stale", "missing", "uncalibrated", "decode_error", "size_mismatch"]);
        assert_eq!(f.mask, CameraMask(1));
        assert_eq!(f.used(), 1);
        assert_eq!(f.cameras[0].age_ns, Some(20 * MS));
        assert!(f.images[0].as_ref().is_some_and(|i| i.size() == (8, 6)));
        assert!(f.images[1..].iter().all(|i| i.is_none()));
        assert!(f.cameras[4].detail.as_deref().is_some_and(|d| d.contains("JPEG")), "{:?}", f.cameras[4]);
        assert!(f.cameras[5].detail.as_deref().is_some_and(|d| d.contains("10 x 6")), "{:?}", f.cameras[5]);
        assert!(f.calibration_changed);
        assert_eq!(f.calibration.len(), 6);
        assert_eq!((f.points.len(), f.points.time_lag.clone()), (1, vec![0.0]));
        let s = b.stats();
        assert_eq!(s[0].camera_info_errors, 1);
        assert_eq!(s[0].count(CameraStatus::Used), 1);
        assert_eq!(s[2].count(CameraStatus::Missing), 1);
        assert!(s[3].calibration.contains("uncalibrated"), "{}", s[3].calibration);
        assert!(s[0].calibration.contains("extrinsic from tf"), "{}", s[0].calibration);
        assert!(s.iter().skip(1).all(|c| c.masked() == 1));

        // next frame: same images; the corrupt one is not decoded again (same verdict), and a
        // moved camera on /tf_static changes the calibration
        b.on_tf(&tf("base_link", "cam0", 1.5), true);
        let g = b.frame(t + 50 * MS, "lidar", &pts);
        assert_eq!(g.cameras[4].status, CameraStatus::DecodeError);
        assert!(g.calibration_changed);
        assert_eq!(b.calibration_changes(), 1);
        assert!((g.calibration.cameras[0].camera_to_lidar[0][3] - 1.5).abs() < 1e-12);
        let h = b.frame(t + 60 * MS, "lidar", &pts);
        assert!(!h.calibration_changed);
        assert_eq!(b.stats()[1].count(CameraStatus::Stale), 3);
        // bad TF is counted
        assert_eq!(b.on_tf(&tf("", "x", 0.0), false).len(), 1);
        assert_eq!(b.tf_errors().0, 1);
    }

    /// Two different images with one stamp (a driver that re-stamps, an edited bag): each is
    /// decoded for itself. A corrupt image carrying a good image's stamp is a decode error, not
    /// the good image's picture; a good image carrying a bad one's stamp is used. The same
    /// message in two frames is still decoded once.
    #[test]
    fn a_new_image_with_an_earlier_stamp_is_decoded_for_itself() {
        for defer in [false, true] {
            let (mut b, names, _) = nuscenes_branch();
            b.set_defer_jpeg(defer);
            let good = |i: usize| jpeg_message(&names[i], nuscenes_jpeg(&names[i]));
            let cut = |i: usize| {
                let mut data = nuscenes_jpeg(&names[i]);
                data.truncate(data.len() / 2);
                jpeg_message(&names[i], data)
            };
            for i in 0..6 {
                b.on_image(i, good(i));
            }
            let f = b.frame(1_010 * MS, "lidar_top", &Points::default());
            assert_eq!(f.used(), 6, "defer {defer}: {:?}", f.cameras);
            // the same messages again: nothing new to decode, all used
            let f = b.frame(1_020 * MS, "lidar_top", &Points::default());
            assert_eq!(f.used(), 6);
            // CAM_FRONT's next image is cut short but carries the first one's stamp
            b.on_image(0, cut(0));
            let f = b.frame(1_030 * MS, "lidar_top", &Points::default());
            assert_eq!(f.cameras[0].status, CameraStatus::DecodeError, "defer {defer}: {:?}", f.cameras[0]);
            assert!(f.images[0].is_none());
            assert_eq!(f.mask, CameraMask(0b11_1110));
            // and a good image after it, with that same stamp again, is used
            b.on_image(0, good(0));
            let f = b.frame(1_040 * MS, "lidar_top", &Points::default());
            assert_eq!(f.cameras[0].status, CameraStatus::Used, "defer {defer}: {:?}", f.cameras[0]);
            assert_eq!(f.images[0].as_ref().map(FrameImage::size), Some((1600, 900)));
            let s = &b.stats()[0];
            assert_eq!((s.count(CameraStatus::Used), s.count(CameraStatus::DecodeError)), (3, 1));
        }
    }

    /// A CameraInfo with lens distortion beyond `max_distortion`, read through `K`, masks the
    /// camera as `distorted` every frame with a message that says to feed rectified images; the
    /// same CameraInfo read through `P` (a rectified image), or with a distortion within the
    /// tolerance, is used. A later undistorted CameraInfo brings the camera back.
    #[test]
    fn distorted_camera_infos_mask_the_camera_unless_rectified() {
        let run = |use_projection: bool, d: Vec<f64>| {
            let mut b = CameraBranch::new(BranchConfig {
                names: vec!["C0".into(), "C1".into()],
                use_projection: vec![use_projection, false],
                max_camera_lidar_delay_s: 0.12,
                sweeps: 1,
                odom_frame: "odom".into(),
                calibration_file: None,
                max_distortion: 1e-3,
            })
            .unwrap();
            let t = 10_000 * MS;
            for i in 0..2 {
                let f = format!("cam{i}");
                assert!(b.on_tf(&tf("lidar", &f, 1.0), true).is_empty());
                let mut c = info(&f, 8, 6);
                c.p = [100.0, 0.0, 4.0, 0.0, 0.0, 100.0, 3.0, 0.0, 0.0, 0.0, 1.0, 0.0];
                if i == 0 {
                    c.distortion_model = "plumb_bob".into();
                    c.d = d.clone();
                }
                b.on_camera_info(i, &c).unwrap();
                b.on_image(i, rgb(t, 8, 6));
            }
            let f = b.frame(t, "lidar", &Points::default());
            (b, f)
        };
        let (mut b, f) = run(false, vec![-0.4, 0.2, 0.0, 0.0, 0.0]);
        assert_eq!(f.cameras[0].status, CameraStatus::Distorted, "{:?}", f.cameras[0]);
        let why = f.cameras[0].detail.clone().unwrap();
        assert!(why.contains("image_rect") && why.contains("-0.4") && why.contains("max_distortion"), "{why}");
        assert_eq!(f.cameras[1].status, CameraStatus::Used);
        assert_eq!(f.mask, CameraMask(0b10));
        assert!(b.stats()[0].calibration.starts_with("distorted"), "{}", b.stats()[0].calibration);
        // every frame, until an undistorted CameraInfo
        let g = b.frame(10_050 * MS, "lidar", &Points::default());
        assert_eq!(g.cameras[0].status, CameraStatus::Distorted);
        assert_eq!(b.stats()[0].count(CameraStatus::Distorted), 2);
        b.on_camera_info(0, &info("cam0", 8, 6)).unwrap();
        let h = b.frame(10_060 * MS, "lidar", &Points::default());
        assert_eq!(h.cameras[0].status, CameraStatus::Used);
        // rectified (P) ignores d; a tiny d passes; a NaN d does not
        assert_eq!(run(true, vec![-0.4, 0.2, 0.0, 0.0, 0.0]).1.cameras[0].status, CameraStatus::Used);
        assert_eq!(run(false, vec![1e-4, -1e-3, 0.0, 0.0, 0.0]).1.cameras[0].status, CameraStatus::Used);
        assert_eq!(run(false, vec![]).1.cameras[0].status, CameraStatus::Used);
        assert_eq!(run(false, vec![f64::NAN, 0.0, 0.0, 0.0, 0.0]).1.cameras[0].status, CameraStatus::Distorted);
    }

    /// A model that takes only cameras `w` pixels wide (as a resize + crop takes only images it
    /// fits) and records the calibration it was given.
    struct WidthOnly {
        w: usize,
        seen: Option<Calibration>,
    }

    impl BevMapModel for WidthOnly {
        fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, Error> {
            if let Some(c) = inputs.calibration.cameras.iter().find(|c| c.image_width != self.w) {
                return Err(Error::InvalidInput(format!("camera `{}` is {} wide", c.name, c.image_width)));
            }
            self.seen = Some(inputs.calibration.clone());
            Err(Error::InvalidInput("stand-in: no map".into()))
        }

        fn check_camera(&self, c: &CameraCalib) -> Result<(), String> {
            if c.image_width == self.w { Ok(()) } else { Err(format!("image {} x {} is too small", c.image_width, c.image_height)) }
        }
    }

    /// A camera the model cannot take is masked as `unsupported_size` with the model's reason
    /// and counted; its calibration entry becomes a stand-in the model takes, so the forward
    /// runs on the other cameras. A masked camera (no image) of such a size is replaced too.
    #[test]
    fn a_camera_the_model_cannot_take_is_masked_and_the_others_still_run() {
        let mut b = branch(3);
        let t = 10_000 * MS;
        for (i, w) in [(0, 8u32), (1, 12), (2, 12)] {
            let f = format!("cam{i}");
            assert!(b.on_tf(&tf("lidar", &f, 1.0), true).is_empty());
            b.on_camera_info(i, &info(&f, w, 6)).unwrap();
            if i < 2 {
                b.on_image(i, rgb(t, w, 6));
            }
        }
        let mut f = b.frame(t, "lidar", &Points::default());
        assert_eq!(f.mask, CameraMask(0b11));
        let mut model = WidthOnly { w: 8, seen: None };
        let (map, _) = b.run_model(&mut model, &mut f);
        assert!(map.unwrap_err().to_string().contains("stand-in"), "the forward ran on the rest");
        let status: Vec<&str> = f.cameras.iter().map(|c| c.status.name()).collect();
        assert_eq!(status, ["used", "unsupported_size", "missing"]);
        assert!(f.cameras[1].detail.as_deref().is_some_and(|d| d.contains("12 x 6")), "{:?}", f.cameras[1]);
        assert_eq!(f.mask, CameraMask(0b01));
        assert!(f.images[1].is_none());
        let seen = model.seen.unwrap();
        assert!(seen.cameras.iter().all(|c| c.image_width == 8));
        assert_eq!(seen.cameras[1].name, "C1");
        let s = &b.stats()[1];
        assert_eq!((s.count(CameraStatus::Used), s.count(CameraStatus::UnsupportedSize)), (0, 1));
        assert!(s.last_problem.as_deref().is_some_and(|p| p.starts_with("unsupported_size")));
    }

    /// LiDAR sweeps from `/tf`: `odom → base_link` (dynamic, the car drives +1 m in x per
    /// 0.1 s) chained with `base_link → lidar` (static). A static object at odom x = 10 lands on
    /// one place in the current cloud's frame from all three sweeps, each with its time lag.
    #[test]
    fn sweeps_follow_the_ego_motion_on_tf() {
        let mut b = CameraBranch::new(BranchConfig {
            names: vec!["C0".into()],
            use_projection: vec![false],
            max_camera_lidar_delay_s: 0.12,
            sweeps: 3,
            odom_frame: "odom".into(),
            calibration_file: None,
            max_distortion: 1e-3,
        })
        .unwrap();
        let edge = |parent: &str, child: &str, t: [f64; 3]| TfMessage {
            transforms: vec![TransformStamped { header: header(0, parent), child_frame_id: child.into(), translation: t, rotation: [0.0, 0.0, 0.0, 1.0] }],
        };
        assert!(b.on_tf(&edge("base_link", "lidar", [0.5, 0.0, 1.8]), true).is_empty());
        let mut last = None;
        for k in 0..4i64 {
            assert!(b.on_tf(&edge("odom", "base_link", [k as f64, 0.0, 0.0]), false).is_empty());
            // the object in this cloud's frame: odom (10, 0, 0) minus the LiDAR's origin (k + 0.5, 0, 1.8)
            let pts = Points { x: vec![9.5 - k as f32], y: vec![0.0], z: vec![-1.8], intensity: vec![3.0], has_intensity: true, ring: None, time: None };
            let f = b.frame(k * 100 * MS, "lidar", &pts);
            assert_eq!(f.points.sweeps, (k as usize + 1).min(3));
            last = Some(f.points);
        }
        let p = last.unwrap();
        assert_eq!((p.x.clone(), p.y.clone(), p.z.clone()), (vec![6.5; 3], vec![0.0; 3], vec![-1.8; 3]));
        for (got, want) in p.time_lag.iter().zip([0.0f32, 0.1, 0.2]) {
            assert!((got - want).abs() < 1e-6, "{:?}", p.time_lag);
        }
        // without the odom edge (another odom frame name) only the current cloud is used
        b.odom_frame = "map".into();
        let f = b.frame(400 * MS, "lidar", &Points { x: vec![5.5], y: vec![0.0], z: vec![-1.8], intensity: vec![3.0], has_intensity: true, ring: None, time: None });
        assert_eq!((f.points.sweeps, f.points.x), (1, vec![5.5]));
    }

    /// The sample frame's six JPEGs with the calibration file: all six used, decoded to
    /// 1600 x 900, and the calibration equals the file's.
    fn nuscenes_jpeg(name: &str) -> Vec<u8> {
        let dir = root().join("tests/data/nuscenes");
        let jpg = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().contains(&format!("__{name}__")))
            .unwrap()
            .path();
        std::fs::read(jpg).unwrap()
    }

    /// The six nuScenes cameras with the sample's calibration file, and the names.
    fn nuscenes_branch() -> (CameraBranch, Vec<String>, CalibrationFile) {
        use crate::sensors::calib::camera::NUSCENES_CAMERAS;
        let file = CalibrationFile::load(&root().join("config/calibration/nuscenes_sample.yaml")).unwrap();
        let names: Vec<String> = NUSCENES_CAMERAS.iter().map(|s| s.to_string()).collect();
        let b = CameraBranch::new(BranchConfig {
            names: names.clone(),
            use_projection: vec![false; 6],
            max_camera_lidar_delay_s: 0.12,
            sweeps: 1,
            odom_frame: "odom".into(),
            calibration_file: Some(file.clone()),
            max_distortion: 1e-3,
        })
        .unwrap();
        (b, names, file)
    }

    fn jpeg_message(name: &str, data: Vec<u8>) -> CameraImage {
        CameraImage::Compressed(CompressedImage { header: header(1_000 * MS, &name.to_lowercase()), format: "jpeg".into(), data })
    }

    #[test]
    fn nuscenes_frame_from_the_calibration_file() {
        let (mut b, names, file) = nuscenes_branch();
        for (i, name) in names.iter().enumerate() {
            b.on_image(i, jpeg_message(name, nuscenes_jpeg(name)));
        }
        let f = b.frame(1_010 * MS, "lidar_top", &Points::default());
        assert_eq!(f.used(), 6, "{:?}", f.cameras);
        assert_eq!(f.mask, CameraMask(0b11_1111));
        for (i, c) in f.calibration.cameras.iter().enumerate() {
            let fc = file.camera(&names[i]).unwrap();
            assert_eq!(c.camera_to_lidar, fc.camera_to_lidar);
            assert_eq!(Some((c.intrinsics, 1600, 900)), fc.intrinsics);
            let img = f.images[i].as_ref().unwrap();
            assert!(matches!(img, FrameImage::Rgb(_)), "decoded on the host unless deferred");
            assert_eq!(img.size(), (1600, 900));
        }
    }

    /// A map model that decodes JPEGs itself and could not decode `fails`; its forward fails.
    struct NvjpegStandIn {
        fails: Vec<(usize, String)>,
    }

    impl BevMapModel for NvjpegStandIn {
        fn forward(&mut self, _: &BevFrameInputs) -> Result<BevMap, Error> {
            Err(Error::InvalidInput("stand-in".into()))
        }

        fn decodes_jpeg(&self) -> bool {
            true
        }

        fn take_decode_failures(&mut self) -> Vec<(usize, String)> {
            std::mem::take(&mut self.fails)
        }
    }

    /// With a model that decodes JPEGs itself, the branch checks their headers and hands the
    /// bytes over: a JPEG cut short is still a decode error here; one whose markers are whole
    /// but whose data is bad reaches the model, which reports it (`decode_failed`): the camera
    /// is then a decode error of that frame, not used, and out of the mask.
    /// CAM_FRONT's JPEG cut to its first 78,718 bytes (60 %) and given an end-of-image marker:
    /// every marker in place, the scan ends early.
    fn cut_front_jpeg() -> Vec<u8> {
        let mut d = nuscenes_jpeg("CAM_FRONT");
        d.truncate(78_718);
        d.extend_from_slice(&[0xFF, 0xD9]);
        d
    }

    /// Decoded here, it is this frame's decode error. Deferred, the branch screens headers only
    /// and hands it over; the model's scan checks refuse it (`ScreenedJpeg::check_scans`), and
    /// the host decode it falls back on (`FrameImage::to_rgb`) names the same fault, which the
    /// model reports through `run_model` (tests/frame_map_model).
    #[test]
    fn a_jpeg_cut_short_with_its_end_marker_appended_is_a_decode_error_deferred_or_not() {
        let cut_short = |why: &str| why.contains("scan data ends at MCU") && why.contains("the file was cut short");
        for defer in [true, false] {
            let (mut b, names, _) = nuscenes_branch();
            b.set_defer_jpeg(defer);
            for (i, name) in names.iter().enumerate() {
                let data = if name == "CAM_FRONT" { cut_front_jpeg() } else { nuscenes_jpeg(name) };
                b.on_image(i, jpeg_message(name, data));
            }
            let f = b.frame(1_010 * MS, "lidar_top", &Points::default());
            let front = names.iter().position(|n| n == "CAM_FRONT").unwrap();
            if defer {
                assert_eq!(f.used(), 6, "the screen passes it: {:?}", f.cameras);
                let img = f.images[front].as_ref().unwrap();
                let scans = img.jpeg().unwrap().check_scans().unwrap_err().to_string();
                assert!(cut_short(&scans), "{scans}");
                let host = img.to_rgb(&DecodeLimits::default()).unwrap_err();
                assert!(cut_short(&host), "{host}");
                continue;
            }
            assert_eq!(f.used(), 5, "{:?}", f.cameras);
            assert_eq!(f.cameras[front].status, CameraStatus::DecodeError);
            let why = f.cameras[front].detail.clone().unwrap_or_default();
            assert!(cut_short(&why), "{why}");
            assert!(f.images[front].is_none());
            assert_eq!(b.stats()[front].count(CameraStatus::DecodeError), 1);
        }
    }

    #[test]
    fn deferred_jpegs_are_screened_here_and_model_failures_are_reported() {
        let (mut b, names, _) = nuscenes_branch();
        b.set_defer_jpeg(true);
        for (i, name) in names.iter().enumerate() {
            let mut data = nuscenes_jpeg(name);
            if i == 1 {
                data.truncate(data.len() / 2); // no end-of-image marker
            }
            b.on_image(i, jpeg_message(name, data));
        }
        let mut f = b.frame(1_010 * MS, "lidar_top", &Points::default());
        assert_eq!(f.used(), 5, "{:?}", f.cameras);
        assert_eq!(f.cameras[1].status, CameraStatus::DecodeError);
        assert!(f.cameras[1].detail.as_deref().is_some_and(|d| d.contains("end-of-image")), "{:?}", f.cameras[1].detail);
        for i in [0, 2, 3, 4, 5] {
            let img = f.images[i].as_ref().unwrap();
            assert_eq!(img.jpeg().map(|j| j.bytes().to_vec()), Some(nuscenes_jpeg(&names[i])));
            assert_eq!(img.size(), (1600, 900));
            // the deferred image decodes on the host to the same pixels as the branch's decode
            let rgb = img.to_rgb(&DecodeLimits::default()).unwrap();
            assert_eq!((rgb.width, rgb.height), (1600, 900));
        }
        // through the model, as the node, replay and the bench run it: the failure is reported
        // even though the forward failed
        let mut model = NvjpegStandIn { fails: vec![(3, "JPEG: bad Huffman code".into())] };
        let (map, failures) = b.run_model(&mut model, &mut f);
        assert!(map.is_err());
        assert_eq!(failures, vec![(3, "JPEG: bad Huffman code".to_string())]);
        assert!(model.fails.is_empty(), "taken once");
        assert_eq!(f.cameras[3].status, CameraStatus::DecodeError);
        assert_eq!(f.mask, CameraMask(0b11_0101));
        assert!(f.images[3].is_none());
        let s = &b.stats()[3];
        assert_eq!((s.count(CameraStatus::Used), s.count(CameraStatus::DecodeError)), (0, 1));
        assert!(s.last_problem.as_deref().is_some_and(|p| p.contains("bad Huffman code")));
        // a camera that was not used stays as it was
        b.decode_failed(&mut f, 1, "again");
        assert_eq!(b.stats()[1].count(CameraStatus::DecodeError), 1);
        assert_eq!(f.used(), 4);
    }
}
