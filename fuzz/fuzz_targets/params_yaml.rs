//! A node parameters file (`--params-file` / `config/perception.yaml`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sptr::frame::params::NodeParams;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = NodeParams::parse(text, "fuzz.yaml");
});
