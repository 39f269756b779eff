//! Progress of a replay on stderr: an `indicatif` bar (frames/s, ETA) on a terminal, plain
//! lines at most every two seconds otherwise (CI logs, `| tee`), or nothing.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar on a terminal, plain lines otherwise.
    Auto,
    Plain,
    Quiet,
}

pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    total: u64,
    done: u64,
    start: Instant,
    last_line: Option<Instant>,
}

impl Progress {
    /// `total`: frames expected (an estimate from the metadata; 0 when unknown).
    pub fn new(mode: ProgressMode, total: u64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (mode == ProgressMode::Auto && tty).then(|| {
            let b = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{bar:40} {pos}/{len} frames  {per_sec}  ETA {eta}  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b
        });
        Progress {
            bar,
            plain: mode == ProgressMode::Plain || (mode == ProgressMode::Auto && !tty),
            total,
            done: 0,
            start: Instant::now(),
            last_line: None,
        }
    }

    /// One more frame done (`note`: a short status, e.g. a skip).
    pub fn frame(&mut self, note: Option<&str>) {
        self.done += 1;
        if let Some(b) = &self.bar {
            b.set_position(self.done);
            if let Some(n) = note {
                b.println(n);
            }
            return;
        }
        if !self.plain {
            return;
        }
        if let Some(n) = note {
            eprintln!("replay: {n}");
        }
        let now = Instant::now();
        if self
            .last_line
            .is_none_or(|t| now - t >= Duration::from_secs(2))
            || self.done == self.total
        {
            self.last_line = Some(now);
            eprintln!("replay: {}", self.line());
        }
    }

    /// A line for the user that is not about one frame (nothing when quiet).
    pub fn note(&self, note: &str) {
        if let Some(b) = &self.bar {
            b.println(note);
        } else if self.plain {
            eprintln!("replay: {note}");
        }
    }

    fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            self.done as f64 / secs
        } else {
            0.0
        };
        let eta = if rate > 0.0 && self.total > self.done {
            format!(", ETA {:.0} s", (self.total - self.done) as f64 / rate)
        } else {
            String::new()
        };
        format!(
            "{}/{} frames, {rate:.2} frames/s{eta}",
            self.done, self.total
        )
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        } else if self.plain && self.last_line.is_some_and(|_| self.done != self.total) {
            eprintln!("replay: {}", self.line());
        }
    }
}
