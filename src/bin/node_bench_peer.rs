//! `node_bench_peer`: the node benchmark's publisher (see `sptr::ros::bench_peer`). Drives a
//! running `perception_node` over DDS at a fixed rate with a bag's cloud and camera messages and
//! prints what it measured as one JSON line (also written to `--out`). Exit status 0 when it ran,
//! 1 on an error (the node never answered, a bad bag, a ROS failure). The arguments and the run
//! are in `sptr::cli::node_bench_peer`.

use clap::Parser;
use sptr::cli::node_bench_peer::{command, NodeBenchPeerArgs};

fn main() {
    std::process::exit(command(NodeBenchPeerArgs::parse()));
}
