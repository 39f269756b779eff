//! The node's stop deadline. On SIGINT/SIGTERM (or a CUDA error under `on_cuda_error: exit`)
//! `node::run` stops in order: the frame in progress, the runtime's tasks, then the ROS node and
//! its DDS participant. Each stage is bounded but the last one is DDS's own teardown, which on a
//! loaded machine once took over 3 s (CI, two busy cores). docs/node.md promises the process is
//! gone within a second of the signal; this guard keeps that promise: a thread that ends the
//! process when the orderly stop has not finished by [`STOP_DEADLINE`], with a last line that says
//! so and names the stage still running (the other participants then notice we left by DDS's
//! liveliness timeout, as after a SIGKILL, which they are built to survive).
//!
//! Exactly one last line is written: whichever of the orderly stop ([`StopGuard::finish`]) and
//! the guard claims it first writes it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the orderly stop may take, from the signal to the last line.
pub const STOP_DEADLINE: Duration = Duration::from_secs(1);

/// The stages of the orderly stop, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for the frame in progress (bounded by the node's `SHUTDOWN_WAIT`).
    ProcessingThread,
    /// The tokio runtime's tasks (subscriptions, diagnostics) stopping.
    Runtime,
    /// The spinning thread deleting the node, its publishers and its DDS participant.
    RosNode,
    /// Writing the last line.
    Report,
}

impl Stage {
    const ALL: [Stage; 4] = [Stage::ProcessingThread, Stage::Runtime, Stage::RosNode, Stage::Report];

    pub fn what(self) -> &'static str {
        match self {
            Stage::ProcessingThread => "the processing thread's last frame",
            Stage::Runtime => "the runtime's tasks",
            Stage::RosNode => "the ROS node's deletion (its DDS participant)",
            Stage::Report => "the stop report",
        }
    }
}

struct Shared {
    stage: AtomicUsize,
    /// Set by whichever writes the last line.
    claimed: AtomicBool,
}

/// What the guard does at the deadline: gets the last line; in the node it writes it and ends
/// the process (it does not return there).
pub type OnDeadline = Box<dyn FnOnce(String) + Send>;

pub struct StopGuard {
    shared: Arc<Shared>,
    which: String,
    /// Until [`arm`](Self::arm) hands them to the guard's thread.
    pending: Option<(Box<dyn Fn() -> String + Send>, OnDeadline)>,
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StopGuard {
    /// A guard for the stop started by `which` (`SIGINT`, ...): at its deadline it calls
    /// `on_deadline` with the last line, `perception_node: {which}: stopped in N ms (forced ...:
    /// <stage> still running; <summary>)`, `summary()` giving the counts. Nothing runs before
    /// [`arm`](Self::arm).
    pub fn new(
        which: &str,
        summary: impl Fn() -> String + Send + 'static,
        on_deadline: OnDeadline,
    ) -> StopGuard {
        StopGuard {
            shared: Arc::new(Shared {
                stage: AtomicUsize::new(0),
                claimed: AtomicBool::new(false),
            }),
            which: which.to_string(),
            pending: Some((Box::new(summary), on_deadline)),
            done: None,
            thread: None,
        }
    }

    /// Starts the guard's thread: the deadline is `started + deadline`, unless
    /// [`finish`](Self::finish) comes first. Without a thread (the system refused one) there is
    /// no deadline and the orderly stop goes on alone. A second call does nothing.
    pub fn arm(&mut self, started: Instant, deadline: Duration) {
        let Some((summary, on_deadline)) = self.pending.take() else {
            return;
        };
        let (done, finished) = mpsc::channel::<()>();
        let (s, which) = (self.shared.clone(), self.which.clone());
        self.thread = std::thread::Builder::new()
            .name("sptr-stop-guard".into())
            .spawn(move || {
                let left = deadline.saturating_sub(started.elapsed());
                // A message or a dropped sender: the orderly stop wrote the last line.
                if finished.recv_timeout(left) != Err(mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
                if s.claimed.swap(true, Ordering::SeqCst) {
                    return;
                }
                let stage = Stage::ALL[s.stage.load(Ordering::SeqCst).min(Stage::ALL.len() - 1)];
                on_deadline(format!(
                    "perception_node: {which}: stopped in {:.0} ms (forced at the {:.0} ms deadline: {} still running; {})",
                    started.elapsed().as_secs_f64() * 1e3,
                    deadline.as_secs_f64() * 1e3,
                    stage.what(),
                    summary()
                ));
            })
            .ok();
        self.done = Some(done);
    }

    /// The orderly stop has reached `stage`.
    pub fn stage(&self, stage: Stage) {
        let i = Stage::ALL.iter().position(|&s| s == stage).unwrap_or(0);
        self.shared.stage.store(i, Ordering::SeqCst);
    }

    /// The orderly stop is done: true when it may write the last line; false when the guard
    /// already has (in the node the process is ending then).
    pub fn finish(mut self) -> bool {
        if self.shared.claimed.swap(true, Ordering::SeqCst) {
            return false;
        }
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts() -> String {
        "received 3, processed 2".into()
    }

    #[test]
    fn a_stop_that_finishes_writes_its_own_line_and_the_guard_stays_quiet() {
        let (tx, rx) = mpsc::channel::<String>();
        let mut guard = StopGuard::new("SIGINT", counts, Box::new(move |line| tx.send(line).unwrap()));
        guard.arm(Instant::now(), Duration::from_secs(600));
        guard.stage(Stage::RosNode);
        assert!(guard.finish(), "the orderly stop came first");
        // finish joined the guard: it ended without a line (its sender is gone with it)
        assert_eq!(rx.recv(), Err(mpsc::RecvError));
    }

    #[test]
    fn a_stop_past_the_deadline_is_forced_naming_the_stage_still_running() {
        let (tx, rx) = mpsc::channel::<String>();
        let mut guard = StopGuard::new("SIGTERM", counts, Box::new(move |line| tx.send(line).unwrap()));
        guard.stage(Stage::RosNode);
        let started = Instant::now();
        guard.arm(started, Duration::from_millis(20));
        // no timing luck: wait for the guard's line however long the machine takes
        let line = rx.recv().expect("the guard writes the last line at the deadline");
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(line.starts_with("perception_node: SIGTERM: stopped in "), "{line}");
        assert!(line.contains("forced at the 20 ms deadline"), "{line}");
        assert!(line.contains(Stage::RosNode.what()), "{line}");
        assert!(line.ends_with("received 3, processed 2)"), "{line}");
        assert!(!guard.finish(), "the guard wrote the line: the orderly stop must not");
    }

    #[test]
    fn a_deadline_already_past_at_the_start_fires_at_once_at_the_first_stage() {
        let (tx, rx) = mpsc::channel::<String>();
        let mut guard = StopGuard::new("SIGINT", counts, Box::new(move |line| tx.send(line).unwrap()));
        guard.arm(Instant::now(), Duration::ZERO);
        let line = rx.recv().unwrap();
        assert!(line.contains(Stage::ProcessingThread.what()), "{line}");
        assert!(!guard.finish());
    }
}
