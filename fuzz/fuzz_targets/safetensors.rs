//! The libFuzzer target of `checks/safetensors.rs` (what it checks is said there;
//! `tests/fuzz_replay.rs` replays the same check in `cargo test`).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../checks/safetensors.rs"]
mod check;

fuzz_target!(
    init: {
        // The expected tensors, built once before fuzzing (building them takes longer than one
        // input may).
        check::init();
    },
    |data: &[u8]| check::check(data)
);
