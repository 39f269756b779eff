//! A rosbag2 sqlite3 storage file (`.db3`) under a fixed, valid `metadata.yaml`: opened, every
//! message read and decoded, as replay does.
#[path = "bag_messages.rs"]
mod bag_messages;

/// The bag directory's `metadata.yaml` beside the input (`fuzz.db3`).
pub const METADATA: &str = "rosbag2_bagfile_information:
  version: 5
  storage_identifier: sqlite3
  relative_file_paths: [fuzz.db3]
  duration: {nanoseconds: 0}
  starting_time: {nanoseconds_since_epoch: 0}
  message_count: 1
  topics_with_message_count:
    - message_count: 1
      topic_metadata:
        name: /points
        type: sensor_msgs/msg/PointCloud2
        serialization_format: cdr
        offered_qos_profiles: ''
";

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-sqlite-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    if std::fs::write(dir.join("metadata.yaml"), METADATA).is_err() || std::fs::write(dir.join("fuzz.db3"), data).is_err() {
        return;
    }
    bag_messages::read_all(&dir, data);
}
