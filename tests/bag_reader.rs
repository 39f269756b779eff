//! `sptr::bag::reader` against rosbag2 bags written by the third-party `rosbags` package
//! (tests/fixtures/make_bag_fixtures.py): MCAP (plain and zstd chunks) and sqlite3 storage read
//! identically, clouds decode through the CDR reader and the PointCloud2 codec, and damaged input
//! gives errors naming the file, never a panic.

mod common;

use std::fs;
use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sptr::msgs::cdr::{decode_message, Message};
use sptr::bag::{Bag, BagError, RawMessage, Storage};

#[derive(Debug, Deserialize)]
struct Expected {
    bags: Vec<String>,
    topics: Vec<ExpTopic>,
    message_count: u64,
    messages: Vec<ExpMessage>,
}

#[derive(Debug, Deserialize)]
struct ExpTopic {
    name: String,
    #[serde(rename = "type")]
    type_name: String,
    count: u64,
}

#[derive(Debug, Deserialize)]
struct ExpMessage {
    topic: String,
    #[serde(rename = "type")]
    type_name: String,
    timestamp_ns: i64,
    len: usize,
    sha256: String,
    #[serde(default)]
    points: Option<Vec<[f32; 4]>>,
}

const LIDAR: &str = "/sensing/lidar/points";
const CAM: &str = "/cam/camera_info";

fn bags_dir() -> PathBuf {
    common::root().join("tests/data/bags")
}

fn expected() -> Expected {
    // JSON is YAML: no JSON crate needed.
    let text = fs::read_to_string(bags_dir().join("expected.json")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read_all(bag: &Bag, filter: &[&str]) -> Vec<RawMessage> {
    bag.messages(filter)
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("{}: {e}", bag.path().display()))
}

/// A scratch copy of a fixture bag directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn copy_of(bag: &str, tag: &str) -> Scratch {
        let dst = std::env::temp_dir().join(format!(
            "sptr-bag-reader-{}-{bag}-{tag}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dst);
        fs::create_dir_all(&dst).unwrap();
        for e in fs::read_dir(bags_dir().join(bag)).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
        Scratch(dst)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn check_bag_matches_expected(bag: &Bag, exp: &Expected) {
    let mut topics: Vec<_> = bag
        .topics()
        .iter()
        .map(|t| (t.name.clone(), t.type_name.clone(), t.count))
        .collect();
    topics.sort();
    let want: Vec<_> = exp
        .topics
        .iter()
        .map(|t| (t.name.clone(), t.type_name.clone(), t.count))
        .collect();
    assert_eq!(topics, want, "{}", bag.path().display());
    assert_eq!(bag.message_count(), exp.message_count);

    let msgs = read_all(bag, &[]);
    assert_eq!(msgs.len(), exp.messages.len());
    for w in msgs.windows(2) {
        assert!(
            w[0].timestamp_ns <= w[1].timestamp_ns,
            "not in timestamp order"
        );
    }
    for (m, e) in msgs.iter().zip(&exp.messages) {
        assert_eq!(m.topic, e.topic);
        assert_eq!(m.type_name, e.type_name);
        assert_eq!(m.timestamp_ns, e.timestamp_ns);
        assert_eq!(m.data.len(), e.len);
        assert_eq!(
            sha_hex(&m.data),
            e.sha256,
            "{} @ {}",
            m.topic,
            m.timestamp_ns
        );
    }
}

#[test]
fn all_storages_read_identically() {
    let exp = expected();
    assert_eq!(exp.bags.len(), 3);
    let mut reference: Option<Vec<RawMessage>> = None;
    for name in &exp.bags {
        let bag = Bag::open(&bags_dir().join(name)).unwrap();
        let want = if name.starts_with("mcap") {
            Storage::Mcap
        } else {
            Storage::Sqlite3
        };
        assert_eq!(bag.storage(), want, "{name}");
        assert_eq!(bag.files().len(), 1);
        assert_eq!(bag.starting_time_ns(), exp.messages[0].timestamp_ns);
        assert_eq!(
            bag.duration_ns(),
            exp.messages.last().unwrap().timestamp_ns - exp.messages[0].timestamp_ns
        );
        check_bag_matches_expected(&bag, &exp);
        // The metadata.yaml path opens the same bag.
        let same = Bag::open(&bags_dir().join(name).join("metadata.yaml")).unwrap();
        assert_eq!(same.topics(), bag.topics());
        assert_eq!(same.files(), bag.files());
        let msgs = read_all(&bag, &[]);
        match &reference {
            None => reference = Some(msgs),
            Some(r) => assert_eq!(&msgs, r, "{name} differs from {}", exp.bags[0]),
        }
    }
}

#[test]
fn bare_mcap_file_opens_from_its_own_records() {
    let exp = expected();
    for name in ["mcap_small", "mcap_zstd"] {
        let file = bags_dir().join(name).join(format!("{name}.mcap"));
        let bag = Bag::open(&file).unwrap();
        assert_eq!(bag.storage(), Storage::Mcap);
        check_bag_matches_expected(&bag, &exp);
    }
}

#[test]
fn clouds_decode_to_expected_points() {
    let exp = expected();
    for name in &exp.bags {
        let bag = Bag::open(&bags_dir().join(name)).unwrap();
        let msgs = read_all(&bag, &[]);
        let mut clouds = 0;
        for (m, e) in msgs.iter().zip(&exp.messages) {
            match decode_message(&m.type_name, &m.data).unwrap() {
                Message::PointCloud2(pc) => {
                    clouds += 1;
                    assert_eq!(pc.header.stamp.as_nanos(), m.timestamp_ns);
                    let (pts, _report) = sptr::msgs::cloud::decode(&pc.view()).unwrap();
                    let want = e.points.as_ref().expect("expected points for a cloud");
                    assert_eq!(pts.len(), want.len());
                    assert!(pts.has_intensity);
                    for (i, p) in want.iter().enumerate() {
                        assert_eq!(
                            [pts.x[i], pts.y[i], pts.z[i], pts.intensity[i]],
                            *p,
                            "{name} point {i}"
                        );
                    }
                }
                Message::CameraInfo(ci) => {
                    assert_eq!(m.topic, CAM);
                    assert_eq!(ci.header.stamp.as_nanos(), m.timestamp_ns);
                    assert_eq!((ci.width, ci.height), (1600, 900));
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
        assert_eq!(clouds, 3);
    }
}

#[test]
fn topic_filter_returns_only_that_topic() {
    let exp = expected();
    for name in &exp.bags {
        let bag = Bag::open(&bags_dir().join(name)).unwrap();
        for topic in [LIDAR, CAM] {
            let msgs = read_all(&bag, &[topic]);
            let want: Vec<_> = exp.messages.iter().filter(|m| m.topic == topic).collect();
            assert_eq!(msgs.len(), want.len(), "{name} {topic}");
            for (m, e) in msgs.iter().zip(want) {
                assert_eq!(m.topic, topic);
                assert_eq!(m.timestamp_ns, e.timestamp_ns);
                assert_eq!(sha_hex(&m.data), e.sha256);
            }
        }
        assert!(read_all(&bag, &["/no/such/topic"]).is_empty());
        assert_eq!(read_all(&bag, &[LIDAR, CAM]).len(), exp.messages.len());
    }
}

#[test]
fn missing_metadata_is_an_error_naming_the_directory() {
    let s = Scratch::copy_of("sqlite_small", "nometa");
    fs::remove_file(s.0.join("metadata.yaml")).unwrap();
    let err = Bag::open(&s.0).unwrap_err();
    assert!(matches!(err, BagError::MissingMetadata { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("metadata.yaml"), "{msg}");
    assert!(msg.contains(&s.0.display().to_string()), "{msg}");

    let err = Bag::open(&s.0.join("no-such-bag")).unwrap_err();
    assert!(err.to_string().contains("no-such-bag"), "{err}");
}

#[test]
fn unknown_storage_id_is_an_error_naming_it() {
    let s = Scratch::copy_of("mcap_small", "storage");
    let meta = s.0.join("metadata.yaml");
    let text = fs::read_to_string(&meta).unwrap();
    assert!(text.contains("storage_identifier: mcap"));
    fs::write(
        &meta,
        text.replace("storage_identifier: mcap", "storage_identifier: rosbag_v1"),
    )
    .unwrap();
    let err = Bag::open(&s.0).unwrap_err();
    assert!(matches!(err, BagError::UnknownStorage { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("rosbag_v1") && msg.contains("metadata.yaml"),
        "{msg}"
    );
    assert_eq!(err.path(), meta);

    // Malformed YAML is an error too, naming the file.
    fs::write(&meta, "rosbag2_bagfile_information: [unclosed").unwrap();
    let err = Bag::open(&s.0).unwrap_err();
    assert!(matches!(err, BagError::Metadata { .. }), "{err:?}");
    assert!(err.to_string().contains("metadata.yaml"));
}

/// Messages before the error (each must be one of the expected, byte for byte), then the error.
fn read_until_error(bag: &Bag, exp: &Expected) -> (usize, BagError) {
    let mut good = 0;
    let mut it = bag.messages(&[]);
    for item in it.by_ref() {
        match item {
            Ok(m) => {
                let sha = sha_hex(&m.data);
                assert!(
                    exp.messages
                        .iter()
                        .any(|e| e.timestamp_ns == m.timestamp_ns && e.sha256 == sha),
                    "damaged bag yielded a message that is not in the bag"
                );
                good += 1;
            }
            Err(e) => {
                assert!(it.next().is_none(), "iterator must end after an error");
                return (good, e);
            }
        }
    }
    panic!(
        "{}: damaged bag read without an error ({good} messages)",
        bag.path().display()
    );
}

#[test]
fn truncated_mcap_is_an_error_naming_the_file() {
    let exp = expected();
    for name in ["mcap_small", "mcap_zstd"] {
        let orig = fs::read(bags_dir().join(name).join(format!("{name}.mcap"))).unwrap();
        let n = orig.len();
        let cuts = [
            0,
            3,
            8,
            20,
            60,
            n / 4,
            n / 3,
            n / 2,
            2 * n / 3,
            3 * n / 4,
            n - 40,
            n - 9,
            n - 1,
        ];
        let mut recovered = Vec::new();
        for (k, &cut) in cuts.iter().enumerate() {
            let s = Scratch::copy_of(name, &format!("cut{k}"));
            let file = s.0.join(format!("{name}.mcap"));
            fs::write(&file, &orig[..cut]).unwrap();
            let bag = Bag::open(&s.0).unwrap();
            let (good, err) = read_until_error(&bag, &exp);
            assert_eq!(err.path(), file, "{err}");
            assert!(
                err.to_string().contains(&file.display().to_string()),
                "{err}"
            );
            recovered.push(good);
            // The bare file path fails too, and cleanly.
            let err = Bag::open(&file).unwrap_err();
            assert_eq!(err.path(), file, "{err}");
        }
        eprintln!("{name}: messages recovered before the damage at cuts {cuts:?}: {recovered:?}");
        // Messages in complete records before the damage are kept.
        assert!(recovered.iter().any(|&g| g > 0), "{name}: {recovered:?}");
    }
}

#[test]
fn corrupt_db3_is_an_error_naming_the_file() {
    let exp = expected();
    let orig = fs::read(bags_dir().join("sqlite_small/sqlite_small.db3")).unwrap();
    let n = orig.len();
    let mut errors = 0;
    let offsets: Vec<usize> = (1..n / 1024).map(|p| p * 1024).collect();
    for &off in &offsets {
        let s = Scratch::copy_of("sqlite_small", &format!("corrupt{off}"));
        let file = s.0.join("sqlite_small.db3");
        let mut bytes = orig.clone();
        for b in &mut bytes[off..off + 64] {
            *b = 0xA5;
        }
        fs::write(&file, &bytes).unwrap();
        let bag = Bag::open(&s.0).unwrap();
        let mut last_err = None;
        let mut good = Vec::new();
        for item in bag.messages(&[]) {
            match item {
                Ok(m) => good.push(m),
                Err(e) => last_err = Some(e),
            }
        }
        let intact = good.len() == exp.messages.len()
            && good
                .iter()
                .zip(&exp.messages)
                .all(|(m, e)| m.timestamp_ns == e.timestamp_ns && sha_hex(&m.data) == e.sha256);
        eprintln!(
            "page at {off}: error {}, intact read {intact}",
            last_err.is_some()
        );
        if last_err.is_none() {
            // SQLite keeps no checksums: damage it cannot see must be outside what we read.
            assert!(intact, "corruption at {off} changed messages silently");
        }
        if let Some(e) = last_err {
            errors += 1;
            assert_eq!(e.path(), file, "{e}");
            assert!(e.to_string().contains(&file.display().to_string()), "{e}");
        }
    }
    // Page headers overwritten: SQLite sees the damage on (nearly) every page that holds tables.
    eprintln!("corrupt pages detected: {errors} of {}", offsets.len());
    assert!(errors * 2 > offsets.len(), "{errors} of {}", offsets.len());

    // Overwriting the header in the middle of the file structure: always an error.
    let s = Scratch::copy_of("sqlite_small", "garbage");
    let file = s.0.join("sqlite_small.db3");
    fs::write(
        &file,
        b"this is not a database, just text that is long enough".repeat(40),
    )
    .unwrap();
    let bag = Bag::open(&s.0).unwrap();
    let (good, err) = read_until_error(&bag, &exp);
    assert_eq!(good, 0);
    assert!(matches!(err, BagError::SqliteOpen { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );

    // A missing storage file.
    fs::remove_file(&file).unwrap();
    let (_, err) = read_until_error(&bag, &exp);
    assert_eq!(err.path(), file, "{err}");
}
