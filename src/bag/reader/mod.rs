//! Reading rosbag2 bags (MCAP and sqlite3 storage) with no ROS libraries.
//!
//! A rosbag2 bag is a directory with a `metadata.yaml` (`rosbag2_bagfile_information`) and one or
//! more storage files (`relative_file_paths`). [`Bag::open`] reads the metadata; [`Bag::messages`]
//! yields every message's raw CDR bytes in timestamp order: the files in their listed order, the
//! messages of each file sorted by receive timestamp (stable, so equal stamps keep file order).
//!
//! * MCAP files are streamed from disk with the `mcap` crate (chunks decompressed as they are
//!   needed, zstd/lz4, CRCs checked), with memory bounded by the chunks that overlap in time,
//!   not by the file size: a file with a chunk index in its summary is merged chunk by chunk in
//!   time order (`reader/mcap_indexed.rs`); one without (unindexed, or cut short by a crash) is
//!   read linearly (`reader/mcap_file.rs`, which says what order that can promise). The rosbag2
//!   timestamp is the MCAP `log_time`.
//! * sqlite3 `.db3` files are queried read-only (`messages JOIN topics ORDER BY timestamp`), a
//!   page of rows at a time.
//!
//! A single `.mcap` file (no `metadata.yaml`) can be opened too, its topics and types then come
//! from the file's own channel and schema records.
//!
//! Damage is an error, never a panic: every [`BagError`] names the file and, for errors met while
//! reading messages, how many messages of that file were read before it and the last good
//! timestamp. An iterator that meets damage first yields the messages it read before it, then the
//! error, then ends, so a caller keeps the frames before the damage.

mod mcap_check;
mod mcap_file;
mod mcap_indexed;
mod records;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use mcap_file::McapFileIter;
pub use records::{BagError, BufferUse, RawMessage};

/// The storage plugin of a bag (`storage_identifier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Mcap,
    Sqlite3,
}

impl Storage {
    pub fn as_str(self) -> &'static str {
        match self {
            Storage::Mcap => "mcap",
            Storage::Sqlite3 => "sqlite3",
        }
    }
}


// ---------------------------------------------------------------------------------------------
// metadata.yaml

#[derive(Debug, Deserialize)]
struct MetadataFile {
    rosbag2_bagfile_information: BagInfoYaml,
}

#[derive(Debug, Deserialize)]
struct BagInfoYaml {
    #[serde(default)]
    version: u32,
    storage_identifier: String,
    #[serde(default)]
    relative_file_paths: Vec<String>,
    #[serde(default)]
    duration: Option<DurationYaml>,
    #[serde(default)]
    starting_time: Option<StartingTimeYaml>,
    #[serde(default)]
    message_count: u64,
    #[serde(default)]
    topics_with_message_count: Vec<TopicWithCountYaml>,
    #[serde(default)]
    compression_format: Option<String>,
    #[serde(default)]
    compression_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DurationYaml {
    #[serde(default)]
    nanoseconds: i64,
}

#[derive(Debug, Deserialize)]
struct StartingTimeYaml {
    #[serde(default)]
    nanoseconds_since_epoch: i64,
}

#[derive(Debug, Deserialize)]
struct TopicWithCountYaml {
    topic_metadata: TopicMetadataYaml,
    #[serde(default)]
    message_count: u64,
}

#[derive(Debug, Deserialize)]
struct TopicMetadataYaml {
    name: String,
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    serialization_format: String,
}

/// One topic of a bag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// rosbag2 type name, e.g. `sensor_msgs/msg/PointCloud2`.
    pub type_name: String,
    /// Usually `cdr`.
    pub serialization_format: String,
    /// Message count as recorded in the metadata (or counted, for a bare `.mcap`).
    pub count: u64,
}

/// An opened rosbag2 bag.
#[derive(Debug, Clone)]
pub struct Bag {
    path: PathBuf,
    storage: Storage,
    version: u32,
    files: Vec<PathBuf>,
    topics: Vec<TopicInfo>,
    message_count: u64,
    starting_time_ns: i64,
    duration_ns: i64,
}

impl Bag {
    /// Opens a bag directory (with `metadata.yaml`), its `metadata.yaml`, or a single `.mcap`
    /// file.
    pub fn open(path: &Path) -> Result<Bag, BagError> {
        if path.is_file() && path.file_name().is_some_and(|n| n == "metadata.yaml") {
            if let Some(dir) = path.parent() {
                return Self::open(dir);
            }
        }
        if path.is_file() {
            return Self::open_mcap_file(path);
        }
        let meta_path = path.join("metadata.yaml");
        if !path.is_dir() {
            return Err(BagError::Io {
                path: path.to_path_buf(),
                source: io::Error::new(io::ErrorKind::NotFound, "no such bag directory or file"),
            });
        }
        if !meta_path.is_file() {
            return Err(BagError::MissingMetadata {
                dir: path.to_path_buf(),
            });
        }
        let text = fs::read_to_string(&meta_path).map_err(|source| BagError::Io {
            path: meta_path.clone(),
            source,
        })?;
        let meta: MetadataFile =
            serde_yaml::from_str(&text).map_err(|source| BagError::Metadata {
                path: meta_path.clone(),
                source,
            })?;
        let info = meta.rosbag2_bagfile_information;
        let storage = match info.storage_identifier.trim() {
            "mcap" => Storage::Mcap,
            "sqlite3" => Storage::Sqlite3,
            other => {
                return Err(BagError::UnknownStorage {
                    path: meta_path,
                    id: other.to_string(),
                })
            }
        };
        let mode = info.compression_mode.unwrap_or_default();
        if !mode.is_empty() && !mode.eq_ignore_ascii_case("none") {
            return Err(BagError::UnsupportedCompression {
                path: meta_path,
                mode,
                format: info.compression_format.unwrap_or_default(),
            });
        }
        let mut files = Vec::new();
        for rel in &info.relative_file_paths {
            let p = path.join(rel);
            // rosbag2 before metadata version 4 wrote paths relative to the bag's parent.
            let older = path.parent().map(|parent| parent.join(rel));
            match older {
                Some(o) if !p.exists() && o.is_file() => files.push(o),
                _ => files.push(p),
            }
        }
        if files.is_empty() {
            return Err(BagError::NoFiles { path: meta_path });
        }
        let topics = info
            .topics_with_message_count
            .into_iter()
            .map(|t| TopicInfo {
                name: t.topic_metadata.name,
                type_name: t.topic_metadata.type_name,
                serialization_format: t.topic_metadata.serialization_format,
                count: t.message_count,
            })
            .collect();
        Ok(Bag {
            path: path.to_path_buf(),
            storage,
            version: info.version,
            files,
            topics,
            message_count: info.message_count,
            starting_time_ns: info.starting_time.map_or(0, |t| t.nanoseconds_since_epoch),
            duration_ns: info.duration.map_or(0, |d| d.nanoseconds),
        })
    }

    /// A bare `.mcap` file: topics, types and counts come from a pass over its messages.
    fn open_mcap_file(path: &Path) -> Result<Bag, BagError> {
        let mut topics: BTreeMap<String, TopicInfo> = BTreeMap::new();
        let (mut first, mut last, mut n) = (i64::MAX, i64::MIN, 0u64);
        for m in McapFileIter::new(path.to_path_buf(), Vec::new()) {
            let m = m?;
            first = first.min(m.timestamp_ns);
            last = last.max(m.timestamp_ns);
            n += 1;
            topics
                .entry(m.topic.clone())
                .or_insert_with(|| TopicInfo {
                    name: m.topic.clone(),
                    type_name: m.type_name.clone(),
                    serialization_format: "cdr".to_string(),
                    count: 0,
                })
                .count += 1;
        }
        Ok(Bag {
            path: path.to_path_buf(),
            storage: Storage::Mcap,
            version: 0,
            files: vec![path.to_path_buf()],
            topics: topics.into_values().collect(),
            message_count: n,
            starting_time_ns: if n > 0 { first } else { 0 },
            duration_ns: if n > 0 { last - first } else { 0 },
        })
    }

    /// The bag directory (or `.mcap` file) opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// The metadata version (0 for a bare `.mcap`).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The storage files, in the order they are read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Topics with type and message count, as the metadata lists them.
    pub fn topics(&self) -> &[TopicInfo] {
        &self.topics
    }

    /// Total message count recorded in the metadata.
    pub fn message_count(&self) -> u64 {
        self.message_count
    }

    pub fn starting_time_ns(&self) -> i64 {
        self.starting_time_ns
    }

    pub fn duration_ns(&self) -> i64 {
        self.duration_ns
    }

    /// Every message on the topics in `filter` (all topics when it is empty), in timestamp order
    /// (files in order, each file's messages sorted by timestamp). After an error the iterator
    /// ends.
    pub fn messages(&self, filter: &[&str]) -> Messages {
        Messages {
            storage: self.storage,
            files: self.files.clone(),
            next_file: 0,
            filter: filter.iter().map(|s| s.to_string()).collect(),
            current: None,
            peak_of_done_files: BufferUse::default(),
            done: false,
        }
    }
}

/// Iterator over a bag's messages; see [`Bag::messages`].
pub struct Messages {
    storage: Storage,
    files: Vec<PathBuf>,
    next_file: usize,
    filter: Vec<String>,
    current: Option<FileMessages>,
    peak_of_done_files: BufferUse,
    done: bool,
}

impl Messages {
    /// The most this iterator has held decoded at once so far, over all its files: for MCAP
    /// files read through their chunk index, the messages of the chunks that overlap in time;
    /// for an MCAP file without one whose messages are out of order, the whole file (sqlite3
    /// pages are not counted).
    pub fn peak_buffered(&self) -> BufferUse {
        let current = self
            .current
            .as_ref()
            .map_or(BufferUse::default(), FileMessages::peak_buffered);
        self.peak_of_done_files.max(current)
    }

    fn finish_current_file(&mut self) {
        if let Some(cur) = self.current.take() {
            self.peak_of_done_files = self.peak_of_done_files.max(cur.peak_buffered());
        }
    }
}

/// The messages of one storage file.
enum FileMessages {
    Mcap(Box<McapFileIter>),
    Sqlite(Box<SqliteFileIter>),
}

impl FileMessages {
    fn open(storage: Storage, path: PathBuf, filter: Vec<String>) -> FileMessages {
        match storage {
            Storage::Mcap => FileMessages::Mcap(Box::new(McapFileIter::new(path, filter))),
            Storage::Sqlite3 => FileMessages::Sqlite(Box::new(SqliteFileIter::new(path, filter))),
        }
    }

    fn peak_buffered(&self) -> BufferUse {
        match self {
            FileMessages::Mcap(m) => m.peak_buffered(),
            FileMessages::Sqlite(_) => BufferUse::default(),
        }
    }
}

impl Iterator for FileMessages {
    type Item = Result<RawMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            FileMessages::Mcap(m) => m.next(),
            FileMessages::Sqlite(s) => s.next(),
        }
    }
}

impl Iterator for Messages {
    type Item = Result<RawMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if let Some(cur) = self.current.as_mut() {
                match cur.next() {
                    Some(Ok(m)) => return Some(Ok(m)),
                    Some(Err(e)) => {
                        self.done = true;
                        self.finish_current_file();
                        return Some(Err(e));
                    }
                    None => self.finish_current_file(),
                }
            }
            let Some(path) = self.files.get(self.next_file).cloned() else {
                self.done = true;
                return None;
            };
            self.next_file += 1;
            self.current = Some(FileMessages::open(self.storage, path, self.filter.clone()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// sqlite3

/// Rows fetched per query.
const SQLITE_PAGE: i64 = 64;

/// Reads one `.db3` a page at a time (keyset paging on `(timestamp, id)`), so no statement
/// outlives a call and memory stays bounded.
struct SqliteFileIter {
    path: PathBuf,
    filter: Vec<String>,
    conn: Option<rusqlite::Connection>,
    /// `(timestamp, id)` of the last row returned.
    cursor: Option<(i64, i64)>,
    buffer: std::collections::VecDeque<RawMessage>,
    index: u64,
    finished: bool,
    pending_error: Option<BagError>,
}

impl SqliteFileIter {
    fn new(path: PathBuf, filter: Vec<String>) -> Self {
        SqliteFileIter {
            path,
            filter,
            conn: None,
            cursor: None,
            buffer: Default::default(),
            index: 0,
            finished: false,
            pending_error: None,
        }
    }

    fn open(&self) -> Result<rusqlite::Connection, BagError> {
        if !self.path.is_file() {
            return Err(BagError::Io {
                path: self.path.clone(),
                source: io::Error::new(io::ErrorKind::NotFound, "storage file not found"),
            });
        }
        let err = |source| BagError::SqliteOpen {
            path: self.path.clone(),
            source,
        };
        let conn = rusqlite::Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        // Fail early on a file that is not SQLite or lacks the rosbag2 tables.
        conn.query_row(
            "SELECT count(*) FROM topics t, (SELECT 1 FROM messages LIMIT 1)",
            [],
            |_| Ok(()),
        )
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(()),
            e => Err(e),
        })
        .map_err(err)?;
        Ok(conn)
    }

    fn fetch_page(&mut self) -> Result<(), rusqlite::Error> {
        // `open` runs before the first page; without a connection there is nothing to read.
        let Some(conn) = self.conn.as_ref() else {
            return Err(rusqlite::Error::InvalidQuery);
        };
        let mut sql = String::from(
            "SELECT m.timestamp, m.id, t.name, t.type, m.data \
             FROM messages m JOIN topics t ON m.topic_id = t.id \
             WHERE (?1 IS NULL OR m.timestamp > ?1 OR (m.timestamp = ?1 AND m.id > ?2))",
        );
        if !self.filter.is_empty() {
            let marks: Vec<String> = (0..self.filter.len())
                .map(|i| format!("?{}", i + 4))
                .collect();
            sql.push_str(&format!(" AND t.name IN ({})", marks.join(", ")));
        }
        sql.push_str(" ORDER BY m.timestamp, m.id LIMIT ?3");
        // Same SQL for every page of this file: prepared once, then taken from the cache.
        let mut stmt = conn.prepare_cached(&sql)?;
        let (ts, id) = match self.cursor {
            Some((t, i)) => (Some(t), i),
            None => (None, 0),
        };
        let mut params: Vec<Box<dyn rusqlite::ToSql>> =
            vec![Box::new(ts), Box::new(id), Box::new(SQLITE_PAGE)];
        for f in &self.filter {
            params.push(Box::new(f.clone()));
        }
        let mut rows = stmt.query(rusqlite::params_from_iter(
            params.iter().map(|b| b.as_ref()),
        ))?;
        let mut got = 0;
        while let Some(row) = rows.next()? {
            let timestamp_ns: i64 = row.get(0)?;
            let id: i64 = row.get(1)?;
            let msg = RawMessage {
                timestamp_ns,
                topic: row.get(2)?,
                type_name: row.get(3)?,
                data: row.get(4)?,
            };
            self.cursor = Some((timestamp_ns, id));
            self.buffer.push_back(msg);
            got += 1;
        }
        if got < SQLITE_PAGE {
            self.finished = true;
        }
        Ok(())
    }
}

impl Iterator for SqliteFileIter {
    type Item = Result<RawMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(m) = self.buffer.pop_front() {
                self.index += 1;
                return Some(Ok(m));
            }
            if let Some(e) = self.pending_error.take() {
                return Some(Err(e));
            }
            if self.finished {
                return None;
            }
            if self.conn.is_none() {
                match self.open() {
                    Ok(c) => self.conn = Some(c),
                    Err(e) => {
                        self.finished = true;
                        return Some(Err(e));
                    }
                }
            }
            if let Err(source) = self.fetch_page() {
                // Rows of the page read before the error are returned first, then the error.
                self.finished = true;
                self.pending_error = Some(BagError::Sqlite {
                    path: self.path.clone(),
                    index: self.index + self.buffer.len() as u64,
                    last_timestamp_ns: self.cursor.map(|c| c.0),
                    source,
                });
            }
        }
    }
}
