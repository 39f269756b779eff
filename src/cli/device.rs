//! `--device`, one argument for every command that runs a model: the word is read by
//! [`DeviceChoice`]'s parser (`auto`, `cpu`, `cuda`, `gpu` for `cuda`) and resolved by
//! [`crate::device::resolve`], as the node and replay resolve theirs.

use std::ffi::OsStr;

use clap::builder::{PossibleValue, TypedValueParser};

use crate::device::{DeviceChoice, ResolvedDevice};

// `--device`, default `auto` (flattened into each command that takes it).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DeviceArg {
    /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
    #[arg(long, default_value = "auto", value_parser = DeviceParser::EXPLAINED)]
    pub device: DeviceChoice,
}

impl DeviceArg {
    /// The device the work runs on (see [`resolve`]).
    pub fn resolve(self) -> anyhow::Result<ResolvedDevice> {
        resolve(self.device)
    }
}

/// [`crate::device::resolve`], its error naming the argument and the other choices.
pub fn resolve(choice: DeviceChoice) -> anyhow::Result<ResolvedDevice> {
    crate::device::resolve(choice).map_err(|e| anyhow::anyhow!("--device {choice}: {e} ({CPU_INSTEAD})"))
}

/// How a command-line user runs on the CPU instead of a GPU that cannot be had.
pub const CPU_INSTEAD: &str = "pass --device cpu, or --device auto to fall back to the CPU";

/// The value parser of `--device`: [`DeviceChoice`]'s own parse and error, and its words for
/// the help (`explained`: with what `auto` does, which makes clap lay the help out long).
#[derive(Clone, Copy, Debug)]
pub struct DeviceParser {
    pub explained: bool,
}

impl DeviceParser {
    pub const EXPLAINED: DeviceParser = DeviceParser { explained: true };
    pub const PLAIN: DeviceParser = DeviceParser { explained: false };
}

impl TypedValueParser for DeviceParser {
    type Value = DeviceChoice;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<DeviceChoice, clap::Error> {
        let parse = |s: &str| s.parse::<DeviceChoice>();
        parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(DeviceChoice::ALL.into_iter().map(|c| match c {
            DeviceChoice::Auto if self.explained => {
                PossibleValue::new(c.name()).help("CUDA when a GPU and this build's CUDA support are there, else CPU")
            }
            DeviceChoice::Auto => PossibleValue::new(c.name()),
            DeviceChoice::Cuda => PossibleValue::new(c.name()).alias("gpu"),
            DeviceChoice::Cpu => PossibleValue::new(c.name()),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        device: DeviceArg,
    }

    #[test]
    fn device_words_as_the_library_reads_them() {
        let read = |args: &[&str]| Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|c| c.device.device);
        assert_eq!(read(&[]).unwrap(), DeviceChoice::Auto);
        assert_eq!(read(&["--device", "cpu"]).unwrap(), DeviceChoice::Cpu);
        assert_eq!(read(&["--device", "cuda"]).unwrap(), DeviceChoice::Cuda);
        assert_eq!(read(&["--device", "gpu"]).unwrap(), DeviceChoice::Cuda);
        assert_eq!(read(&["--device=auto"]).unwrap(), DeviceChoice::Auto);
        let e = read(&["--device", "tpu"]).err().unwrap().to_string();
        assert!(e.contains("--device") && e.contains(&"tpu".parse::<DeviceChoice>().unwrap_err().to_string()), "{e}");
    }

    #[test]
    fn cpu_resolves_without_a_gpu() {
        let r = DeviceArg { device: DeviceChoice::Cpu }.resolve().unwrap();
        assert_eq!(r.device, crate::device::Device::Cpu);
    }
}
