//! The `sptr` command line's subcommands, one file per subcommand (the binary in `src/bin/sptr.rs`
//! parses and dispatches).

pub mod bevseg;
pub mod camera_features;
pub mod segment_files;
pub mod segment_progress;

