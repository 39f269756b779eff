//! A model YAML (`--model`), parsed and validated as every model reader of sptr reads one.
use sptr::models::bevfusion::camera::encoder::CameraEncoderConfig;
use sptr::models::sphereformer::config::ModelConfig;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ModelConfig::parse(text, "fuzz.yaml");
    let _ = CameraEncoderConfig::parse(text, "fuzz.yaml");
}
