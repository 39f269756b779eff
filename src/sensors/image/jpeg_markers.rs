//! A JPEG's marker segments read up to its first scan: what the GPU decoder needs to know before
//! it is handed the bytes (`sensors::image::nvjpeg`).
//!
//! nvJPEG is given only what it decodes the way the CPU decoder (zune-jpeg) would: 8-bit
//! sequential Huffman JPEGs (SOF0 / SOF1) with three YCbCr components whose chroma is sampled
//! 1 × 1 and luma 1 × 1, 2 × 1, 1 × 2 or 2 × 2 (4:4:4, 4:2:2, 4:4:0, 4:2:0). Everything else —
//! progressive, lossless or arithmetic-coded, 12-bit, grey, CMYK / YCCK, an Adobe "RGB" JPEG, odd
//! samplings — goes to zune-jpeg, image by image ([`GpuEligibility`]).
//!
//! Truncation: the scan data must be followed by an end-of-image marker (`FF D9`), and every scan
//! must hold all its MCUs (`sensors::image::jpeg_scan`): a file cut short and given an end-of-image
//! marker again decodes without an error, partly flat, on zune-jpeg and on nvJPEG alike.
//! [`screen_for_gpu`] makes the checks a JPEG passes before nvJPEG is handed it (headers, sizes,
//! the end-of-image marker), for the camera branch and the CUDA preprocessor both;
//! [`ScreenedJpeg::check_scans`] the checks of its scan data, which a frame needs before its
//! result is used, not before the decode starts ([`check_scans_beside`] runs them beside the GPU
//! work); [`check_before_gpu`] both, one after the other. zune-jpeg's own path walks the scans
//! in `compressed::decode_jpeg_into`.

use crate::sensors::image::compressed::jpeg_size;
use crate::sensors::image::encodings::{DecodeLimits, ImageError};
use crate::sensors::image::jpeg_scan::check_scan_data;
use std::time::Instant;

/// What the headers before the first scan say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JpegLayout {
    /// The frame marker's second byte (`0xC0` baseline, `0xC1` extended, `0xC2` progressive, ...).
    pub sof: u8,
    pub precision: u8,
    pub width: u16,
    pub height: u16,
    /// Per component: (id, horizontal sampling, vertical sampling).
    pub components: Vec<(u8, u8, u8)>,
    /// The Adobe APP14 segment's colour transform, if the segment is there.
    pub adobe_transform: Option<u8>,
    /// Byte offset of the first scan's entropy-coded data (just past the SOS segment).
    pub scan_data: usize,
    /// An end-of-image marker follows the scan data.
    pub complete: bool,
}

/// Why a JPEG goes to the CPU decoder instead of nvJPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEligibility {
    Eligible,
    /// Not sequential Huffman DCT (progressive, lossless, arithmetic coding); the marker byte.
    Coding(u8),
    /// Sample precision other than 8 bits.
    Precision(u8),
    /// Not three components (grey, CMYK / YCCK).
    Components(usize),
    /// Three components that are not YCbCr (an Adobe "RGB" JPEG, or ids 'R', 'G', 'B').
    NotYcbcr,
    /// A chroma sampling other than 4:4:4, 4:2:2, 4:4:0 or 4:2:0.
    Sampling,
}

impl GpuEligibility {
    /// A short reason for logs and counters.
    pub fn reason(self) -> String {
        match self {
            GpuEligibility::Eligible => "eligible".into(),
            GpuEligibility::Coding(m) => format!("frame marker 0x{m:02X} (progressive / lossless / arithmetic)"),
            GpuEligibility::Precision(p) => format!("{p}-bit samples"),
            GpuEligibility::Components(n) => format!("{n} components"),
            GpuEligibility::NotYcbcr => "RGB-coded components".into(),
            GpuEligibility::Sampling => "chroma sampling".into(),
        }
    }
}

/// Why the headers could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("no JPEG start-of-image marker")]
    NoSoi,
    #[error("headers end at byte {0} before the first scan")]
    Truncated(usize),
    #[error("expected a marker at byte {0}")]
    NotAMarker(usize),
    #[error("segment 0x{marker:02X} at byte {at} has length {len}")]
    BadLength { marker: u8, at: usize, len: usize },
    #[error("no frame header before the first scan")]
    NoFrame,
    #[error("frame header at byte {0} is malformed")]
    BadFrame(usize),
}

/// A frame header: marker, precision, width, height, components.
type Frame = (u8, u8, u16, u16, Vec<(u8, u8, u8)>);

/// Reads the marker segments from SOI to the first SOS.
pub fn read_layout(data: &[u8]) -> Result<JpegLayout, MarkerError> {
    if data.len() < 4 || data[0] != 0xFF || data[1] != 0xD8 {
        return Err(MarkerError::NoSoi);
    }
    let mut at = 2usize;
    let mut frame: Option<Frame> = None;
    let mut adobe = None;
    loop {
        if at >= data.len() {
            return Err(MarkerError::Truncated(at));
        }
        if data[at] != 0xFF {
            return Err(MarkerError::NotAMarker(at));
        }
        // Fill bytes: any number of 0xFF before the marker code.
        while at < data.len() && data[at] == 0xFF {
            at += 1;
        }
        if at >= data.len() {
            return Err(MarkerError::Truncated(at));
        }
        let marker = data[at];
        at += 1;
        // Standalone markers carry no length.
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue;
        }
        if marker == 0xD8 || marker == 0xD9 || marker == 0x00 {
            return Err(MarkerError::NotAMarker(at - 2));
        }
        if at + 2 > data.len() {
            return Err(MarkerError::Truncated(at));
        }
        let len = u16::from_be_bytes([data[at], data[at + 1]]) as usize;
        if len < 2 {
            return Err(MarkerError::BadLength { marker, at: at - 2, len });
        }
        let body_end = at + len;
        if body_end > data.len() {
            return Err(MarkerError::Truncated(data.len()));
        }
        let body = &data[at + 2..body_end];
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof {
            if body.len() < 6 {
                return Err(MarkerError::BadFrame(at - 2));
            }
            let n = body[5] as usize;
            if body.len() < 6 + 3 * n || n == 0 {
                return Err(MarkerError::BadFrame(at - 2));
            }
            let comps = (0..n).map(|i| (body[6 + 3 * i], body[7 + 3 * i] >> 4, body[7 + 3 * i] & 0x0F)).collect();
            let h = u16::from_be_bytes([body[1], body[2]]);
            let w = u16::from_be_bytes([body[3], body[4]]);
            frame = Some((marker, body[0], w, h, comps));
        } else if marker == 0xEE && body.len() >= 12 && &body[..5] == b"Adobe" {
            adobe = Some(body[11]);
        } else if marker == 0xDA {
            let (sof, precision, width, height, components) = frame.ok_or(MarkerError::NoFrame)?;
            let scan_data = body_end;
            let complete = has_eoi_after(data, scan_data);
            return Ok(JpegLayout { sof, precision, width, height, components, adobe_transform: adobe, scan_data, complete });
        }
        at = body_end;
    }
}

/// Whether `FF D9` occurs at or after `from` (entropy-coded data stuffs every 0xFF with a 0x00,
/// so the pair there is a marker). Searched from the end: trailing bytes after EOI are allowed.
fn has_eoi_after(data: &[u8], from: usize) -> bool {
    let mut i = data.len();
    while i >= from + 2 {
        if data[i - 2] == 0xFF && data[i - 1] == 0xD9 {
            return true;
        }
        i -= 1;
    }
    false
}

/// The first marker in the entropy-coded data from `from` (a layout's `scan_data`) up to the
/// end-of-image marker that no JPEG may hold there: a reserved code (`FF 01` to `FF BF`) or a
/// second start-of-image. `(offset, code)`. zune-jpeg (strict) refuses such data; nvJPEG was
/// measured to decode through a stray `FF 01` without an error, so the GPU path checks for it
/// before handing the bytes over. Table, restart and scan markers (multi-scan JPEGs) pass.
pub fn stray_marker(data: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut i = from;
    while let Some(off) = data.get(i..)?.iter().position(|&b| b == 0xFF) {
        let at = i + off;
        let code = *data.get(at + 1)?;
        match code {
            0xD9 => return None,
            0x01..=0xBF | 0xD8 => return Some((at, code)),
            0xFF => i = at + 1, // fill byte
            _ => i = at + 2,
        }
    }
    None
}

/// JPEG bytes whose headers passed [`screen_for_gpu`], with the size and GPU eligibility read
/// there: what nvJPEG may be handed. Their scan data is not checked yet: nvJPEG decodes cut or
/// garbled scan data without an error (and was measured to leave the stream and its later
/// decodes sound: `tests/ops_image_preprocess.rs`), so a result decoded from them stands only
/// once [`ScreenedJpeg::check_scans`] has passed too, which a caller may run beside the GPU work
/// ([`check_scans_beside`]). Only `screen_for_gpu` makes one. `B` holds the bytes (`&[u8]`,
/// `Vec<u8>`, a shared message): its `as_ref` must give the same bytes every time, as every
/// container of plain bytes does.
#[derive(Debug, Clone, Copy)]
pub struct ScreenedJpeg<B> {
    bytes: B,
    width: usize,
    height: usize,
    eligibility: GpuEligibility,
    /// Where the first scan's entropy-coded data starts.
    scan_data: usize,
}

impl<B: AsRef<[u8]>> ScreenedJpeg<B> {
    /// The screened bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// Width and height in pixels (within the limits the screen was given).
    pub fn size(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    /// Whether nvJPEG may decode it ([`JpegLayout::gpu_eligibility`] of its headers).
    pub fn gpu_eligibility(&self) -> GpuEligibility {
        self.eligibility
    }

    /// What holds the bytes.
    pub fn source(&self) -> &B {
        &self.bytes
    }

    /// The same screen over borrowed bytes (for a batch of them; nothing is copied).
    pub fn borrowed(&self) -> ScreenedJpeg<&[u8]> {
        ScreenedJpeg { bytes: self.bytes.as_ref(), width: self.width, height: self.height, eligibility: self.eligibility, scan_data: self.scan_data }
    }

    /// The checks of the scan data, which read every byte: no stray marker inside it
    /// ([`stray_marker`]), and every scan whole, to its last MCU (`jpeg_scan::check_scan_data`),
    /// which nvJPEG does not report.
    pub fn check_scans(&self) -> Result<(), ImageError> {
        let data = self.bytes();
        let corrupt = |what: String| ImageError::Jpeg(what);
        if let Some((at, code)) = stray_marker(data, self.scan_data) {
            // nvJPEG decodes through it; zune-jpeg (the judge) refuses it
            return Err(corrupt(format!("marker 0xFF{code:02X} at byte {at} inside the scan data")));
        }
        check_scan_data(data).map_err(|e| corrupt(e.to_string()))?;
        Ok(())
    }

    /// [`check_scans`](Self::check_scans), and the JPEG checked whole.
    pub fn into_checked(self) -> Result<CheckedJpeg<B>, ImageError> {
        self.check_scans()?;
        Ok(CheckedJpeg(self))
    }
}

/// JPEG bytes that passed [`check_before_gpu`]: screened ([`ScreenedJpeg`]) and their scans
/// checked. Only `check_before_gpu` and [`ScreenedJpeg::into_checked`] make one.
#[derive(Debug, Clone, Copy)]
pub struct CheckedJpeg<B>(ScreenedJpeg<B>);

impl<B: AsRef<[u8]>> CheckedJpeg<B> {
    /// The screen it passed (size, eligibility, bytes).
    pub fn screened(&self) -> &ScreenedJpeg<B> {
        &self.0
    }

    /// The checked bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (usize, usize) {
        self.0.size()
    }
}

/// The checks a JPEG passes before a GPU decoder is given its bytes, in one place so that the
/// camera branch and the CUDA preprocessor cannot disagree: its size from zune-jpeg's header
/// read, within `limits`; its marker segments up to the first scan ([`read_layout`]), their frame
/// header agreeing with that size; an end-of-image marker after the scan data. They read the
/// headers and search for the end-of-image marker from the end: microseconds, where the scan
/// checks ([`ScreenedJpeg::check_scans`]) take milliseconds.
pub fn screen_for_gpu<B: AsRef<[u8]>>(bytes: B, limits: &DecodeLimits) -> Result<ScreenedJpeg<B>, ImageError> {
    let data = bytes.as_ref();
    let (width, height) = jpeg_size(data, limits)?;
    let corrupt = |what: String| ImageError::Jpeg(what);
    let layout = read_layout(data).map_err(|e| corrupt(e.to_string()))?;
    if !layout.complete {
        return Err(corrupt("no end-of-image marker after the scan data".into()));
    }
    if (usize::from(layout.width), usize::from(layout.height)) != (width, height) {
        return Err(corrupt(format!("frame header says {} x {}, the decoder read {width} x {height}", layout.width, layout.height)));
    }
    Ok(ScreenedJpeg { bytes, width, height, eligibility: layout.gpu_eligibility(), scan_data: layout.scan_data })
}

/// Every check before a GPU decoder at once: [`screen_for_gpu`], then
/// [`ScreenedJpeg::check_scans`].
pub fn check_before_gpu<B: AsRef<[u8]>>(bytes: B, limits: &DecodeLimits) -> Result<CheckedJpeg<B>, ImageError> {
    screen_for_gpu(bytes, limits)?.into_checked()
}

/// How the scan checks of a frame's JPEGs went beside other work ([`check_scans_beside`]).
#[derive(Debug)]
pub struct ScanChecks {
    /// The first JPEG (by index) whose scans failed, with why; `Ok` when all passed.
    pub result: Result<(), (usize, ImageError)>,
    /// The longest single JPEG's check, ms.
    pub longest_ms: f64,
    /// How long the caller waited for the checks after its work returned, ms.
    pub waited_ms: f64,
    /// JPEGs walked: the same bytes given in two slots (a masked camera's stand-in) once.
    pub walked: usize,
}

/// When a frame's scan checks run against the GPU work that decodes its screened JPEGs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanCheckTiming {
    /// All of them first, the work only if they passed.
    BeforeDecode,
    /// Beside the work ([`check_scans_beside`]), its result used only if they passed.
    BesideDecode,
}

impl ScanCheckTiming {
    /// `before_decode` or `beside_decode`.
    pub fn name(self) -> &'static str {
        match self {
            ScanCheckTiming::BeforeDecode => "before_decode",
            ScanCheckTiming::BesideDecode => "beside_decode",
        }
    }
}

/// `work` with the scans of `jpegs` checked `when` ([`ScanCheckTiming`]): its result only when
/// every scan passed, else the first bad JPEG (by index) with why. Checked first, the work then
/// does not run; beside it, its result is dropped.
pub fn with_scan_checks<B: AsRef<[u8]> + Sync, R>(when: ScanCheckTiming, jpegs: &[ScreenedJpeg<B>], work: impl FnOnce() -> R) -> (Result<R, (usize, ImageError)>, ScanChecks) {
    match when {
        ScanCheckTiming::BesideDecode => {
            let (out, checks) = check_scans_beside(jpegs, work);
            (checks.result.clone().map(|()| out), checks)
        }
        ScanCheckTiming::BeforeDecode => {
            // the same tasks with no work beside them: the wait is the checks' whole time
            let t = Instant::now();
            let (_, mut checks) = check_scans_beside(jpegs, || ());
            checks.waited_ms = t.elapsed().as_secs_f64() * 1e3;
            (checks.result.clone().map(|()| work()), checks)
        }
    }
}

/// `work` on this thread while the scans of `jpegs` are checked on the rayon pool beside it
/// (each JPEG a task; bytes given in two slots are walked once, in the first, so a failure is
/// named at its lowest slot); returns when both are done. For a GPU frame: `work` enqueues the
/// decode of the screened JPEGs and the network and reads the result back; the checks read every
/// byte of the scan data on the host meanwhile, and the result is used only if they passed.
pub fn check_scans_beside<B: AsRef<[u8]> + Sync, R>(jpegs: &[ScreenedJpeg<B>], work: impl FnOnce() -> R) -> (R, ScanChecks) {
    let same = |a: &[u8], b: &[u8]| std::ptr::eq(a, b);
    let first: Vec<bool> = (0..jpegs.len()).map(|i| !jpegs[..i].iter().any(|j| same(j.bytes(), jpegs[i].bytes()))).collect();
    let mut verdicts: Vec<Option<(Result<(), ImageError>, f64)>> = (0..jpegs.len()).map(|_| None).collect();
    let (out, work_done) = rayon::in_place_scope(|s| {
        for ((jpeg, verdict), _) in jpegs.iter().zip(verdicts.iter_mut()).zip(&first).filter(|(_, f)| **f) {
            s.spawn(move |_| {
                let t = Instant::now();
                let r = jpeg.check_scans();
                *verdict = Some((r, t.elapsed().as_secs_f64() * 1e3));
            });
        }
        // the scope joins the checks after this returns
        (work(), Instant::now())
    });
    let waited_ms = work_done.elapsed().as_secs_f64() * 1e3;
    let mut result = Ok(());
    let mut longest_ms = 0.0f64;
    let walked = first.iter().filter(|f| **f).count();
    for (i, (v, walked_here)) in verdicts.into_iter().zip(first).enumerate() {
        if !walked_here {
            continue; // an earlier slot holds these bytes and their verdict
        }
        // every task ran to its end when the scope returned (a panic in one would have
        // resumed here instead)
        let (r, ms) = v.unwrap_or_else(|| (Err(ImageError::Jpeg("scan check did not run".into())), 0.0));
        longest_ms = longest_ms.max(ms);
        if let (Err(e), Ok(())) = (r, &result) {
            result = Err((i, e));
        }
    }
    (out, ScanChecks { result, longest_ms, waited_ms, walked })
}

impl JpegLayout {
    /// Whether nvJPEG may decode this JPEG (module docs).
    pub fn gpu_eligibility(&self) -> GpuEligibility {
        if !matches!(self.sof, 0xC0 | 0xC1) {
            return GpuEligibility::Coding(self.sof);
        }
        if self.precision != 8 {
            return GpuEligibility::Precision(self.precision);
        }
        if self.components.len() != 3 {
            return GpuEligibility::Components(self.components.len());
        }
        let rgb_ids = self.components.iter().map(|c| c.0).eq([b'R', b'G', b'B']);
        // APP14 transform 0 means "no colour transform": the components are RGB (or CMYK).
        if self.adobe_transform == Some(0) || (self.adobe_transform.is_none() && rgb_ids) {
            return GpuEligibility::NotYcbcr;
        }
        let (y, cb, cr) = (self.components[0], self.components[1], self.components[2]);
        let luma_ok = matches!((y.1, y.2), (1, 1) | (2, 1) | (1, 2) | (2, 2));
        if !luma_ok || (cb.1, cb.2) != (1, 1) || (cr.1, cr.2) != (1, 1) {
            return GpuEligibility::Sampling;
        }
        GpuEligibility::Eligible
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stray_markers_in_the_scan_data_are_found() {
        // scan data: stuffed FF 00, a restart marker, fill bytes, then EOI
        let ok = [0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0xFF, 0xFF, 0xD9, 0xFF, 0x01];
        assert_eq!(stray_marker(&ok, 0), None, "after EOI nothing counts");
        assert_eq!(stray_marker(&[0x12, 0xFF, 0x01, 0xFF, 0xD9], 0), Some((1, 0x01)));
        assert_eq!(stray_marker(&[0xFF, 0x00, 0xFF, 0xD8, 0xFF, 0xD9], 0), Some((2, 0xD8)));
        assert_eq!(stray_marker(&[0xFF, 0xC4, 0xFF, 0xDA, 0xFF, 0xD9], 0), None, "tables and scans of a multi-scan JPEG");
        assert_eq!(stray_marker(&[0x01, 0x02], 0), None);
        assert_eq!(stray_marker(&[0x01, 0xFF], 0), None, "a cut-off stream is the EOI check's");
        assert_eq!(stray_marker(&[0xFF, 0x05], 5), None, "from past the end");
    }

    /// A minimal JPEG header: SOI, optional APP14, SOFn, SOS, `scan` bytes, optional EOI.
    fn jpeg(sof: u8, precision: u8, comps: &[(u8, u8)], adobe: Option<u8>, scan: &[u8], eoi: bool) -> Vec<u8> {
        let mut v = vec![0xFF, 0xD8];
        // An APP0 segment to walk over.
        v.extend_from_slice(&[0xFF, 0xE0, 0x00, 0x07, b'J', b'F', b'I', b'F', 0x00]);
        if let Some(t) = adobe {
            v.extend_from_slice(&[0xFF, 0xEE, 0x00, 0x0E, b'A', b'd', b'o', b'b', b'e', 0, 100, 0, 0, 0, 0, t]);
        }
        let n = comps.len();
        v.extend_from_slice(&[0xFF, sof]);
        v.extend_from_slice(&((8 + 3 * n) as u16).to_be_bytes());
        v.extend_from_slice(&[precision, 0x00, 0x10, 0x00, 0x20, n as u8]);
        for (i, &(id, hv)) in comps.iter().enumerate() {
            v.extend_from_slice(&[id, hv, (i > 0) as u8]);
        }
        v.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00]);
        v.extend_from_slice(scan);
        if eoi {
            v.extend_from_slice(&[0xFF, 0xD9]);
        }
        v
    }

    const YCC420: [(u8, u8); 3] = [(1, 0x22), (2, 0x11), (3, 0x11)];

    #[test]
    fn a_baseline_420_jpeg_is_eligible_and_complete() {
        let d = jpeg(0xC0, 8, &YCC420, None, &[0x12, 0xFF, 0x00, 0x34], true);
        let l = read_layout(&d).unwrap();
        assert_eq!((l.sof, l.precision, l.width, l.height), (0xC0, 8, 0x20, 0x10));
        assert_eq!(l.components, vec![(1, 2, 2), (2, 1, 1), (3, 1, 1)]);
        assert!(l.complete);
        assert_eq!(l.gpu_eligibility(), GpuEligibility::Eligible);
        // Trailing bytes after EOI are allowed.
        let mut t = d.clone();
        t.extend_from_slice(&[0, 0, 0]);
        assert!(read_layout(&t).unwrap().complete);
    }

    #[test]
    fn every_unsupported_kind_names_its_reason() {
        let cases: Vec<(Vec<u8>, GpuEligibility)> = vec![
            (jpeg(0xC2, 8, &YCC420, None, &[1], true), GpuEligibility::Coding(0xC2)),
            (jpeg(0xC3, 8, &YCC420, None, &[1], true), GpuEligibility::Coding(0xC3)),
            (jpeg(0xC9, 8, &YCC420, None, &[1], true), GpuEligibility::Coding(0xC9)),
            (jpeg(0xC1, 12, &YCC420, None, &[1], true), GpuEligibility::Precision(12)),
            (jpeg(0xC0, 8, &[(1, 0x11)], None, &[1], true), GpuEligibility::Components(1)),
            (jpeg(0xC0, 8, &[(1, 0x11), (2, 0x11), (3, 0x11), (4, 0x11)], Some(2), &[1], true), GpuEligibility::Components(4)),
            (jpeg(0xC0, 8, &[(1, 0x11), (2, 0x11), (3, 0x11)], Some(0), &[1], true), GpuEligibility::NotYcbcr),
            (jpeg(0xC0, 8, &[(b'R', 0x11), (b'G', 0x11), (b'B', 0x11)], None, &[1], true), GpuEligibility::NotYcbcr),
            (jpeg(0xC0, 8, &[(1, 0x41), (2, 0x11), (3, 0x11)], None, &[1], true), GpuEligibility::Sampling),
            (jpeg(0xC0, 8, &[(1, 0x22), (2, 0x21), (3, 0x11)], None, &[1], true), GpuEligibility::Sampling),
        ];
        for (d, want) in cases {
            assert_eq!(read_layout(&d).unwrap().gpu_eligibility(), want);
            assert!(!want.reason().is_empty());
        }
        // 4:4:4, 4:2:2 and 4:4:0 and an Adobe YCbCr JPEG (transform 1) are eligible.
        for comps in [[(1, 0x11), (2, 0x11), (3, 0x11)], [(1, 0x21), (2, 0x11), (3, 0x11)], [(1, 0x12), (2, 0x11), (3, 0x11)]] {
            assert_eq!(read_layout(&jpeg(0xC0, 8, &comps, Some(1), &[1], true)).unwrap().gpu_eligibility(), GpuEligibility::Eligible);
        }
    }

    #[test]
    fn a_cut_jpeg_is_incomplete_or_an_error() {
        let d = jpeg(0xC0, 8, &YCC420, None, &[0x12, 0x34, 0x56], true);
        // Cut inside the scan data: headers fine, no EOI.
        assert!(!read_layout(&d[..d.len() - 3]).unwrap().complete);
        // Cut inside the headers: an error for every cut.
        let sos = read_layout(&d).unwrap().scan_data;
        for cut in 0..sos {
            assert!(read_layout(&d[..cut]).is_err(), "cut at {cut}");
        }
        // An EOI inside an APP segment before the scan (an EXIF thumbnail) does not count.
        let mut thumb = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD8, 0xFF, 0xD9];
        thumb.extend_from_slice(&d[2..d.len() - 2]);
        let l = read_layout(&thumb).unwrap();
        assert!(!l.complete);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(read_layout(b""), Err(MarkerError::NoSoi));
        assert_eq!(read_layout(b"\x89PNG\r\n\x1a\n"), Err(MarkerError::NoSoi));
        assert!(matches!(read_layout(&[0xFF, 0xD8, 0x00, 0x00]), Err(MarkerError::NotAMarker(2))));
        assert!(matches!(read_layout(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x01]), Err(MarkerError::BadLength { .. })));
        // SOS before any frame header.
        assert_eq!(read_layout(&[0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9]), Err(MarkerError::NoFrame));
        // A frame header claiming more components than it holds.
        assert!(matches!(read_layout(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x08, 8, 0, 1, 0, 1, 3]), Err(MarkerError::BadFrame(2))));
        // Pseudo-random bytes after SOI never panic.
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut d = vec![0xFF, 0xD8];
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                d.push(if x.is_multiple_of(5) { 0xFF } else { x as u8 });
            }
            let _ = read_layout(&d);
        }
    }

    #[test]
    fn pillows_fixtures_are_classified() {
        let dir = crate::repo_root().join("tests/data/camera");
        let read = |n: &str| read_layout(&std::fs::read(dir.join(n)).unwrap()).unwrap();
        assert_eq!(read("progressive.jpg").gpu_eligibility(), GpuEligibility::Coding(0xC2));
        assert_eq!(read("gray.jpg").gpu_eligibility(), GpuEligibility::Components(1));
        let small = read("small.jpg");
        assert_eq!((small.width, small.height), (64, 40));
        assert_eq!(small.gpu_eligibility(), GpuEligibility::Eligible);
        assert!(read("progressive.jpg").complete && read("gray.jpg").complete);
    }

    #[test]
    fn the_checks_before_the_gpu_pass_whole_jpegs_and_name_what_is_wrong() {
        let dir = crate::repo_root().join("tests/data");
        let front = std::fs::read_dir(dir.join("nuscenes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains("__CAM_FRONT__"))
            .unwrap();
        let d = std::fs::read(front).unwrap();
        let limits = DecodeLimits::default();
        let c = check_before_gpu(&d, &limits).unwrap();
        assert_eq!((c.size(), c.screened().gpu_eligibility()), ((1600, 900), GpuEligibility::Eligible));
        assert!(std::ptr::eq(c.bytes(), d.as_slice()), "the checked bytes are the ones given");
        assert!(std::ptr::eq(c.screened().borrowed().bytes(), d.as_slice()));
        let progressive = std::fs::read(dir.join("camera/progressive.jpg")).unwrap();
        assert_eq!(check_before_gpu(&progressive, &limits).unwrap().screened().gpu_eligibility(), GpuEligibility::Coding(0xC2));
        let why = |bytes: &[u8]| check_before_gpu(bytes, &limits).unwrap_err().to_string();
        // cut, no end-of-image marker
        assert!(why(&d[..d.len() / 2]).contains("no end-of-image marker"));
        // cut, the marker appended: only the scan walk sees it
        let mut cut = d[..78_718].to_vec();
        cut.extend_from_slice(&[0xFF, 0xD9]);
        let w = why(&cut);
        assert!(w.starts_with("corrupt or truncated JPEG: scan data ends at MCU ") && w.contains("the file was cut short"), "{w}");
        // a stray marker is named as such, before the walk
        let mut stray = d.clone();
        let at = read_layout(&d).unwrap().scan_data + 3000;
        stray[at..at + 2].copy_from_slice(&[0xFF, 0x01]);
        assert!(why(&stray).contains(&format!("marker 0xFF01 at byte {at} inside the scan data")));
        // over the limits: the size error
        assert!(matches!(check_before_gpu(&d, &DecodeLimits { max_pixels: 1000 }), Err(ImageError::TooLarge { .. })));
    }

    /// The screen reads headers only: a JPEG cut short with its end-of-image marker appended,
    /// or with a stray marker in its scan data, passes it and fails the scan checks, by index
    /// when they run beside other work.
    #[test]
    fn the_screen_passes_what_only_the_scan_checks_refuse() {
        let dir = crate::repo_root().join("tests/data/nuscenes");
        let mut jpegs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
            .map(|p| std::fs::read(p).unwrap())
            .collect();
        jpegs.sort();
        assert_eq!(jpegs.len(), 6);
        let limits = DecodeLimits::default();
        let mut cut = jpegs[0][..78_718].to_vec();
        cut.extend_from_slice(&[0xFF, 0xD9]);
        let mut stray = jpegs[1].clone();
        let at = read_layout(&stray).unwrap().scan_data + 3000;
        stray[at..at + 2].copy_from_slice(&[0xFF, 0x01]);
        for (name, bad) in [("cut", &cut), ("stray", &stray)] {
            let s = screen_for_gpu(bad.as_slice(), &limits).unwrap_or_else(|e| panic!("{name}: the screen refused it: {e}"));
            assert_eq!((s.size(), s.gpu_eligibility()), ((1600, 900), GpuEligibility::Eligible), "{name}");
            assert!(s.check_scans().is_err(), "{name}");
            assert!(s.into_checked().is_err(), "{name}");
        }
        // no end-of-image marker: the screen refuses it
        assert!(screen_for_gpu(&jpegs[2][..jpegs[2].len() / 2], &limits).unwrap_err().to_string().contains("no end-of-image marker"));

        let good: Vec<ScreenedJpeg<&[u8]>> = jpegs.iter().map(|j| screen_for_gpu(j.as_slice(), &limits).unwrap()).collect();
        let (out, checks) = check_scans_beside(&good, || 41 + 1);
        assert_eq!(out, 42, "the work's result comes back");
        assert!(checks.result.is_ok(), "{:?}", checks.result);
        assert!(checks.longest_ms > 0.0 && checks.waited_ms >= 0.0, "{checks:?}");
        // cameras 2 and 4 bad: the first is named, whatever order the checks ended in
        let mut batch = good.clone();
        batch[4] = screen_for_gpu(cut.as_slice(), &limits).unwrap();
        batch[2] = screen_for_gpu(stray.as_slice(), &limits).unwrap();
        let (_, checks) = check_scans_beside(&batch, || ());
        let (cam, why) = checks.result.unwrap_err();
        assert_eq!(cam, 2);
        assert!(why.to_string().contains(&format!("marker 0xFF01 at byte {at} inside the scan data")), "{why}");
        let (_, none) = check_scans_beside::<&[u8], _>(&[], || ());
        assert!(none.result.is_ok());
        assert_eq!((checks.walked, none.walked), (6, 0));
        // a stand-in (the same bytes in a second slot) is walked once, its fault named at its
        // first slot
        let mut stand_in = batch.clone();
        stand_in[5] = stand_in[2];
        stand_in[1] = stand_in[0];
        let (_, checks) = check_scans_beside(&stand_in, || ());
        assert_eq!((checks.walked, checks.result.map_err(|e| e.0)), (4, Err(2)));
        // checked first: the work runs only when every scan passed
        let mut ran = false;
        let (out, checks) = with_scan_checks(ScanCheckTiming::BeforeDecode, &batch, || ran = true);
        assert_eq!((ran, out.map_err(|e| e.0), checks.result.map_err(|e| e.0)), (false, Err(2), Err(2)));
        let (out, checks) = with_scan_checks(ScanCheckTiming::BeforeDecode, &good, || 1);
        assert!(out == Ok(1) && checks.result.is_ok() && checks.waited_ms >= checks.longest_ms, "{checks:?}");
        // beside: the work ran, its result is dropped for the bad camera
        let mut ran = false;
        let (out, checks) = with_scan_checks(ScanCheckTiming::BesideDecode, &batch, || ran = true);
        assert_eq!((ran, out.map_err(|e| e.0), checks.result.map_err(|e| e.0)), (true, Err(2), Err(2)));
        let (out, _) = with_scan_checks(ScanCheckTiming::BesideDecode, &good, || 1);
        assert_eq!(out, Ok(1));
    }

    #[test]
    fn the_nuscenes_jpegs_are_eligible_baseline_420() {
        let dir = crate::repo_root().join("tests/data/nuscenes");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jpg") {
                let d = std::fs::read(&p).unwrap();
                let l = read_layout(&d).unwrap();
                assert_eq!((l.width, l.height, l.sof), (1600, 900, 0xC0), "{}", p.display());
                assert!(l.complete);
                assert_eq!(l.gpu_eligibility(), GpuEligibility::Eligible);
                assert!(!read_layout(&d[..d.len() / 2]).unwrap().complete);
                seen += 1;
            }
        }
        assert_eq!(seen, 6);
    }
}
