//! A JPEG's entropy-coded data walked to its last MCU: is every scan whole?
//!
//! zune-jpeg, meeting a marker (or the end of the file) inside scan data, feeds its decoder zero
//! bits and fills the MCUs left without an error, and nvJPEG does not report such a file either:
//! a JPEG cut short with an end-of-image marker appended decodes "successfully", its bottom rows
//! flat. So before either decoder sees a JPEG, [`check_scan_data`] reads its headers (SOF0 /
//! SOF1 / SOF2 frame, DHT, DRI, SOS) and walks every scan's Huffman-coded data the way a decoder
//! would (ITU-T T.81 F.2.2 and G.1.2: decode each symbol, skip its magnitude bits; no
//! dequantisation, no IDCT), and checks that
//!
//! - each scan's data holds every MCU the frame needs (for a non-interleaved scan: every data
//!   unit of its component, with the component's own rounded-up block counts), within each
//!   restart interval too, without reading past the segment's real bytes into a marker or the
//!   end of the file (the 1-bits padding the last byte are the data's own);
//! - the restart markers come in order (RST0 .. RST7, then RST0 again), one after each interval
//!   and none inside one;
//! - every Huffman code is in its table;
//! - a sequential frame has every component in some scan, and a progressive frame's scans cover
//!   every component's coefficients 0..=63 down to bit 0 (a progressive file missing its last
//!   scans is a truncated file too: the decoders would show it blurred, without an error).
//!
//! Arithmetic-coded, lossless and hierarchical frames are refused as unsupported: no caller
//! gets that far with one (zune-jpeg's header read refuses them first, in `compressed::jpeg_size`,
//! and nvJPEG is given baseline / extended Huffman frames only). A frame whose height is left to
//! a DNL marker is refused too (zune-jpeg refuses DNL, and the callers' size check refuses a
//! height of 0 first). Bytes left over after a scan's last MCU are passed over, as decoders
//! do, and counted ([`ScanSummary::unread_bytes`]).
//!
//! What the walk does not catch: damage that keeps the stream's structure (a flipped bit that
//! still decodes to valid codes) decodes to a wrong image on any decoder.
//!
//! Cost: Huffman decoding is a chain of dependent table lookups, so the sequential walk looks up
//! several AC symbols at once ([`RunTable`]). On the six nuScenes 1600 × 900 4:2:0 JPEGs, release
//! build, one thread, median of 31 repeats, on a 2-core host: 1.0-1.2 ms per image for the walk
//! against 7.2-7.9 ms for zune-jpeg's full decode to RGB of the same files, about 15 % (with
//! other builds running on the host: 1.8 against 11.1 ms). `cargo test --release --features cuda
//! --lib jpeg_scan::tests::walk_cost -- --ignored --nocapture` measures both.

use std::fmt;

/// Bits the Huffman lookup decodes at once; longer codes take the canonical slow path.
const LOOKAHEAD: u32 = 9;
/// Bits a sequential scan's multi-symbol lookups cover ([`RunTable`]).
const RUN_LOOKAHEAD: u32 = 12;
/// A multi-symbol lookup of a sequential scan: per `RUN_LOOKAHEAD`-bit prefix, the whole
/// symbols (codes and magnitude bits) it holds, packed `bits | coefficients << 4 |
/// ends_block << 12`; 0 when not even one fits. Huffman decoding is a chain of dependent
/// lookups; one lookup for several symbols is what makes the walk cheap.
type RunTable = [u16; 1 << RUN_LOOKAHEAD];
/// [`RunTable`] entry fields.
const RUN_BITS: u32 = 15;
const RUN_ENDS_BLOCK: u32 = 1 << 12;

/// What a walk of a whole JPEG found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanSummary {
    pub progressive: bool,
    pub scans: usize,
    /// Byte offset of the end-of-image marker, or the file's length when there is none.
    pub end: usize,
    /// Whole bytes of entropy-coded data left over after the last MCU of a scan or restart
    /// interval (decoders pass over them): 0 in a well-formed file.
    pub unread_bytes: usize,
}

/// Where in a scan the walk was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanPlace {
    /// 1-based, in file order.
    pub scan: usize,
    /// The id of a non-interleaved scan's one component; `None` for an interleaved scan.
    pub component: Option<u8>,
    /// 0-based index of the MCU being read (equal to the number of whole MCUs before it).
    pub mcu: usize,
    pub mcus: usize,
    pub mcus_per_row: usize,
}

impl fmt::Display for ScanPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_row = self.mcus_per_row.max(1);
        let rows = self.mcus.div_ceil(per_row);
        write!(
            f,
            "MCU {} of {} (row {} of {}) of scan {}",
            thousands(self.mcu + 1),
            thousands(self.mcus),
            thousands(self.mcu / per_row + 1),
            thousands(rows),
            self.scan
        )?;
        if let Some(id) = self.component {
            write!(f, " (component {id} alone)")?;
        }
        Ok(())
    }
}

/// Why the scan data is not whole, or could not be walked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    NoSoi,
    /// A marker segment runs past the end of the file.
    HeadersCut { at: usize },
    Malformed { at: usize, what: String },
    /// A frame marker other than SOF0 / SOF1 / SOF2.
    Unsupported { marker: u8 },
    Dnl { at: usize },
    /// The data of a scan (or of a restart interval) ends before its last MCU: at byte `at`,
    /// where marker `next` (`None`: the end of the file) follows.
    DataEnds { place: ScanPlace, at: usize, next: Option<u8> },
    BadHuffmanCode { place: ScanPlace, table: TableId, near: usize },
    /// A DC difference category no sample precision allows (above 15).
    BadDcCategory { place: ScanPlace, category: u8, near: usize },
    RestartOutOfOrder { place: ScanPlace, at: usize, expected: u8, found: u8 },
    /// A restart marker inside a restart interval: the data before it is short.
    RestartEarly { place: ScanPlace, at: usize, found: u8, interval_end: usize },
    /// The scans end before the frame is whole (a component never scanned, progressive
    /// coefficients never sent or not refined to bit 0).
    Incomplete { scans: usize, at: usize, what: String },
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::NoSoi => f.write_str("no JPEG start-of-image marker"),
            ScanError::HeadersCut { at } => write!(f, "a marker segment at byte {} runs past the end of the file", thousands(*at)),
            ScanError::Malformed { at, what } => write!(f, "{what} (byte {})", thousands(*at)),
            ScanError::Unsupported { marker } => {
                write!(f, "frame marker 0xFF{marker:02X} (lossless, hierarchical or arithmetic-coded) is not supported")
            }
            ScanError::Dnl { at } => write!(
                f,
                "the frame's height is left to a DNL marker (byte {}), which is not supported",
                thousands(*at)
            ),
            ScanError::DataEnds { place, at, next } => write!(
                f,
                "scan data ends at {place}, at byte {} where {} follows: the file was cut short",
                thousands(*at),
                describe_marker(*next)
            ),
            ScanError::BadHuffmanCode { place, table, near } => write!(
                f,
                "no code of Huffman table {table} matches the scan data at {place}, near byte {}",
                thousands(*near)
            ),
            ScanError::BadDcCategory { place, category, near } => write!(
                f,
                "DC difference of category {category} (at most 15) at {place}, near byte {}",
                thousands(*near)
            ),
            ScanError::RestartOutOfOrder { place, at, expected, found } => write!(
                f,
                "restart marker RST{found} at byte {} where RST{expected} belongs, before {place}",
                thousands(*at)
            ),
            ScanError::RestartEarly { place, at, found, interval_end } => write!(
                f,
                "restart marker RST{found} at byte {} comes at {place}, before its restart interval ends at MCU {}: the scan data before it is short",
                thousands(*at),
                thousands(*interval_end)
            ),
            ScanError::Incomplete { scans, at, what } => write!(
                f,
                "the scans end after scan {scans} (byte {}) with {what}: the file was cut short",
                thousands(*at)
            ),
        }
    }
}

impl std::error::Error for ScanError {}

/// A Huffman table's class and destination, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableId {
    pub ac: bool,
    pub id: u8,
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", if self.ac { "AC" } else { "DC" }, self.id)
    }
}

fn describe_marker(code: Option<u8>) -> String {
    match code {
        None => "the end of the file".into(),
        Some(0xD9) => "an end-of-image marker".into(),
        Some(c @ 0xD0..=0xD7) => format!("restart marker RST{}", c - 0xD0),
        Some(c) => format!("marker 0xFF{c:02X}"),
    }
}

/// `12345678` → `"12,345,678"`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Walks every scan of the JPEG in `data` (module docs). The frame's coefficients are not kept,
/// but a progressive frame keeps one 64-bit word per block of each component it refines (which
/// coefficients are non-zero so far): callers check the image size against their limits first.
pub fn check_scan_data(data: &[u8]) -> Result<ScanSummary, ScanError> {
    Walker::new(data).walk()
}

/// The position of the next marker at or after `from`, skipping entropy-coded bytes, stuffed
/// `FF 00` pairs and fill bytes: `(offset of the FF just before the code, code)`.
fn find_marker(data: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut i = from;
    loop {
        let at = i + data.get(i..)?.iter().position(|&b| b == 0xFF)?;
        match *data.get(at + 1)? {
            0x00 => i = at + 2,
            0xFF => i = at + 1,
            code => return Some((at, code)),
        }
    }
}

/// Whether any byte of `word` is 0xFF.
fn has_ff_byte(word: u64) -> bool {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // the classic zero-byte test on the complement
    let inverted = !word;
    inverted.wrapping_sub(LOW) & word & HIGH != 0
}

/// Reads entropy-coded bits MSB first, unstuffing `FF 00`. At a marker or the end of the file it
/// stops and supplies zero bits, as decoders do, but counts them: once any is consumed the scan
/// has read past its real data ([`BitReader::overread`]).
///
/// `Copy`, and handed by value to everything not inlined, so that the hot loops keep it in
/// registers.
#[derive(Clone, Copy)]
struct BitReader<'a> {
    data: &'a [u8],
    /// The next byte to load.
    pos: usize,
    /// Loaded bits, left-aligned: the next bit is the MSB.
    bits: u64,
    count: u32,
    /// Zero bits appended past the real data (the last `fake` of the `count` loaded bits).
    fake: u32,
    /// Where the real data ends (a marker's first FF, or the file's length) once reached.
    stop: Option<usize>,
}

impl<'a> BitReader<'a> {
    fn new(data: &'a [u8], start: usize) -> Self {
        BitReader { data, pos: start, bits: 0, count: 0, fake: 0, stop: None }
    }

    /// At least `n` (at most 57) bits loaded.
    #[inline(always)]
    fn ensure(&mut self, n: u32) {
        if self.count < n {
            self.refill();
        }
    }

    #[inline(always)]
    fn refill(&mut self) {
        if self.stop.is_none() && self.count <= 56 {
            // Fast path: eight bytes with no 0xFF among them are plain data.
            let word = self.data.get(self.pos..self.pos + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()).map(u64::from_be_bytes);
            if let Some(word) = word.filter(|&w| !has_ff_byte(w)) {
                let take = (64 - self.count) / 8;
                let kept = if take == 8 { word } else { word & !(u64::MAX >> (8 * take)) };
                self.bits |= kept >> self.count;
                self.count += 8 * take;
                self.pos += take as usize;
                return;
            }
        }
        *self = self.refilled_bytewise();
    }

    /// Byte by byte: stuffing, markers and the end of the file.
    #[inline(never)]
    fn refilled_bytewise(mut self) -> Self {
        while self.count <= 56 {
            let byte = self.next_byte();
            self.bits |= u64::from(byte) << (56 - self.count);
            self.count += 8;
        }
        self
    }

    fn next_byte(&mut self) -> u8 {
        if self.stop.is_none() {
            match (self.data.get(self.pos), self.data.get(self.pos + 1)) {
                (Some(0xFF), Some(0x00)) => {
                    self.pos += 2;
                    return 0xFF;
                }
                (Some(&b), _) if b != 0xFF => {
                    self.pos += 1;
                    return b;
                }
                // a marker, fill bytes before one, or the end of the file
                _ => self.stop = Some(self.pos),
            }
        }
        self.fake += 8;
        0
    }

    /// The next `n` bits (1..=32; [`Self::ensure`] first), not consumed.
    #[inline(always)]
    fn peek(&self, n: u32) -> u32 {
        (self.bits >> (64 - n)) as u32
    }

    /// Consumes `n` loaded bits (`n` ≤ the loaded count).
    #[inline(always)]
    fn skip(&mut self, n: u32) {
        self.bits <<= n;
        self.count -= n;
    }

    /// The next `n` bits (0..=16) as a number, consumed.
    #[inline]
    fn take(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        self.ensure(n);
        let v = self.peek(n);
        self.skip(n);
        v
    }

    /// Consumes `n` bits, any number.
    #[inline]
    fn skip_many(&mut self, mut n: u32) {
        while n > 0 {
            let step = n.min(32);
            self.ensure(step);
            self.skip(step);
            n -= step;
        }
    }

    /// Whether a zero bit from past the real data has been consumed.
    #[inline(always)]
    fn overread(&self) -> bool {
        self.count < self.fake
    }

    /// Unconsumed bits of real data among those loaded.
    fn real_bits_loaded(self) -> u32 {
        self.count.saturating_sub(self.fake)
    }

    /// About where the next unconsumed bit is (stuffed bytes not counted back).
    fn near_byte(self) -> usize {
        let loaded_bytes = (self.real_bits_loaded() / 8) as usize;
        self.stop.unwrap_or(self.pos).saturating_sub(loaded_bytes)
    }

    /// Whole bytes of real data not consumed: those loaded, and those up to the next marker.
    fn unread_bytes(self) -> usize {
        let loaded = (self.real_bits_loaded() / 8) as usize;
        let ahead = match self.stop {
            Some(_) => 0,
            None => self.next_marker().map_or(self.data.len(), |(at, _)| at).saturating_sub(self.pos),
        };
        loaded + ahead
    }

    /// The marker after this reader's data: the one it stopped at, or the next after the bytes
    /// it has not loaded.
    fn next_marker(self) -> Option<(usize, u8)> {
        find_marker(self.data, self.stop.unwrap_or(self.pos))
    }
}

/// A Huffman table (T.81 C, F.2.2.3): a lookup on the next [`LOOKAHEAD`] bits for short codes,
/// the canonical code ranges for the rest.
struct HuffmanTable {
    id: TableId,
    /// Per `LOOKAHEAD`-bit prefix: `(code length << 8) | symbol`, or 0 when the code is longer.
    fast: [u16; 1 << LOOKAHEAD],
    /// The same with the length of the code and of the magnitude bits that follow it in a
    /// sequential scan (DC: the category; AC: the size, the symbol's low nibble): one shift
    /// consumes both. 0 for longer codes and impossible DC categories.
    fast_sequential: [u16; 1 << LOOKAHEAD],
    /// AC tables in a sequential scan: the [`RunTable`] of its symbols. Built at the first
    /// sequential scan that uses the table: progressive files redefine tables scan after scan
    /// and never need it.
    ac_runs: std::cell::OnceCell<Box<RunTable>>,
    /// Per code length: the largest code of that length (-1 when none) ...
    max_code: [i32; 17],
    /// ... and what to add to a code of that length to index `symbols`.
    offset: [i32; 17],
    symbols: Vec<u8>,
}

impl HuffmanTable {
    /// From a DHT table's 16 code counts and its symbols.
    fn build(id: TableId, counts: &[u8], symbols: &[u8]) -> Result<Self, String> {
        let mut table = HuffmanTable {
            id,
            fast: [0; 1 << LOOKAHEAD],
            fast_sequential: [0; 1 << LOOKAHEAD],
            ac_runs: std::cell::OnceCell::new(),
            max_code: [-1; 17],
            offset: [0; 17],
            symbols: symbols.to_vec(),
        };
        let mut code = 0u32;
        let mut k = 0usize;
        for len in 1..=16u32 {
            let n = usize::from(counts[len as usize - 1]);
            if n > 0 {
                table.offset[len as usize] = k as i32 - code as i32;
                for _ in 0..n {
                    if code >= 1 << len {
                        return Err(format!("Huffman table {id} has more codes of length {len} than fit"));
                    }
                    if len <= LOOKAHEAD {
                        let shift = LOOKAHEAD - len;
                        let first = (code << shift) as usize;
                        let symbol = u16::from(symbols[k]);
                        table.fast[first..first + (1 << shift)].fill(((len as u16) << 8) | symbol);
                        let magnitude = if id.ac { symbol & 15 } else { symbol };
                        if magnitude <= 15 {
                            table.fast_sequential[first..first + (1 << shift)].fill(((len as u16 + magnitude) << 8) | symbol);
                        }
                    }
                    code += 1;
                    k += 1;
                }
                table.max_code[len as usize] = code as i32 - 1;
            }
            code <<= 1;
        }
        Ok(table)
    }

    /// [`Self::ac_runs`], built on first use.
    fn ac_runs(&self) -> &RunTable {
        self.ac_runs.get_or_init(|| self.build_ac_runs())
    }

    /// Level by level, for strings of `v` = 0, 1, ..= `RUN_LOOKAHEAD` bits: a string's entry is
    /// its first symbol (when its code and magnitude bits, `t` of them, fit in `v`) plus the
    /// entry of the `v - t` bits after it, from a level already built. The strings that share
    /// a first code are one aligned range, and the bits after the symbol sweep the shorter level
    /// from its start, so each range is that level plus one constant (the packed fields never
    /// carry: at most 12 bits, and 12 symbols of 16 coefficients). Coefficient counts are not
    /// capped here: the reader uses an entry only where its coefficients stay inside the block.
    fn build_ac_runs(&self) -> Box<RunTable> {
        let mut levels: Vec<Vec<u16>> = Vec::with_capacity(RUN_LOOKAHEAD as usize + 1);
        for v in 0..=RUN_LOOKAHEAD {
            let level = self.first_symbol_then(v, &levels);
            levels.push(level);
        }
        // always 2^RUN_LOOKAHEAD entries; an empty table would only mean no shortcut
        let longest = levels.pop().unwrap_or_default().into_boxed_slice();
        longest.try_into().unwrap_or_else(|_| Box::new([0; 1 << RUN_LOOKAHEAD]))
    }

    /// One level of [`Self::build_ac_runs`]: the entries of all `v`-bit strings, `shorter`
    /// holding the levels of fewer bits.
    fn first_symbol_then(&self, v: u32, shorter: &[Vec<u16>]) -> Vec<u16> {
        let mut level = vec![0u16; 1 << v];
        let mut x = 0usize;
        while x < level.len() {
            let window = if v >= LOOKAHEAD { x >> (v - LOOKAHEAD) } else { x << (LOOKAHEAD - v) };
            let (code, sequential) = (self.fast[window], self.fast_sequential[window]);
            let len = u32::from(code >> 8);
            if code == 0 || len > v {
                // no code of at most min(v, LOOKAHEAD) bits starts here
                x += 1 << v.saturating_sub(LOOKAHEAD);
                continue;
            }
            let range = &mut level[x..x + (1 << (v - len))];
            x += 1 << (v - len);
            let t = u32::from(sequential >> 8);
            if sequential == 0 || t > v {
                continue;
            }
            let (run, size) = (u32::from(sequential as u8 >> 4), u32::from(sequential as u8 & 15));
            let coefficients = match (size, run) {
                (0, 15) => 16,
                (0, _) => {
                    range.fill((t | RUN_ENDS_BLOCK) as u16);
                    continue;
                }
                _ => run + 1,
            };
            let base = (t | coefficients << 4) as u16;
            let Some(after) = shorter.get((v - t) as usize) else { continue };
            for chunk in range.chunks_exact_mut(after.len()) {
                chunk.iter_mut().zip(after).for_each(|(d, r)| *d = base + r);
            }
        }
        level
    }

    /// The next symbol, its code consumed; `None` when no code matches. At least 16 bits loaded.
    #[inline(always)]
    fn decode(&self, bits: &mut BitReader) -> Option<u8> {
        let entry = self.fast[bits.peek(LOOKAHEAD) as usize];
        let (len, symbol) = if entry != 0 { (u32::from(entry >> 8), entry as u8) } else { self.decode_long(bits.peek(16))? };
        bits.skip(len);
        Some(symbol)
    }

    /// T.81 F.2.2.3 DECODE for the codes longer than the lookup: `(code length, symbol)` of the
    /// code that starts the 16-bit `window`.
    #[inline(never)]
    fn decode_long(&self, window: u32) -> Option<(u32, u8)> {
        for len in LOOKAHEAD + 1..=16 {
            let code = (window >> (16 - len)) as i32;
            if code <= self.max_code[len as usize] {
                return Some((len, *self.symbols.get((code + self.offset[len as usize]) as usize)?));
            }
        }
        None
    }
}

/// Why a block could not be read, before it is placed in its scan.
enum Corrupt {
    NoCode(TableId),
    DcCategory(u8),
}

/// Reads a DC coefficient's difference: its category's code, then that many bits.
#[inline(always)]
fn skip_dc(bits: &mut BitReader, dc: &HuffmanTable) -> Result<(), Corrupt> {
    bits.ensure(32);
    let entry = dc.fast_sequential[bits.peek(LOOKAHEAD) as usize];
    if entry != 0 {
        bits.skip(u32::from(entry >> 8));
        return Ok(());
    }
    let category = dc.decode(bits).ok_or(Corrupt::NoCode(dc.id))?;
    if category > 15 {
        return Err(Corrupt::DcCategory(category));
    }
    bits.skip(u32::from(category));
    Ok(())
}

/// Whether a [`RunTable`] entry applies at coefficient `k`: some symbol fits, and each starts
/// before the block's end (an end of block only before coefficient 63, where one can still come).
#[inline(always)]
fn run_fits(entry: u32, k: u32) -> bool {
    let limit = if entry & RUN_ENDS_BLOCK != 0 { 63 } else { 64 };
    entry & RUN_BITS != 0 && k + (entry >> 4 & 0xFF) <= limit
}

/// Reads a sequential block (T.81 F.2.2): the DC difference, then the AC coefficients up to an
/// end of block or coefficient 63 (a run past it ends the block, as libjpeg reads it).
#[inline(always)]
fn skip_sequential_block(bits: &mut BitReader, block: &SequentialBlock) -> Result<(), Corrupt> {
    skip_dc(bits, block.dc)?;
    let mut k = 1u32;
    while k < 64 {
        bits.ensure(32);
        let run = u32::from(block.ac_runs[bits.peek(RUN_LOOKAHEAD) as usize]);
        if run_fits(run, k) {
            bits.skip(run & RUN_BITS);
            if run & RUN_ENDS_BLOCK != 0 {
                break;
            }
            k += run >> 4 & 0xFF;
            continue;
        }
        let entry = block.ac.fast_sequential[bits.peek(LOOKAHEAD) as usize];
        let rs = if entry != 0 {
            bits.skip(u32::from(entry >> 8));
            entry as u8
        } else {
            let rs = block.ac.decode(bits).ok_or(Corrupt::NoCode(block.ac.id))?;
            bits.skip(u32::from(rs & 15));
            rs
        };
        let (run, size) = (u32::from(rs >> 4), u32::from(rs & 15));
        if size != 0 {
            k += run + 1;
        } else if run == 15 {
            k += 16;
        } else {
            break;
        }
    }
    Ok(())
}

/// Coefficients `lo..=hi` of a zig-zag-ordered block as bits of a word (0 when `lo > hi`).
fn band_mask(lo: u32, hi: u32) -> u64 {
    if lo > hi || lo > 63 {
        return 0;
    }
    let upto_hi = if hi >= 63 { u64::MAX } else { (1u64 << (hi + 1)) - 1 };
    upto_hi & !((1u64 << lo) - 1)
}

/// One scan's way of reading an MCU.
trait McuReader {
    fn read_mcu(&mut self, bits: &mut BitReader, mcu: usize) -> Result<(), Corrupt>;
    /// At a restart marker: the per-interval state (an EOB run) starts over.
    fn restart(&mut self) {}
}

/// What a sequential block of one scan component is read with.
#[derive(Clone, Copy)]
struct SequentialBlock<'t> {
    dc: &'t HuffmanTable,
    ac: &'t HuffmanTable,
    /// The AC table's multi-symbol lookup.
    ac_runs: &'t RunTable,
}

/// Sequential (SOF0 / SOF1): per block of the MCU, its component's tables.
struct SequentialMcu<'t> {
    blocks: Vec<SequentialBlock<'t>>,
}

impl McuReader for SequentialMcu<'_> {
    #[inline(always)]
    fn read_mcu(&mut self, bits: &mut BitReader, _mcu: usize) -> Result<(), Corrupt> {
        for block in &self.blocks {
            skip_sequential_block(bits, block)?;
        }
        Ok(())
    }
}

/// Progressive, first DC scan: per block its DC table (T.81 G.1.2.1).
struct DcFirstMcu<'t> {
    blocks: Vec<&'t HuffmanTable>,
}

impl McuReader for DcFirstMcu<'_> {
    fn read_mcu(&mut self, bits: &mut BitReader, _mcu: usize) -> Result<(), Corrupt> {
        self.blocks.iter().try_for_each(|dc| skip_dc(bits, dc))
    }
}

/// Progressive, DC refinement: one bit per block.
struct DcRefineMcu {
    blocks: u32,
}

impl McuReader for DcRefineMcu {
    fn read_mcu(&mut self, bits: &mut BitReader, _mcu: usize) -> Result<(), Corrupt> {
        bits.skip_many(self.blocks);
        Ok(())
    }
}

/// Progressive, first AC scan of band `ss..=se` of one component (T.81 G.1.2.2); marks the
/// coefficients it makes non-zero in `nonzero` (one word per block) for later refinements.
struct AcFirstMcu<'t, 'h> {
    ac: &'t HuffmanTable,
    ss: u32,
    se: u32,
    eob_run: u32,
    nonzero: &'h mut [u64],
}

impl McuReader for AcFirstMcu<'_, '_> {
    fn read_mcu(&mut self, bits: &mut BitReader, mcu: usize) -> Result<(), Corrupt> {
        if self.eob_run > 0 {
            self.eob_run -= 1;
            return Ok(());
        }
        let mut marks = 0u64;
        let mut k = self.ss;
        while k <= self.se {
            bits.ensure(32);
            let rs = self.ac.decode(bits).ok_or(Corrupt::NoCode(self.ac.id))?;
            let (run, size) = (u32::from(rs >> 4), u32::from(rs & 15));
            if size != 0 {
                k += run;
                bits.skip(size);
                if k < 64 {
                    marks |= 1 << k;
                }
                k += 1;
            } else if run == 15 {
                k += 16;
            } else {
                // an end-of-band run: this block and the next `eob_run` ones end here
                self.eob_run = (1 << run) + bits.take(run) - 1;
                break;
            }
        }
        if let Some(word) = self.nonzero.get_mut(mcu) {
            *word |= marks;
        }
        Ok(())
    }

    fn restart(&mut self) {
        self.eob_run = 0;
    }
}

/// Progressive, AC refinement of band `ss..=se` (T.81 G.1.2.3): besides the new coefficients'
/// codes, one correction bit per coefficient already non-zero, which is why `nonzero` is kept.
struct AcRefineMcu<'t, 'h> {
    ac: &'t HuffmanTable,
    ss: u32,
    se: u32,
    eob_run: u32,
    nonzero: &'h mut [u64],
}

impl McuReader for AcRefineMcu<'_, '_> {
    fn read_mcu(&mut self, bits: &mut BitReader, mcu: usize) -> Result<(), Corrupt> {
        let mut history = self.nonzero.get(mcu).copied().unwrap_or(0);
        let mut k = self.ss;
        if self.eob_run == 0 {
            while k <= self.se {
                bits.ensure(32);
                let rs = self.ac.decode(bits).ok_or(Corrupt::NoCode(self.ac.id))?;
                let (mut run, new_coefficient) = (u32::from(rs >> 4), rs & 15 != 0);
                if new_coefficient {
                    bits.skip(1); // its sign
                } else if run != 15 {
                    self.eob_run = (1 << run) + bits.take(run);
                    break;
                }
                // Pass `run` still-zero coefficients (a ZRL: 16); each non-zero one on the way
                // has a correction bit. A new coefficient goes where the run ends.
                while k <= self.se {
                    if history >> k & 1 == 1 {
                        bits.skip_many(1);
                    } else if run == 0 {
                        break;
                    } else {
                        run -= 1;
                    }
                    k += 1;
                }
                if new_coefficient && k <= self.se {
                    history |= 1 << k;
                }
                k += 1;
            }
        }
        if self.eob_run > 0 {
            // the rest of the band in this block: a correction bit per non-zero coefficient
            bits.skip_many((history & band_mask(k, self.se)).count_ones());
            self.eob_run -= 1;
        }
        if let Some(word) = self.nonzero.get_mut(mcu) {
            *word = history;
        }
        Ok(())
    }

    fn restart(&mut self) {
        self.eob_run = 0;
    }
}

/// A frame component.
struct Component {
    id: u8,
    h: usize,
    v: usize,
    /// Its own block grid (T.81 A.2.2, rounded up): what a non-interleaved scan of it holds.
    blocks_wide: usize,
    blocks_high: usize,
}

/// What has been sent of a component so far.
struct Coverage {
    /// In some scan (sequential).
    scanned: bool,
    /// Per coefficient (zig-zag order): the lowest bit sent so far, -1 when none (progressive).
    low_bit: [i8; 64],
    /// Per block, the coefficients non-zero so far (progressive AC scans; allocated at the first).
    nonzero: Vec<u64>,
}

struct Frame {
    marker: u8,
    width: usize,
    height: usize,
    h_max: usize,
    v_max: usize,
    components: Vec<Component>,
}

impl Frame {
    fn progressive(&self) -> bool {
        self.marker == 0xC2
    }
}

#[derive(Clone, Copy)]
struct ScanComponent {
    /// Index into the frame's components.
    index: usize,
    dc: usize,
    ac: usize,
}

struct ScanHeader {
    at: usize,
    components: Vec<ScanComponent>,
    ss: u32,
    se: u32,
    ah: u32,
    al: u32,
}

/// The MCU grid of one scan and how its data is interrupted.
struct ScanGrid {
    place: ScanPlace,
    restart_interval: usize,
}

impl ScanGrid {
    fn at(&self, mcu: usize) -> ScanPlace {
        ScanPlace { mcu, ..self.place }
    }
}

/// `[class][destination]`: class 0 DC, 1 AC.
type HuffmanTables = [[Option<HuffmanTable>; 4]; 2];

struct Walker<'a> {
    data: &'a [u8],
    frame: Option<Frame>,
    tables: HuffmanTables,
    restart_interval: usize,
    scans: usize,
    coverage: Vec<Coverage>,
    unread_bytes: usize,
}

impl<'a> Walker<'a> {
    fn new(data: &'a [u8]) -> Self {
        Walker { data, frame: None, tables: Default::default(), restart_interval: 0, scans: 0, coverage: Vec::new(), unread_bytes: 0 }
    }

    /// The marker segments from SOI to EOI (or the end of the file), each scan walked.
    fn walk(mut self) -> Result<ScanSummary, ScanError> {
        if !self.data.starts_with(&[0xFF, 0xD8]) {
            return Err(ScanError::NoSoi);
        }
        let mut at = 2;
        let mut end = self.data.len();
        while let Some((marker_at, code)) = find_marker(self.data, at) {
            at = marker_at + 2;
            if code == 0xD9 {
                end = marker_at;
                break;
            }
            // Standalone markers (TEM, RSTn, a repeated SOI) carry no segment.
            if matches!(code, 0x01 | 0xD0..=0xD8) {
                continue;
            }
            let len = match self.data.get(at..at + 2) {
                Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
                None => return Err(ScanError::HeadersCut { at: marker_at }),
            };
            if len < 2 {
                return Err(ScanError::Malformed { at: marker_at, what: format!("marker 0xFF{code:02X} has segment length {len}") });
            }
            let body = self.data.get(at + 2..at + len).ok_or(ScanError::HeadersCut { at: marker_at })?;
            at += len;
            match code {
                0xC0..=0xC2 => self.read_frame(code, body, marker_at)?,
                0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return Err(ScanError::Unsupported { marker: code }),
                0xC4 => self.read_huffman_tables(body, marker_at)?,
                0xDD => self.read_restart_interval(body, marker_at)?,
                0xDC => return Err(ScanError::Dnl { at: marker_at }),
                0xDA => {
                    let scan = self.read_scan_header(body, marker_at)?;
                    at = self.walk_scan(&scan, at)?;
                }
                _ => {} // APPn, COM, DQT, DAC, ...: nothing the walk needs
            }
        }
        self.check_complete(end)?;
        let progressive = self.frame.as_ref().is_some_and(Frame::progressive);
        Ok(ScanSummary { progressive, scans: self.scans, end, unread_bytes: self.unread_bytes })
    }

    fn read_frame(&mut self, marker: u8, body: &[u8], at: usize) -> Result<(), ScanError> {
        let bad = |what: &str| ScanError::Malformed { at, what: format!("frame header: {what}") };
        if self.scans > 0 {
            return Err(bad("a second frame header after a scan"));
        }
        if body.len() < 6 {
            return Err(bad("too short"));
        }
        let height = usize::from(u16::from_be_bytes([body[1], body[2]]));
        let width = usize::from(u16::from_be_bytes([body[3], body[4]]));
        let n = usize::from(body[5]);
        if height == 0 {
            return Err(ScanError::Dnl { at });
        }
        if width == 0 || n == 0 || body.len() < 6 + 3 * n {
            return Err(bad("zero width, no components or fewer component entries than counted"));
        }
        let sampling: Vec<(u8, usize, usize)> =
            body[6..6 + 3 * n].chunks_exact(3).map(|c| (c[0], usize::from(c[1] >> 4), usize::from(c[1] & 15))).collect();
        if sampling.iter().any(|&(_, h, v)| !(1..=4).contains(&h) || !(1..=4).contains(&v)) {
            return Err(bad("a sampling factor outside 1..=4"));
        }
        let h_max = sampling.iter().map(|c| c.1).max().unwrap_or(1);
        let v_max = sampling.iter().map(|c| c.2).max().unwrap_or(1);
        let components = sampling
            .into_iter()
            .map(|(id, h, v)| Component {
                id,
                h,
                v,
                blocks_wide: (width * h).div_ceil(h_max * 8),
                blocks_high: (height * v).div_ceil(v_max * 8),
            })
            .collect::<Vec<_>>();
        self.coverage = components.iter().map(|_| Coverage { scanned: false, low_bit: [-1; 64], nonzero: Vec::new() }).collect();
        self.frame = Some(Frame { marker, width, height, h_max, v_max, components });
        Ok(())
    }

    fn read_huffman_tables(&mut self, body: &[u8], at: usize) -> Result<(), ScanError> {
        let bad = |what: String| ScanError::Malformed { at, what };
        let mut rest = body;
        while let Some((&class_id, after)) = rest.split_first() {
            let (class, id) = (class_id >> 4, class_id & 15);
            if class > 1 || id > 3 {
                return Err(bad(format!("Huffman table class {class} destination {id}")));
            }
            let counts = after.get(..16).ok_or_else(|| bad("Huffman table cut short".into()))?;
            let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
            if total > 256 {
                return Err(bad(format!("Huffman table with {total} codes")));
            }
            let symbols = after.get(16..16 + total).ok_or_else(|| bad("Huffman table cut short".into()))?;
            let id = TableId { ac: class == 1, id };
            self.tables[usize::from(class)][usize::from(id.id)] = Some(HuffmanTable::build(id, counts, symbols).map_err(bad)?);
            rest = &after[16 + total..];
        }
        Ok(())
    }

    fn read_restart_interval(&mut self, body: &[u8], at: usize) -> Result<(), ScanError> {
        let b = body.get(..2).ok_or_else(|| ScanError::Malformed { at, what: "restart interval segment too short".into() })?;
        self.restart_interval = usize::from(u16::from_be_bytes([b[0], b[1]]));
        Ok(())
    }

    fn read_scan_header(&self, body: &[u8], at: usize) -> Result<ScanHeader, ScanError> {
        let bad = |what: String| ScanError::Malformed { at, what: format!("scan header: {what}") };
        let frame = self.frame.as_ref().ok_or_else(|| bad("no frame header before it".into()))?;
        let n = usize::from(*body.first().unwrap_or(&0));
        if !(1..=4).contains(&n) || body.len() < 4 + 2 * n {
            return Err(bad(format!("{n} components in a {}-byte segment", body.len() + 2)));
        }
        let mut components: Vec<ScanComponent> = Vec::with_capacity(n);
        for pair in body[1..1 + 2 * n].chunks_exact(2) {
            let index = frame.components.iter().position(|c| c.id == pair[0]).ok_or_else(|| bad(format!("component {} is not in the frame", pair[0])))?;
            if components.iter().any(|c| c.index == index) {
                return Err(bad(format!("component {} twice", pair[0])));
            }
            let (dc, ac) = (usize::from(pair[1] >> 4), usize::from(pair[1] & 15));
            if dc > 3 || ac > 3 {
                return Err(bad(format!("Huffman table destination {dc} / {ac}")));
            }
            components.push(ScanComponent { index, dc, ac });
        }
        let p = &body[1 + 2 * n..];
        let (ss, se, ah, al) = (u32::from(p[0]), u32::from(p[1]), u32::from(p[2] >> 4), u32::from(p[2] & 15));
        if frame.progressive() {
            // T.81 G.1.1.1.1: a DC scan holds DC only; an AC scan one component and a band of 1..=63.
            let dc_scan_ok = ss == 0 && se == 0;
            let ac_scan_ok = ss >= 1 && ss <= se && se <= 63 && n == 1;
            if !(dc_scan_ok || ac_scan_ok) || al > 13 || ah > 13 {
                return Err(bad(format!("progression Ss {ss} Se {se} Ah {ah} Al {al} with {n} components")));
            }
        }
        Ok(ScanHeader { at, components, ss, se, ah, al })
    }

    /// Walks the scan whose data starts at `start`; returns where the next marker is.
    fn walk_scan(&mut self, scan: &ScanHeader, start: usize) -> Result<usize, ScanError> {
        self.scans += 1;
        let Walker { data, frame, tables, coverage, unread_bytes, .. } = self;
        let frame = frame.as_ref().ok_or_else(|| ScanError::Malformed { at: scan.at, what: "scan before the frame header".into() })?;
        let grid = scan_grid(frame, scan, self.scans, self.restart_interval);
        // An MCU's blocks, in order: a non-interleaved scan's MCU is one block (T.81 A.2.2).
        let units: Vec<(usize, ScanComponent)> = match scan.components.as_slice() {
            [one] => vec![(1, *one)],
            many => many.iter().map(|c| (frame.components[c.index].h * frame.components[c.index].v, *c)).collect(),
        };
        let per_block = |ac: bool| -> Result<Vec<&HuffmanTable>, ScanError> {
            let mut v = Vec::new();
            for &(count, c) in &units {
                v.extend(std::iter::repeat_n(table(tables, ac, if ac { c.ac } else { c.dc }, scan)?, count));
            }
            Ok(v)
        };
        let (end, unread) = if !frame.progressive() {
            let dc = per_block(false)?;
            let ac = per_block(true)?;
            let blocks = dc.into_iter().zip(ac).map(|(dc, ac)| SequentialBlock { dc, ac, ac_runs: ac.ac_runs() }).collect();
            walk_scan_data(data, start, &grid, &mut SequentialMcu { blocks })?
        } else if scan.ss == 0 && scan.ah == 0 {
            walk_scan_data(data, start, &grid, &mut DcFirstMcu { blocks: per_block(false)? })?
        } else if scan.ss == 0 {
            let blocks = units.iter().map(|u| u.0 as u32).sum();
            walk_scan_data(data, start, &grid, &mut DcRefineMcu { blocks })?
        } else {
            let c = scan.components[0];
            let ac = table(tables, true, c.ac, scan)?;
            let component = &frame.components[c.index];
            let nonzero = &mut coverage[c.index].nonzero;
            if nonzero.is_empty() {
                let blocks = component.blocks_wide * component.blocks_high;
                nonzero.try_reserve_exact(blocks).map_err(|_| ScanError::Malformed {
                    at: scan.at,
                    what: format!("no memory for the progressive state of {blocks} blocks"),
                })?;
                nonzero.resize(blocks, 0);
            }
            let (ss, se) = (scan.ss, scan.se);
            if scan.ah == 0 {
                walk_scan_data(data, start, &grid, &mut AcFirstMcu { ac, ss, se, eob_run: 0, nonzero })?
            } else {
                walk_scan_data(data, start, &grid, &mut AcRefineMcu { ac, ss, se, eob_run: 0, nonzero })?
            }
        };
        *unread_bytes += unread;
        self.record_coverage(scan);
        Ok(end)
    }

    fn record_coverage(&mut self, scan: &ScanHeader) {
        for c in &scan.components {
            let coverage = &mut self.coverage[c.index];
            coverage.scanned = true;
            for k in scan.ss..=scan.se.min(63) {
                let low = &mut coverage.low_bit[k as usize];
                // A first scan (Ah = 0) sends the coefficient; a refinement without one sends nothing usable.
                if scan.ah == 0 || *low >= 0 {
                    *low = if *low < 0 { scan.al as i8 } else { (*low).min(scan.al as i8) };
                }
            }
        }
    }

    /// After the last scan: every component scanned, and for a progressive frame every
    /// coefficient sent down to bit 0.
    fn check_complete(&self, end: usize) -> Result<(), ScanError> {
        let Some(frame) = &self.frame else {
            return Err(ScanError::Malformed { at: end, what: "no frame header".into() });
        };
        let incomplete = |what: String| ScanError::Incomplete { scans: self.scans, at: end, what };
        if self.scans == 0 {
            return Err(incomplete("no scan at all".into()));
        }
        for (c, coverage) in frame.components.iter().zip(&self.coverage) {
            if !coverage.scanned {
                return Err(incomplete(format!("component {} in no scan", c.id)));
            }
            if !frame.progressive() {
                continue;
            }
            let missing: Vec<usize> = (0..64).filter(|&k| coverage.low_bit[k] < 0).collect();
            if let (Some(first), Some(last)) = (missing.first(), missing.last()) {
                return Err(incomplete(format!(
                    "component {}'s coefficients {first}..={last} ({} of them) never sent",
                    c.id,
                    missing.len()
                )));
            }
            if let Some(k) = (0..64).find(|&k| coverage.low_bit[k] > 0) {
                return Err(incomplete(format!(
                    "component {}'s coefficient {k} refined only down to bit {}, not 0",
                    c.id, coverage.low_bit[k]
                )));
            }
        }
        Ok(())
    }
}

/// The scan's MCU grid: the frame's for an interleaved scan, the component's own blocks for a
/// non-interleaved one (T.81 A.2); `number` is the scan's, 1-based.
fn scan_grid(frame: &Frame, scan: &ScanHeader, number: usize, restart_interval: usize) -> ScanGrid {
    let (per_row, rows, component) = match scan.components.as_slice() {
        [one] => {
            let c = &frame.components[one.index];
            (c.blocks_wide, c.blocks_high, Some(c.id))
        }
        _ => (frame.width.div_ceil(8 * frame.h_max), frame.height.div_ceil(8 * frame.v_max), None),
    };
    ScanGrid { place: ScanPlace { scan: number, component, mcu: 0, mcus: per_row * rows, mcus_per_row: per_row }, restart_interval }
}

/// The Huffman table a scan names, or why it cannot be used.
fn table<'t>(tables: &'t HuffmanTables, ac: bool, id: usize, scan: &ScanHeader) -> Result<&'t HuffmanTable, ScanError> {
    tables[usize::from(ac)][id].as_ref().ok_or_else(|| ScanError::Malformed {
        at: scan.at,
        what: format!("scan uses Huffman table {}, which no DHT segment defined", TableId { ac, id: id as u8 }),
    })
}

/// Reads every MCU of a scan from `start`, restart interval by restart interval; returns where
/// the marker after the scan's data is (after any restart marker that trails its last MCU), and
/// how many whole bytes of data were left unread after the intervals' last MCUs.
fn walk_scan_data<M: McuReader>(data: &[u8], start: usize, grid: &ScanGrid, mcus: &mut M) -> Result<(usize, usize), ScanError> {
    let total = grid.place.mcus;
    let interval = if grid.restart_interval == 0 { total } else { grid.restart_interval };
    let mut bits = BitReader::new(data, start);
    let mut next_restart = 0u8;
    let mut mcu = 0usize;
    let mut unread = 0usize;
    loop {
        let interval_end = total.min(mcu.saturating_add(interval));
        while mcu < interval_end {
            if let Err(c) = mcus.read_mcu(&mut bits, mcu) {
                return Err(corrupt_error(c, grid, mcu, bits, interval_end));
            }
            if bits.overread() {
                return Err(ran_out(grid, mcu, bits, interval_end));
            }
            mcu += 1;
        }
        unread += bits.unread_bytes();
        if mcu == total {
            return Ok((after_scan(data, bits), unread));
        }
        // A restart interval is over: RSTn must come next (bytes before it are passed over, as
        // libjpeg does).
        match bits.next_marker() {
            Some((at, code @ 0xD0..=0xD7)) if code - 0xD0 == next_restart => {
                bits = BitReader::new(data, at + 2);
                next_restart = (next_restart + 1) % 8;
                mcus.restart();
            }
            Some((at, code @ 0xD0..=0xD7)) => {
                return Err(ScanError::RestartOutOfOrder { place: grid.at(mcu), at, expected: next_restart, found: code - 0xD0 });
            }
            Some((at, code)) => return Err(ScanError::DataEnds { place: grid.at(mcu), at, next: Some(code) }),
            None => return Err(ScanError::DataEnds { place: grid.at(mcu), at: data.len(), next: None }),
        }
    }
}

/// The MCU at `mcu` needed bits past the data's end: a cut, or a restart marker too early.
#[cold]
fn ran_out(grid: &ScanGrid, mcu: usize, bits: BitReader, interval_end: usize) -> ScanError {
    let place = grid.at(mcu);
    match bits.next_marker() {
        Some((at, code @ 0xD0..=0xD7)) => ScanError::RestartEarly { place, at, found: code - 0xD0, interval_end },
        Some((at, code)) => ScanError::DataEnds { place, at, next: Some(code) },
        None => ScanError::DataEnds { place, at: bits.data.len(), next: None },
    }
}

/// A code not in its table, or an impossible DC category. Met in the zero bits past the data's
/// end, it is the cut that is reported.
#[cold]
fn corrupt_error(c: Corrupt, grid: &ScanGrid, mcu: usize, bits: BitReader, interval_end: usize) -> ScanError {
    if bits.stop.is_some() && bits.real_bits_loaded() < 32 {
        return ran_out(grid, mcu, bits, interval_end);
    }
    let (place, near) = (grid.at(mcu), bits.near_byte());
    match c {
        Corrupt::NoCode(table) => ScanError::BadHuffmanCode { place, table, near },
        Corrupt::DcCategory(category) => ScanError::BadDcCategory { place, category, near },
    }
}

/// Where the segments go on after a scan's last MCU: the next marker that is not a restart
/// marker (one trailing the last interval is passed over), or the end of the file.
fn after_scan(data: &[u8], bits: BitReader) -> usize {
    let mut next = bits.next_marker();
    while let Some((at, 0xD0..=0xD7)) = next {
        next = find_marker(data, at + 2);
    }
    next.map_or(data.len(), |(at, _)| at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn data_dir(sub: &str) -> PathBuf {
        crate::repo_root().join("tests/data").join(sub)
    }

    fn nuscenes_jpegs() -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(data_dir("nuscenes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect();
        v.sort();
        assert_eq!(v.len(), 6);
        v
    }

    fn camera_jpeg(name: &str) -> Vec<u8> {
        std::fs::read(data_dir("camera").join(name)).unwrap()
    }

    /// Byte offset just past the first SOS segment (the first scan's data).
    fn first_scan_data(d: &[u8]) -> usize {
        crate::sensors::image::jpeg_markers::read_layout(d).unwrap().scan_data
    }

    /// Offset of the last end-of-image marker.
    fn eoi(d: &[u8]) -> usize {
        d.windows(2).rposition(|w| w == [0xFF, 0xD9]).unwrap()
    }

    /// `n` cut lengths spread over the scan data (from its first byte to just before the EOI).
    fn cut_points(d: &[u8], n: usize) -> Vec<usize> {
        let (from, to) = (first_scan_data(d), eoi(d));
        (0..n).map(|i| from + (to - from) * i / n).collect()
    }

    /// The ways a cut file can end.
    fn endings(d: &[u8], cut: usize) -> [(&'static str, Vec<u8>); 3] {
        let mut with_eoi = d[..cut].to_vec();
        with_eoi.extend_from_slice(&[0xFF, 0xD9]);
        let mut with_marker = d[..cut].to_vec();
        with_marker.extend_from_slice(&[0xFF, 0xFE, 0x00, 0x04, b'h', b'i', 0xFF, 0xD9]); // a comment, then EOI
        [("EOI appended", with_eoi), ("plain end of file", d[..cut].to_vec()), ("COM + EOI appended", with_marker)]
    }

    fn assert_every_cut_is_refused(name: &str, d: &[u8], n: usize) {
        for cut in cut_points(d, n) {
            for (how, bytes) in endings(d, cut) {
                let r = check_scan_data(&bytes);
                assert!(r.is_err(), "{name} cut at {cut} of {} bytes, {how}: {r:?}", d.len());
            }
        }
    }

    #[test]
    fn the_nuscenes_jpegs_are_whole() {
        for (name, d) in nuscenes_jpegs() {
            let s = check_scan_data(&d).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s, ScanSummary { progressive: false, scans: 1, end: eoi(&d), unread_bytes: 0 }, "{name}");
            // Trailing bytes after the end-of-image marker are not looked at.
            let mut t = d.clone();
            t.extend_from_slice(b"\0\0trailing");
            assert!(check_scan_data(&t).is_ok());
        }
    }

    #[test]
    fn cut_nuscenes_jpegs_are_refused_however_they_end() {
        for (name, d) in nuscenes_jpegs() {
            assert_every_cut_is_refused(&name, &d, 20);
            // the last few bytes of data, down to the final byte (which holds the padding bits)
            for short in 1..=4 {
                let mut b = d[..eoi(&d) - short].to_vec();
                b.extend_from_slice(&[0xFF, 0xD9]);
                assert!(check_scan_data(&b).is_err(), "{name}: {short} bytes short");
            }
        }
    }

    #[test]
    fn the_reported_cut_names_the_mcu_the_row_and_what_follows() {
        let (name, d) = nuscenes_jpegs().into_iter().find(|(n, _)| n.contains("__CAM_FRONT__")).unwrap();
        assert_eq!(d.len(), 131_197, "{name}");
        let mut cut = d[..78_718].to_vec();
        cut.extend_from_slice(&[0xFF, 0xD9]);
        let e = check_scan_data(&cut).unwrap_err();
        let ScanError::DataEnds { place, at, next } = e.clone() else { panic!("{e}") };
        // 1600 x 900 at 4:2:0: MCUs of 16 x 16, 100 per row, 57 rows.
        assert_eq!((place.scan, place.component, place.mcus, place.mcus_per_row), (1, None, 5700, 100));
        assert!((2000..5000).contains(&place.mcu), "{e}");
        assert_eq!((at, next), (78_718, Some(0xD9)));
        let msg = e.to_string();
        assert!(msg.starts_with("scan data ends at MCU ") && msg.contains(" of 5,700 (row ") && msg.contains(" of 57) of scan 1"), "{msg}");
        assert!(msg.contains("at byte 78,718 where an end-of-image marker follows: the file was cut short"), "{msg}");
        // plain end of file, another marker
        let e = check_scan_data(&d[..78_718]).unwrap_err();
        assert!(matches!(e, ScanError::DataEnds { next: None, at: 78_718, .. }), "{e}");
        assert!(e.to_string().contains("where the end of the file follows"), "{e}");
        let mut other = d[..78_718].to_vec();
        other.extend_from_slice(&[0xFF, 0xC4, 0x00, 0x02, 0xFF, 0xD9]);
        let e = check_scan_data(&other).unwrap_err();
        assert!(e.to_string().contains("where marker 0xFFC4 follows"), "{e}");
    }

    #[test]
    fn a_cut_inside_a_stuffed_ff_is_refused() {
        let (_, d) = nuscenes_jpegs().into_iter().next().unwrap();
        let from = first_scan_data(&d);
        let stuffed: Vec<usize> = (from..eoi(&d)).filter(|&i| d[i] == 0xFF && d[i + 1] == 0x00).take(20).collect();
        assert!(!stuffed.is_empty());
        for i in stuffed {
            let mut b = d[..=i].to_vec(); // ends in the FF of a stuffed pair
            b.extend_from_slice(&[0xFF, 0xD9]);
            assert!(check_scan_data(&b).is_err(), "cut after the FF at {i}");
        }
    }

    /// The Pillow fixtures (tests/fixtures/make_scan_jpegs.py) and what each is.
    const FIXTURES: [(&str, bool, usize); 8] = [
        ("scan_restart_rows_420.jpg", false, 1),
        ("scan_restart_blocks_444.jpg", false, 1),
        ("scan_progressive_420.jpg", true, 10),
        ("scan_progressive_restart_422.jpg", true, 10),
        ("scan_gray.jpg", false, 1),
        ("scan_gray_progressive.jpg", true, 6),
        ("small.jpg", false, 1),
        ("progressive.jpg", true, 10),
    ];

    #[test]
    fn pillows_fixtures_are_whole_and_every_cut_is_refused() {
        for (name, progressive, scans) in FIXTURES {
            let d = camera_jpeg(name);
            let s = check_scan_data(&d).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Every scan (and restart interval) read to its last byte: the walk's bit count is exact.
            assert_eq!((s.progressive, s.scans, s.end, s.unread_bytes), (progressive, scans, eoi(&d), 0), "{name}");
            assert_every_cut_is_refused(name, &d, 40);
        }
    }

    #[test]
    fn the_fixtures_are_the_codings_they_are_named_for() {
        use crate::sensors::image::jpeg_markers::read_layout;
        let sampling = |name: &str| read_layout(&camera_jpeg(name)).unwrap().components.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>();
        assert_eq!(sampling("scan_restart_rows_420.jpg"), vec![(2, 2), (1, 1), (1, 1)]);
        assert_eq!(sampling("scan_restart_blocks_444.jpg"), vec![(1, 1), (1, 1), (1, 1)]);
        assert_eq!(sampling("scan_progressive_restart_422.jpg"), vec![(2, 1), (1, 1), (1, 1)]);
        assert_eq!(sampling("scan_gray.jpg").len(), 1);
        let restart_interval = |name: &str| {
            let d = camera_jpeg(name);
            let at = d.windows(2).position(|w| w == [0xFF, 0xDD]).unwrap();
            (u16::from_be_bytes([d[at + 4], d[at + 5]]), d.windows(2).filter(|w| w[0] == 0xFF && (0xD0..=0xD7).contains(&w[1])).count())
        };
        // 203 x 117 at 4:2:0: 13 MCUs a row, 8 rows, a marker between rows.
        assert_eq!(restart_interval("scan_restart_rows_420.jpg"), (13, 7));
        // 4:4:4: 26 x 15 MCUs, every 5th followed by a marker but the last.
        assert_eq!(restart_interval("scan_restart_blocks_444.jpg"), (5, 77));
        assert_eq!(restart_interval("scan_progressive_restart_422.jpg").0, 7);
    }

    /// The fixture with its restart markers rewritten by `edit` (given each marker's index
    /// and code byte).
    fn with_restarts(name: &str, edit: impl Fn(usize, &mut u8)) -> Vec<u8> {
        let mut d = camera_jpeg(name);
        let from = first_scan_data(&d);
        let mut n = 0;
        for i in from..d.len() - 1 {
            if d[i] == 0xFF && (0xD0..=0xD7).contains(&d[i + 1]) {
                edit(n, &mut d[i + 1]);
                n += 1;
            }
        }
        d
    }

    #[test]
    fn restart_markers_out_of_order_are_refused() {
        let swapped = with_restarts("scan_restart_blocks_444.jpg", |i, code| {
            if i == 3 {
                *code = 0xD0 + 6;
            }
        });
        let e = check_scan_data(&swapped).unwrap_err();
        assert!(matches!(e, ScanError::RestartOutOfOrder { expected: 3, found: 6, place: ScanPlace { mcu: 20, .. }, .. }), "{e}");
        assert!(e.to_string().contains("RST6") && e.to_string().contains("where RST3 belongs"), "{e}");
    }

    #[test]
    fn a_restart_interval_cut_short_is_refused() {
        // An interval's data cut out between two markers (a splice): the next marker comes early.
        let d = camera_jpeg("scan_restart_rows_420.jpg");
        let from = first_scan_data(&d);
        let markers: Vec<usize> = (from..d.len() - 1).filter(|&i| d[i] == 0xFF && (0xD0..=0xD7).contains(&d[i + 1])).collect();
        let (a, b) = (markers[2], markers[3]);
        let mut spliced = d[..a + 2 + (b - a) / 3].to_vec();
        spliced.extend_from_slice(&d[b..]);
        let e = check_scan_data(&spliced).unwrap_err();
        assert!(matches!(e, ScanError::RestartEarly { found: 3, interval_end: 52, .. }), "{e}");
        assert!(e.to_string().contains("before its restart interval ends at MCU 52"), "{e}");
        // A marker missing altogether: the data runs on into the next interval, then RSTn+1
        // arrives where RSTn should.
        let mut dropped = d[..markers[4]].to_vec();
        dropped.extend_from_slice(&d[markers[4] + 2..]);
        assert!(check_scan_data(&dropped).is_err());
    }

    #[test]
    fn a_progressive_file_without_its_last_scans_is_refused() {
        for name in ["scan_progressive_420.jpg", "scan_progressive_restart_422.jpg", "scan_gray_progressive.jpg", "progressive.jpg"] {
            let d = camera_jpeg(name);
            let sos: Vec<usize> = d.windows(2).enumerate().filter(|(_, w)| *w == [0xFF, 0xDA]).map(|(i, _)| i).collect();
            // EOI in place of every scan after the first (and of the DHT before it, if any).
            for &at in &sos[1..] {
                let mut b = d[..at].to_vec();
                b.extend_from_slice(&[0xFF, 0xD9]);
                let e = check_scan_data(&b).unwrap_err();
                assert!(matches!(e, ScanError::Incomplete { .. }), "{name} ending before byte {at}: {e}");
                assert!(e.to_string().contains("the file was cut short"), "{e}");
            }
        }
        // The whole file's last scan refines to bit 0: without it, "refined only down to bit 1".
        let d = camera_jpeg("scan_progressive_420.jpg");
        let last = d.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
        let mut b = d[..last].to_vec();
        b.extend_from_slice(&[0xFF, 0xD9]);
        let msg = check_scan_data(&b).unwrap_err().to_string();
        assert!(msg.contains("refined only down to bit 1"), "{msg}");
    }

    #[test]
    fn a_sequential_frame_needs_every_component_scanned() {
        // The frame of small.jpg given a fourth component that no scan holds.
        let d = camera_jpeg("small.jpg");
        let sof = d.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let mut b = d[..sof].to_vec();
        let len = u16::from_be_bytes([d[sof + 2], d[sof + 3]]) as usize;
        b.extend_from_slice(&[0xFF, 0xC0]);
        b.extend_from_slice(&((len + 3) as u16).to_be_bytes());
        b.extend_from_slice(&d[sof + 4..sof + 9]);
        b.push(4);
        b.extend_from_slice(&d[sof + 10..sof + 2 + len]);
        b.extend_from_slice(&[9, 0x11, 0]);
        b.extend_from_slice(&d[sof + 2 + len..]);
        let msg = check_scan_data(&b).unwrap_err().to_string();
        assert!(msg.contains("component 9 in no scan"), "{msg}");
    }

    /// The run table's entry of `prefix`, symbol by symbol with the one-symbol lookup.
    fn run_entry_one_by_one(ac: &HuffmanTable, prefix: u32) -> u32 {
        let (mut used, mut coefficients) = (0u32, 0u32);
        while used < RUN_LOOKAHEAD {
            let window = ((prefix << used) & ((1 << RUN_LOOKAHEAD) - 1)) >> (RUN_LOOKAHEAD - LOOKAHEAD);
            let entry = ac.fast_sequential[window as usize];
            let bits = u32::from(entry >> 8);
            if entry == 0 || used + bits > RUN_LOOKAHEAD {
                break;
            }
            let (run, size) = (u32::from(entry as u8 >> 4), u32::from(entry as u8 & 15));
            if size == 0 && run != 15 {
                return (used + bits) | coefficients << 4 | RUN_ENDS_BLOCK;
            }
            used += bits;
            coefficients += if size == 0 { 16 } else { run + 1 };
        }
        used | coefficients << 4
    }

    #[test]
    fn the_multi_symbol_lookup_agrees_with_one_symbol_at_a_time() {
        for name in ["small.jpg", "scan_restart_blocks_444.jpg"] {
            let mut w = Walker::new(&[]);
            let d = camera_jpeg(name);
            let mut at = 2;
            while let Some((m, code)) = find_marker(&d, at) {
                let len = u16::from_be_bytes([d[m + 2], d[m + 3]]) as usize;
                if code == 0xC4 {
                    w.read_huffman_tables(&d[m + 4..m + 2 + len], m).unwrap();
                }
                if code == 0xDA {
                    break;
                }
                at = m + 2 + len;
            }
            for ac in w.tables[1].iter().flatten() {
                let runs = ac.ac_runs();
                for prefix in 0..1u32 << RUN_LOOKAHEAD {
                    assert_eq!(u32::from(runs[prefix as usize]), run_entry_one_by_one(ac, prefix), "{name} {} prefix {prefix:012b}", ac.id);
                }
            }
        }
    }

    #[test]
    fn corrupt_codes_are_named_and_never_panic() {
        let (_, d) = nuscenes_jpegs().into_iter().next().unwrap();
        let from = first_scan_data(&d);
        // 32 one bits (stuffed: FF 00 four times) are no code of a JPEG Huffman table.
        let mut b = d.clone();
        for i in 0..4 {
            b[from + 1000 + 2 * i..from + 1002 + 2 * i].copy_from_slice(&[0xFF, 0x00]);
        }
        let e = check_scan_data(&b).unwrap_err();
        assert!(matches!(e, ScanError::BadHuffmanCode { .. }), "{e}");
        assert!(e.to_string().contains("no code of Huffman table"), "{e}");
        // Pseudo-random damage anywhere: an error or a pass, never a panic.
        let mut x = 0x9E37_79B9u32;
        for _ in 0..300 {
            let mut b = d.clone();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let i = (x as usize) % b.len();
                b[i] = (x >> 8) as u8;
            }
            let _ = check_scan_data(&b);
        }
        for name in ["scan_progressive_restart_422.jpg", "scan_restart_rows_420.jpg"] {
            let d = camera_jpeg(name);
            for i in 0..d.len() {
                let mut b = d.clone();
                b[i] ^= 0x5A;
                let _ = check_scan_data(&b);
            }
        }
    }

    #[test]
    fn headers_the_walk_refuses() {
        assert_eq!(check_scan_data(b""), Err(ScanError::NoSoi));
        assert_eq!(check_scan_data(b"\x89PNG"), Err(ScanError::NoSoi));
        // SOI alone, SOI + EOI: no frame.
        assert!(matches!(check_scan_data(&[0xFF, 0xD8]), Err(ScanError::Malformed { .. })));
        assert!(matches!(check_scan_data(&[0xFF, 0xD8, 0xFF, 0xD9]), Err(ScanError::Malformed { .. })));
        let d = camera_jpeg("small.jpg");
        let sof = d.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        // Arithmetic coding, lossless: unsupported.
        for m in [0xC3, 0xC9, 0xCA] {
            let mut b = d.clone();
            b[sof + 1] = m;
            assert_eq!(check_scan_data(&b), Err(ScanError::Unsupported { marker: m }));
        }
        // Height 0 (to come from a DNL marker), and a DNL marker.
        let mut b = d.clone();
        b[sof + 5..sof + 7].fill(0);
        assert!(matches!(check_scan_data(&b), Err(ScanError::Dnl { .. })));
        assert!(check_scan_data(&b).unwrap_err().to_string().contains("DNL"));
        let mut b = d[..eoi(&d)].to_vec();
        b.extend_from_slice(&[0xFF, 0xDC, 0x00, 0x04, 0x00, 0x28, 0xFF, 0xD9]);
        assert!(matches!(check_scan_data(&b), Err(ScanError::Dnl { .. })));
        // Headers cut: every cut before the scan data is an error.
        for cut in 2..first_scan_data(&d) {
            assert!(check_scan_data(&d[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn the_bit_reader_unstuffs_and_counts_bits_past_the_data() {
        let data = [0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD9];
        let mut r = BitReader::new(&data, 0);
        r.ensure(24);
        assert_eq!(r.peek(24), 0x12FF34);
        r.skip(24);
        assert!(!r.overread());
        assert_eq!(r.stop, Some(4));
        r.ensure(1);
        r.skip(1);
        assert!(r.overread());
        assert_eq!(r.next_marker(), Some((4, 0xD9)));
        // The fast path (no FF in eight bytes) and the byte path agree.
        let plain: Vec<u8> = (1..=40).collect();
        let mut fast = BitReader::new(&plain, 0);
        let mut got = Vec::new();
        for _ in 0..40 {
            fast.ensure(8);
            got.push(fast.peek(8) as u8);
            fast.skip(8);
        }
        assert_eq!(got, plain);
        assert!(!fast.overread());
        assert_eq!(band_mask(1, 5), 0b11_1110);
        assert_eq!(band_mask(0, 63), u64::MAX);
        assert_eq!(band_mask(64, 63), 0);
        assert_eq!(thousands(5_120), "5,120");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }

    /// Release build, one thread: the walk against zune-jpeg's full decode of the same files
    /// (module docs). `cargo test --release --lib jpeg_scan::tests::walk_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn walk_cost() {
        use std::time::Instant;
        let files = nuscenes_jpegs();
        let median_ms = |f: &dyn Fn(&[u8])| {
            let mut per_image: Vec<f64> = (0..31)
                .map(|_| {
                    let t = Instant::now();
                    for (_, d) in &files {
                        f(d);
                    }
                    t.elapsed().as_secs_f64() * 1e3 / files.len() as f64
                })
                .collect();
            per_image.sort_by(f64::total_cmp);
            per_image[per_image.len() / 2]
        };
        let walk = median_ms(&|d| {
            std::hint::black_box(check_scan_data(d).unwrap());
        });
        // zune-jpeg alone, as `compressed` configures it (strict, RGB out)
        let decode = median_ms(&|d| {
            let opts = zune_core::options::DecoderOptions::default()
                .set_strict_mode(true)
                .jpeg_set_out_colorspace(zune_core::colorspace::ColorSpace::RGB);
            let mut dec = zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(d), opts);
            std::hint::black_box(dec.decode().unwrap());
        });
        eprintln!("per 1600 x 900 image: scan walk {walk:.3} ms, zune-jpeg decode {decode:.3} ms");
    }
}
