//! The FP16 range guard: which layers of a forward produced a value that FP16 cannot hold (on
//! CUDA) or a value that is not finite (on the CPU), so that a frame whose activations left the
//! range is reported instead of being published as a plausible label.
//!
//! Why: the CUDA path stores activations in FP16 (largest finite value 65,504). A checkpoint
//! whose activations grow past it saturates to ±inf; the next ReLU (`fmaxf`) turns the NaNs that
//! follow into zeros, and the logits come out finite and wrong, with nothing to tell. Every kernel
//! that stores FP16 activations therefore checks, in FP32 before the conversion, each value it
//! stores (see `kernels/device/prelude.cuh`, `fp16_range_bits` / `range_flag`):
//!
//! - [`RANGE_SATURATED`]: `|v| >= 65504` (it rounds to the largest FP16 value or to inf);
//! - [`RANGE_NON_FINITE`]: `v` is NaN or ±inf already in FP32 (an input was).
//!
//! A value followed by a fused ReLU or GELU is checked before it: the activation would turn a NaN
//! or -inf into 0 (so a large negative value that the ReLU zeroes is flagged too: the network is
//! out of FP16's range there, as an FP16 store of the layer's own output would show).
//!
//! A thread ORs those bits over what it stores and, only when they are not zero, its warp's
//! converged lanes OR them into one `u32` per layer with a single `atomicOr`: nothing but two
//! compares a value when the frame is in range. The flags live in one small device buffer per
//! forward ([`crate::device::range::RangeFlags`]), copied to pinned host memory behind the
//! frame's last kernel and read once the frame's outputs are back (no extra synchronisation).
//! The CPU path (f32) checks each layer output for NaN/inf ([`CpuRangeScan`]).
//!
//! Layer ids are registered once per uploaded model in execution order ([`LayerNames`]), with
//! the upstream module path of the tensor they guard (`unet.blocks.block0.conv_branch.2`), so a
//! [`RangeReport`] lists the flagged layers in the order they ran: the first one is where the
//! range was left, the later ones mostly inherit its infs and NaNs.
//!
//! Adopting it in another network (the camera branch's Swin, FPN, LSS and BEV decoder):
//! 1. at upload, `names.add("<module path>")` for every kernel launch that stores an FP16
//!    tensor, in execution order, and keep the [`LayerId`]s with the layers;
//! 2. per forward, `RangeFlags::new(dev, &names)`; pass `flags.slot(id)?` to each launch, whose
//!    kernel takes `u32* range_flags, u32 range_layer` and calls `range_flag(range_flags,
//!    range_layer, bits)` once per thread with `bits |= fp16_range_bits(v)` over the values it
//!    stores (the windowed attention and the layers of `kernels/ops/rowwise.cu` already take a slot);
//! 3. after the last kernel, `readback.enqueue(dev, flags)` ([`crate::device::range::RangeReadback`],
//!    one per model), and once the frame's outputs are on the host, `pending.finish(&names)`;
//!    put the [`RangeReport`] into the frame's result, where `perception` and the node act on it.

use rayon::prelude::*;

/// Bit of a layer's flags: a value reached the FP16 saturation (`|v| >= 65504`, finite in FP32).
pub const RANGE_SATURATED: u32 = 1;
/// Bit of a layer's flags: a value was NaN or infinite (in FP32, before any conversion).
pub const RANGE_NON_FINITE: u32 = 2;
/// The largest finite FP16 value; a stored value at or beyond it is flagged.
pub const FP16_MAX: f32 = 65504.0;

/// A guarded layer: an index into its model's [`LayerNames`] (and its flag buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LayerId(u32);

impl LayerId {
    pub fn index(self) -> u32 {
        self.0
    }
}

/// The guarded layers of a model, in execution order: id → name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerNames {
    names: Vec<String>,
}

impl LayerNames {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the next layer (call in the order the forward runs them).
    pub fn add(&mut self, name: impl Into<String>) -> LayerId {
        let id = LayerId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.names.push(name.into());
        id
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn name(&self, id: LayerId) -> Option<&str> {
        self.names.get(id.0 as usize).map(String::as_str)
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The report of one forward from its per-layer flag words (`flags[i]` for layer `i`; bits
    /// [`RANGE_SATURATED`], [`RANGE_NON_FINITE`]). Flags past the registered layers, which no
    /// kernel can set, are reported under their index rather than dropped.
    pub fn report(&self, flags: &[u32]) -> RangeReport {
        let layers = flags
            .iter()
            .enumerate()
            .filter(|(_, &f)| f != 0)
            .map(|(i, &f)| FlaggedLayer {
                name: self.names.get(i).cloned().unwrap_or_else(|| format!("layer #{i}")),
                saturated: f & RANGE_SATURATED != 0,
                non_finite: f & RANGE_NON_FINITE != 0,
            })
            .collect();
        RangeReport { layers }
    }
}

/// One layer that produced out-of-range values in a forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlaggedLayer {
    /// Module path (`unet.u.blocks.block0.conv_branch.5`) or tensor name (`input`).
    pub name: String,
    /// A finite value reached the FP16 saturation (|v| >= 65504).
    pub saturated: bool,
    /// A value was NaN or infinite.
    pub non_finite: bool,
}

impl FlaggedLayer {
    /// `overflow`, `NaN/inf` or `overflow, NaN/inf`.
    pub fn what(&self) -> &'static str {
        match (self.saturated, self.non_finite) {
            (true, true) => "overflow, NaN/inf",
            (true, false) => "overflow",
            _ => "NaN/inf",
        }
    }
}

impl std::fmt::Display for FlaggedLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.what())
    }
}

/// What the range guard found in one forward: the flagged layers in execution order (empty:
/// every guarded value was in range).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeReport {
    pub layers: Vec<FlaggedLayer>,
}

impl RangeReport {
    /// No layer was flagged.
    pub fn is_clean(&self) -> bool {
        self.layers.is_empty()
    }

    /// The first flagged layer in execution order: where the range was left.
    pub fn first(&self) -> Option<&FlaggedLayer> {
        self.layers.first()
    }

    /// The flagged layers' names, in execution order.
    pub fn names(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.name.clone()).collect()
    }

    /// One line for logs and reports: the count and the first `max` layers,
    /// e.g. `3 layers out of range: input_conv.0 (overflow), ... and 1 more`.
    pub fn summary(&self, max: usize) -> String {
        if self.layers.is_empty() {
            return "no layer out of range".into();
        }
        let n = self.layers.len();
        let shown: Vec<String> = self.layers.iter().take(max.max(1)).map(|l| l.to_string()).collect();
        let more = n.saturating_sub(shown.len());
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        let noun = if n == 1 { "layer" } else { "layers" };
        format!("{n} {noun} out of range: {}{tail}", shown.join(", "))
    }
}

/// The CPU path's guard (f32 activations: only NaN and inf are out of range): each layer output
/// is checked once, in execution order.
#[derive(Debug, Default)]
pub struct CpuRangeScan {
    report: RangeReport,
}

/// Below this many values a layer output is checked on the calling thread.
const PARALLEL_SCAN_MIN: usize = 1 << 16;

impl CpuRangeScan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Flags the layer `name()` (called only then) when a value of `values` is NaN or inf.
    pub fn check(&mut self, values: &[f32], name: impl FnOnce() -> String) {
        let bad = if values.len() < PARALLEL_SCAN_MIN {
            values.iter().any(|v| !v.is_finite())
        } else {
            values.par_iter().any(|v| !v.is_finite())
        };
        if bad {
            self.report.layers.push(FlaggedLayer { name: name(), saturated: false, non_finite: true });
        }
    }

    pub fn finish(self) -> RangeReport {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_named_layers_in_execution_order() {
        let mut n = LayerNames::new();
        let a = n.add("input");
        let b = n.add("input_conv.0");
        let c = n.add("unet.blocks.block0.conv_branch.2");
        assert_eq!((a.index(), b.index(), c.index(), n.len()), (0, 1, 2, 3));
        assert_eq!(n.name(c), Some("unet.blocks.block0.conv_branch.2"));
        assert!(n.report(&[0, 0, 0]).is_clean());
        let r = n.report(&[0, RANGE_SATURATED, RANGE_SATURATED | RANGE_NON_FINITE]);
        assert_eq!(r.names(), ["input_conv.0", "unet.blocks.block0.conv_branch.2"]);
        assert_eq!(r.first().map(|l| l.what()), Some("overflow"));
        assert_eq!(r.layers[1].what(), "overflow, NaN/inf");
        assert_eq!(
            r.summary(1),
            "2 layers out of range: input_conv.0 (overflow) and 1 more"
        );
        assert_eq!(
            r.summary(5),
            "2 layers out of range: input_conv.0 (overflow), unet.blocks.block0.conv_branch.2 (overflow, NaN/inf)"
        );
        // a flag no registered layer owns is still reported
        let r = n.report(&[0, 0, 0, RANGE_NON_FINITE]);
        assert_eq!(r.summary(3), "1 layer out of range: layer #3 (NaN/inf)");
        assert_eq!(RangeReport::default().summary(3), "no layer out of range");
    }

    #[test]
    fn cpu_scan_flags_nan_and_inf_but_not_large_finite_values() {
        let mut s = CpuRangeScan::new();
        s.check(&[1.0, -3.0e38, 1.3e6], || "finite".into());
        s.check(&[0.0, f32::NAN], || "nan".into());
        let mut big = vec![0.5f32; PARALLEL_SCAN_MIN + 7];
        s.check(&big, || "large and finite".into());
        big[PARALLEL_SCAN_MIN + 3] = f32::NEG_INFINITY;
        s.check(&big, || "large with -inf".into());
        let r = s.finish();
        assert_eq!(r.names(), ["nan", "large with -inf"]);
        assert!(r.layers.iter().all(|l| l.non_finite && !l.saturated));
    }
}
