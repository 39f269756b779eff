//! Progress of a long CPU segmentation on stderr, stage by stage (`sptr segment`): SphereFormer
//! on the CPU takes minutes for a few hundred thousand voxels, and saying nothing for that long
//! looks like a hang. On a terminal a bar (stages done, elapsed time, the stage running now);
//! otherwise (logs, `| tee`) a plain line per finished stage once the run has taken 2 s (short
//! runs print nothing); or nothing (`quiet`). Like replay's progress (`src/replay/progress.rs`).

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::models::sphereformer::network::StageHook;
use crate::replay::ProgressMode;

/// Runs shorter than this print no plain lines.
const QUIET_FOR: Duration = Duration::from_secs(2);

/// Progress of one segmentation whose stages are `names` (in order).
pub struct StageProgress {
    names: Vec<String>,
    bar: Option<ProgressBar>,
    plain: bool,
    start: Instant,
    done: Mutex<usize>,
    /// Where the lines go (stderr; a buffer in tests).
    out: Mutex<Box<dyn std::io::Write + Send>>,
}

impl StageProgress {
    /// Progress on stderr.
    pub fn new(mode: ProgressMode, names: Vec<String>) -> Arc<StageProgress> {
        let tty = std::io::stderr().is_terminal();
        let bar = (mode == ProgressMode::Auto && tty).then(|| {
            let b = ProgressBar::new(names.len() as u64);
            let style = ProgressStyle::with_template("{bar:30} {pos}/{len} stages  {elapsed}  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.set_message(names.first().map(|n| format!("running {n}")).unwrap_or_default());
            b.enable_steady_tick(Duration::from_secs(1));
            b
        });
        let plain = mode == ProgressMode::Plain || (mode == ProgressMode::Auto && !tty);
        Self::with(names, bar, plain, Box::new(std::io::stderr()))
    }

    /// Plain lines into `out` (tests).
    pub fn plain_into(names: Vec<String>, out: Box<dyn std::io::Write + Send>) -> Arc<StageProgress> {
        Self::with(names, None, true, out)
    }

    fn with(names: Vec<String>, bar: Option<ProgressBar>, plain: bool, out: Box<dyn std::io::Write + Send>) -> Arc<StageProgress> {
        Arc::new(StageProgress { names, bar, plain, start: Instant::now(), done: Mutex::new(0), out: Mutex::new(out) })
    }

    /// The hook to give [`crate::models::sphereformer::segmenter::Segmenter::set_stage_hook`].
    pub fn hook(self: &Arc<Self>) -> StageHook {
        let me = self.clone();
        Arc::new(move |name: &str, took: Duration| me.stage(name, took, me.start.elapsed()))
    }

    /// Stage `name` ended after `took`, `elapsed` into the run.
    fn stage(&self, name: &str, took: Duration, elapsed: Duration) {
        let done = {
            let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
            *d += 1;
            *d
        };
        let total = self.names.len().max(done);
        let next = self.names.get(done).map(|n| format!("; next: {n}")).unwrap_or_default();
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
            b.set_message(self.names.get(done).map(|n| format!("running {n}")).unwrap_or_default());
            return;
        }
        if self.plain && elapsed >= QUIET_FOR {
            let line = format!(
                "segment: stage {done}/{total} {name} took {:.1} s ({:.1} s in all){next}\n",
                took.as_secs_f64(),
                elapsed.as_secs_f64()
            );
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
    }

    /// The run is over: the bar goes away.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` the test can read back.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_lines_once_the_run_is_long() {
        let buf = Buf::default();
        let names: Vec<String> = ["voxelize", "input_conv", "head"].iter().map(|s| s.to_string()).collect();
        let p = StageProgress::plain_into(names, Box::new(buf.clone()));
        p.stage("voxelize", Duration::from_millis(30), Duration::from_millis(30));
        assert!(buf.0.lock().unwrap().is_empty(), "a short run prints nothing");
        p.stage("input_conv", Duration::from_secs(5), Duration::from_secs(5));
        p.stage("head", Duration::from_millis(200), Duration::from_millis(5200));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "segment: stage 2/3 input_conv took 5.0 s (5.0 s in all); next: head\n\
             segment: stage 3/3 head took 0.2 s (5.2 s in all)\n"
        );
    }
}
