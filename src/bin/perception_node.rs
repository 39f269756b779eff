//! `perception_node`: the sptr ROS 2 node (see `sptr::ros::node`).
//!
//! ```text
//! perception_node --ros-args --params-file config/perception.yaml [-p device:=cpu] [-r __ns:=/perception]
//! ```

fn main() {
    std::process::exit(sptr::ros::node::main());
}
