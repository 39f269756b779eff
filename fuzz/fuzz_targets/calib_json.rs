//! The libFuzzer target of `checks/calib_json.rs` (what it checks is said there; `tests/fuzz_replay.rs`
//! replays the same check in `cargo test`).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../checks/calib_json.rs"]
mod check;

fuzz_target!(|data: &[u8]| check::check(data));
