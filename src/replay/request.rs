//! `sptr replay`'s request (the command's options before anything is loaded) and [`run`],
//! which loads the model, label map and BEV settings, opens the frame processor and replays.

use std::path::{Path, PathBuf};

use super::{
    open_processor, replay, replay_with, LabelSource, ProgressMode, ReplayError, ReplayOptions,
    ReplayOutcome, Shard, WeightsSource,
};
use crate::device::{Device, DeviceChoice};
use crate::ops::label_grid::cpu::BevGridParams;
use crate::models::sphereformer::config::{ModelConfig, ModelYaml};
use crate::frame::params::{NodeParams, DEFAULT_NODE_PARAMS_FILE};
use crate::eval::labels::LabelMap;
use crate::frame::outputs::OutputTopics;
use super::cameras::absolute_topic;
use super::CameraReplayOptions;
use crate::frame::cameras::BranchConfig;
use crate::sensors::calib::file::CalibrationFile;
use crate::models::bevfusion::map::{class_colour, NUSCENES_MAP_CLASSES};
use crate::frame::map_messages::MapStyle;
use crate::frame::params::IntrinsicsFrom;
use crate::frame::map_model::{SegMapModel, SegWeightsSource};

/// The node params file for the nuScenes SphereFormer (`config/models/sphereformer_nuscenes.yaml`),
/// named when the default parameters do not fit a model.
const NUSCENES_PARAMS: &str = "config/perception_nuscenes.yaml";

/// BEV grid settings and frame id, as the node takes them from its parameters: the `bev`
/// section of the node params file `params` when given, else of the node's default parameters
/// ([`NodeParams::defaults`]: `config/perception.yaml`, built in; ±51.2 m at 0.4 m, the
/// SemanticKITTI model's object classes as obstacles, frame `base_link`), so a replay and the
/// node under the same parameters give the same BEV messages. Colours: the model's palette.
///
/// Every obstacle class must be a class of `model`, as the node requires (it exits at start
/// otherwise). The default ids are class ids of the SemanticKITTI model the default parameters
/// are made for: a model with fewer classes is an error asking for `--params` (for the nuScenes
/// model, `config/perception_nuscenes.yaml`). As in the node, ids are not checked against class
/// names: a model with as many classes but another class list needs its own params file too.
pub fn bev_params(
    model: &ModelYaml,
    params: Option<(&Path, &NodeParams)>,
) -> Result<(BevGridParams, String), ReplayError> {
    let defaults;
    let node = match params {
        Some((_, p)) => p,
        None => {
            defaults = NodeParams::defaults()
                .map_err(|e| ReplayError::Setup(format!("the node's default parameters: {e}")))?;
            &defaults
        }
    };
    let bev = &node.bev;
    if let Some(c) = bev
        .obstacle_classes
        .iter()
        .find(|&&c| c as usize >= model.classes)
    {
        let n = model.classes;
        return Err(ReplayError::Setup(match params {
            Some((path, _)) => format!(
                "{}: bev.obstacle_classes has class {c} but the model has {n} classes; give a params file made for this model",
                path.display()
            ),
            None => format!(
                "without --params, replay uses the node's default parameters ({DEFAULT_NODE_PARAMS_FILE}, made for the model {}), \
                 whose bev.obstacle_classes has class {c}, but this model has {n} classes: give --params with a node params \
                 file made for this model ({NUSCENES_PARAMS} for the nuScenes SphereFormer)",
                node.model.config
            ),
        }));
    }
    let p = crate::frame::processor::bev_params(model, bev.range, bev.resolution, &bev.obstacle_classes);
    p.validate()
        .map_err(|e| ReplayError::Setup(format!("BEV grid: {e}")))?;
    Ok((p, bev.frame_id.clone()))
}

/// The camera branch of a replay from the params file `path` (`None` when its `input.cameras` is
/// empty): the cameras' topics as the node `sptr` resolves them, the calibration file (relative
/// to the params file), the map classes of `camera.model_config` (nuScenes' six without one)
/// with `camera.map_thresholds` and upstream's class colours ([`class_colour`]).
pub fn camera_options(path: &Path, p: &NodeParams) -> Result<Option<CameraReplayOptions>, ReplayError> {
    if p.input.cameras.is_empty() {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let resolve = |v: &str| -> Option<PathBuf> { (!v.is_empty()).then(|| dir.join(v)) };
    let calibration_file = match resolve(&p.camera.calibration_file) {
        Some(f) => Some(CalibrationFile::load(&f).map_err(|e| ReplayError::Setup(format!("{}: camera.calibration_file: {e}", path.display())))?),
        None => None,
    };
    let map_classes = match resolve(&p.camera.model_config) {
        Some(f) => map_classes(&f).map_err(|e| ReplayError::Setup(format!("{}: camera.model_config: {e}", path.display())))?,
        None => NUSCENES_MAP_CLASSES.iter().map(|s| s.to_string()).collect(),
    };
    let thresholds = p.map_thresholds(map_classes.len()).map_err(|e| ReplayError::Setup(format!("{}: {e}", path.display())))?;
    let palette: Vec<[u8; 3]> = map_classes.iter().map(|c| class_colour(c)).collect();
    let mut inputs = p.camera_inputs();
    for c in &mut inputs {
        c.image_topic = absolute_topic(&c.image_topic);
        c.camera_info_topic = absolute_topic(&c.camera_info_topic);
    }
    let branch = BranchConfig {
        names: p.input.cameras.clone(),
        use_projection: inputs.iter().map(|c| c.intrinsics == IntrinsicsFrom::P).collect(),
        max_camera_lidar_delay_s: p.camera.max_camera_lidar_delay,
        max_distortion: p.camera.max_distortion,
        sweeps: p.lidar.sweeps,
        odom_frame: p.lidar.odom_frame.clone(),
        calibration_file,
    };
    Ok(Some(CameraReplayOptions {
        inputs,
        branch,
        map_classes,
        map_style: Some(MapStyle { thresholds, palette }),
        map_ground_truth: None,
        beside_lidar: p.camera.beside_lidar,
    }))
}

/// `map_classes` of a BEVFusion seg model YAML.
fn map_classes(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let v: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let list = v
        .get("map_classes")
        .and_then(|c| c.as_sequence())
        .ok_or_else(|| format!("{}: no `map_classes` list", path.display()))?;
    list.iter()
        .map(|c| c.as_str().map(str::to_string).ok_or_else(|| format!("{}: `map_classes` must be names", path.display())))
        .collect()
}

/// What `sptr replay` was asked, before anything is loaded.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub bag: PathBuf,
    pub model: PathBuf,
    pub weights: WeightsSource,
    pub device: DeviceChoice,
    pub lidar_topic: Option<String>,
    pub labels: Option<LabelSource>,
    pub label_map: Option<PathBuf>,
    pub ignore: Option<u32>,
    /// Node params file whose `bev` section sets the BEV grid (`None`: the node's defaults,
    /// see [`bev_params`]).
    pub params: Option<PathBuf>,
    pub out: PathBuf,
    pub bev_png_frames: Vec<u64>,
    pub shard: Shard,
    pub progress: ProgressMode,
    /// The CUDA network's precision, overriding the model YAML's `precision` (`None`: the YAML's).
    pub precision: Option<crate::device::storage::Precision>,
    /// Overrides the params file's `camera.model_config` (a BEVFusion seg model YAML).
    pub camera_model: Option<PathBuf>,
    /// Overrides `camera.model_weights`: a safetensors file or `random:<seed>`.
    pub camera_weights: Option<String>,
    /// A directory of BEV map ground-truth masks ([`super::map_eval`]).
    pub map_ground_truth: Option<PathBuf>,
}

/// The BEV map model of a replay: `camera.model_config` / `camera.model_weights` of the params
/// file `path` (relative to it; weights may be `random:<seed>`), each overridden by the request;
/// `None` without a model config. On `device`, the frame processor's.
pub fn open_map_model(req: &ReplayRequest, path: &Path, p: &NodeParams, device: Device) -> Result<Option<SegMapModel>, ReplayError> {
    open_map_model_with(req.camera_model.as_deref(), req.camera_weights.as_deref(), path, p, device)
}

/// [`open_map_model`] with the overrides given one by one (`sptr bench pipeline --cameras`).
pub fn open_map_model_with(
    camera_model: Option<&Path>,
    camera_weights: Option<&str>,
    path: &Path,
    p: &NodeParams,
    device: Device,
) -> Result<Option<SegMapModel>, ReplayError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let config = match (camera_model, p.camera.model_config.as_str()) {
        (Some(m), _) => m.to_path_buf(),
        (None, "") => return Ok(None),
        (None, v) => dir.join(v),
    };
    let weights_value = camera_weights.map_or_else(|| p.camera.model_weights.clone(), str::to_string);
    let weights = match SegWeightsSource::parse(&weights_value) {
        Ok(SegWeightsSource::File(f)) if camera_weights.is_none() => SegWeightsSource::File(dir.join(f)),
        Ok(w) => w,
        Err(e) => return Err(ReplayError::Setup(format!("{e} (or pass --camera-weights FILE|random:SEED)"))),
    };
    let mut model = SegMapModel::open(&config, &weights, device).map_err(|e| ReplayError::Setup(format!("BEV map model: {e}")))?;
    if let Some(w) = model.apply_cuda_graph_param(p.camera.cuda_graph) {
        eprintln!("warning: {w}");
    }
    Ok(Some(model))
}

/// The LiDAR topic to replay: `--lidar-topic`, else the params file's `topics.input_points`
/// when it names another topic than the node's default (the node would subscribe there), else
/// `None` (the default topic if the bag has it, else the bag's only PointCloud2 topic).
fn lidar_topic(req: &ReplayRequest, params: Option<&NodeParams>) -> Option<String> {
    if let Some(t) = &req.lidar_topic {
        return Some(t.clone());
    }
    let from_params = absolute_topic(&params?.topics.input_points);
    (from_params != super::DEFAULT_LIDAR_TOPIC).then_some(from_params)
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
    let mut model = ModelConfig::load(&req.model)
        .map_err(|e| ReplayError::Setup(format!("--model: {e}")))?
        .yaml;
    if let Some(p) = req.precision {
        model.precision = p;
    }
    let params = match &req.params {
        Some(p) => Some((
            p.as_path(),
            NodeParams::load(p).map_err(|e| ReplayError::Setup(format!("--params: {e}")))?,
        )),
        None => None,
    };
    let (bev, bev_frame_id) = bev_params(&model, params.as_ref().map(|(p, n)| (*p, n)))?;
    let mut cameras = match &params {
        Some((path, p)) => camera_options(path, p)?,
        None => None,
    };
    if cameras.is_none() && (req.camera_model.is_some() || req.camera_weights.is_some() || req.map_ground_truth.is_some()) {
        return Err(ReplayError::Setup(
            "--camera-model/--camera-weights/--map-ground-truth need the camera branch: give --params with input.cameras set (e.g. config/perception_nuscenes_cameras.yaml)".into(),
        ));
    }
    let (mut processor, device, device_name) =
        open_processor(req.device, &model, &req.model, &req.weights, &bev)?;
    // as the node: `on_overflow` of the params file (default `drop`)
    processor.set_on_overflow(params.as_ref().map(|(_, p)| p.on_overflow).unwrap_or_default());
    let mut map_model = match (&params, &mut cameras) {
        (Some((path, p)), Some(c)) => {
            let m = open_map_model(req, path, p, device)?;
            if let Some(m) = &m {
                if m.classes() != c.map_classes.as_slice() {
                    // the map classes of an overriding YAML
                    c.map_classes = m.classes().to_vec();
                    let thresholds = p.map_thresholds(c.map_classes.len()).map_err(|e| ReplayError::Setup(format!("{}: {e}", path.display())))?;
                    let palette = c.map_classes.iter().map(|n| class_colour(n)).collect();
                    c.map_style = Some(MapStyle { thresholds, palette });
                }
            }
            c.map_ground_truth = req.map_ground_truth.clone();
            if m.is_none() && req.map_ground_truth.is_some() {
                return Err(ReplayError::Setup("--map-ground-truth needs a BEV map model (camera.model_config or --camera-model)".into()));
            }
            m
        }
        _ => None,
    };
    let opts = ReplayOptions {
        bag: req.bag.clone(),
        lidar_topic: lidar_topic(req, params.as_ref().map(|(_, p)| p)),
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
        cameras,
    };
    match map_model.as_mut() {
        Some(m) => replay_with(&mut processor, &model, &opts, Some(m as &mut (dyn crate::frame::cameras::BevMapModel + Send))),
        None => replay(&mut processor, &model, &opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository ([`crate::repo_root`]: test binaries may run away from their build).
    fn root() -> std::path::PathBuf {
        crate::repo_root()
    }

    fn model(name: &str) -> ModelYaml {
        ModelConfig::load(&root().join("config/models").join(name))
            .unwrap()
            .yaml
    }

    /// Without --params: the BEV grid and frame the node gets from its default params file,
    /// `config/perception.yaml` (the installed copy the launch file passes is this file).
    #[test]
    fn default_bev_params_are_the_nodes() {
        let kitti = model("sphereformer_semantickitti.yaml");
        let (bev, frame) = bev_params(&kitti, None).unwrap();
        let file = root().join("config/perception.yaml");
        let node = NodeParams::load(&file).unwrap();
        assert_eq!(NodeParams::defaults().unwrap(), node);
        // What the node builds from them (`ros::node::main`).
        let node_bev = crate::frame::processor::bev_params(
            &kitti,
            node.bev.range,
            node.bev.resolution,
            &node.bev.obstacle_classes,
        );
        assert_eq!(
            (&bev, frame.as_str()),
            (&node_bev, node.bev.frame_id.as_str())
        );
        assert_eq!(
            bev_params(&kitti, Some((&file, &node))).unwrap(),
            (bev.clone(), frame.clone())
        );
        // And what they are today (docs/replay.md documents them).
        assert_eq!(bev.range, [-51.2, -51.2, 51.2, 51.2]);
        assert_eq!(bev.resolution, 0.4);
        assert_eq!(frame, "base_link");
        let names: Vec<&str> = bev
            .obstacle_classes
            .iter()
            .map(|&c| kitti.class_names[c as usize].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "car",
                "bicycle",
                "motorcycle",
                "truck",
                "other-vehicle",
                "person",
                "bicyclist",
                "motorcyclist",
                "building",
                "fence",
                "trunk",
                "pole",
                "traffic-sign"
            ]
        );
    }

    /// The six-camera params file gives the sample bag's topics, the calibration file and the
    /// six map classes; a missing calibration file and a threshold list of the wrong length are
    /// errors naming the parameter; no cameras, no camera branch.
    #[test]
    fn camera_options_from_the_params_file() {
        let file = root().join("config/perception_nuscenes_cameras.yaml");
        let p = NodeParams::load(&file).unwrap();
        let c = camera_options(&file, &p).unwrap().unwrap();
        assert_eq!(c.inputs[0].image_topic, "/sptr/input/cameras/CAM_FRONT/image/compressed");
        assert_eq!(c.inputs[5].camera_info_topic, "/sptr/input/cameras/CAM_BACK_RIGHT/camera_info");
        assert_eq!(c.map_classes, NUSCENES_MAP_CLASSES.map(String::from).to_vec());
        assert_eq!(c.branch.calibration_file.as_ref().map(|f| f.cameras.len()), Some(6));
        assert_eq!(c.map_style.as_ref().map(|s| s.thresholds.clone()), Some(vec![0.5; 6]));
        let mut bad = p.clone();
        bad.camera.calibration_file = "nowhere.yaml".into();
        let e = camera_options(&file, &bad).unwrap_err().to_string();
        assert!(e.contains("camera.calibration_file") && e.contains("nowhere.yaml"), "{e}");
        let mut bad = p.clone();
        bad.camera.map_thresholds = vec![0.5; 5];
        let e = camera_options(&file, &bad).unwrap_err().to_string();
        assert!(e.contains("camera.map_thresholds") && e.contains("6 classes"), "{e}");
        let mut none = p.clone();
        none.input.cameras.clear();
        assert!(camera_options(&file, &none).unwrap().is_none());
    }

    /// The default obstacle ids are SemanticKITTI's: the nuScenes model (16 classes) needs
    /// --params, as the node would exit on them; its params file works.
    #[test]
    fn default_params_that_do_not_fit_the_model_are_a_clear_error() {
        let nus = model("sphereformer_nuscenes.yaml");
        let e = bev_params(&nus, None).unwrap_err().to_string();
        assert!(
            e.contains("--params") && e.contains(NUSCENES_PARAMS) && e.contains("16 classes"),
            "{e}"
        );
        let file = root().join(NUSCENES_PARAMS);
        let node = NodeParams::load(&file).unwrap();
        let (bev, frame) = bev_params(&nus, Some((&file, &node))).unwrap();
        assert_eq!(bev.classes, 16);
        assert_eq!(frame, "", "the nuScenes params file stamps the grids with the cloud's frame");
        let mut bad = node.clone();
        bad.bev.obstacle_classes.push(16);
        let e = bev_params(&nus, Some((&file, &bad)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("perception_nuscenes.yaml") && e.contains("class 16"),
            "{e}"
        );
    }
}
