//! ROS messages without ROS: CDR reading and writing of the messages sptr reads and writes
//! (`cdr`), the PointCloud2 codec (`cloud`) and the decoded cloud (`points`).

pub mod cdr;
pub mod cloud;
pub mod points;

