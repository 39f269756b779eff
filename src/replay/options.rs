//! `sptr replay`'s options once parsed: what to replay, how, and where the outputs go.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::eval::labels::LabelMap;
use crate::frame::outputs::OutputTopics;
use crate::replay::cameras::CameraReplayOptions;
use crate::replay::ground_truth::LabelSource;
use crate::replay::progress::ProgressMode;

/// `--shard i/n`: frames with `index % n == i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    pub fn contains(&self, frame: u64) -> bool {
        frame % self.count as u64 == self.index as u64
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("--shard {s:?}: expected i/n with 0 <= i < n, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

/// Everything a replay needs besides the model.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub bag: PathBuf,
    /// `None`: [`DEFAULT_LIDAR_TOPIC`] if the bag has it, else its only PointCloud2 topic.
    pub lidar_topic: Option<String>,
    pub labels: Option<LabelSource>,
    pub label_map: LabelMap,
    pub out: PathBuf,
    /// The node's `bev.frame_id`: the frame of the BEV grids; empty: the cloud's frame.
    pub bev_frame_id: String,
    pub bev_png_frames: BTreeSet<u64>,
    pub shard: Shard,
    pub topics: OutputTopics,
    /// For the report: the model YAML, the weights, the device.
    pub model_name: String,
    pub weights_name: String,
    pub device_name: String,
    pub progress: ProgressMode,
    /// The camera branch (`input.cameras` of the params file); `None`: LiDAR only.
    pub cameras: Option<CameraReplayOptions>,
}

