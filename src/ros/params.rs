//! The node's parameters: the `--params-file` files checked before ROS starts, then the
//! parameters r2r actually gives the node (files and `-p name:=value` overrides, as dotted
//! names) merged and validated again with [`NodeParams::parse`].
//!
//! `r2r::Context::create()` panics on a params file it cannot parse, so [`validate_params_files`]
//! runs first and turns every problem into an error that names the file and the parameter.

use std::path::{Path, PathBuf};

use r2r::ParameterValue;
use serde_yaml::{Mapping, Value};

use crate::error::ConfigError;
use crate::frame::params::NodeParams;

/// Parameters the node reads but [`NodeParams`] does not describe (ROS-wide ones).
pub const ROS_PARAMS: &[&str] = &["use_sim_time"];

/// The paths given as `--params-file <path>` after `--ros-args` (in order), from `args`
/// (the process arguments without the program name).
pub fn params_files(args: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut in_ros_args = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--ros-args" => in_ros_args = true,
            "--" => in_ros_args = false,
            "--params-file" if in_ros_args => {
                if let Some(p) = args.get(i + 1) {
                    out.push(PathBuf::from(p));
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether `--params-file` is the last argument of a `--ros-args` section (rcl would fail on it).
pub fn dangling_params_file(args: &[String]) -> bool {
    args.last().is_some_and(|a| a == "--params-file") && args.iter().any(|a| a == "--ros-args")
}

/// The node's name and namespace as the command line sets them (`-r __node:=`/`__name:=`,
/// `-r __ns:=` after `--ros-args`); defaults `sptr` and `/`.
pub fn node_name_from_args(args: &[String]) -> (String, String) {
    let (mut name, mut ns) = ("sptr".to_string(), "/".to_string());
    let mut in_ros_args = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--ros-args" => in_ros_args = true,
            "--" => in_ros_args = false,
            "-r" | "--remap" if in_ros_args => {
                if let Some(rule) = args.get(i + 1) {
                    if let Some(v) = rule
                        .strip_prefix("__node:=")
                        .or_else(|| rule.strip_prefix("__name:="))
                    {
                        name = v.to_string();
                    } else if let Some(v) = rule.strip_prefix("__ns:=") {
                        ns = if v.starts_with('/') {
                            v.to_string()
                        } else {
                            format!("/{v}")
                        };
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    (name, ns)
}

/// Whether a params file's top-level key applies to the node `name` in `ns` (the keys r2r
/// matches: `/**`, `**`, the node name, the fully qualified name).
fn applies(key: &str, name: &str, ns: &str) -> bool {
    let fqn = if ns == "/" {
        format!("/{name}")
    } else {
        format!("{}/{name}", ns.trim_end_matches('/'))
    };
    key == "/**" || key == "**" || key == name || key == fqn
}

/// A serde "missing field" error: a params file may leave values to another file or to `-p`.
fn is_missing_field(e: &ConfigError) -> bool {
    matches!(e, ConfigError::Parse { reason, .. } if reason.contains("missing field"))
}

/// Checks the params files before rcl reads them (it panics on a malformed one) and returns,
/// per file, the `ros__parameters` of the sections that apply to the node (see [`applies`]),
/// for [`merged`].
///
/// Each file must be a YAML mapping of node names to `ros__parameters:` mappings. A file with
/// the single section `sptr:` (like `config/perception.yaml`) is validated alone with
/// [`NodeParams::load`]; then the files together with [`merged`]. Values a file leaves out
/// (e.g. launch_ros's `/**:` file of overrides) are only required after the `-p` overrides
/// are in, by the node's second validation.
pub fn validate_params_files(
    files: &[PathBuf],
    name: &str,
    ns: &str,
) -> Result<Vec<(PathBuf, Mapping)>, ConfigError> {
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let file = f.display().to_string();
        let text = std::fs::read_to_string(f).map_err(|e| ConfigError::Read {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        let v: Value = serde_yaml::from_str(&text).map_err(|e| ConfigError::Parse {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        let root = v.as_mapping().ok_or_else(|| ConfigError::Parse {
            file: file.clone(),
            reason: "must be a mapping of node names to `ros__parameters:` (e.g. `sptr: ros__parameters: ...`)".into(),
        })?;
        let mut sections = Mapping::new();
        let mut keys = Vec::new();
        for (k, section) in root {
            let Some(k) = k.as_str() else {
                return Err(ConfigError::Parse {
                    file: file.clone(),
                    reason: format!("top-level key {k:?} is not a node name"),
                });
            };
            let params = section
                .get("ros__parameters")
                .and_then(Value::as_mapping)
                .ok_or_else(|| ConfigError::Parse {
                    file: file.clone(),
                    reason: format!("`{k}` has no `ros__parameters:` mapping"),
                })?;
            if applies(k, name, ns) {
                keys.push(k.to_string());
                for (pk, pv) in params {
                    sections.insert(pk.clone(), pv.clone());
                }
            }
        }
        if keys == ["sptr"] {
            if let Err(e) = NodeParams::load(f) {
                if !is_missing_field(&e) {
                    return Err(e);
                }
            }
        }
        out.push((f.clone(), sections));
    }
    if !out.is_empty() {
        let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        if let Err(e) = merged(&out, &[], &list.join(" + ")) {
            if !is_missing_field(&e) {
                return Err(e);
            }
        }
    }
    Ok(out)
}

fn to_yaml(v: &ParameterValue) -> Option<Value> {
    Some(match v {
        ParameterValue::NotSet => return None,
        ParameterValue::Bool(b) => Value::Bool(*b),
        ParameterValue::Integer(i) => Value::Number((*i).into()),
        ParameterValue::Double(d) => Value::Number((*d).into()),
        ParameterValue::String(s) => Value::String(s.clone()),
        ParameterValue::BoolArray(a) => {
            Value::Sequence(a.iter().map(|b| Value::Bool(*b)).collect())
        }
        ParameterValue::ByteArray(a) => Value::Sequence(
            a.iter()
                .map(|b| Value::Number((*b as u64).into()))
                .collect(),
        ),
        ParameterValue::IntegerArray(a) => {
            Value::Sequence(a.iter().map(|i| Value::Number((*i).into())).collect())
        }
        ParameterValue::DoubleArray(a) => {
            Value::Sequence(a.iter().map(|d| Value::Number((*d).into())).collect())
        }
        ParameterValue::StringArray(a) => {
            Value::Sequence(a.iter().map(|s| Value::String(s.clone())).collect())
        }
    })
}

/// Sets `dotted` (e.g. `bev.resolution`) in the nested mapping `m`.
fn set_dotted(m: &mut Mapping, dotted: &str, value: Value) {
    let mut parts = dotted.split('.').peekable();
    let mut cur = m;
    while let Some(p) = parts.next() {
        let key = Value::String(p.to_string());
        if parts.peek().is_none() {
            cur.insert(key, value);
            return;
        }
        let entry = cur
            .entry(key)
            .or_insert_with(|| Value::Mapping(Mapping::new()));
        if !entry.is_mapping() {
            *entry = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(next) = entry else { return };
        cur = next;
    }
}

/// The node's parameters: the params files' values (in order), overlaid with every parameter
/// r2r gives the node (`(dotted name, value)`; the same files plus `-p` overrides), validated
/// with [`NodeParams::parse`]. `source` names where they came from in error messages.
///
/// Starting from the files' own mappings keeps values rcl's YAML parser does not hand over
/// (an empty list such as `cameras: []`).
pub fn merged(
    files: &[(PathBuf, Mapping)],
    ros: &[(String, ParameterValue)],
    source: &str,
) -> Result<NodeParams, ConfigError> {
    let mut m = Mapping::new();
    for (_, fm) in files {
        for (k, v) in fm {
            if let Some(k) = k.as_str() {
                flatten_into(&mut m, k, v);
            }
        }
    }
    for (name, v) in ros {
        if ROS_PARAMS.contains(&name.as_str()) {
            continue;
        }
        if let Some(v) = to_yaml(v) {
            set_dotted(&mut m, name, v);
        }
    }
    let mut node = Mapping::new();
    node.insert("ros__parameters".into(), Value::Mapping(m));
    let mut root = Mapping::new();
    root.insert("sptr".into(), Value::Mapping(node));
    let text = serde_yaml::to_string(&Value::Mapping(root)).map_err(|e| ConfigError::Parse {
        file: source.to_string(),
        reason: e.to_string(),
    })?;
    NodeParams::parse(&text, source).map_err(|e| match e {
        // Line numbers would point into the text built here, not into a file.
        ConfigError::Parse { file, reason } => ConfigError::Parse {
            file,
            reason: strip_location(&reason),
        },
        other => other,
    })
}

/// `reason` without serde_yaml's " at line N column M".
fn strip_location(reason: &str) -> String {
    let Some(i) = reason.find(" at line ") else {
        return reason.to_string();
    };
    let digits = |t: &str| t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let rest = &reason[i + " at line ".len()..];
    let n = digits(rest);
    let Some(after) = rest[n..].strip_prefix(" column ").filter(|_| n > 0) else {
        return reason.to_string();
    };
    let m = digits(after);
    if m == 0 {
        return reason.to_string();
    }
    format!("{}{}", &reason[..i], &after[m..])
}

/// Copies `v` under `prefix` into `m`, nested mappings merged key by key (a later file
/// overrides single values, as rcl does).
fn flatten_into(m: &mut Mapping, prefix: &str, v: &Value) {
    if ROS_PARAMS.contains(&prefix) {
        return;
    }
    match v {
        Value::Mapping(inner) => {
            for (k, v) in inner {
                if let Some(k) = k.as_str() {
                    flatten_into(m, &format!("{prefix}.{k}"), v);
                }
            }
        }
        other => set_dotted(m, prefix, other.clone()),
    }
}

/// `model.config` as a path. A relative path is resolved against the directory of the params
/// file it came from (the last file that sets it, as `config/perception.yaml` documents), or
/// against the working directory when it came from a `-p` override (or there is no file).
pub fn model_config_path(params: &NodeParams, files: &[(PathBuf, Mapping)]) -> PathBuf {
    resolve_path("model", "config", &params.model.config, files)
}

/// `model.weights` as a path, resolved as [`model_config_path`] resolves `model.config`.
pub fn weights_path(params: &NodeParams, files: &[(PathBuf, Mapping)]) -> PathBuf {
    resolve_path("model", "weights", &params.model.weights, files)
}

/// `camera.model_config` as a path (resolved as [`model_config_path`]); `None` when empty.
pub fn camera_model_path(params: &NodeParams, files: &[(PathBuf, Mapping)]) -> Option<PathBuf> {
    let v = &params.camera.model_config;
    (!v.is_empty()).then(|| resolve_path("camera", "model_config", v, files))
}

/// `camera.model_weights` as a path (resolved as [`model_config_path`]); `None` when empty.
pub fn camera_weights_path(params: &NodeParams, files: &[(PathBuf, Mapping)]) -> Option<PathBuf> {
    let v = &params.camera.model_weights;
    (!v.is_empty()).then(|| resolve_path("camera", "model_weights", v, files))
}

/// `camera.calibration_file` as a path (resolved as [`model_config_path`]); `None` when empty.
pub fn calibration_file_path(params: &NodeParams, files: &[(PathBuf, Mapping)]) -> Option<PathBuf> {
    let v = &params.camera.calibration_file;
    (!v.is_empty()).then(|| resolve_path("camera", "calibration_file", v, files))
}

/// The path parameter `<section>.<key>` (final value `value`), relative paths resolved against
/// the params file that set that value, else the working directory.
fn resolve_path(section: &str, key: &str, value: &str, files: &[(PathBuf, Mapping)]) -> PathBuf {
    let p = Path::new(value);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let dotted = format!("{section}.{key}");
    let set_by = |m: &Mapping| -> Option<String> {
        if let Some(v) = m.get(dotted.as_str()) {
            return v.as_str().map(str::to_string);
        }
        m.get(section)?.get(key)?.as_str().map(str::to_string)
    };
    let from_file = files
        .iter()
        .rev()
        .find_map(|(f, m)| set_by(m).map(|v| (f, v)));
    match from_file {
        Some((f, v)) if v == value => match f.parent() {
            Some(dir) => dir.join(p),
            None => p.to_path_buf(),
        },
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "sptr:\n  ros__parameters:\n    device: cuda\n    model:\n      config: models/m.yaml\n      weights: \"\"\n    input:\n      qos_depth: 1\n      cameras: []\n    bev:\n      frame_id: base_link\n      range: [-51.2, -51.2, 51.2, 51.2]\n      resolution: 0.4\n      obstacle_classes: [0, 1]\n    budget:\n      processing_ms: 100.0\n      error_after_s: 2.0\n";

    fn file_mapping() -> Vec<(PathBuf, Mapping)> {
        let v: Value = serde_yaml::from_str(FILE).unwrap();
        vec![(
            PathBuf::from("/cfg/p.yaml"),
            v["sptr"]["ros__parameters"].as_mapping().unwrap().clone(),
        )]
    }

    #[test]
    fn finds_params_files_only_after_ros_args() {
        let a: Vec<String> = [
            "--params-file",
            "x",
            "--ros-args",
            "-r",
            "__ns:=/a",
            "--params-file",
            "/p.yaml",
            "-p",
            "device:=cpu",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(params_files(&a), vec![PathBuf::from("/p.yaml")]);
    }

    #[test]
    fn node_name_and_sections() {
        let a: Vec<String> = [
            "--ros-args",
            "-r",
            "__node:=lidar_seg",
            "-r",
            "__ns:=perception",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            node_name_from_args(&a),
            ("lidar_seg".to_string(), "/perception".to_string())
        );
        assert!(
            applies("/**", "sptr", "/x")
                && applies("sptr", "sptr", "/x")
                && applies("/x/sptr", "sptr", "/x")
        );
        assert!(!applies("other", "sptr", "/") && !applies("/y/sptr", "sptr", "/x"));
        assert_eq!(strip_location("sptr.ros__parameters.bev: unknown field `x`, expected one of `a` at line 12 column 7"),
                   "sptr.ros__parameters.bev: unknown field `x`, expected one of `a`");
    }

    #[test]
    fn launch_style_partial_file_is_merged() {
        let dir = std::env::temp_dir().join(format!("sptr_params_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let full = dir.join("p.yaml");
        std::fs::write(&full, FILE).unwrap();
        let over = dir.join("launch.yaml");
        std::fs::write(&over, "/**:\n  ros__parameters:\n    device: cpu\n    model.weights: w.safetensors\n    use_sim_time: false\n").unwrap();
        let maps = validate_params_files(&[full.clone(), over.clone()], "sptr", "/").unwrap();
        let p = merged(&maps, &[], "t").unwrap();
        assert_eq!(p.device, crate::device::DeviceChoice::Cpu);
        assert_eq!(p.model.weights, "w.safetensors");
        // The overrides file alone is incomplete: not an error before ROS (`-p` may complete it).
        assert!(validate_params_files(std::slice::from_ref(&over), "sptr", "/").is_ok());
        std::fs::write(
            &over,
            "/**:\n  ros__parameters:\n    bev:\n      resolution: 0\n",
        )
        .unwrap();
        let e = validate_params_files(&[full.clone(), over.clone()], "sptr", "/").unwrap_err();
        assert!(
            e.to_string().contains("bev.resolution") && e.to_string().contains("launch.yaml"),
            "{e}"
        );
        std::fs::write(&over, "sptr: [1, 2\n").unwrap();
        let e = validate_params_files(std::slice::from_ref(&over), "sptr", "/").unwrap_err();
        assert!(e.to_string().contains("launch.yaml"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn overrides_take_effect_and_are_validated() {
        let files = file_mapping();
        let p = merged(
            &files,
            &[("device".into(), ParameterValue::String("cpu".into()))],
            "t",
        )
        .unwrap();
        assert_eq!(p.device, crate::device::DeviceChoice::Cpu);
        assert_eq!(p.input.cameras, Vec::<String>::new());
        let p = merged(
            &files,
            &[("budget.processing_ms".into(), ParameterValue::Integer(50))],
            "t",
        )
        .unwrap();
        assert_eq!(p.budget.processing_ms, 50.0);
        assert!(p.camera.beside_lidar);
        let p = merged(&files, &[("camera.beside_lidar".into(), ParameterValue::Bool(false))], "t").unwrap();
        assert!(!p.camera.beside_lidar, "-p camera.beside_lidar:=false (the TF camera test's node)");
        let p = merged(&files, &[("camera.cuda_graph".into(), ParameterValue::Bool(true))], "t").unwrap();
        assert!(p.camera.cuda_graph, "-p camera.cuda_graph:=true");
        let e = merged(
            &files,
            &[("bev.resolution".into(), ParameterValue::Double(0.0))],
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("bev.resolution"), "{e}");
        let e = merged(
            &files,
            &[("device".into(), ParameterValue::String("tpu".into()))],
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
        let e = merged(
            &files,
            &[("bev.nonsense".into(), ParameterValue::Integer(1))],
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("nonsense"), "{e}");
        let p = merged(
            &files,
            &[("use_sim_time".into(), ParameterValue::Bool(true))],
            "t",
        )
        .unwrap();
        assert_eq!(
            model_config_path(&p, &files),
            PathBuf::from("/cfg/models/m.yaml")
        );
        // A later file that does not set model.config does not move it (launch_ros's `/**:` file).
        let mut later = files.clone();
        later.push((
            PathBuf::from("/tmp/launch.yaml"),
            serde_yaml::from_str("device: cpu").unwrap(),
        ));
        assert_eq!(
            model_config_path(&p, &later),
            PathBuf::from("/cfg/models/m.yaml")
        );
        // Topic names and the CUDA error policy: defaults, overrides, validation.
        assert_eq!(p.topics.output_points, "~/output/points");
        assert_eq!(p.on_cuda_error, crate::frame::params::CudaErrorPolicy::Exit);
        let p2 = merged(
            &files,
            &[
                (
                    "topics.output_points".into(),
                    ParameterValue::String("seg/points".into()),
                ),
                (
                    "on_cuda_error".into(),
                    ParameterValue::String("recover".into()),
                ),
            ],
            "t",
        )
        .unwrap();
        assert_eq!(p2.topics.output_points, "seg/points");
        assert_eq!(p2.topics.input_points, "~/input/points");
        assert_eq!(p2.on_cuda_error, crate::frame::params::CudaErrorPolicy::Recover);
        for bad in ["", "a b", "x/", "a//b"] {
            let e = merged(
                &files,
                &[(
                    "topics.bev_labels".into(),
                    ParameterValue::String(bad.into()),
                )],
                "t",
            )
            .unwrap_err();
            assert!(e.to_string().contains("topics.bev_labels"), "{bad:?}: {e}");
        }
        let e = merged(
            &files,
            &[(
                "on_cuda_error".into(),
                ParameterValue::String("sometimes".into()),
            )],
            "t",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("on_cuda_error") || e.to_string().contains("sometimes"),
            "{e}"
        );
        // Weights resolve like model.config.
        let pw = merged(
            &files,
            &[(
                "model.weights".into(),
                ParameterValue::String("w.safetensors".into()),
            )],
            "t",
        )
        .unwrap();
        assert_eq!(weights_path(&pw, &files), PathBuf::from("w.safetensors"));
        let mut with_w = files.clone();
        with_w[0]
            .1
            .get_mut("model")
            .unwrap()
            .as_mapping_mut()
            .unwrap()
            .insert("weights".into(), "w.safetensors".into());
        assert_eq!(
            weights_path(&pw, &with_w),
            PathBuf::from("/cfg/w.safetensors")
        );
        // From -p: relative to the working directory.
        let over = [(
            "model.config".into(),
            ParameterValue::String("x/m.yaml".into()),
        )];
        let p = merged(&files, &over, "t").unwrap();
        assert_eq!(model_config_path(&p, &files), PathBuf::from("x/m.yaml"));
    }
}
