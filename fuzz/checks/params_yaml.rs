//! A node parameters file (`--params-file` / `config/perception.yaml`).
use sptr::frame::params::NodeParams;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = NodeParams::parse(text, "fuzz.yaml");
}
