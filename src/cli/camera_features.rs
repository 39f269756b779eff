//! `sptr camera-features`: the camera encoder on a batch of camera images (decoded and
//! preprocessed as the model YAML says) or of preprocessed images, its outputs
//! written as NCHW float32 `.npy` files (upstream's layout) for inspection and for the parity
//! harness, which also takes the weights and the input tensor from here.

use crate::device::range_guard::RangeReport;
use crate::device::Device;
use crate::models::bevfusion::camera::encoder::{random_tensors, CameraEncoder, CameraEncoderConfig, EncoderOutput, BACKBONE_PREFIX, NECK_PREFIX};
use crate::nn::npy;
use crate::ops::dense::FeatureMap;
use crate::nn::random::save_tensors;
use crate::nn::{ModelError, Weights};
use crate::sensors::image::compressed::JpegDecoderChoice;
use crate::Error;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where the encoder's weights come from.
#[derive(Debug, Clone)]
pub enum WeightsArg {
    File(PathBuf),
    /// Deterministic random weights with this seed (optionally written to a file).
    Random { seed: u64, save: Option<PathBuf> },
}

/// What `camera-features` does.
#[derive(Debug, Clone)]
pub struct FeaturesJob {
    pub model: PathBuf,
    pub weights: WeightsArg,
    /// Normalized images, NHWC f32 `[n, h, w, 3]`.
    pub images: Vec<f32>,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// Where the encoder runs (resolved from `--device`).
    pub device: Device,
    /// Also write each backbone output.
    pub stages: bool,
    /// Write the input tensor the encoder consumed (NCHW `.npy`; FP16-rounded on CUDA).
    pub save_input: Option<PathBuf>,
    pub out: PathBuf,
}

/// Decodes camera image files (JPEG or PNG, any size each) and preprocesses them as the model
/// YAML says (`image_size`, `augment2d.resize`, `bot_pct_lim`, `image_normalize`; the CPU
/// preprocessing, Pillow's resize): NHWC `(data, n, h, w)`.
pub fn preprocess_files(paths: &[PathBuf], model: &Path) -> Result<(Vec<f32>, usize, usize, usize), Error> {
    use crate::sensors::image::compressed::decode_compressed;
    use crate::sensors::image::encodings::DecodeLimits;
    use crate::ops::image_preprocess::cpu::{preprocess_cpu, ImagePreprocess};
    if paths.is_empty() {
        return Err(Error::InvalidInput("no camera images given".into()));
    }
    let cfg = ImagePreprocess::load(model)?;
    let limits = DecodeLimits::default();
    let images = paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(|e| Error::Io(format!("{}: cannot read: {e}", p.display())))?;
            // the format is sniffed from the bytes; an empty format string accepts JPEG and PNG
            decode_compressed("", &bytes, &limits).map_err(|e| Error::InvalidInput(format!("{}: {e}", p.display())))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let refs: Vec<_> = images.iter().collect();
    let batch = preprocess_cpu(&refs, &cfg)?;
    Ok((batch.data, batch.n, batch.h, batch.w))
}

/// Like [`preprocess_files`], on CUDA with the JPEG decoder `choice` (`ops::image_preprocess::cuda`;
/// JPEG files only): the FP16 network input widened to f32, NHWC `(data, n, h, w)`, and the
/// decoder used in words.
#[cfg(feature = "cuda-core")]
pub fn preprocess_files_cuda(
    paths: &[PathBuf],
    model: &Path,
    choice: crate::sensors::image::compressed::JpegDecoderChoice,
) -> Result<(Vec<f32>, usize, usize, usize, String), Error> {
    use crate::sensors::image::encodings::DecodeLimits;
    use crate::ops::image_preprocess::cpu::ImagePreprocess;
    use crate::ops::image_preprocess::cuda::CameraPreprocessCuda;
    if paths.is_empty() {
        return Err(Error::InvalidInput("no camera images given".into()));
    }
    let cfg = ImagePreprocess::load(model)?;
    let jpegs = paths
        .iter()
        .map(|p| std::fs::read(p).map_err(|e| Error::Io(format!("{}: cannot read: {e}", p.display()))))
        .collect::<Result<Vec<_>, Error>>()?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let mut pre = CameraPreprocessCuda::with_decoder(&dev, cfg, choice)?;
    let slices: Vec<&[u8]> = jpegs.iter().map(|j| j.as_slice()).collect();
    let batch = pre.run_jpeg(&dev, &slices, &DecodeLimits::default())?;
    let data = batch.to_host(&dev)?;
    Ok((data, batch.n, batch.h, batch.w, pre.jpeg_decoder()))
}

fn write_map(dir: &Path, name: &str, m: &FeatureMap) -> Result<PathBuf, Error> {
    let path = dir.join(format!("{name}.npy"));
    npy::write_f32(&path, &[m.n, m.c, m.h, m.w], &m.to_nchw())?;
    Ok(path)
}

/// Runs the job; returns a printable summary (one line per file written).
pub fn run(job: &FeaturesJob) -> Result<String, Error> {
    run_checked(job).map(|(summary, _)| summary)
}

/// [`run`], and the FP16 range guard's report of the CUDA forward ([`crate::device::range_guard`]:
/// the layers whose activations left FP16's range; always clean on the CPU, whose f32 encoder is
/// not guarded). The files are written either way: they are for inspection.
pub fn run_checked(job: &FeaturesJob) -> Result<(String, RangeReport), Error> {
    let cfg = CameraEncoderConfig::load(&job.model)?;
    let (enc, weights_line) = match &job.weights {
        WeightsArg::File(p) => encoder_from_file(&cfg, p)?,
        WeightsArg::Random { seed, save } => {
            let t = random_tensors(&cfg, *seed)?;
            if let Some(p) = save {
                save_tensors(p, &t)?;
            }
            let w = Weights::from_tensors(&format!("random camera encoder weights (seed {seed})"), t)?;
            (CameraEncoder::from_weights(&cfg, w)?, None)
        }
    };
    std::fs::create_dir_all(&job.out).map_err(|e| Error::Io(format!("{}: cannot create: {e}", job.out.display())))?;
    let start = std::time::Instant::now();
    let (out, used, range): (EncoderOutput, Vec<f32>, RangeReport) =
        if job.device == Device::Cuda { run_cuda(&enc, job)? } else { (enc.forward_cpu(&job.images, job.n, job.h, job.w)?, job.images.clone(), RangeReport::default()) };
    let took = start.elapsed().as_secs_f64() * 1e3;
    let mut lines = vec![format!("{} images {} x {} on {} in {took:.1} ms (upload and plan included)", job.n, job.h, job.w, job.device)];
    lines.extend(weights_line);
    if let Some(p) = &job.save_input {
        let m = FeatureMap::new(job.n, job.h, job.w, 3, used)?;
        npy::write_f32(p, &[m.n, 3, m.h, m.w], &m.to_nchw())?;
        lines.push(format!("input  [{}, 3, {}, {}] -> {}", m.n, m.h, m.w, p.display()));
    }
    if job.stages {
        for (k, m) in out.stages.iter().enumerate() {
            let i = cfg.backbone.out_indices[k];
            let p = write_map(&job.out, &format!("stage{i}"), m)?;
            lines.push(format!("stage{i} [{}, {}, {}, {}] -> {}", m.n, m.c, m.h, m.w, p.display()));
        }
    }
    for (k, m) in out.neck.iter().enumerate() {
        let p = write_map(&job.out, &format!("neck{k}"), m)?;
        lines.push(format!("neck{k}  [{}, {}, {}, {}] -> {}{}", m.n, m.c, m.h, m.w, p.display(), if k == 0 { " (the view transform's input)" } else { "" }));
    }
    Ok((lines.join("\n"), range))
}

/// Whether a tensor is the camera encoder's (backbone or neck), by its BEVFusion name.
fn is_encoder_tensor(name: &str) -> bool {
    [BACKBONE_PREFIX, NECK_PREFIX].iter().any(|p| name.strip_prefix(p).is_some_and(|r| r.starts_with('.')))
}

/// The module a tensor belongs to, for the summary of ignored ones: `encoders.<x>.<y>`, or the
/// first component of other names (`fuser`, `decoder`, `heads`).
fn module_of(name: &str) -> &str {
    let parts = if name.starts_with("encoders.") { 3 } else { 1 };
    match name.match_indices('.').nth(parts - 1) {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

/// The encoder from a weights file holding its tensors: the encoder's part of a BEVFusion
/// checkpoint (`encoders.camera.backbone.*`, `encoders.camera.neck.*`), alone or in a whole
/// checkpoint whose other tensors (view transform, LiDAR encoder, fuser, decoder, heads) are
/// ignored; and the summary line saying how many were used and ignored.
fn encoder_from_file(cfg: &CameraEncoderConfig, path: &Path) -> Result<(CameraEncoder, Option<String>), Error> {
    let mut all = Weights::from_file(path)?;
    let total = all.len();
    let mine = all.split_off(is_encoder_tensor);
    let used = mine.len();
    let enc = match CameraEncoder::from_weights(cfg, mine) {
        Ok(enc) => enc,
        Err(e @ ModelError::Mismatch { .. }) if used == 0 => {
            let modules: Vec<&str> = all.names().map(module_of).collect::<BTreeSet<_>>().into_iter().collect();
            return Err(Error::InvalidInput(format!(
                "{}: none of its {total} tensors is the camera encoder's ({BACKBONE_PREFIX}.*, {NECK_PREFIX}.*); its tensors \
                 are under {}: give BEVFusion weights (a whole seg checkpoint or its camera encoder) for --weights\n{e}",
                path.display(),
                list_some(&modules),
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let line = if all.is_empty() {
        format!("weights: {} camera encoder tensors from {}", used, path.display())
    } else {
        let modules: Vec<&str> = all.names().map(module_of).collect::<BTreeSet<_>>().into_iter().collect();
        format!(
            "weights: {used} camera encoder tensors from {}, {} other tensors ignored ({})",
            path.display(),
            all.len(),
            list_some(&modules)
        )
    };
    Ok((enc, Some(line)))
}

/// Up to eight names, then how many more.
fn list_some(names: &[&str]) -> String {
    let mut s = names.iter().take(8).map(|n| format!("{n}.*")).collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s.push_str(&format!(" and {} more", names.len() - 8));
    }
    s
}

#[cfg(feature = "cuda-core")]
fn run_cuda(enc: &CameraEncoder, job: &FeaturesJob) -> Result<(EncoderOutput, Vec<f32>, RangeReport), Error> {
    use crate::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let gpu = CudaCameraEncoder::upload(&dev, enc)?;
    let plan = gpu.plan(&dev, job.n, job.h, job.w)?;
    let (out, range) = gpu.forward_host_checked(&dev, &plan, &job.images)?;
    let used = job.images.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    Ok((out, used, range))
}

#[cfg(not(feature = "cuda-core"))]
fn run_cuda(_: &CameraEncoder, _: &FeaturesJob) -> Result<(EncoderOutput, Vec<f32>, RangeReport), Error> {
    Err(Error::InvalidInput("this build has no CUDA backend: rebuild with `--features cuda` or use --device cpu".into()))
}

/// `sptr camera-features`'s arguments.
#[derive(clap::Args)]
pub struct CameraFeaturesArgs {
    /// Camera images (JPEG or PNG), one batch in this order; decoded and preprocessed as the
    /// model YAML says (resize, crop, normalize).
    #[arg(required_unless_present = "input")]
    images: Vec<PathBuf>,
    /// Instead of images: normalized images, float32 NCHW `.npy` `[n, 3, h, w]`.
    #[arg(long, conflicts_with = "images")]
    input: Option<PathBuf>,
    /// Model YAML (reads `model.encoders.camera.backbone` and `.neck`).
    #[arg(long, default_value = "config/models/bevfusion_seg_camera.yaml")]
    model: PathBuf,
    /// safetensors weights with BEVFusion's names: the camera encoder's tensors
    /// (`encoders.camera.backbone.*`, `.neck.*`), alone or in a whole seg checkpoint (the
    /// other tensors are ignored and counted).
    #[arg(long, conflicts_with = "random_weights")]
    weights: Option<PathBuf>,
    /// Deterministic random weights with this seed instead (smoke runs, parity).
    #[arg(long)]
    random_weights: Option<u64>,
    /// Write the random weights as safetensors (for the PyTorch parity reference).
    #[arg(long, requires = "random_weights")]
    save_weights: Option<PathBuf>,
    /// Write the input tensor the encoder consumed (NCHW .npy; FP16-rounded on CUDA).
    #[arg(long)]
    save_input: Option<PathBuf>,
    /// JPEG decoder: cpu (zune-jpeg, CPU preprocessing, the default) or nvjpeg / auto (the
    /// CUDA preprocessing with nvJPEG; JPEG files only; needs the CUDA backend).
    #[arg(long, default_value = "cpu")]
    jpeg_decoder: JpegDecoderChoice,
    /// Also write each backbone output.
    #[arg(long)]
    stages: bool,
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

/// `sptr camera-features`: the job from the arguments, run; exit status 4 when the features left
/// the FP16 range.
pub fn command(a: CameraFeaturesArgs) -> anyhow::Result<()> {
    use crate::ops::image_preprocess::cpu::read_input_npy;
    use super::status::{print_out_of_range, OutOfRange};
    let weights = match (a.weights, a.random_weights) {
        (Some(w), _) => WeightsArg::File(w),
        (None, Some(seed)) => WeightsArg::Random { seed, save: a.save_weights },
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
    };
    let (images, n, h, w) = match (a.input, a.jpeg_decoder) {
        (Some(p), _) => read_input_npy(&p)?,
        (None, JpegDecoderChoice::Cpu) => preprocess_files(&a.images, &a.model)?,
        (None, choice) => camera_input_cuda(&a.images, &a.model, choice)?,
    };
    let device = a.device.resolve()?.device;
    let job = FeaturesJob { model: a.model, weights, images, n, h, w, device, stages: a.stages, save_input: a.save_input, out: a.out };
    let (summary, range) = run_checked(&job)?;
    println!("{summary}");
    if !range.is_clean() {
        print_out_of_range(&range);
        return Err(OutOfRange(format!(
            "the features were written but cannot be trusted (docs/precision.md); {}",
            range.summary(1)
        ))
        .into());
    }
    Ok(())
}

/// `--jpeg-decoder nvjpeg|auto`: the CUDA preprocessing of the JPEGs.
#[cfg(feature = "cuda-core")]
fn camera_input_cuda(images: &[PathBuf], model: &Path, choice: JpegDecoderChoice) -> anyhow::Result<(Vec<f32>, usize, usize, usize)> {
    if let Some(why) = crate::device::cuda_unavailable() {
        anyhow::bail!("--jpeg-decoder {choice} preprocesses on CUDA, and {why}");
    }
    let (data, n, h, w, decoder) = preprocess_files_cuda(images, model, choice)?;
    eprintln!("camera input decoded by {decoder}");
    Ok((data, n, h, w))
}
#[cfg(not(feature = "cuda-core"))]
fn camera_input_cuda(_: &[PathBuf], _: &Path, choice: JpegDecoderChoice) -> anyhow::Result<(Vec<f32>, usize, usize, usize)> {
    anyhow::bail!("--jpeg-decoder {choice} needs the CUDA backend: rebuild with `--features cuda`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoder_tensors_and_modules_by_name() {
        assert!(is_encoder_tensor("encoders.camera.backbone.patch_embed.projection.weight"));
        assert!(is_encoder_tensor("encoders.camera.neck.lateral_convs.0.conv.weight"));
        assert!(!is_encoder_tensor("encoders.camera.vtransform.depthnet.weight"));
        assert!(!is_encoder_tensor("encoders.camera.backbone_extra.x"));
        assert_eq!(module_of("encoders.camera.vtransform.dx"), "encoders.camera.vtransform");
        assert_eq!(module_of("encoders.lidar.backbone.conv_input.0.weight"), "encoders.lidar.backbone");
        assert_eq!(module_of("heads.map.classifier.6.weight"), "heads");
        assert_eq!(module_of("linear"), "linear");
        assert_eq!(list_some(&["a", "b"]), "a.*, b.*");
        let many: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(list_some(&refs).ends_with("m7.* and 2 more"));
    }
}
