//! Stage timing: the wall time of each stage of a forward on the host ([`StageTimes`]) and, on
//! CUDA, stage boundaries as events on the stream ([`GpuClock`]) so a frame needs no host
//! synchronisation per stage.

use std::time::{Duration, Instant};

/// Called with each stage's name and wall time as it is recorded (progress of long CPU runs).
pub type StageHook = std::sync::Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// Wall time of each stage of a forward, in the order they ran.
#[derive(Clone, Default)]
pub struct StageTimes {
    pub stages: Vec<(String, Duration)>,
    /// Told of every stage [`StageTimes::record`] records; not part of the times (not compared,
    /// not printed).
    pub hook: Option<StageHook>,
}

impl PartialEq for StageTimes {
    fn eq(&self, other: &Self) -> bool {
        self.stages == other.stages
    }
}

impl std::fmt::Debug for StageTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageTimes").field("stages", &self.stages).finish()
    }
}

impl StageTimes {
    pub fn record(&mut self, name: impl Into<String>, since: Instant) {
        let name = name.into();
        let took = since.elapsed();
        if let Some(h) = &self.hook {
            h(&name, took);
        }
        self.stages.push((name, took));
    }
    pub fn total(&self) -> Duration {
        self.stages.iter().map(|(_, d)| *d).sum()
    }
    pub fn get(&self, name: &str) -> Option<Duration> {
        self.stages.iter().find(|(n, _)| n == name).map(|(_, d)| *d)
    }
}

#[cfg(feature = "cuda-core")]
pub use gpu::GpuClock;

#[cfg(feature = "cuda-core")]
mod gpu {
    use super::StageTimes;
    use crate::device::cuda::{cuda_err, CudaDevice};
    use crate::Error;

    /// Stage boundaries as CUDA events on the stream, so a frame needs no host synchronisation per
    /// stage: the durations (GPU time between consecutive boundaries, idle gaps included) are read
    /// in [`GpuClock::finish`], once the frame's results are back on the host.
    pub struct GpuClock {
        start: cudarc::driver::CudaEvent,
        marks: Vec<(String, cudarc::driver::CudaEvent)>,
        /// Clocks of work on other streams that ran beside this clock's stages.
        branches: Vec<GpuClock>,
    }

    impl GpuClock {
        /// A clock whose first stage starts with the work enqueued from now on.
        pub fn start(dev: &CudaDevice) -> Result<Self, Error> {
            Ok(Self { start: timing_event(dev)?, marks: Vec::new(), branches: Vec::new() })
        }

        /// Adds the stages of a clock on another stream, whose work ran beside this clock's:
        /// [`GpuClock::finish`] appends them after this clock's own, so the stages' times add up
        /// to more than the frame.
        pub fn add_branch(&mut self, branch: GpuClock) {
            self.branches.push(branch);
        }

        /// Ends stage `name` after the work enqueued so far.
        pub fn mark(&mut self, dev: &CudaDevice, name: String) -> Result<(), Error> {
            self.marks.push((name, timing_event(dev)?));
            Ok(())
        }

        /// Appends every stage's GPU time to `t`, then its branches' (reading a time waits for
        /// its boundary).
        pub fn finish(self, t: &mut StageTimes) -> Result<(), Error> {
            let mut prev = &self.start;
            for (name, ev) in &self.marks {
                let ms = prev.elapsed_ms(ev).map_err(cuda_err(format!("reading the time of stage {name}")))?;
                t.stages.push((name.clone(), std::time::Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3)));
                prev = ev;
            }
            self.branches.into_iter().try_for_each(|b| b.finish(t))
        }
    }

    fn timing_event(dev: &CudaDevice) -> Result<cudarc::driver::CudaEvent, Error> {
        dev.stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("recording a timing event"))
    }
}
