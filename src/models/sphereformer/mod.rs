//! SphereFormer's LiDAR segmentation (dvlab-research/SphereFormer): the model YAML (`config`), the
//! inference preprocessing (`preprocess`), the network (`network`, `network_cuda`), the segmenter
//! that runs a cloud through them (`segmenter`), the precision choice (`precision`), and random
//! weights for tests and benchmarks (`random`).

pub mod config;
pub mod network;
#[cfg(feature = "cuda-core")]
pub mod precision;
pub mod preprocess;
pub mod random;
pub mod segmenter;

