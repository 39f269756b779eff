//! Exit statuses beyond 0 and 1, and the FP16 range report they go with.

use crate::device::range_guard::RangeReport;

/// Exit status of `segment`, `replay` and `camera-features` when the network's activations left
/// the FP16 range (NaN/inf on the CPU) and `--allow-overflow` was not given: results not to be
/// trusted.
pub const EXIT_OUT_OF_RANGE: i32 = 4;

/// The error that makes `sptr` exit with [`EXIT_OUT_OF_RANGE`].
#[derive(Debug)]
pub struct OutOfRange(pub String);

impl std::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfRange {}

/// The exit status for an error a command returned: [`EXIT_OUT_OF_RANGE`] or 1.
pub fn exit_status(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<OutOfRange>().is_some() {
        EXIT_OUT_OF_RANGE
    } else {
        1
    }
}

/// The layers a range report flags, one per line (at most 20), on stderr.
pub fn print_out_of_range(range: &RangeReport) {
    eprintln!(
        "sptr: the network's activations left the FP16 range (NaN/inf on the CPU) in {} layer(s), in execution order \
         (the first is where the range was left):",
        range.layers.len()
    );
    for l in range.layers.iter().take(20) {
        eprintln!("  {l}");
    }
    if range.layers.len() > 20 {
        eprintln!("  ... and {} more", range.layers.len() - 20);
    }
}
