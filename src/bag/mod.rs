//! Rosbag2 support for `sptr replay`, with no ROS libraries.
//!
//! [`cdr`] decodes (and encodes) the message types replay needs from their CDR bytes, the
//! `data` of every rosbag2 message in MCAP and sqlite3 storage: `sensor_msgs/PointCloud2` (its
//! body a [`crate::cloud::CloudBuf`], so the node's PointCloud2 codec decodes it),
//! `sensor_msgs/Image`, `sensor_msgs/CompressedImage` and `sensor_msgs/CameraInfo`.
//! [`reader`] opens rosbag2 bags (MCAP and sqlite3 storage) and yields their raw messages in
//! timestamp order.

pub mod cdr;
pub mod reader;

pub use cdr::{
    decode_message, is_supported_type, CameraInfo, CdrError, CdrMessage, CompressedImage, Header,
    Image, Message, PointCloud2, RegionOfInterest, Time,
};
pub use reader::{Bag, BagError, Messages, RawMessage, Storage, TopicInfo};
