//! `sptr replay`'s request (the command's options before anything is loaded) and [`run`],
//! which loads the model, label map and BEV settings, opens the frame processor and replays.

use std::path::{Path, PathBuf};

use super::{
    open_processor, replay, Device, LabelSource, ProgressMode, ReplayError, ReplayOptions,
    ReplayOutcome, Shard, WeightsSource,
};
use crate::bev::label_grid::BevGridParams;
use crate::config::{ModelConfig, ModelYaml, NodeParams};
use crate::eval::labels::LabelMap;
use crate::outputs::OutputTopics;

/// Classes that are not obstacles by default: ground and vegetation of the SemanticKITTI and
/// nuScenes class lists (what `config/perception.yaml` leaves out for SemanticKITTI).
const NOT_OBSTACLE: &[&str] = &[
    "road",
    "parking",
    "sidewalk",
    "other-ground",
    "terrain",
    "vegetation",
    "driveable_surface",
    "other_flat",
];

/// BEV grid settings and frame id: the `bev` section of a node params file when given (its
/// obstacle ids must exist in the model), else the range and resolution of
/// `config/perception.yaml` (±51.2 m, 0.4 m), every class but ground and vegetation as an
/// obstacle, and the cloud's own frame. Colours: the model's palette.
pub fn bev_params(
    model: &ModelYaml,
    params: Option<(&Path, &NodeParams)>,
) -> Result<(BevGridParams, String), ReplayError> {
    let (range, resolution, obstacles, frame_id) = match params {
        Some((path, p)) => {
            if let Some(c) = p
                .bev
                .obstacle_classes
                .iter()
                .find(|&&c| c as usize >= model.classes)
            {
                return Err(ReplayError::Setup(format!(
                    "{}: bev.obstacle_classes has class {c} but the model has {} classes; give a params file made for this model",
                    path.display(),
                    model.classes
                )));
            }
            (
                p.bev.range,
                p.bev.resolution,
                p.bev.obstacle_classes.clone(),
                p.bev.frame_id.clone(),
            )
        }
        None => {
            let obstacles: Vec<u8> = model
                .class_names
                .iter()
                .enumerate()
                .filter(|(_, n)| !NOT_OBSTACLE.contains(&n.as_str()))
                .map(|(i, _)| i as u8)
                .collect();
            ([-51.2, -51.2, 51.2, 51.2], 0.4, obstacles, String::new())
        }
    };
    let p = crate::perception::bev_params(model, range, resolution, &obstacles);
    p.validate()
        .map_err(|e| ReplayError::Setup(format!("BEV grid: {e}")))?;
    Ok((p, frame_id))
}

/// What `sptr replay` was asked, before anything is loaded.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub bag: PathBuf,
    pub model: PathBuf,
    pub weights: WeightsSource,
    pub device: Device,
    pub lidar_topic: Option<String>,
    pub labels: Option<LabelSource>,
    pub label_map: Option<PathBuf>,
    pub ignore: Option<u32>,
    /// Node params file whose `bev` section sets the BEV grid.
    pub params: Option<PathBuf>,
    pub out: PathBuf,
    pub bev_png_frames: Vec<u64>,
    pub shard: Shard,
    pub progress: ProgressMode,
}

/// Loads the model, label map and BEV settings of `req` and replays.
pub fn run(req: &ReplayRequest) -> Result<ReplayOutcome, ReplayError> {
    let mut label_map = match &req.label_map {
        Some(p) => LabelMap::load(p)?,
        None => LabelMap::identity(),
    };
    if let Some(i) = req.ignore {
        label_map.ignore = i;
    }
    if req.labels.is_none() && (req.label_map.is_some() || req.ignore.is_some()) {
        return Err(ReplayError::Setup(
            "--label-map/--ignore need ground truth: add --labels-topic or --labels-dir".into(),
        ));
    }
    let model = ModelConfig::load(&req.model)
        .map_err(|e| ReplayError::Setup(format!("--model: {e}")))?
        .yaml;
    let params = match &req.params {
        Some(p) => Some((
            p.as_path(),
            NodeParams::load(p).map_err(|e| ReplayError::Setup(format!("--params: {e}")))?,
        )),
        None => None,
    };
    let (bev, bev_frame_id) = bev_params(&model, params.as_ref().map(|(p, n)| (*p, n)))?;
    let (mut processor, device_name) =
        open_processor(req.device, &model, &req.model, &req.weights, &bev)?;
    let opts = ReplayOptions {
        bag: req.bag.clone(),
        lidar_topic: req.lidar_topic.clone(),
        labels: req.labels.clone(),
        label_map,
        out: req.out.clone(),
        bev_frame_id,
        bev_png_frames: req.bev_png_frames.iter().copied().collect(),
        shard: req.shard,
        topics: OutputTopics::default(),
        model_name: req.model.display().to_string(),
        weights_name: req.weights.describe(),
        device_name,
        progress: req.progress,
    };
    replay(&mut processor, &model, &opts)
}
