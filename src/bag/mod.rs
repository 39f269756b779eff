//! Rosbag2 support for `sptr replay`, with no ROS libraries.
//!
//! [`cdr`] decodes (and encodes) the message types replay needs from their CDR bytes, the
//! `data` of every rosbag2 message in MCAP and sqlite3 storage: `sensor_msgs/PointCloud2` (its
//! body a [`crate::msgs::cloud::CloudBuf`], so the node's PointCloud2 codec decodes it),
//! `sensor_msgs/Image`, `sensor_msgs/CompressedImage` and `sensor_msgs/CameraInfo`.
//! [`reader`] opens rosbag2 bags (MCAP and sqlite3 storage) and yields their raw messages in
//! timestamp order. [`writer`] writes rosbag2 bags (MCAP storage and `metadata.yaml`), the
//! output of `sptr replay`, with the message definitions of [`msgdefs`] as MCAP schemas so rviz
//! and Foxglove decode them; [`info`] is `sptr bag info`'s summary. `nav_msgs/OccupancyGrid`
//! is encoded (and decoded) too, for the BEV occupancy output.

pub mod info;
pub mod msgdefs;
pub mod reader;
pub mod writer;

pub use crate::msgs::cdr::{decode_message, is_supported_type, CameraInfo, CdrError, CdrMessage, CompressedImage, Header, Image, MapMetaData, Message, OccupancyGrid, PointCloud2, Pose, RegionOfInterest, Time};
pub use reader::{Bag, BagError, BufferUse, Messages, RawMessage, Storage, TopicInfo};
pub use writer::{BagWriter, WriterError};
