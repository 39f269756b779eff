//! The CUDA C++ sources in `kernels/`, embedded in the binary so one file ships everything.
//!
//! Each source is compiled separately by NVRTC (see `nvrtc.rs`) with `PRELUDE` prepended; the
//! prelude holds what every kernel file shares, since NVRTC cannot read include files that are
//! not on disk.

/// One kernel source file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Module name: the file stem, also the cache-file prefix.
    pub name: &'static str,
    pub src: &'static str,
    /// Whether NVRTC may contract `a * b + c` into FMAs. Off (the default) for modules whose float
    /// arithmetic must round exactly as the CPU reference or PyTorch does op by op (voxel keys,
    /// window cells, spherical coordinates); on for arithmetic-bound kernels that keep their
    /// few exact steps in `__fmul_rn` / `__fadd_rn`, which are never contracted.
    pub fmad: bool,
}

/// Shared definitions, prepended to every module.
pub const PRELUDE: &str = include_str!("../../kernels/device/prelude.cuh");

/// The activation storage type and its conversions (`store_t`, FP16, BF16 or FP32; see
/// [`crate::device::storage`]), prepended after the prelude to [`STORAGE_MODULES`].
pub const STORAGE: &str = include_str!("../../kernels/device/storage.cuh");

/// The modules written against `store_t`: each has an FP16 build and BF16 and FP32 twins
/// (compiled with `-DSPTR_STORAGE_BF16`, `-DSPTR_STORAGE_F32`). The others store FP16 only, or no
/// activations at all.
pub const STORAGE_MODULES: &[&str] = &["sparse_conv", "attention_core", "layers"];

/// Whether module `name` has BF16 and FP32 builds.
pub fn has_storage_twin(name: &str) -> bool {
    STORAGE_MODULES.contains(&name)
}

/// Every kernel module the crate uses.
pub const ALL: &[KernelSource] = &[
    KernelSource { name: "scan_sort", src: include_str!("../../kernels/device/scan_sort.cu"), fmad: false },
    KernelSource { name: "voxelize", src: include_str!("../../kernels/ops/voxelize.cu"), fmad: false },
    KernelSource { name: "net_inputs", src: include_str!("../../kernels/models/sphereformer/net_inputs.cu"), fmad: false },
    KernelSource { name: "bev_grid", src: include_str!("../../kernels/ops/label_grid.cu"), fmad: false },
    KernelSource { name: "sparse_map", src: include_str!("../../kernels/ops/sparse_map.cu"), fmad: false },
    KernelSource { name: "sparse_conv", src: include_str!("../../kernels/ops/sparse_conv.cu"), fmad: false },
    KernelSource { name: "attention", src: include_str!("../../kernels/ops/attention.cu"), fmad: false },
    KernelSource { name: "attention_core", src: include_str!("../../kernels/ops/attention_core.cu"), fmad: true },
    KernelSource { name: "layers", src: include_str!("../../kernels/ops/rowwise.cu"), fmad: true },
    KernelSource { name: "dense", src: include_str!("../../kernels/ops/dense.cu"), fmad: false },
    KernelSource { name: "bev_dense", src: include_str!("../../kernels/ops/bev_dense.cu"), fmad: false },
    KernelSource { name: "swin", src: include_str!("../../kernels/models/bevfusion/swin.cu"), fmad: true },
    KernelSource { name: "bev_pool", src: include_str!("../../kernels/models/bevfusion/bev_pool.cu"), fmad: false },
    KernelSource { name: "lidar_encoder", src: include_str!("../../kernels/models/bevfusion/lidar_encoder.cu"), fmad: false },
    KernelSource { name: "image_preprocess", src: include_str!("../../kernels/ops/image_preprocess.cu"), fmad: false },
];

/// The source of module `name`, if there is one.
pub fn find(name: &str) -> Option<&'static KernelSource> {
    ALL.iter().find(|k| k.name == name)
}

/// The full text NVRTC compiles for `k`.
pub fn full_source(k: &KernelSource) -> String {
    let mut s = String::with_capacity(PRELUDE.len() + STORAGE.len() + k.src.len() + 64);
    s.push_str(PRELUDE);
    if has_storage_twin(k.name) {
        s.push('\n');
        s.push_str(STORAGE);
    }
    s.push_str("\n#line 1 \"");
    s.push_str(k.name);
    s.push_str(".cu\"\n");
    s.push_str(k.src);
    s
}
