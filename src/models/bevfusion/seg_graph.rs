//! The BEV map network as one CUDA graph: Swin-T, FPN, view transform, [fuser,] decoder and head
//! (about 200 kernels a frame, launched one by one from the host otherwise) captured once per
//! calibration, image size and camera mask, and replayed per frame.
//!
//! The graph reads its own input buffers and writes its own output buffer: a frame copies its
//! preprocessed images (and the fusion model's LiDAR BEV map, made eagerly before: its sparse
//! shapes change every frame) in, launches the graph, and reads the probabilities from the
//! graph's output. The output is lent, borrowing the graph, so no next launch can overwrite it
//! while it is read. Everything the network allocates inside the graph is freed inside it (graph
//! memory nodes).
//!
//! Before the capture the network runs eagerly twice on the graph's inputs: that loads every
//! kernel, lets cuDNN choose its algorithms, builds the view transform's geometry and the Swin
//! window plan and grows the memory pool, none of which may happen inside a capture. A capture
//! the driver refuses is an error the caller counts; the model then runs eagerly.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::models::bevfusion::head_cuda::CudaBevMaps;
use crate::models::bevfusion::lss::CameraMask;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::image_preprocess::cuda::CudaCameraBatch;
use crate::sensors::calib::camera::Calibration;
use crate::Error;
use cudarc::driver::{sys, CudaGraph, CudaSlice};
use half::f16;

/// What a captured graph is valid for: the calibration (the view transform's geometry is baked
/// in), the image batch's shape and the camera mask (a kernel argument of the pool).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphKey {
    calib: Calibration,
    shape: [usize; 3],
    mask: CameraMask,
}

impl GraphKey {
    pub fn of(calib: &Calibration, batch: &CudaCameraBatch, mask: CameraMask) -> Self {
        Self { calib: calib.clone(), shape: [batch.n, batch.h, batch.w], mask }
    }

    pub fn matches(&self, calib: &Calibration, batch: &CudaCameraBatch, mask: CameraMask) -> bool {
        self.shape == [batch.n, batch.h, batch.w] && self.mask == mask && &self.calib == calib
    }
}

/// Counts of the graph path, for the bench and the diagnostics.
#[derive(Debug, Clone, Default)]
pub struct GraphStatus {
    /// Graphs captured (one per calibration, image size and camera mask seen).
    pub captures: usize,
    /// Frames run as a graph replay.
    pub replays: usize,
    /// Captures the driver refused (those frames ran eagerly).
    pub refused: usize,
    /// Why the last capture was refused.
    pub last_refusal: Option<String>,
    /// The key of the last refusal: frames with it run eagerly without trying again.
    pub(crate) refused_key: Option<GraphKey>,
}

/// One captured network with its input and output buffers.
pub struct MapGraph {
    pub(crate) key: GraphKey,
    images: CudaSlice<f16>,
    lidar_bev: Option<CudaFeatureMap>,
    maps: CudaBevMaps,
    graph: CudaGraph,
}

// SAFETY: CUDA graph objects are not internally synchronised, so calls on one must be serialised
// (the driver API's graph thread-safety rules); they may be made from any thread that binds the
// context, which `CudaGraph::launch`/`upload` do. A `MapGraph` is owned by one `CudaBevSeg` and
// used only through `&mut` (capture, replay), so moving it to another thread keeps every call
// serialised.
unsafe impl Send for MapGraph {}

fn copy_map(dev: &CudaDevice, m: &CudaFeatureMap) -> Result<CudaFeatureMap, Error> {
    // SAFETY: filled by the copy below before any read.
    let mut data = unsafe { dev.alloc_uninit::<f16>(m.data.len(), "the graph's LiDAR BEV input") }?;
    dev.stream.memcpy_dtod(&m.data, &mut data).map_err(cuda_err("copying the LiDAR BEV map"))?;
    CudaFeatureMap::from_slice(m.n, m.h, m.w, m.c, data)
}

impl MapGraph {
    /// Warms `network` (the model's network for this calibration, image size and mask: images
    /// and the LiDAR BEV map in, probabilities out, all enqueued without a host wait) up on
    /// copies of this frame's inputs, then captures it.
    pub(crate) fn capture(
        dev: &CudaDevice,
        calib: &Calibration,
        batch: &CudaCameraBatch,
        mask: CameraMask,
        lidar_bev: Option<&CudaFeatureMap>,
        mut network: impl FnMut(&CudaSlice<f16>, Option<&CudaFeatureMap>) -> Result<CudaBevMaps, Error>,
    ) -> Result<Self, Error> {
        let s = &dev.stream;
        // SAFETY: filled by the copy below before any read.
        let mut images = unsafe { dev.alloc_uninit::<f16>(batch.data.len(), "the graph's image input") }?;
        s.memcpy_dtod(&batch.data, &mut images).map_err(cuda_err("copying the images"))?;
        let lidar = lidar_bev.map(|m| copy_map(dev, m)).transpose()?;
        let mut out_shape = None;
        for _ in 0..2 {
            let maps = network(&images, lidar.as_ref())?;
            out_shape = Some((maps.n, maps.classes, maps.x, maps.y));
        }
        let (n, classes, x, y) = out_shape.ok_or_else(|| Error::Cuda("graph warm-up ran no frame".into()))?;
        let len = n * classes * x * y;
        // SAFETY: the graph's last node writes all `len` values before any read.
        let data = unsafe { dev.alloc_uninit::<f32>(len.max(1), "the graph's output") }?;
        let mut maps = CudaBevMaps { n, classes, x, y, data };
        dev.synchronize()?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| Error::Cuda(format!("CUDA graph: begin capture: {e:?}")))?;
        // the network's buffers are dropped inside the capture: they become the graph's own
        let run = network(&images, lidar.as_ref()).and_then(|out| {
            if out.data.len() < len {
                return Err(Error::Cuda(format!("CUDA graph: the captured frame's maps hold {} values, the warm-up's {len}", out.data.len())));
            }
            s.memcpy_dtod(&out.data.slice(0..len.max(1)), &mut maps.data).map_err(cuda_err("CUDA graph: copying the maps out"))
        });
        // the capture always ends, so the stream is usable again whatever happened inside
        let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
        let graph = match (run, graph) {
            (Ok(()), Ok(Some(g))) => g,
            (run, graph) => {
                let why = match (run, graph) {
                    (Err(e), _) => format!("the captured frame failed: {e}"),
                    (_, Err(e)) => format!("end capture / instantiate: {e:?}"),
                    _ => "the capture recorded nothing".to_string(),
                };
                // Buffers freed inside an aborted capture leave their error in the context, where
                // the next call on any thread would report it as its own: cleared here, named in
                // the refusal.
                let stale = dev.ctx.check_err().err().map(|e| format!(" (cleared from the context: {e:?})")).unwrap_or_default();
                return Err(Error::Cuda(format!("CUDA graph: {why}{stale}")));
            }
        };
        graph.upload().map_err(|e| Error::Cuda(format!("CUDA graph: upload: {e:?}")))?;
        Ok(Self { key: GraphKey::of(calib, batch, mask), images, lidar_bev: lidar, maps, graph })
    }

    /// One frame: its inputs copied in and the graph launched (enqueued on the stream; nothing
    /// waits); the probabilities are in the returned output until the next replay.
    pub(crate) fn replay(&mut self, dev: &CudaDevice, images: &CudaSlice<f16>, lidar_bev: Option<&CudaFeatureMap>) -> Result<&CudaBevMaps, Error> {
        let s = &dev.stream;
        if images.len() != self.images.len() {
            return Err(Error::InvalidInput(format!("CUDA graph: {} image values for a graph of {}", images.len(), self.images.len())));
        }
        // queued before the launch on the same stream: the graph reads this frame's images
        s.memcpy_dtod(images, &mut self.images).map_err(cuda_err("CUDA graph: copying the images in"))?;
        match (lidar_bev, &mut self.lidar_bev) {
            (Some(src), Some(own)) if (src.n, src.h, src.w, src.c) == (own.n, own.h, own.w, own.c) => {
                s.memcpy_dtod(&src.data, &mut own.data).map_err(cuda_err("CUDA graph: copying the LiDAR BEV map in"))?;
            }
            (None, None) => {}
            _ => return Err(Error::InvalidInput("CUDA graph: the LiDAR BEV input does not match the captured one".into())),
        }
        self.graph.launch().map_err(|e| Error::Cuda(format!("CUDA graph: launch: {e:?}")))?;
        Ok(&self.maps)
    }
}
