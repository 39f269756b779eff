//! Which device runs the work, decided in one place.
//!
//! A user names a device with one word ([`DeviceChoice`]: `--device` on the command line, `device:`
//! in the node's params file): `cpu`, `cuda` (`gpu` is another name for it) or `auto`.
//! [`resolve`] turns the word into the [`Device`] the models and the frame processor are opened
//! on:
//!
//! - `cpu`: the CPU.
//! - `cuda`: GPU 0, when this build has the CUDA backend and the GPU can be opened (driver, device,
//!   NVRTC); otherwise an error that says what is missing and what to do.
//! - `auto`: `cuda` when it can be had, else the CPU, with the reason recorded
//!   ([`ResolvedDevice::fallback`]) so the caller can say why it runs on the CPU.
//!
//! Opening the GPU to find out whether it can be used takes a CUDA context for a moment; the
//! models open their own afterwards.

use crate::Error;

/// A device as a user names it (`--device`, the params file's `device:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// CUDA when this build and machine can use it, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// Where the work runs, once a [`DeviceChoice`] is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// GPU 0.
    Cuda,
}

/// A [`DeviceChoice`] resolved by [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDevice {
    pub device: Device,
    /// What was asked.
    pub choice: DeviceChoice,
    /// Why `auto` runs on the CPU (`None` when it runs on CUDA, and for `cpu` and `cuda`).
    pub fallback: Option<String>,
}

/// A word that names no device; its message is the one every entry point shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDevice(pub String);

impl std::fmt::Display for UnknownDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown device `{}`: use auto, cpu or cuda (gpu is another name for cuda)", self.0)
    }
}

impl std::error::Error for UnknownDevice {}

impl From<UnknownDevice> for Error {
    fn from(e: UnknownDevice) -> Self {
        Error::InvalidInput(e.to_string())
    }
}

impl DeviceChoice {
    /// Every choice, in the order help texts list them.
    pub const ALL: [DeviceChoice; 3] = [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda];

    /// The word that names it (`gpu` is read as `cuda`).
    pub fn name(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda),
            other => Err(UnknownDevice(other.to_string())),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DeviceChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = String::deserialize(d)?;
        word.parse().map_err(serde::de::Error::custom)
    }
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl ResolvedDevice {
    pub fn is_cuda(&self) -> bool {
        self.device == Device::Cuda
    }

    /// The device in words for reports: `cpu`, `cuda`, or `cpu (auto: <why>)` when `auto` fell
    /// back to the CPU.
    pub fn describe(&self) -> String {
        match &self.fallback {
            Some(why) => format!("cpu (auto: {why})"),
            None => self.device.name().to_string(),
        }
    }
}

/// Why CUDA cannot be had on this build and machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaUnavailable {
    /// The build lacks the cargo feature `cuda`.
    NotBuilt,
    /// GPU 0 could not be opened: no driver, no GPU, no NVRTC, or the driver refused (its words).
    NotUsable(String),
}

impl std::fmt::Display for CudaUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaUnavailable::NotBuilt => f.write_str("this build has no CUDA support (cargo feature `cuda`)"),
            CudaUnavailable::NotUsable(why) => write!(f, "the GPU cannot be used: {why}"),
        }
    }
}

/// Why CUDA cannot be had here, or `None` when GPU 0 opens (this build's `cuda` feature, then the
/// driver, the device and NVRTC, as [`crate::device::cuda::CudaDevice::new`] checks them).
pub fn cuda_unavailable() -> Option<CudaUnavailable> {
    #[cfg(feature = "cuda-core")]
    {
        match crate::device::cuda::CudaDevice::new(0) {
            Ok(_) => None,
            Err(Error::Cuda(why)) => Some(CudaUnavailable::NotUsable(why)),
            Err(e) => Some(CudaUnavailable::NotUsable(e.to_string())),
        }
    }
    #[cfg(not(feature = "cuda-core"))]
    {
        Some(CudaUnavailable::NotBuilt)
    }
}

/// The device `choice` runs on (see the module doc): `cpu` as it is; `cuda`, or an error saying
/// what is missing and how to get it (the caller adds how its user picks the CPU instead:
/// `--device cpu`, `device: cpu`); `auto` CUDA when it can be had, else the CPU with the reason.
pub fn resolve(choice: DeviceChoice) -> Result<ResolvedDevice, Error> {
    resolve_with(choice, cuda_unavailable)
}

/// [`resolve`] with the probe of CUDA given (tests give one that fails).
fn resolve_with(choice: DeviceChoice, probe: impl FnOnce() -> Option<CudaUnavailable>) -> Result<ResolvedDevice, Error> {
    let on = |device: Device, fallback: Option<String>| ResolvedDevice { device, choice, fallback };
    match choice {
        DeviceChoice::Cpu => Ok(on(Device::Cpu, None)),
        DeviceChoice::Cuda => match probe() {
            None => Ok(on(Device::Cuda, None)),
            Some(why @ CudaUnavailable::NotBuilt) => Err(Error::Cuda(format!("{why}: rebuild with `--features cuda`"))),
            Some(why) => Err(Error::Cuda(why.to_string())),
        },
        DeviceChoice::Auto => Ok(match probe() {
            None => on(Device::Cuda, None),
            Some(why) => on(Device::Cpu, Some(why.to_string())),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse_to_one_choice_each() {
        assert_eq!("auto".parse::<DeviceChoice>(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse::<DeviceChoice>(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda));
        assert_eq!("gpu".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda), "gpu is another name for cuda");
        for c in DeviceChoice::ALL {
            assert_eq!(c.to_string().parse::<DeviceChoice>(), Ok(c), "{c} reads back");
        }
        assert_eq!(DeviceChoice::default(), DeviceChoice::Auto);
    }

    #[test]
    fn unknown_words_are_refused_with_the_words_to_use() {
        for bad in ["tpu", "", "CUDA", "Cpu", " cpu", "cuda:0"] {
            let e = bad.parse::<DeviceChoice>().unwrap_err();
            assert_eq!(e, UnknownDevice(bad.to_string()));
            assert_eq!(e.to_string(), format!("unknown device `{bad}`: use auto, cpu or cuda (gpu is another name for cuda)"));
        }
        let e: Error = "tpu".parse::<DeviceChoice>().unwrap_err().into();
        assert!(e.to_string().contains("unknown device `tpu`"), "{e}");
    }

    #[test]
    fn params_files_name_the_device_with_the_same_words() {
        #[derive(Debug, serde::Deserialize)]
        struct P {
            device: DeviceChoice,
        }
        let read = |yaml: &str| serde_yaml::from_str::<P>(yaml).map(|p| p.device);
        assert_eq!(read("device: cpu").unwrap(), DeviceChoice::Cpu);
        assert_eq!(read("device: cuda").unwrap(), DeviceChoice::Cuda);
        assert_eq!(read("device: gpu").unwrap(), DeviceChoice::Cuda);
        assert_eq!(read("device: auto").unwrap(), DeviceChoice::Auto);
        let e = read("device: tpu").unwrap_err().to_string();
        assert!(e.contains("unknown device `tpu`: use auto, cpu or cuda"), "{e}");
        assert!(read("device: 1").is_err());
    }

    #[test]
    fn cpu_needs_no_probe() {
        let r = resolve_with(DeviceChoice::Cpu, || panic!("cpu must not probe the GPU")).unwrap();
        assert_eq!(r, ResolvedDevice { device: Device::Cpu, choice: DeviceChoice::Cpu, fallback: None });
        assert_eq!(r.describe(), "cpu");
        assert_eq!(resolve(DeviceChoice::Cpu).unwrap().device, Device::Cpu);
    }

    #[test]
    fn auto_falls_back_to_the_cpu_and_says_why() {
        let r = resolve_with(DeviceChoice::Auto, || Some(CudaUnavailable::NotBuilt)).unwrap();
        assert_eq!(r.device, Device::Cpu);
        assert_eq!(r.fallback.as_deref(), Some("this build has no CUDA support (cargo feature `cuda`)"));
        assert_eq!(r.describe(), "cpu (auto: this build has no CUDA support (cargo feature `cuda`))");
        let r = resolve_with(DeviceChoice::Auto, || Some(CudaUnavailable::NotUsable("no CUDA driver".into()))).unwrap();
        assert_eq!(r.device, Device::Cpu);
        assert_eq!(r.fallback.as_deref(), Some("the GPU cannot be used: no CUDA driver"));
        assert!(!r.is_cuda());
    }

    #[test]
    fn auto_and_cuda_take_a_usable_gpu() {
        for c in [DeviceChoice::Auto, DeviceChoice::Cuda] {
            let r = resolve_with(c, || None).unwrap();
            assert_eq!(r, ResolvedDevice { device: Device::Cuda, choice: c, fallback: None });
            assert_eq!(r.describe(), "cuda");
        }
    }

    #[test]
    fn cuda_that_cannot_be_had_is_an_error_saying_what_to_do() {
        let e = resolve_with(DeviceChoice::Cuda, || Some(CudaUnavailable::NotBuilt)).unwrap_err().to_string();
        assert_eq!(e, "CUDA: this build has no CUDA support (cargo feature `cuda`): rebuild with `--features cuda`");
        let why = "the CUDA driver is here but libnvrtc is not: install CUDA's NVRTC (13.x) or set LD_LIBRARY_PATH to it";
        let e = resolve_with(DeviceChoice::Cuda, || Some(CudaUnavailable::NotUsable(why.into()))).unwrap_err().to_string();
        assert_eq!(e, format!("CUDA: the GPU cannot be used: {why}"));
    }

    /// Without a GPU (or without the `cuda` feature) `auto` is the CPU, with the reason, and
    /// `cuda` an error; skipped where a GPU can be used.
    #[test]
    fn without_a_gpu_auto_is_the_cpu_and_cuda_an_error() {
        let Some(why) = cuda_unavailable() else {
            eprintln!("SKIPPED without_a_gpu_auto_is_the_cpu_and_cuda_an_error: a GPU can be used here");
            return;
        };
        if !cfg!(feature = "cuda-core") {
            assert_eq!(why, CudaUnavailable::NotBuilt);
        }
        let r = resolve(DeviceChoice::Auto).unwrap();
        assert_eq!(r.device, Device::Cpu);
        assert_eq!(r.fallback, Some(why.to_string()));
        assert_eq!(resolve(DeviceChoice::Cuda).unwrap_err().to_string().contains("rebuild with"), !cfg!(feature = "cuda-core"));
    }

    /// With a GPU, `auto` and `cuda` are GPU 0; skipped without one (SPTR_REQUIRE_GPU=1: fails).
    #[cfg(feature = "cuda-core")]
    #[test]
    fn with_a_gpu_auto_and_cuda_are_the_gpu() {
        if let Some(why) = cuda_unavailable() {
            if std::env::var("SPTR_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("SPTR_REQUIRE_GPU=1 but {why}");
            }
            eprintln!("SKIPPED with_a_gpu_auto_and_cuda_are_the_gpu: {why}");
            return;
        }
        for c in [DeviceChoice::Auto, DeviceChoice::Cuda] {
            let r = resolve(c).unwrap();
            assert_eq!((r.device, r.fallback), (Device::Cuda, None));
        }
    }
}
