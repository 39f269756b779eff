//! `sptr bench`: benchmarks with machine-readable JSON output. The LiDAR pipeline and model
//! (`lidar`), the sparse ops (`ops`) and BEVFusion's parts (`bevfusion`), each command's
//! arguments beside its handler.

pub mod bevfusion;
pub mod lidar;
pub mod ops;

use anyhow::Result;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// The host probe alone (a fixed CPU workload timed over and over, nothing else of ours
    /// running): whether this machine's cores slow down now and then, to run beside a benchmark
    /// before blaming the code for a tail (JSON; README, the node bench).
    Host(lidar::HostArgs),
    /// The perception node's per-frame work without ROS (decode, SphereFormer, BEV grids,
    /// labeled cloud; `sptr::frame::processor`): latency p50/p99 over --frames frames (JSON).
    Pipeline(lidar::PipelineArgs),
    /// Voxelization time, CPU and (if available) CUDA, on a cloud and on a batch of it; on CUDA
    /// also with the points uploaded through a page-locked staging buffer.
    Voxelize(ops::VoxelizeArgs),
    /// Sparse conv (CUDA): SubM k3 C=32..256 with the map cached and built in the call, strided
    /// k2 s2 32->64..128->256, on a cloud voxelized at --voxel-size (JSON lines).
    Spconv(ops::SpconvArgs),
    /// SphereFormer stage attention (CUDA): cubic and spherical window attention with RPE, the
    /// partitions, and the whole stage, at C=32/2 heads and C=64/4 heads (JSON lines).
    Attention(ops::AttentionArgs),
    /// Camera input per frame: JPEG decode (all images in parallel), upload, resize + crop +
    /// normalize on the GPU (and the CPU reference), JSON (`camera::bench`).
    CameraInput(bevfusion::CameraInputArgs),
    /// BEVFusion's LiDAR branch on CUDA (random weights): hard voxelization from host points and
    /// the SparseEncoder to the BEV map, medians and p90 (JSON line).
    LidarEncoder(bevfusion::LidarEncoderArgs),
    /// BEVFusion's fuser, BEV decoder and map head on CUDA (random weights, full-size BEV
    /// maps), cuDNN and im2col + cuBLAS side by side: median/p90/min GPU ms per part (JSON lines).
    BevDecoder(bevfusion::BevDecoderArgs),
    /// BEVFusion's camera encoder on CUDA (random weights): Swin-T alone and Swin-T + neck,
    /// median/p90 GPU ms, FLOPs and the H100 tensor-core floor (JSON lines).
    Camera(bevfusion::CameraArgs),
    /// End-to-end segmentation (points on the host -> labels on the host): latency median/p90,
    /// per-stage medians, device memory (JSON line).
    Model(lidar::ModelArgs),
    /// BEVFusion BEV map segmentation on CUDA, from JPEG bytes on the host to the masks on the
    /// host: median / p90 per frame and per stage, peak device memory (one JSON line).
    Bevseg(bevfusion::BevsegArgs),
    /// Lift-splat view transform (CUDA): geometry build and bev_pool on the seg and detection
    /// geometries with the nuScenes calibration, bytes moved and the DRAM floor, and the whole
    /// view transform (JSON lines).
    Bevpool(bevfusion::BevpoolArgs),
}

pub fn command(what: BenchCmd) -> Result<()> {
    match what {
        BenchCmd::Host(a) => lidar::host(a),
        BenchCmd::Pipeline(a) => lidar::pipeline(a),
        BenchCmd::Voxelize(a) => ops::voxelize(a),
        BenchCmd::Spconv(a) => ops::spconv(a),
        BenchCmd::Attention(a) => ops::attention(a),
        BenchCmd::CameraInput(a) => bevfusion::camera_input(a),
        BenchCmd::LidarEncoder(a) => bevfusion::lidar_encoder(a),
        BenchCmd::BevDecoder(a) => bevfusion::bev_decoder(a),
        BenchCmd::Camera(a) => bevfusion::camera(a),
        BenchCmd::Model(a) => lidar::model(a),
        BenchCmd::Bevseg(a) => bevfusion::bevseg(a),
        BenchCmd::Bevpool(a) => bevfusion::bevpool(a),
    }
}
