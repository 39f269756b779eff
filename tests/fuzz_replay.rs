//! The fuzz targets' checks (fuzz/checks/, the same code the libFuzzer targets of fuzz/ run)
//! replayed in the normal test suite: per target, the seeds scripts/fuzz.sh builds, every finding
//! kept in tests/data/fuzz/<target>/, and a fixed set of deterministic mutations of each (byte and
//! bit flips, truncations, a byte inserted or deleted, a chunk duplicated, bytes overwritten with
//! random or boundary values), from a fixed-seed xorshift generator: the same inputs every run.
//!
//! Coverage-guided runs, which find new inputs, are `scripts/fuzz.sh SECONDS`; this replay is
//! what every `cargo test` runs. A check that panics, or one allocation above the fuzzers' 2 GiB
//! bound, fails the target's test naming the seed and the mutation, and the input is written to
//! `$CARGO_TARGET_TMPDIR/fuzz_replay/<target>/` (run it again with
//! `cd fuzz && cargo +nightly fuzz run <target> FILE`).

mod common;

#[path = "../fuzz/checks/bag_metadata.rs"]
mod bag_metadata;
#[path = "../fuzz/checks/bin_cloud.rs"]
mod bin_cloud;
#[path = "../fuzz/checks/calib_json.rs"]
mod calib_json;
#[path = "../fuzz/checks/camera_info_cdr.rs"]
mod camera_info_cdr;
#[path = "../fuzz/checks/cloud_cdr.rs"]
mod cloud_cdr;
#[path = "../fuzz/checks/compressed_image_cdr.rs"]
mod compressed_image_cdr;
#[path = "../fuzz/checks/image_cdr.rs"]
mod image_cdr;
#[path = "../fuzz/checks/jpeg.rs"]
mod jpeg;
#[path = "../fuzz/checks/mcap_file.rs"]
mod mcap_file;
#[path = "../fuzz/checks/model_yaml.rs"]
mod model_yaml;
#[path = "../fuzz/checks/params_yaml.rs"]
mod params_yaml;
#[path = "../fuzz/checks/pcd.rs"]
mod pcd;
#[path = "../fuzz/checks/png.rs"]
mod png;
#[path = "../fuzz/checks/safetensors.rs"]
mod safetensors;
#[path = "../fuzz/checks/sqlite_bag.rs"]
mod sqlite_bag;

use sptr::bag::reader::Bag;
use sptr::msgs::cdr::{decode_message, Message};
use sptr::sensors::image::encodings::DecodeLimits;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::panic::catch_unwind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Every target of fuzz/ (`fuzz/fuzz_targets/<name>.rs`), each replayed by a test below.
const TARGETS: [&str; 15] = [
    "bag_metadata",
    "bin_cloud",
    "calib_json",
    "camera_info_cdr",
    "cloud_cdr",
    "compressed_image_cdr",
    "image_cdr",
    "jpeg",
    "mcap_file",
    "model_yaml",
    "params_yaml",
    "pcd",
    "png",
    "safetensors",
    "sqlite_bag",
];

/// Mutations of each seed and finding. A seed's inputs are its mutations 1..=MUTATIONS; the
/// number is the same on every machine (no time budget), so a run explores the same inputs.
const MUTATIONS: u32 = 300;

/// The largest single allocation the fuzzers allow (scripts/fuzz.sh: `-malloc_limit_mb=2048`).
const ALLOCATION_LIMIT: usize = 2048 << 20;

// ----- the allocation bound -----

/// The system allocator, noting the largest single allocation of each thread (a decoder must
/// not reserve what its input cannot back), and naming the input under way when the system
/// refuses an allocation (the process then aborts, before the harness could report it).
struct NoteLargest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    /// The input under way on this thread (target, seed, mutation), for the message above.
    static CURRENT: RefCell<String> = const { RefCell::new(String::new()) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

fn refused(size: usize) {
    use std::io::Write;
    let _ = CURRENT.try_with(|c| {
        if let Ok(c) = c.try_borrow() {
            // Writing to stderr does not allocate.
            let _ = writeln!(std::io::stderr(), "fuzz_replay: an allocation of {size} bytes was refused while running {c}");
        }
    });
}

// SAFETY: every call goes to the system allocator unchanged.
unsafe impl GlobalAlloc for NoteLargest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        let p = System.alloc(layout);
        if p.is_null() {
            refused(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            refused(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() {
            refused(new_size);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: NoteLargest = NoteLargest;

// ----- panics -----

thread_local! {
    /// Whether this thread is running a check under [`replay`], whose panics are findings that
    /// the replay reports itself, and the last such panic's message and place.
    static REPLAYING: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Installs (once) a panic hook that keeps a replayed check's panic to itself (its message and
/// place for the report; no backtrace per input, which a few hundred failing mutations would
/// make slow) and leaves every other panic to the default hook.
fn quiet_replayed_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if REPLAYING.with(|r| r.get()) {
                let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = format!("{}{place}", panic_message(info.payload())));
            } else {
                default(info);
            }
        }));
    });
}

// ----- seeds -----

/// An input to replay: a seed of scripts/fuzz.sh or a committed finding.
struct Seed {
    /// Where it comes from: a path under the repository, or what the script builds it from.
    name: String,
    bytes: Vec<u8>,
    /// A committed finding (tests/data/fuzz/), which need not decode.
    finding: bool,
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(common::root()).unwrap_or(path).display().to_string()
}

/// The files of `dir` (relative to the repository root) whose names start with `prefix` and end
/// with `suffix`, sorted: a shell glob `dir/prefix*suffix`, which must match.
fn glob(dir: &str, prefix: &str, suffix: &str) -> Vec<Seed> {
    let full = common::root().join(dir);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&full)
        .unwrap_or_else(|e| panic!("{}: {e}", full.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix)))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seed file {dir}/{prefix}*{suffix}");
    paths.into_iter().map(|p| Seed { name: relative(&p), bytes: read(&p), finding: false }).collect()
}

fn built(name: &str, bytes: Vec<u8>) -> Seed {
    Seed { name: name.to_string(), bytes, finding: false }
}

/// The first `n` bytes of a file (`head -c n`).
fn head(path: &Path, n: usize) -> Vec<u8> {
    let mut bytes = read(path);
    bytes.truncate(n);
    bytes
}

/// The seeds scripts/fuzz.sh's `seed()` gives `target`, built the same way.
fn script_seeds(target: &str) -> Vec<Seed> {
    let root = common::root();
    match target {
        "cloud_cdr" => glob("tests/data/cdr", "pointcloud2.", ".cdr"),
        "image_cdr" => glob("tests/data/cdr", "image.", ".cdr"),
        "compressed_image_cdr" => glob("tests/data/cdr", "compressed_image.", ".cdr"),
        "camera_info_cdr" => glob("tests/data/cdr", "camera_info.", ".cdr"),
        "jpeg" => glob("tests/data/camera", "", ".jpg"),
        "png" => glob("tests/data/camera", "", ".png"),
        "pcd" => {
            let ascii = b"VERSION .7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH 2\n\
                          HEIGHT 1\nPOINTS 2\nDATA ascii\n1 2 3 4\n5 6 7 8\n";
            let mut binary = b"VERSION .7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 2\nHEIGHT 1\nPOINTS 2\n\
                               DATA binary\n"
                .to_vec();
            binary.extend(head(&root.join("tests/data/semantickitti/000000.bin"), 24));
            vec![built("ascii.pcd (scripts/fuzz.sh)", ascii.to_vec()), built("binary.pcd (scripts/fuzz.sh)", binary)]
        }
        "bin_cloud" => {
            let mut kitti = vec![4u8];
            kitti.extend(head(&root.join("tests/data/semantickitti/000000.bin"), 1600));
            let mut nuscenes = vec![5u8];
            nuscenes.extend(head(&common::nuscenes_sweep_path(), 2000));
            vec![built("kitti (scripts/fuzz.sh)", kitti), built("nuscenes (scripts/fuzz.sh)", nuscenes)]
        }
        "mcap_file" => {
            let mut seeds = glob("tests/data/bags/mcap_small", "", ".mcap");
            seeds.extend(glob("tests/data/bags/mcap_zstd", "", ".mcap"));
            seeds
        }
        "sqlite_bag" => glob("tests/data/bags/sqlite_small", "", ".db3"),
        "bag_metadata" => ["mcap_small", "sqlite_small"]
            .iter()
            .flat_map(|b| glob(&format!("tests/data/bags/{b}"), "metadata", ".yaml"))
            .collect(),
        "safetensors" => vec![built("tiny.safetensors (scripts/fuzz.sh)", tiny_safetensors())],
        "model_yaml" => glob("config/models", "", ".yaml"),
        "params_yaml" => glob("config", "", ".yaml"),
        "calib_json" => glob("tests/data/nuscenes", "calib", ".json"),
        _ => panic!("scripts/fuzz.sh has no seeds for {target}"),
    }
}

/// The script's tiny safetensors file: Python's `json.dumps` of two tensors (its separators are
/// `", "` and `": "`), its length as a little-endian u64 before it, and 20 zero bytes of data.
fn tiny_safetensors() -> Vec<u8> {
    let header = r#"{"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 20]);
    bytes
}

/// The committed findings of `target` (tests/data/fuzz/<target>/), which the script adds to its
/// seeds.
fn findings(target: &str) -> Vec<Seed> {
    let dir = common::root().join("tests/data/fuzz").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    paths.sort();
    paths.into_iter().map(|p| Seed { name: relative(&p), bytes: read(&p), finding: true }).collect()
}

// ----- mutations -----

/// xorshift64*: a small fixed-seed generator, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds start far apart (and never at 0).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// FNV-1a of a seed's name, so that each seed's mutations are its own and do not depend on
/// which other seeds exist.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Values that break length and count fields: zero, all ones, and the signed limits.
const BOUNDARY: [u64; 6] = [0, u64::MAX, 0x7F, 0x80, 0x7FFF_FFFF, 0x8000_0000];

/// Mutation `n` (1, 2, ...) of `seed` named `name`: one to three edits, each one of the kinds
/// below, at positions and of sizes drawn from a generator seeded by the name and `n`.
fn mutate(name: &str, seed: &[u8], n: u32) -> Vec<u8> {
    let mut rng = Rng::new(fnv(name) ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut data = seed.to_vec();
    let edits = 1 + if rng.below(3) == 0 { 1 + rng.below(2) } else { 0 };
    // The first edit's kind cycles with `n`, so every kind is tried on every seed.
    let mut kind = n as usize % 8;
    for e in 0..edits {
        if e > 0 {
            kind = rng.below(8);
        }
        edit(&mut data, kind, &mut rng);
    }
    data
}

fn edit(data: &mut Vec<u8>, kind: usize, rng: &mut Rng) {
    let len = data.len();
    if len == 0 {
        data.push(rng.byte());
        return;
    }
    match kind {
        // A byte replaced by another.
        0 => {
            let at = rng.below(len);
            data[at] ^= 1 + rng.below(255) as u8;
        }
        // One bit flipped.
        1 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        // Cut short: at a random point, or at a quarter, half or three quarters, or one byte
        // before the end.
        2 => {
            let at = match rng.below(3) {
                0 => rng.below(len),
                1 => len * (1 + rng.below(3)) / 4,
                _ => len - 1,
            };
            data.truncate(at);
        }
        // A byte inserted.
        3 => {
            let at = rng.below(len + 1);
            data.insert(at, rng.byte());
        }
        // A byte deleted.
        4 => {
            data.remove(rng.below(len));
        }
        // A chunk of up to 64 bytes repeated right after itself or somewhere else.
        5 => {
            let from = rng.below(len);
            let n = 1 + rng.below((len - from).min(64));
            let chunk = data[from..from + n].to_vec();
            let to = if rng.below(2) == 0 { from + n } else { rng.below(len + 1) };
            data.splice(to..to, chunk);
        }
        // Up to 8 bytes overwritten with random ones.
        6 => {
            let at = rng.below(len);
            for b in data.iter_mut().skip(at).take(1 + rng.below(8)) {
                *b = rng.byte();
            }
        }
        // A boundary value written over 1, 2, 4 or 8 bytes, little or big endian (a length or
        // count field).
        _ => {
            let width = 1 << rng.below(4);
            let value = BOUNDARY[rng.below(BOUNDARY.len())];
            let le = value.to_le_bytes();
            let mut bytes = le[..width].to_vec();
            if rng.below(2) == 0 {
                bytes.reverse();
            }
            let at = rng.below(len);
            for (d, s) in data.iter_mut().skip(at).zip(&bytes) {
                *d = *s;
            }
        }
    }
}

// ----- the replay -----

/// What a replay ran.
#[derive(Debug)]
struct Replayed {
    inputs: usize,
    seeds: usize,
    findings: usize,
    slowest: (Duration, String),
}

/// Runs `check` on every seed and `mutations` mutations of each. Err: one line per input that
/// made the check panic or allocate more than `limit` bytes at once (target, seed, mutation, the
/// panic message and where the input was written).
fn replay(target: &str, check: fn(&[u8]), seeds: &[Seed], mutations: u32, limit: usize) -> Result<Replayed, String> {
    assert!(!seeds.is_empty(), "{target}: no seeds to replay");
    quiet_replayed_panics();
    let mut failures = Vec::new();
    let mut out = Replayed { inputs: 0, seeds: 0, findings: 0, slowest: (Duration::ZERO, String::new()) };
    for seed in seeds {
        if seed.finding {
            out.findings += 1;
        } else {
            out.seeds += 1;
        }
        for n in 0..=mutations {
            let input = if n == 0 { seed.bytes.clone() } else { mutate(&seed.name, &seed.bytes, n) };
            let what = if n == 0 { format!("{target}: {} itself", seed.name) } else { format!("{target}: {} mutation {n}", seed.name) };
            CURRENT.with(|c| *c.borrow_mut() = what.clone());
            LARGEST.with(|l| l.set(0));
            let start = Instant::now();
            REPLAYING.with(|r| r.set(true));
            let outcome = catch_unwind(|| check(&input));
            REPLAYING.with(|r| r.set(false));
            let took = start.elapsed();
            let largest = LARGEST.with(|l| l.get());
            out.inputs += 1;
            if took > out.slowest.0 {
                out.slowest = (took, what.clone());
            }
            let problem = match outcome {
                Err(_) => Some(format!("panicked: {}", LAST_PANIC.with(|p| p.take()))),
                Ok(()) if largest > limit => Some(format!("allocated {largest} bytes at once (the bound is {limit})")),
                Ok(()) => None,
            };
            if let Some(problem) = problem {
                let file = save(target, &seed.name, n, &input);
                failures.push(format!("{what} {problem} (input: {})", file.display()));
            }
        }
    }
    CURRENT.with(|c| c.borrow_mut().clear());
    if failures.is_empty() {
        Ok(out)
    } else {
        Err(format!("{} of {} inputs failed:\n{}", failures.len(), out.inputs, failures.join("\n")))
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(not a string)".to_string()
    }
}

/// Writes a failing input to `$CARGO_TARGET_TMPDIR/fuzz_replay/<target>/`, named after its seed
/// and mutation.
fn save(target: &str, seed: &str, n: u32, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz_replay").join(target);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let stem: String = seed.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' { c } else { '_' }).collect();
    let file = dir.join(if n == 0 { stem } else { format!("{stem}.mutation-{n}") });
    std::fs::write(&file, input).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    file
}

/// Replays `target`'s check on its seeds, findings and their mutations, after checking that
/// every seed of the script is an input the decoder accepts (`accepts`, the same public call the
/// check starts with): a seed the decoder refuses would leave the checks after it unexercised.
fn replay_target(target: &str, check: fn(&[u8]), accepts: fn(&[u8]) -> bool) {
    replay_target_with(target, check, accepts, Vec::new());
}

/// [`replay_target`] with seeds of the replay's own after the script's.
fn replay_target_with(target: &str, check: fn(&[u8]), accepts: fn(&[u8]) -> bool, extra: Vec<Seed>) {
    let mut seeds = script_seeds(target);
    assert!(!seeds.is_empty(), "{target}: scripts/fuzz.sh gives no seeds");
    seeds.extend(extra);
    let refused: Vec<&str> = seeds.iter().filter(|s| !accepts(&s.bytes)).map(|s| s.name.as_str()).collect();
    assert!(refused.is_empty(), "{target}: the decoder refuses the seeds {refused:?}: the replay would not get past it");
    seeds.extend(findings(target));
    let start = Instant::now();
    match replay(target, check, &seeds, MUTATIONS, ALLOCATION_LIMIT) {
        Ok(r) => {
            assert_eq!(r.inputs, seeds.len() * (MUTATIONS as usize + 1));
            println!(
                "{target}: {} inputs ({} seeds, {} findings, {MUTATIONS} mutations each) in {:.1} s; slowest {:?} ({})",
                r.inputs,
                r.seeds,
                r.findings,
                start.elapsed().as_secs_f64(),
                r.slowest.0,
                r.slowest.1
            );
        }
        Err(e) => panic!("fuzz replay of `{target}`: {e}"),
    }
}

// ----- what each seed must decode to -----

const LIMITS: DecodeLimits = DecodeLimits { max_pixels: 1 << 20 };

/// A scratch directory of this test process for the bag seeds.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-replay-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Removes, when dropped, the directories of this process in the temp directory that the bag
/// checks (`sptr-fuzz-mcap-<pid>`, ...) and [`scratch`] write.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn temp_dirs(prefixes: &[&str]) -> RemoveOnDrop {
    RemoveOnDrop(prefixes.iter().map(|p| std::env::temp_dir().join(format!("{p}-{}", std::process::id()))).collect())
}

/// Whether the bag at `path` opens and reads at least one message, every one without an error.
fn bag_reads(path: &Path) -> bool {
    let Ok(bag) = Bag::open(path) else {
        return false;
    };
    let mut n = 0;
    for m in bag.messages(&[]) {
        if m.is_err() {
            return false;
        }
        n += 1;
    }
    n > 0
}

// ----- one test per target -----

#[test]
fn pointcloud2_cdr_never_has_more_points_than_its_header_and_round_trips() {
    replay_target("cloud_cdr", cloud_cdr::check, |d| {
        let Ok(Message::PointCloud2(msg)) = decode_message("sensor_msgs/msg/PointCloud2", d) else {
            return false;
        };
        sptr::msgs::cloud::decode(&msg.cloud.view()).is_ok_and(|(_, r)| r.kept > 0)
    });
}

#[test]
fn image_cdr_decodes_to_width_by_height_pixels_within_the_limit() {
    use sptr::sensors::image::encodings::{decode_raw, RawImage};
    replay_target("image_cdr", image_cdr::check, |d| {
        let Ok(Message::Image(msg)) = decode_message("sensor_msgs/msg/Image", d) else {
            return false;
        };
        decode_raw(RawImage::from(&msg), &LIMITS).is_ok()
    });
}

/// The script's CompressedImage seeds carry a 13-byte JPEG stub (SOI, APP0 cut short, EOI) that
/// no decoder accepts, so mutations of them alone never reach the checks of a decoded image.
/// The replay adds the committed small JPEG and PNG as CompressedImage messages (one little-,
/// one big-endian), which decode.
#[test]
fn compressed_image_cdr_decodes_within_the_pixel_limit() {
    use sptr::msgs::cdr::{CdrMessage, CompressedImage, Header};
    use sptr::sensors::image::compressed::decode_compressed;
    let extra: Vec<Seed> = [("jpeg", "small.jpg", true), ("png", "small.png", false)]
        .into_iter()
        .map(|(format, file, little_endian)| {
            let msg = CompressedImage { header: Header::default(), format: format.into(), data: read(&common::data("camera").join(file)) };
            built(&format!("tests/data/camera/{file} in a CompressedImage (replay only)"), msg.to_cdr(little_endian).unwrap())
        })
        .collect();
    for seed in &extra {
        let Ok(Message::CompressedImage(msg)) = decode_message("sensor_msgs/msg/CompressedImage", &seed.bytes) else {
            panic!("{}: not a CompressedImage", seed.name);
        };
        assert!(decode_compressed(&msg.format, &msg.data, &LIMITS).is_ok(), "{}: the image does not decode", seed.name);
    }
    replay_target_with("compressed_image_cdr", compressed_image_cdr::check, |d| matches!(decode_message("sensor_msgs/msg/CompressedImage", d), Ok(Message::CompressedImage(_))), extra);
}

#[test]
fn camera_info_cdr_gives_only_finite_intrinsics() {
    use sptr::sensors::calib::camera::intrinsics_from_k;
    replay_target("camera_info_cdr", camera_info_cdr::check, |d| {
        matches!(decode_message("sensor_msgs/msg/CameraInfo", d), Ok(Message::CameraInfo(msg)) if intrinsics_from_k(&msg.k).is_ok())
    });
}

#[test]
fn jpeg_decodes_to_its_stated_size_and_marker_checks_stay_inside_it() {
    replay_target("jpeg", jpeg::check, |d| sptr::sensors::image::compressed::decode_jpeg(d, &LIMITS).is_ok());
}

#[test]
fn png_decodes_within_the_pixel_limit() {
    replay_target("png", png::check, |d| sptr::sensors::image::compressed::decode_png(d, &LIMITS).is_ok());
}

#[test]
fn pcd_never_gives_more_points_than_bytes() {
    replay_target("pcd", pcd::check, |d| sptr::sensors::cloud_files::parse_pcd(d).is_ok_and(|p| !p.x.is_empty()));
}

#[test]
fn bin_cloud_takes_whole_rows_of_the_stride() {
    replay_target("bin_cloud", bin_cloud::check, |d| {
        d.split_first().is_some_and(|(&s, body)| sptr::Points::parse_bin(body, s as usize, "seed.bin").is_ok_and(|p| !p.x.is_empty()))
    });
}

#[test]
fn mcap_file_reads_without_panic_and_no_message_outgrows_the_file() {
    let _cleanup = temp_dirs(&["sptr-fuzz-mcap", "sptr-fuzz-replay-mcap"]);
    replay_target("mcap_file", mcap_file::check, |d| {
        let file = scratch("mcap").join("seed.mcap");
        std::fs::write(&file, d).unwrap();
        bag_reads(&file)
    });
}

#[test]
fn sqlite_bag_reads_without_panic_and_no_message_outgrows_the_file() {
    let _cleanup = temp_dirs(&["sptr-fuzz-sqlite", "sptr-fuzz-replay-sqlite"]);
    replay_target("sqlite_bag", sqlite_bag::check, |d| {
        let dir = scratch("sqlite");
        std::fs::write(dir.join("metadata.yaml"), sqlite_bag::METADATA).unwrap();
        std::fs::write(dir.join("fuzz.db3"), d).unwrap();
        bag_reads(&dir)
    });
}

#[test]
fn bag_metadata_opens_its_storage_or_is_refused_without_panic() {
    let _cleanup = temp_dirs(&["sptr-fuzz-meta", "sptr-fuzz-replay-metadata"]);
    replay_target("bag_metadata", bag_metadata::check, |d| {
        let dir = scratch("metadata");
        let bags = common::root().join("tests/data/bags");
        std::fs::copy(bags.join("mcap_small/mcap_small.mcap"), dir.join("mcap_small.mcap")).unwrap();
        std::fs::copy(bags.join("sqlite_small/sqlite_small.db3"), dir.join("sqlite_small.db3")).unwrap();
        std::fs::write(dir.join("metadata.yaml"), d).unwrap();
        bag_reads(&dir)
    });
}

#[test]
fn safetensors_load_and_check_against_the_model_without_panic() {
    safetensors::init();
    replay_target("safetensors", safetensors::check, |d| sptr::nn::weights::Weights::from_bytes(d, "seed.safetensors").is_ok());
}

#[test]
fn model_yaml_parses_or_is_refused_without_panic() {
    use sptr::models::bevfusion::camera::encoder::CameraEncoderConfig;
    use sptr::models::sphereformer::config::ModelConfig;
    replay_target("model_yaml", model_yaml::check, |d| {
        std::str::from_utf8(d).is_ok_and(|t| ModelConfig::parse(t, "seed.yaml").is_ok() || CameraEncoderConfig::parse(t, "seed.yaml").is_ok())
    });
}

#[test]
fn node_params_yaml_parses_or_is_refused_without_panic() {
    replay_target("params_yaml", params_yaml::check, |d| {
        std::str::from_utf8(d).is_ok_and(|t| sptr::frame::params::NodeParams::parse(t, "seed.yaml").is_ok())
    });
}

#[test]
fn nuscenes_calib_json_gives_all_six_cameras_or_an_error() {
    use sptr::sensors::calib::camera::Calibration;
    const CAMERAS: [&str; 6] = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];
    replay_target("calib_json", calib_json::check, |d| {
        std::str::from_utf8(d).is_ok_and(|t| Calibration::from_nuscenes_json(t, "seed.json", &CAMERAS, 1600, 900).is_ok())
    });
}

// ----- the harness itself -----

/// Every fuzz target has its check replayed here: a target added to fuzz/ without a test above
/// would be fuzzed only by hand.
#[test]
fn every_fuzz_target_is_replayed() {
    let dir = common::root().join("fuzz/fuzz_targets");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, TARGETS, "fuzz/fuzz_targets/ and this file's targets differ");
    let this = std::fs::read_to_string(common::root().join("tests/fuzz_replay.rs")).unwrap();
    for t in TARGETS {
        let wrapper = std::fs::read_to_string(dir.join(format!("{t}.rs"))).unwrap();
        assert!(wrapper.contains(&format!("#[path = \"../checks/{t}.rs\"]")), "fuzz/fuzz_targets/{t}.rs does not run fuzz/checks/{t}.rs");
        assert!(this.contains(&format!("#[path = \"../fuzz/checks/{t}.rs\"]\nmod {t};")), "{t}'s check is not included here");
        assert!(this.contains(&format!("(\"{t}\", {t}::check,")), "{t} has no replay test");
    }
}

/// A check that panics on some mutations fails the replay, which names the target, the seed
/// and each mutation and writes each failing input where it says.
#[test]
fn replay_reports_each_panicking_input_with_its_seed_mutation_and_file() {
    // Panics on an input one byte longer than the seed (a byte inserted, or a short chunk
    // repeated), and on the input "boom".
    fn fragile(data: &[u8]) {
        assert!(data.len() != 9, "one byte too many");
        assert!(data != b"boom", "boom");
    }
    let seeds = [built("eight bytes", b"12345678".to_vec()), Seed { name: "tests/data/fuzz/x/boom".into(), bytes: b"boom".to_vec(), finding: true }];
    let e = replay("selftest", fragile, &seeds, 40, ALLOCATION_LIMIT).expect_err("a panicking check must fail the replay");
    println!("{e}");
    assert!(e.contains("selftest: tests/data/fuzz/x/boom itself panicked: boom"), "{e}");
    let first = e.lines().find(|l| l.contains("selftest: eight bytes mutation ")).unwrap_or_else(|| panic!("no mutation named: {e}"));
    assert!(first.contains("panicked: one byte too many"), "{first}");
    // The input written is the mutation that failed.
    let n: u32 = first.split("mutation ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let file = first.split("(input: ").nth(1).unwrap().trim_end_matches(')');
    assert_eq!(std::fs::read(file).unwrap(), mutate("eight bytes", b"12345678", n));
    assert_eq!(mutate("eight bytes", b"12345678", n).len(), 9);
    // A check that never panics passes the same inputs.
    let ok = replay("selftest", |_| {}, &seeds, 40, ALLOCATION_LIMIT).unwrap();
    assert_eq!((ok.inputs, ok.seeds, ok.findings), (82, 1, 1));
}

/// An allocation above the bound fails the replay like a panic (shown with a bound of 1 MiB,
/// not the 2 GiB one, which a machine without overcommit could refuse and abort on).
#[test]
fn replay_reports_an_allocation_above_the_bound() {
    fn greedy(data: &[u8]) {
        if data.first() == Some(&b'g') {
            std::hint::black_box(vec![0u8; (1 << 20) + 1]);
        }
    }
    let seeds = [built("greedy", b"g".to_vec()), built("modest", b"m".to_vec())];
    let e = replay("selftest-alloc", greedy, &seeds, 0, 1 << 20).expect_err("the allocation must fail the replay");
    assert!(e.starts_with("1 of 2 inputs failed"), "{e}");
    assert!(e.contains("selftest-alloc: greedy itself allocated 1048577 bytes at once (the bound is 1048576)"), "{e}");
}

/// Mutations are the same on every run and differ from their seed.
#[test]
fn mutations_are_deterministic_and_change_the_seed() {
    let seed: Vec<u8> = (0..=255u8).collect();
    let mut changed = 0;
    for n in 1..=MUTATIONS {
        let a = mutate("seed", &seed, n);
        assert_eq!(a, mutate("seed", &seed, n), "mutation {n} is not deterministic");
        changed += (a != seed) as u32;
    }
    // A flip of a byte to itself cannot happen, but a chunk overwritten with the same bytes can.
    assert!(changed >= MUTATIONS * 95 / 100, "only {changed} of {MUTATIONS} mutations changed the seed");
    assert_ne!(mutate("seed", &seed, 1), mutate("other", &seed, 1));
}
