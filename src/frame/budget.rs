//! The node's latency budget over time (ROS-free, so it is unit-tested on any machine): when is
//! the node persistently over `budget.processing_ms`, the diagnostics' ERROR?
//!
//! Only processed frames can be over budget; time without a processed frame (no input, only
//! rejected clouds) is neither over nor within budget. A frame still being processed counts as
//! over budget once it has run longer than the budget (a 16 s CPU frame is over budget long before
//! it ends). The *run* is the current sequence of consecutive over-budget frames (none once a
//! frame is processed within budget); its length goes from the start of its first frame to the
//! end of its last (to now while an over-budget frame is still in progress), so idle time after
//! the last frame never adds to it. ERROR, with `W = budget.error_after_s`, when
//!
//! * the run is at least `W` long: the node was over budget, frame after frame, for `W`, and
//! * the run is current: its last frame ended at most `W` ago (or is still in progress).
//!
//! Together: every frame processed during the last `W` seconds was over budget, there was at
//! least one, and the frames before them back to `W` before the last were over budget too.
//! `W = 0`: ERROR as soon as the last processed frame was over budget. The diagnostics report the
//! run's length as how long processing has been over budget.

use std::time::Instant;

/// What the processing thread reports; read by the diagnostics.
#[derive(Debug, Clone, Copy, Default)]
pub struct BudgetState {
    /// Start of the first frame of the current run of consecutive over-budget frames (`None`:
    /// the last processed frame was within budget, or none was processed).
    run_start: Option<Instant>,
    /// End of the last processed frame.
    last_end: Option<Instant>,
    /// Start of the frame being processed now.
    in_progress: Option<Instant>,
}

impl BudgetState {
    /// A frame's processing starts at `t`.
    pub fn frame_started(&mut self, t: Instant) {
        self.in_progress = Some(t);
    }

    /// The frame in progress was processed by `end`, over budget or not.
    pub fn frame_processed(&mut self, end: Instant, over: bool) {
        let start = self.in_progress.take().unwrap_or(end);
        self.run_start = if over { Some(self.run_start.unwrap_or(start)) } else { None };
        self.last_end = Some(end);
    }

    /// The frame in progress was rejected (bad input, an error): it was not processed, so it is
    /// neither over nor within budget, and the run of over-budget frames is unchanged.
    pub fn frame_rejected(&mut self) {
        self.in_progress = None;
    }

    /// `Some(seconds over budget)` when the diagnostics must say ERROR at `now` (module docs);
    /// `budget_ms` and `error_after_s` are the node's validated parameters (positive, finite;
    /// zero or positive, finite).
    pub fn error(&self, now: Instant, budget_ms: f64, error_after_s: f64) -> Option<f64> {
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        let in_progress_over = self
            .in_progress
            .is_some_and(|s| secs(s, now) * 1e3 > budget_ms);
        let start = match (self.run_start, in_progress_over) {
            (Some(s), _) => s,
            (None, true) => self.in_progress?,
            (None, false) => return None,
        };
        let end = if in_progress_over { now } else { self.last_end? };
        let long_enough = secs(start, end) >= error_after_s;
        let current = error_after_s == 0.0 || secs(end, now) <= error_after_s;
        (long_enough && current).then(|| secs(start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const BUDGET_MS: f64 = 100.0;

    /// `t0 + s` seconds.
    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    /// A processed frame from `start` lasting `ms`.
    fn frame(b: &mut BudgetState, t0: Instant, start: f64, ms: f64) {
        b.frame_started(at(t0, start));
        b.frame_processed(at(t0, start + ms / 1e3), ms > BUDGET_MS);
    }

    fn rejected(b: &mut BudgetState, t0: Instant, start: f64) {
        b.frame_started(at(t0, start));
        b.frame_rejected();
    }

    /// Two frames just over budget, then only rejected clouds. Idle time is not
    /// over budget: never ERROR (the old rule said "over the budget for 2.8 s").
    #[test]
    fn frames_over_budget_then_only_rejects_is_not_an_error() {
        let t0 = Instant::now();
        let mut b = BudgetState::default();
        frame(&mut b, t0, 0.0, 100.9);
        frame(&mut b, t0, 0.5, 101.3);
        for k in 0..40 {
            rejected(&mut b, t0, 0.7 + 0.1 * k as f64);
            let now = 0.75 + 0.1 * k as f64;
            assert_eq!(b.error(at(t0, now), BUDGET_MS, 2.0), None, "at {now} s");
        }
        for now in [2.8, 10.0, 100.0] {
            assert_eq!(b.error(at(t0, now), BUDGET_MS, 2.0), None, "at {now} s");
        }
        // frames 3 s apart, each over budget, nothing within budget between: over budget frame
        // after frame for 3 s, an ERROR while they keep coming
        frame(&mut b, t0, 3.0, 120.0);
        assert!(b.error(at(t0, 3.2), BUDGET_MS, 2.0).is_some());
    }

    /// Every frame over budget at 10 Hz: ERROR once the run covers `error_after_s`, saying how
    /// long; when frames stop, ERROR ends `error_after_s` after the last one.
    #[test]
    fn sustained_over_budget_is_an_error_while_it_lasts() {
        let t0 = Instant::now();
        let mut b = BudgetState::default();
        for k in 0..30 {
            frame(&mut b, t0, 0.1 * k as f64, 150.0);
            let end = 0.1 * k as f64 + 0.15;
            let e = b.error(at(t0, end), BUDGET_MS, 2.0);
            assert_eq!(e.is_some(), end >= 2.0, "at {end} s: {e:?}");
        }
        // last frame ended at 3.05 s; the run lasted 3.05 s
        let e = b.error(at(t0, 3.1), BUDGET_MS, 2.0).expect("ERROR");
        assert!((e - 3.05).abs() < 1e-6, "{e}");
        assert!(b.error(at(t0, 5.0), BUDGET_MS, 2.0).is_some(), "2 s after the last frame");
        assert_eq!(b.error(at(t0, 5.1), BUDGET_MS, 2.0), None, "over 2 s after the last frame");
        // rejected clouds in between change nothing
        rejected(&mut b, t0, 3.2);
        assert!(b.error(at(t0, 4.0), BUDGET_MS, 2.0).is_some());
    }

    /// One frame within budget during the window: no ERROR until the window has passed it.
    #[test]
    fn a_frame_within_budget_in_the_window_means_no_error() {
        let t0 = Instant::now();
        let mut b = BudgetState::default();
        for k in 0..50 {
            let ms = if k == 30 { 50.0 } else { 150.0 };
            frame(&mut b, t0, 0.1 * k as f64, ms);
        }
        // frame 30 (3.0-3.05 s) was within budget; the run since starts at 3.1 s, its last frame
        // (49) ended at 5.05 s
        assert_eq!(b.error(at(t0, 5.06), BUDGET_MS, 2.0), None);
        frame(&mut b, t0, 5.1, 150.0);
        let e = b.error(at(t0, 5.3), BUDGET_MS, 2.0).expect("the run 3.1-5.25 s is 2.15 s long");
        assert!((e - 2.15).abs() < 1e-6, "{e}");
    }

    /// Frames slower than the window (the full model on a CPU, 16 s a frame): ERROR the whole
    /// time, including during a frame (it is over budget long before it ends).
    #[test]
    fn slow_frames_are_an_error_throughout() {
        let t0 = Instant::now();
        let mut b = BudgetState::default();
        b.frame_started(t0);
        assert_eq!(b.error(at(t0, 0.05), BUDGET_MS, 2.0), None, "not yet over budget");
        assert_eq!(b.error(at(t0, 1.0), BUDGET_MS, 2.0), None, "over budget for 1 s only");
        assert!(b.error(at(t0, 2.0), BUDGET_MS, 2.0).is_some());
        b.frame_processed(at(t0, 16.0), true);
        for k in 1..4 {
            b.frame_started(at(t0, 16.0 * k as f64));
            for s in [0.0, 0.05, 1.0, 8.0, 15.9] {
                let now = 16.0 * k as f64 + s;
                assert!(b.error(at(t0, now), BUDGET_MS, 2.0).is_some(), "at {now} s");
            }
            b.frame_processed(at(t0, 16.0 * (k + 1) as f64), true);
        }
        // the next frame is fast: within budget, no ERROR
        b.frame_started(at(t0, 64.0));
        b.frame_processed(at(t0, 64.05), false);
        assert_eq!(b.error(at(t0, 64.1), BUDGET_MS, 2.0), None);
    }

    /// `error_after_s: 0`: ERROR as soon as the last frame was over budget, none when it was not.
    #[test]
    fn zero_error_after_is_the_last_frame() {
        let t0 = Instant::now();
        let mut b = BudgetState::default();
        assert_eq!(b.error(t0, BUDGET_MS, 0.0), None, "no frame yet");
        frame(&mut b, t0, 0.0, 120.0);
        assert!(b.error(at(t0, 0.2), BUDGET_MS, 0.0).is_some());
        assert!(b.error(at(t0, 30.0), BUDGET_MS, 0.0).is_some());
        // huge values are no problem (no Duration overflow)
        assert_eq!(b.error(at(t0, 30.0), BUDGET_MS, 1e300), None);
        frame(&mut b, t0, 31.0, 20.0);
        assert_eq!(b.error(at(t0, 31.1), BUDGET_MS, 0.0), None);
        b.frame_started(at(t0, 32.0));
        assert_eq!(b.error(at(t0, 1e6), 1e300, 0.0), None);
    }
}
