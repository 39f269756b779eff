//! Telling a slow frame of ours from a slow host, for the benchmarks.
//!
//! On some GPU hosts every stage of a frame, host-only ones too, slows down 3-8x every second or
//! so while neither a sleeping probe thread nor the hypervisor's steal counter notices
//! (docs/node.md, the node bench). Two measures here say whose the slowdown is:
//!
//! - [`HostProbe`]: a thread that times a fixed CPU workload (integer mixing over a 64 KiB
//!   buffer: core and L1/L2, no memory bandwidth, no allocation, no lock, no syscall) over and
//!   over. Nothing of ours slows it but a core shortage; when it slows at the same moments as
//!   the frames, the host's cores ran slower (frequency, a neighbour on the same cores/caches).
//! - [`ProcCounters`]: per frame, from `/proc`: this process's page faults and CPU time, the
//!   whole host's busy and steal time. Faults or CPU time that jump with the slow frames are
//!   ours; other processes' CPU time (host busy minus ours) that jumps is a neighbour in this
//!   machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::json::{line, Fixed, Whole};
use crate::bench::percentiles::Percentiles;

/// One run of the probe's workload: when it started and how long it took, ms.
type Sample = (Instant, f64);

/// The probe thread; [`stop`](Self::stop) ends it and returns what it measured.
pub struct HostProbe {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The workload: `ROUNDS` passes of integer mixing over a 64 KiB buffer, ~0.1-0.3 ms on a
/// server core. Returns a value that depends on every step, so it cannot be optimised away.
fn workload(buf: &mut [u64]) -> u64 {
    const ROUNDS: usize = 24;
    let mut acc = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..ROUNDS {
        for v in buf.iter_mut() {
            acc = (acc ^ *v).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(31);
            *v = acc;
        }
    }
    acc
}

impl HostProbe {
    /// Starts the probe; it runs its workload back to back, sleeping 1 ms between runs (it
    /// takes a fraction of one core).
    pub fn start() -> HostProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let (s, log) = (stop.clone(), samples.clone());
        let thread = std::thread::Builder::new()
            .name("sptr-host-probe".into())
            .spawn(move || {
                let mut buf = vec![1u64; 8192];
                let mut sink = 0u64;
                while !s.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    sink ^= workload(&mut buf);
                    let d = t.elapsed().as_secs_f64() * 1e3;
                    log.lock().unwrap_or_else(|p| p.into_inner()).push((t, d));
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::hint::black_box(sink);
            })
            .ok();
        HostProbe { stop, samples, thread }
    }

    /// Stops the probe and returns its runs.
    pub fn stop(mut self) -> ProbeLog {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        ProbeLog::new(samples)
    }
}

/// A probe run this many times slower than the median is a slowdown of the host (a fixed
/// workload in a core's own caches does not vary 3x otherwise).
const SLOW_RUN_OVER_MEDIAN: f64 = 3.0;

/// Slow runs closer together than this belong to one episode.
const EPISODE_GAP: Duration = Duration::from_millis(200);

/// The probe's runs, in the order they ran (one thread, one after the other), and their median.
pub struct ProbeLog {
    samples: Vec<Sample>,
    median_ms: Option<f64>,
}

/// When a run ended.
fn run_end(&(t, d): &Sample) -> Instant {
    t + Duration::from_secs_f64(d / 1e3)
}

impl ProbeLog {
    fn new(samples: Vec<Sample>) -> ProbeLog {
        let median_ms = Percentiles::of(&samples.iter().map(|s| s.1).collect::<Vec<_>>()).map(|p| p.p50);
        ProbeLog { samples, median_ms }
    }

    /// The median run, ms (`None` without runs).
    pub fn median_ms(&self) -> Option<f64> {
        self.median_ms
    }

    /// The slowest run that overlapped `[from, to]`, as a multiple of the median run (1.0: the
    /// host ran the probe as fast as usual); `None` when no run overlapped. Runs follow one
    /// another, so their starts and ends both grow: the overlapping ones are found by bisection.
    pub fn max_ratio_in(&self, from: Instant, to: Instant) -> Option<f64> {
        let median = self.median_ms?;
        let first = self.samples.partition_point(|s| run_end(s) < from);
        let last = self.samples.partition_point(|s| s.0 <= to);
        self.samples.get(first..last)?.iter().map(|(_, d)| d / median).max_by(f64::total_cmp)
    }

    /// The host's slowdowns: runs, the median run, how many runs were over 3x and 10x the
    /// median, the episodes (slow runs grouped when under 200 ms apart) with when each started
    /// (s from the first run), how long it lasted (first slow run's start to the last one's end,
    /// ms) and its slowest run's ratio, and the median gap and length of episodes. On a quiet
    /// host there are none or a few short ones; on the noisy hosts of the node bench they came
    /// every ~1.5 s.
    pub fn slowdowns(&self) -> Slowdowns {
        let Some(typical) = self.median_ms else {
            return Slowdowns { runs: self.samples.len(), figures: None };
        };
        let t0 = self.samples.first().map_or_else(Instant::now, |s| s.0);
        // (start, end, slowest ratio)
        let mut episodes: Vec<(Instant, Instant, f64)> = Vec::new();
        for s @ &(t, d) in self.samples.iter().filter(|s| s.1 > SLOW_RUN_OVER_MEDIAN * typical) {
            let (ratio, end) = (d / typical, run_end(s));
            match episodes.last_mut() {
                Some(e) if t.saturating_duration_since(e.1) < EPISODE_GAP => {
                    e.1 = end;
                    e.2 = e.2.max(ratio);
                }
                _ => episodes.push((t, end, ratio)),
            }
        }
        let length_ms = |e: &(Instant, Instant, f64)| e.1.duration_since(e.0).as_secs_f64() * 1e3;
        let gaps: Vec<f64> = episodes.windows(2).map(|w| w[1].0.duration_since(w[0].0).as_secs_f64()).collect();
        let lengths: Vec<f64> = episodes.iter().map(length_ms).collect();
        let count_over = |k: f64| self.samples.iter().filter(|s| s.1 > k * typical).count();
        Slowdowns {
            runs: self.samples.len(),
            figures: Some(SlowdownFigures {
                probe_median_ms: Fixed(typical),
                runs_over_3x: count_over(SLOW_RUN_OVER_MEDIAN),
                runs_over_10x: count_over(10.0),
                episodes: episodes.len(),
                episode_gap_s_p50: Percentiles::of(&gaps).map(|p| Fixed(p.p50)),
                episode_ms_p50: Percentiles::of(&lengths).map(|p| Fixed(p.p50)),
                episode_list: episodes.iter().map(|e| (Fixed(e.0.duration_since(t0).as_secs_f64()), Fixed(length_ms(e)), Fixed(e.2))).collect(),
            }),
        }
    }
}

/// The probe's slowdowns ([`ProbeLog::slowdowns`]); `{"runs":0}` alone without runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slowdowns {
    pub runs: usize,
    #[serde(flatten)]
    pub figures: Option<SlowdownFigures>,
}

/// The figures of [`Slowdowns`] (medians nearest rank, as the benchmarks' `p50`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowdownFigures {
    pub probe_median_ms: Fixed<4>,
    pub runs_over_3x: usize,
    pub runs_over_10x: usize,
    pub episodes: usize,
    /// `null` with fewer than two episodes.
    pub episode_gap_s_p50: Option<Fixed<2>>,
    pub episode_ms_p50: Option<Fixed<1>>,
    /// Per episode: `[start s, length ms, slowest run / median]`.
    pub episode_list: Vec<(Fixed<3>, Fixed<1>, Fixed<1>)>,
}

/// The JSON of `sptr bench host`.
#[derive(Serialize)]
struct HostBench {
    bench: &'static str,
    duration_s: Fixed<1>,
    steal_ms: Whole,
    probe: Slowdowns,
}

/// `sptr bench host`: the probe alone for `duration`, nothing else of ours running: does this
/// machine's every core slow down now and then (a noisy host), before a benchmark is blamed?
pub fn bench_alone(duration: Duration) -> String {
    let steal0 = ProcCounters::now().host_steal_ms;
    let probe = HostProbe::start();
    std::thread::sleep(duration);
    let log = probe.stop();
    let steal = ProcCounters::now().host_steal_ms - steal0;
    line(&HostBench { bench: "host", duration_s: Fixed(duration.as_secs_f64()), steal_ms: Whole(steal), probe: log.slowdowns() })
}

/// Counters from `/proc` at one moment (Linux; zeros elsewhere).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcCounters {
    /// This process's minor and major page faults.
    pub minor_faults: u64,
    pub major_faults: u64,
    /// This process's CPU time (user + system), ms.
    pub self_cpu_ms: f64,
    /// Every CPU's busy time (user, nice, system, irq, softirq), ms.
    pub host_busy_ms: f64,
    /// Every CPU's steal time, ms.
    pub host_steal_ms: f64,
}

/// `/proc` counts in clock ticks of 10 ms (USER_HZ 100 on Linux).
const TICK_MS: f64 = 10.0;

impl ProcCounters {
    pub fn now() -> ProcCounters {
        let mut c = ProcCounters::default();
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            c.read_self_stat(&stat);
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
            c.read_host_stat(&stat);
        }
        c
    }

    /// `/proc/self/stat`: fields after the command name's closing parenthesis (the name may hold
    /// spaces); minflt, majflt, utime, stime are fields 10, 12, 14, 15 of the whole line.
    fn read_self_stat(&mut self, stat: &str) {
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return };
        // rest starts at field 3 (state)
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| f.get(n - 3).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        self.minor_faults = field(10);
        self.major_faults = field(12);
        self.self_cpu_ms = (field(14) + field(15)) as f64 * TICK_MS;
    }

    /// `/proc/stat`'s `cpu` line: user nice system idle iowait irq softirq steal ...
    fn read_host_stat(&mut self, stat: &str) {
        let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return };
        let v: Vec<u64> = line.split_whitespace().skip(1).map(|s| s.parse().unwrap_or(0)).collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        self.host_busy_ms = (at(0) + at(1) + at(2) + at(5) + at(6)) as f64 * TICK_MS;
        self.host_steal_ms = at(7) as f64 * TICK_MS;
    }

    /// What changed from `earlier` to `self`.
    pub fn since(&self, earlier: &ProcCounters) -> ProcCounters {
        ProcCounters {
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
            major_faults: self.major_faults.saturating_sub(earlier.major_faults),
            self_cpu_ms: self.self_cpu_ms - earlier.self_cpu_ms,
            host_busy_ms: self.host_busy_ms - earlier.host_busy_ms,
            host_steal_ms: self.host_steal_ms - earlier.host_steal_ms,
        }
    }
}

/// One timed frame: its time, the probe's slowest run during it (ratio to the median) and what
/// `/proc` counted during it.
pub struct FrameHost {
    pub ms: f64,
    pub probe_ratio: Option<f64>,
    pub counts: ProcCounters,
}

/// The median of a group for the JSON (nearest rank, as the benchmarks' `p50`), 0 for an empty
/// group (its `frames` says 0).
fn group_median(v: &[f64]) -> f64 {
    Percentiles::of(v).map_or(0.0, |p| p.p50)
}

/// A frame is slow when it took over this multiple of the median frame.
const SLOW_OVER_MEDIAN: f64 = 1.5;

/// The host measures of a bench's frames: the probe's median, per frame the probe ratio, faults
/// and CPU times, and a comparison of the slow frames (over 1.5x the median frame) with the
/// others: the median probe ratio, faults, own CPU and other processes' CPU of each group; and
/// the probe's slowdowns over the whole run ([`ProbeLog::slowdowns`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostFrames {
    pub probe_median_ms: Option<Fixed<4>>,
    pub slow_frames: FrameGroup,
    pub other_frames: FrameGroup,
    pub slowdowns: Option<Slowdowns>,
    pub probe_ratio: Vec<Option<Fixed<2>>>,
    pub minor_faults: Vec<u64>,
    pub major_faults: Vec<u64>,
    pub self_cpu_ms: Vec<Whole>,
    pub host_busy_ms: Vec<Whole>,
    pub steal_ms: Vec<Whole>,
}

/// The slow or the other frames of [`HostFrames`]: how many, and their medians.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameGroup {
    pub frames: usize,
    pub probe_ratio_p50: Fixed<2>,
    pub minor_faults_p50: Whole,
    pub self_cpu_ms_p50: Fixed<1>,
    pub other_cpu_ms_p50: Fixed<1>,
    pub steal_ms_p50: Fixed<1>,
}

impl HostFrames {
    pub fn of(probe: Option<&ProbeLog>, frames: &[FrameHost]) -> HostFrames {
        let typical = group_median(&frames.iter().map(|f| f.ms).collect::<Vec<_>>());
        let group = |slow: bool| -> FrameGroup {
            let g: Vec<&FrameHost> = frames.iter().filter(|f| (f.ms > SLOW_OVER_MEDIAN * typical) == slow).collect();
            let median = |v: &dyn Fn(&FrameHost) -> Option<f64>| group_median(&g.iter().filter_map(|f| v(f)).collect::<Vec<_>>());
            FrameGroup {
                frames: g.len(),
                probe_ratio_p50: Fixed(median(&|f| f.probe_ratio)),
                minor_faults_p50: Whole(median(&|f| Some(f.counts.minor_faults as f64))),
                self_cpu_ms_p50: Fixed(median(&|f| Some(f.counts.self_cpu_ms))),
                other_cpu_ms_p50: Fixed(median(&|f| Some((f.counts.host_busy_ms - f.counts.self_cpu_ms).max(0.0)))),
                steal_ms_p50: Fixed(median(&|f| Some(f.counts.host_steal_ms))),
            }
        };
        HostFrames {
            probe_median_ms: probe.and_then(|p| p.median_ms).map(Fixed),
            slow_frames: group(true),
            other_frames: group(false),
            slowdowns: probe.map(ProbeLog::slowdowns),
            probe_ratio: frames.iter().map(|f| f.probe_ratio.map(Fixed)).collect(),
            minor_faults: frames.iter().map(|f| f.counts.minor_faults).collect(),
            major_faults: frames.iter().map(|f| f.counts.major_faults).collect(),
            self_cpu_ms: frames.iter().map(|f| Whole(f.counts.self_cpu_ms)).collect(),
            host_busy_ms: frames.iter().map(|f| Whole(f.counts.host_busy_ms)).collect(),
            steal_ms: frames.iter().map(|f| Whole(f.counts.host_steal_ms)).collect(),
        }
    }
}

/// The probe alone, for frames timed in another process (the node bench's peer times the
/// node's frames; `/proc/self` there would be the peer's, so only the probe is reported): the
/// probe's median run, the slow frames' (over 1.5x the median latency) median probe ratio
/// against the other complete frames', and each frame's ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeFrames {
    pub probe_median_ms: Option<Fixed<4>>,
    pub slow_frames: ProbeGroup,
    pub other_frames: ProbeGroup,
    pub probe_ratio: Vec<Option<Fixed<2>>>,
}

/// The slow or the other complete frames of [`ProbeFrames`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeGroup {
    pub frames: usize,
    pub probe_ratio_p50: Fixed<2>,
}

impl ProbeFrames {
    /// Per frame `(latency ms, probe ratio)`, `None` for a frame that never completed.
    pub fn of(probe_median_ms: Option<f64>, frames: &[(Option<f64>, Option<f64>)]) -> ProbeFrames {
        let typical = group_median(&frames.iter().filter_map(|f| f.0).collect::<Vec<_>>());
        let group = |slow: bool| -> ProbeGroup {
            let g: Vec<Option<f64>> =
                frames.iter().filter(|f| f.0.is_some_and(|ms| (ms > SLOW_OVER_MEDIAN * typical) == slow)).map(|f| f.1).collect();
            ProbeGroup { frames: g.len(), probe_ratio_p50: Fixed(group_median(&g.into_iter().flatten().collect::<Vec<_>>())) }
        };
        ProbeFrames {
            probe_median_ms: probe_median_ms.map(Fixed),
            slow_frames: group(true),
            other_frames: group(false),
            probe_ratio: frames.iter().map(|f| f.1.map(Fixed)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        let line = "4242 (sptr (bench) x) R 1 2 3 4 5 6 1234 0 7 0 150 25 0 0 20 0";
        let mut c = ProcCounters::default();
        c.read_self_stat(line);
        assert_eq!((c.minor_faults, c.major_faults), (1234, 7));
        assert_eq!(c.self_cpu_ms, 1750.0);
    }

    #[test]
    fn host_stat_busy_excludes_idle_and_iowait_and_steal_is_its_own() {
        let stat = "cpu  100 5 20 9000 40 3 2 7 0 0\ncpu0 50 2 10 4500 20 1 1 3 0 0\n";
        let mut c = ProcCounters::default();
        c.read_host_stat(stat);
        assert_eq!(c.host_busy_ms, (100 + 5 + 20 + 3 + 2) as f64 * 10.0);
        assert_eq!(c.host_steal_ms, 70.0);
    }

    #[test]
    fn counters_of_this_process_grow_with_its_work() {
        let a = ProcCounters::now();
        if a == ProcCounters::default() {
            return; // no /proc (not Linux)
        }
        // touch 64 MiB of fresh pages: at least 64 MiB / 2 MiB minor faults even with huge pages
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let d = ProcCounters::now().since(&a);
        assert!(d.minor_faults >= 32, "{d:?}");
    }

    #[test]
    fn probe_ratio_is_the_slowest_overlapping_run_over_the_median() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let log = ProbeLog::new(vec![(at(0), 1.0), (at(10), 1.0), (at(20), 4.0), (at(30), 1.0), (at(40), 2.0)]);
        assert_eq!(log.median_ms(), Some(1.0));
        assert_eq!(log.max_ratio_in(at(19), at(25)), Some(4.0));
        assert_eq!(log.max_ratio_in(at(29), at(35)), Some(1.0));
        assert_eq!(log.max_ratio_in(at(41), at(42)), Some(2.0)); // started before, still running
        assert_eq!(log.max_ratio_in(at(50), at(60)), None);
    }

    #[test]
    fn slowdowns_are_grouped_into_episodes() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut samples: Vec<Sample> = (0..100).map(|i| (at(i * 20), 1.0)).collect();
        // two episodes 1.5 s apart: runs at 400, 420, 440 ms (4x, 12x, 5x: 400 to 445 ms) and one
        // at 1900 ms (3.5x: 3.5 ms long)
        samples[20].1 = 4.0;
        samples[21].1 = 12.0;
        samples[22].1 = 5.0;
        samples[95].1 = 3.5;
        let j = line(&ProbeLog::new(samples).slowdowns());
        // medians are nearest-rank, as the benchmarks' p50: of two episodes, the shorter
        assert_eq!(
            j,
            "{\"runs\":100,\"probe_median_ms\":1.0,\"runs_over_3x\":4,\"runs_over_10x\":1,\"episodes\":2,\
             \"episode_gap_s_p50\":1.5,\"episode_ms_p50\":3.5,\"episode_list\":[[0.4,45.0,12.0],[1.9,3.5,3.5]]}"
        );
        assert_eq!(line(&ProbeLog::new(Vec::new()).slowdowns()), "{\"runs\":0}");
        // one run: a median, no episode
        let one = line(&ProbeLog::new(vec![(t0, 0.25)]).slowdowns());
        assert_eq!(one, "{\"runs\":1,\"probe_median_ms\":0.25,\"runs_over_3x\":0,\"runs_over_10x\":0,\"episodes\":0,\"episode_gap_s_p50\":null,\"episode_ms_p50\":null,\"episode_list\":[]}");
    }

    #[test]
    fn the_probe_alone_reports_its_runs() {
        let text = bench_alone(Duration::from_millis(50));
        let j = crate::bench::json::parse_row(&text, &["bench", "duration_s", "steal_ms", "probe"]);
        assert_eq!(j["bench"], "host");
        assert_eq!(j["duration_s"].as_f64(), Some(0.1), "0.05 s to 0.1 s, as ever");
        assert!(j["steal_ms"].is_i64(), "whole ms: {text}");
        // the probe thread may get no run in on a loaded machine: then it says so
        assert!(j["probe"]["runs"].as_u64().is_some(), "{j}");
    }

    #[test]
    fn a_running_probe_records_runs() {
        let probe = HostProbe::start();
        // wait for runs, not for a time: the probe's first runs may come late on a busy machine
        while probe.samples.lock().unwrap().len() < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let log = probe.stop();
        assert!(log.median_ms().unwrap() > 0.0);
    }

    #[test]
    fn slow_frames_are_compared_with_the_others() {
        let f = |ms: f64, ratio: f64, faults: u64| FrameHost {
            ms,
            probe_ratio: Some(ratio),
            counts: ProcCounters { minor_faults: faults, self_cpu_ms: 20.0, host_busy_ms: 30.0, ..Default::default() },
        };
        let frames = [f(10.0, 1.0, 5), f(11.0, 1.1, 5), f(10.0, 1.0, 6), f(40.0, 3.0, 500)];
        let probe = ProbeLog::new(vec![(Instant::now(), 0.2)]);
        let j = line(&HostFrames::of(Some(&probe), &frames));
        let keys = [
            "probe_median_ms", "slow_frames", "other_frames", "slowdowns", "probe_ratio", "minor_faults", "major_faults",
            "self_cpu_ms", "host_busy_ms", "steal_ms",
        ];
        let v = crate::bench::json::parse_row(&j, &keys);
        assert!(j.contains("\"probe_median_ms\":0.2,"), "{j}");
        assert!(j.contains("\"slowdowns\":{\"runs\":1,"), "{j}");
        assert!(j.contains("\"slow_frames\":{\"frames\":1,\"probe_ratio_p50\":3.0,\"minor_faults_p50\":500,"), "{j}");
        assert!(j.contains("\"other_frames\":{\"frames\":3,\"probe_ratio_p50\":1.0,\"minor_faults_p50\":5,\"self_cpu_ms_p50\":20.0,\"other_cpu_ms_p50\":10.0,\"steal_ms_p50\":0.0}"), "{j}");
        assert!(j.contains("\"probe_ratio\":[1.0,1.1,1.0,3.0],\"minor_faults\":[5,5,6,500],\"major_faults\":[0,0,0,0],\"self_cpu_ms\":[20,20,20,20]"), "{j}");
        assert_eq!(v["host_busy_ms"][0], 30);
        // without a probe: no median, no slowdowns
        let v: serde_json::Value = serde_json::from_str(&line(&HostFrames::of(None, &frames))).unwrap();
        assert!(v["probe_median_ms"].is_null() && v["slowdowns"].is_null(), "{v}");
    }

    #[test]
    fn probe_alone_compares_slow_complete_frames_and_skips_incomplete_ones() {
        let frames = [(Some(10.0), Some(1.0)), (Some(11.0), Some(1.2)), (None, Some(9.0)), (Some(10.0), None), (Some(40.0), Some(3.5))];
        let j = line(&ProbeFrames::of(Some(0.4), &frames));
        // the other complete frames' ratios are 1.0 and 1.2 (one has none): nearest rank gives 1.0
        assert_eq!(
            j,
            "{\"probe_median_ms\":0.4,\"slow_frames\":{\"frames\":1,\"probe_ratio_p50\":3.5},\
             \"other_frames\":{\"frames\":3,\"probe_ratio_p50\":1.0},\"probe_ratio\":[1.0,1.2,9.0,null,3.5]}"
        );
        crate::bench::json::parse_row(&j, &["probe_median_ms", "slow_frames", "other_frames", "probe_ratio"]);
    }
}
