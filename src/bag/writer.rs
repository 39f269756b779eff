//! Writing a rosbag2 bag: one MCAP storage file (zstd chunks, `ros2` profile, each channel
//! with its `ros2msg` schema and CDR encoding) and a `metadata.yaml`, what `ros2 bag record -s
//! mcap` produces, so `ros2 bag info/play`, rviz and Foxglove open it. Replay writes its labeled
//! clouds and BEV grids here.
//!
//! The metadata is version 5 (`files` listed), which every rosbag2 from Humble on reads. It is
//! written by [`BagWriter::finish`] only: a writer dropped without it (an error part way) leaves
//! no `metadata.yaml`, so a half-written bag is never mistaken for a finished one.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use super::msgdefs;

/// A failure writing the bag; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: MCAP write failed: {source}")]
    Mcap {
        path: PathBuf,
        #[source]
        source: mcap::McapError,
    },
    #[error(
        "cannot write topic {topic}: no message definition for type {type_name} in this build"
    )]
    UnknownType { topic: String, type_name: String },
    #[error(
        "topic {topic} is not registered with the bag writer (register it with add_topic first)"
    )]
    UnknownTopic { topic: String },
    #[error("topic {topic} registered twice with different types ({first} and {second})")]
    TopicTypeClash {
        topic: String,
        first: String,
        second: String,
    },
}

struct Topic {
    type_name: String,
    channel: u16,
    count: u64,
}

/// An open output bag. Topics are registered once ([`BagWriter::add_topic`]), then messages
/// (CDR bytes with their receive time) are written in any order.
pub struct BagWriter {
    dir: PathBuf,
    file_name: String,
    mcap: mcap::Writer<BufWriter<fs::File>>,
    topics: BTreeMap<String, Topic>,
    sequence: u32,
    first_ns: Option<i64>,
    last_ns: Option<i64>,
    count: u64,
}

impl BagWriter {
    /// Creates the bag directory `dir` (and its parents) and its storage file
    /// `<dir name>_0.mcap`. An existing `metadata.yaml` there is removed first (a re-run
    /// replaces its output bag).
    pub fn create(dir: &Path) -> Result<BagWriter, WriterError> {
        Self::create_with_chunk_size(dir, None)
    }

    /// [`BagWriter::create`] with MCAP chunks of about `chunk_bytes` (`None`: the `mcap`
    /// crate's default). Small chunks make damage lose fewer messages; tests use them to
    /// damage a bag between frames.
    pub fn create_with_chunk_size(
        dir: &Path,
        chunk_bytes: Option<u64>,
    ) -> Result<BagWriter, WriterError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WriterError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let meta = dir.join("metadata.yaml");
        if meta.exists() {
            fs::remove_file(&meta).map_err(io_err(&meta))?;
        }
        let stem = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
            .unwrap_or_else(|| "replay".to_string());
        let file_name = format!("{stem}_0.mcap");
        let path = dir.join(&file_name);
        let file = fs::File::create(&path).map_err(io_err(&path))?;
        let mut options = mcap::WriteOptions::new();
        if let Some(c) = chunk_bytes {
            options = options.chunk_size(Some(c));
        }
        let mcap = options
            .profile("ros2")
            .library(concat!("sptr ", env!("CARGO_PKG_VERSION")))
            .compression(Some(mcap::Compression::Zstd))
            .create(BufWriter::new(file))
            .map_err(|source| WriterError::Mcap { path, source })?;
        Ok(BagWriter {
            dir: dir.to_path_buf(),
            file_name,
            mcap,
            topics: BTreeMap::new(),
            sequence: 0,
            first_ns: None,
            last_ns: None,
            count: 0,
        })
    }

    fn mcap_path(&self) -> PathBuf {
        self.dir.join(&self.file_name)
    }

    /// Registers `topic` with `type_name` (`sensor_msgs/msg/PointCloud2`, …); registering the
    /// same pair again is a no-op.
    pub fn add_topic(&mut self, topic: &str, type_name: &str) -> Result<(), WriterError> {
        if let Some(t) = self.topics.get(topic) {
            if t.type_name == type_name {
                return Ok(());
            }
            return Err(WriterError::TopicTypeClash {
                topic: topic.to_string(),
                first: t.type_name.clone(),
                second: type_name.to_string(),
            });
        }
        let def = msgdefs::definition(type_name).ok_or_else(|| WriterError::UnknownType {
            topic: topic.to_string(),
            type_name: type_name.to_string(),
        })?;
        let path = self.mcap_path();
        let mcap_err = |source| WriterError::Mcap {
            path: path.clone(),
            source,
        };
        let schema = self
            .mcap
            .add_schema(type_name, "ros2msg", def.as_bytes())
            .map_err(mcap_err)?;
        let mut meta = BTreeMap::new();
        meta.insert("offered_qos_profiles".to_string(), String::new());
        let channel = self
            .mcap
            .add_channel(schema, topic, "cdr", &meta)
            .map_err(mcap_err)?;
        self.topics.insert(
            topic.to_string(),
            Topic {
                type_name: type_name.to_string(),
                channel,
                count: 0,
            },
        );
        Ok(())
    }

    /// Writes one message (`data`: CDR with its encapsulation header) received at `time_ns`.
    pub fn write(&mut self, topic: &str, time_ns: i64, data: &[u8]) -> Result<(), WriterError> {
        let path = self.mcap_path();
        let t = self
            .topics
            .get_mut(topic)
            .ok_or_else(|| WriterError::UnknownTopic {
                topic: topic.to_string(),
            })?;
        let stamp = u64::try_from(time_ns).unwrap_or(0);
        let header = mcap::records::MessageHeader {
            channel_id: t.channel,
            sequence: self.sequence,
            log_time: stamp,
            publish_time: stamp,
        };
        self.mcap
            .write_to_known_channel(&header, data)
            .map_err(|source| WriterError::Mcap { path, source })?;
        t.count += 1;
        self.sequence = self.sequence.wrapping_add(1);
        self.count += 1;
        self.first_ns = Some(self.first_ns.map_or(time_ns, |f| f.min(time_ns)));
        self.last_ns = Some(self.last_ns.map_or(time_ns, |l| l.max(time_ns)));
        Ok(())
    }

    /// Messages written so far.
    pub fn message_count(&self) -> u64 {
        self.count
    }

    /// Finishes the MCAP file (summary, footer) and writes `metadata.yaml`; returns the bag
    /// directory.
    pub fn finish(mut self) -> Result<PathBuf, WriterError> {
        let path = self.mcap_path();
        self.mcap.finish().map_err(|source| WriterError::Mcap {
            path: path.clone(),
            source,
        })?;
        let meta_path = self.dir.join("metadata.yaml");
        let text = self.metadata_yaml();
        fs::write(&meta_path, text).map_err(|source| WriterError::Io {
            path: meta_path,
            source,
        })?;
        Ok(self.dir.clone())
    }

    fn metadata_yaml(&self) -> String {
        let start = self.first_ns.unwrap_or(0);
        let duration = self.last_ns.unwrap_or(0) - start;
        let mut s = String::new();
        s.push_str("rosbag2_bagfile_information:\n");
        s.push_str("  version: 5\n");
        s.push_str("  storage_identifier: mcap\n");
        s.push_str(&format!("  duration:\n    nanoseconds: {duration}\n"));
        s.push_str(&format!(
            "  starting_time:\n    nanoseconds_since_epoch: {start}\n"
        ));
        s.push_str(&format!("  message_count: {}\n", self.count));
        s.push_str("  topics_with_message_count:\n");
        for (name, t) in &self.topics {
            s.push_str("    - topic_metadata:\n");
            s.push_str(&format!("        name: {}\n", yaml_str(name)));
            s.push_str(&format!("        type: {}\n", yaml_str(&t.type_name)));
            s.push_str("        serialization_format: cdr\n");
            s.push_str("        offered_qos_profiles: \"\"\n");
            s.push_str(&format!("      message_count: {}\n", t.count));
        }
        s.push_str("  compression_format: \"\"\n");
        s.push_str("  compression_mode: \"\"\n");
        s.push_str("  relative_file_paths:\n");
        s.push_str(&format!("    - {}\n", yaml_str(&self.file_name)));
        s.push_str("  files:\n");
        s.push_str(&format!("    - path: {}\n", yaml_str(&self.file_name)));
        s.push_str(&format!(
            "      starting_time:\n        nanoseconds_since_epoch: {start}\n"
        ));
        s.push_str(&format!(
            "      duration:\n        nanoseconds: {duration}\n"
        ));
        s.push_str(&format!("      message_count: {}\n", self.count));
        s
    }
}

/// A YAML double-quoted scalar (topic names and file names may hold any character).
fn yaml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl std::fmt::Debug for BagWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BagWriter")
            .field("dir", &self.dir)
            .field("file", &self.file_name)
            .field("messages", &self.count)
            .finish()
    }
}
