//! The `sptr` command line: one file per subcommand (or family of subcommands), each with its
//! clap arguments beside its handler (`command`); `src/bin/sptr.rs` parses and dispatches.
//! Shared: the value parsers (`args`), `--device` (`device`), the input files (`inputs`) and the
//! exit statuses (`status`).

pub mod args;
pub mod bag;
pub mod bench;
pub mod bevseg;
pub mod camera_features;
pub mod device;
pub mod eval;
pub mod info;
pub mod inputs;
pub mod kernels;
#[cfg(feature = "ros")]
pub mod node_bench_peer;
pub mod prepare;
pub mod random_weights;
pub mod replay;
pub mod segment;
pub mod segment_files;
pub mod segment_progress;
pub mod status;
pub mod voxelize;
