//! The stored record: a bucket's configuration and state in a compact, versioned binary
//! format (specified in `docs/distributed.md`, pinned by the golden files in
//! `tests/golden/`).
//!
//! ```text
//! header   "b4rs" | version u8 = 2 | flags u8 = 0 | n u16 | config checksum u32
//! n blocks kind u8 | bflags u8 | 6 zero bytes | capacity | refill tokens | refill period
//!          | last refill | tokens | remainder                (six big-endian i64)
//! tail     per bandwidth: [initial tokens i64] [first refill i64] [id: u16 len + UTF-8]
//! ledger   m u16 | [m > 0: per bandwidth the base level: tokens i64 | remainder i64]
//! (v2)     | m entries: owner u64 | seq u64 | expires i64
//!              | per bandwidth: taken tokens i64 | taken remainder i64
//!                               | level tokens i64 | level remainder i64
//!          | k u16 | k tombstones: owner u64 | seq u64 | expires i64
//! ```
//!
//! A level of tokens -1 (remainder 0) is infinite. The levels and what they mean are
//! `ledger.rs`'s (and `docs/distributed.md`'s, "In-doubt calls are settled").
//!
//! ```text
//! ```
//!
//! The state fields sit at fixed offsets so a server-side script can rewrite them without
//! parsing the rest; the checksum covers every configuration byte (not the state and not the
//! ledger, which such scripts rewrite). Version 1 records (no ledger) are still read; this
//! version writes version 2. The ledger is the record of recent operations that settles
//! in-doubt calls: see [`Ledger`].
//!
//! ```
//! use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
//! use bucket4rs_distributed::format;
//! use std::time::Duration;
//!
//! let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
//! let state = BucketState::new(&config, 7);
//! let bytes = format::encode(&config, &state);
//! let record = format::decode(&bytes)?;
//! assert_eq!((record.config, record.state), (config, state));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::time::Duration;

use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState, RefillKind};

use crate::error::FormatError;

/// The record magic.
#[doc(hidden)]
pub const MAGIC: [u8; 4] = *b"b4rs";
/// The format version this library writes (and the newest it reads).
pub const VERSION: u8 = 2;
/// Bytes before the first bandwidth block.
#[doc(hidden)]
pub const HEADER_LEN: usize = 12;
/// Bytes of one bandwidth block.
#[doc(hidden)]
pub const BLOCK_LEN: usize = 56;
/// Offset of `last refill` inside a block (then `tokens` at +8 and `remainder` at +16).
#[doc(hidden)]
pub const STATE_OFFSET: usize = 32;

const KIND_GREEDY: u8 = 0;
const KIND_INTERVALLY: u8 = 1;
const KIND_ALIGNED: u8 = 2;
const F_INITIAL: u8 = 1;
const F_ADAPTIVE: u8 = 2;
const F_ID: u8 = 4;

/// A decoded record.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// # use bucket4rs_distributed::format; use std::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let record = format::decode(&format::encode(&config, &BucketState::new(&config, 0)))?;
/// assert_eq!(record.state.bandwidths()[0].tokens(), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The stored configuration.
    pub config: BucketConfiguration,
    /// The stored state (checked to fit the configuration).
    pub state: BucketState,
    /// The recent operations kept for settling in-doubt calls (empty in a version 1 record).
    pub ledger: Ledger,
}

/// The operations a record remembers so that a call whose reply was lost can be settled:
/// each entry names an operation (its manager and sequence number), what it took, and, per
/// bandwidth, a *level* that keeps giving it back exact as later operations refill and consume
/// (see `docs/distributed.md`, "In-doubt calls are settled"). Tombstones name operations that
/// were settled: they are never applied later.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// # use bucket4rs_distributed::format; use std::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let record = format::decode(&format::encode(&config, &BucketState::new(&config, 0)))?;
/// assert!(record.ledger.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Per bandwidth, the level below the oldest entry (empty when there is no entry).
    pub(crate) base: Vec<Level>,
    pub(crate) entries: Vec<LedgerEntry>,
    pub(crate) tombstones: Vec<Tombstone>,
}

/// A level in refill units (tokens × refill period + remainder); `None` is infinite.
pub(crate) type Level = Option<i128>;

impl Ledger {
    /// Operations remembered (settled ones included, until they expire).
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::format::Ledger::default().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.entries.len() + self.tombstones.len()
    }

    /// Whether the record remembers no operation.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::format::Ledger::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.tombstones.is_empty()
    }
}

/// One remembered operation that took tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LedgerEntry {
    /// The manager that sent it (random per [`ProxyManager`](crate::ProxyManager)).
    pub(crate) owner: u64,
    /// Its sequence number in that manager.
    pub(crate) seq: u64,
    /// When it may be forgotten: the bucket's clock shifted right by 20 bits (about 1 ms).
    pub(crate) expires: i64,
    /// Per bandwidth, what it took, in refill units.
    pub(crate) taken: Vec<i128>,
    /// Per bandwidth, the level above it.
    pub(crate) level: Vec<Level>,
}

/// A settled operation: never applied after its settlement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tombstone {
    pub(crate) owner: u64,
    pub(crate) seq: u64,
    pub(crate) expires: i64,
}

/// `u` refill units as stored: (tokens, remainder), saturated at `i64::MAX` tokens.
fn units_pair(u: i128, period: i128) -> (i64, i64) {
    (
        i64::try_from(u.div_euclid(period)).unwrap_or(i64::MAX),
        u.rem_euclid(period) as i64,
    )
}

fn put_units(out: &mut Vec<u8>, u: Level, period: i128) {
    let (t, r) = match u {
        None => (-1, 0),
        Some(u) => units_pair(u.max(0), period),
    };
    out.extend_from_slice(&t.to_be_bytes());
    out.extend_from_slice(&r.to_be_bytes());
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>, mut h: u32) -> u32 {
    for b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn checksum(bytes: &[u8], n: usize) -> u32 {
    let mut h = 0x811c_9dc5;
    h = fnv1a(bytes[..8].iter().copied(), h);
    for i in 0..n {
        let at = HEADER_LEN + i * BLOCK_LEN;
        h = fnv1a(bytes[at..at + STATE_OFFSET].iter().copied(), h);
    }
    fnv1a(bytes[HEADER_LEN + n * BLOCK_LEN..].iter().copied(), h)
}

/// Encodes a configuration and its state. The state must belong to the configuration
/// (missing bandwidth states are written as zeros).
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// # use bucket4rs_distributed::format; use std::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let bytes = format::encode(&config, &BucketState::new(&config, 0));
/// assert_eq!(&bytes[..5], b"b4rs\x02");
/// assert_eq!(bytes.len(), format::HEADER_LEN + format::BLOCK_LEN + 4); // an empty ledger
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn encode(config: &BucketConfiguration, state: &BucketState) -> Vec<u8> {
    encode_with(config, state, &Ledger::default())
}

/// Encodes a decoded record as it is, ledger included ([`encode`] writes an empty ledger).
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// # use bucket4rs_distributed::format; use std::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let bytes = format::encode(&config, &BucketState::new(&config, 0));
/// assert_eq!(format::encode_record(&format::decode(&bytes)?), bytes);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn encode_record(record: &Record) -> Vec<u8> {
    encode_with(&record.config, &record.state, &record.ledger)
}

/// [`encode`] with a ledger (entries with the wrong bandwidth count are written with zeros).
pub(crate) fn encode_with(
    config: &BucketConfiguration,
    state: &BucketState,
    ledger: &Ledger,
) -> Vec<u8> {
    let bws = config.bandwidths();
    let n = bws.len().min(u16::MAX as usize);
    let mut out = Vec::with_capacity(HEADER_LEN + n * (BLOCK_LEN + 8));
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(0);
    out.extend_from_slice(&(n as u16).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    let mut tail = Vec::new();
    for (i, b) in bws.iter().take(n).enumerate() {
        let (kind, mut flags) = match b.refill_kind() {
            RefillKind::Greedy => (KIND_GREEDY, 0),
            RefillKind::Intervally => (KIND_INTERVALLY, 0),
            RefillKind::IntervallyAligned {
                adaptive_initial_tokens,
                ..
            } => (
                KIND_ALIGNED,
                if adaptive_initial_tokens {
                    F_ADAPTIVE
                } else {
                    0
                },
            ),
            // A refill kind added to the core later: encode as greedy would misread it, so
            // such a configuration cannot be produced by this version's builder paths.
            _ => (u8::MAX, 0),
        };
        if let Some(t) = b.explicit_initial_tokens() {
            flags |= F_INITIAL;
            tail.extend_from_slice(&(t as i64).to_be_bytes());
        }
        if let RefillKind::IntervallyAligned {
            first_refill_nanos, ..
        } = b.refill_kind()
        {
            tail.extend_from_slice(&first_refill_nanos.to_be_bytes());
        }
        if let Some(id) = b.id() {
            flags |= F_ID;
            let id = &id.as_bytes()[..id.len().min(u16::MAX as usize)];
            tail.extend_from_slice(&(id.len() as u16).to_be_bytes());
            tail.extend_from_slice(id);
        }
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&[0; 6]);
        for v in [
            b.capacity() as i64,
            b.refill_tokens() as i64,
            b.refill_period().as_nanos() as i64,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        let s = state.bandwidths().get(i).copied().unwrap_or_default();
        for v in [s.last_refill_nanos(), s.tokens(), s.remainder()] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    out.extend_from_slice(&tail);
    let sum = checksum(&out, n);
    out[8..12].copy_from_slice(&sum.to_be_bytes());
    let period = |i: usize| bws[i].refill_period().as_nanos() as i128;
    let m = ledger.entries.len().min(u16::MAX as usize);
    out.reserve(4 + 16 * n + m * (24 + 32 * n) + 24 * ledger.tombstones.len());
    out.extend_from_slice(&(m as u16).to_be_bytes());
    if m > 0 {
        for i in 0..n {
            put_units(
                &mut out,
                ledger.base.get(i).copied().flatten().or(Some(0)),
                period(i),
            );
        }
    }
    for e in ledger.entries.iter().take(m) {
        out.extend_from_slice(&e.owner.to_be_bytes());
        out.extend_from_slice(&e.seq.to_be_bytes());
        out.extend_from_slice(&e.expires.to_be_bytes());
        for i in 0..n {
            put_units(
                &mut out,
                Some(e.taken.get(i).copied().unwrap_or(0)),
                period(i),
            );
            put_units(&mut out, e.level.get(i).copied().flatten(), period(i));
        }
    }
    let k = ledger.tombstones.len().min(u16::MAX as usize);
    out.extend_from_slice(&(k as u16).to_be_bytes());
    for t in ledger.tombstones.iter().take(k) {
        out.extend_from_slice(&t.owner.to_be_bytes());
        out.extend_from_slice(&t.seq.to_be_bytes());
        out.extend_from_slice(&t.expires.to_be_bytes());
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let end = self.at.checked_add(N).ok_or(FormatError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(FormatError::Truncated)?;
        self.at = end;
        let mut out = [0; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
    fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_be_bytes(self.take()?))
    }
}

fn positive(v: i64, what: &'static str) -> Result<u64, FormatError> {
    if v < 0 {
        Err(FormatError::Invalid { what })
    } else {
        Ok(v as u64)
    }
}

/// Decodes a record, validating everything: magic, version, lengths, checksum, the
/// configuration (with the core's builder) and the state against it.
///
/// # Errors
/// A [`FormatError`] naming what is wrong; never a panic, never a misread record.
///
/// ```
/// use bucket4rs_distributed::{format, FormatError};
/// let mut bytes = b"b4rs\x09\x00\x00\x01\x00\x00\x00\x00".to_vec();
/// assert_eq!(format::decode(&bytes), Err(FormatError::UnsupportedVersion { found: 9, newest_supported: 2 }));
/// ```
pub fn decode(bytes: &[u8]) -> Result<Record, FormatError> {
    if bytes.len() < 4 {
        return Err(if MAGIC.starts_with(bytes) {
            FormatError::Truncated
        } else {
            FormatError::BadMagic
        });
    }
    if bytes[..4] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let mut r = Reader { bytes, at: 4 };
    let [version, flags] = r.take::<2>()?;
    if version == 0 {
        return Err(FormatError::Invalid { what: "version" });
    }
    if version > VERSION {
        return Err(FormatError::UnsupportedVersion {
            found: version,
            newest_supported: VERSION,
        });
    }
    if flags != 0 {
        return Err(FormatError::Invalid {
            what: "header flags",
        });
    }
    let n = r.u16()? as usize;
    if n == 0 {
        return Err(FormatError::Invalid {
            what: "bandwidth count",
        });
    }
    let stored_sum = u32::from_be_bytes(r.take()?);
    struct Block {
        kind: u8,
        flags: u8,
        fields: [i64; 6],
    }
    let mut blocks = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let meta = r.take::<8>()?;
        if meta[2..] != [0; 6] || meta[1] & !(F_INITIAL | F_ADAPTIVE | F_ID) != 0 {
            return Err(FormatError::Invalid {
                what: "bandwidth flags",
            });
        }
        let mut fields = [0; 6];
        for f in &mut fields {
            *f = r.i64()?;
        }
        blocks.push(Block {
            kind: meta[0],
            flags: meta[1],
            fields,
        });
    }
    let mut bandwidths = Vec::with_capacity(n.min(1024));
    let mut states = Vec::with_capacity(n.min(1024));
    for blk in &blocks {
        let [c, t, p, last, tokens, rem] = blk.fields;
        let capacity = positive(c, "capacity")?;
        let refill_tokens = positive(t, "refill tokens")?;
        let period = Duration::from_nanos(positive(p, "refill period")?);
        let mut b = Bandwidth::builder().capacity(capacity);
        b = match blk.kind {
            KIND_GREEDY | KIND_INTERVALLY if blk.flags & F_ADAPTIVE != 0 => {
                return Err(FormatError::Invalid {
                    what: "adaptive flag",
                });
            }
            KIND_GREEDY => b.refill_greedy(refill_tokens, period),
            KIND_INTERVALLY => b.refill_intervally(refill_tokens, period),
            KIND_ALIGNED => b, // completed below, once the tail is read
            _ => {
                return Err(FormatError::Invalid {
                    what: "refill kind",
                });
            }
        };
        if blk.flags & F_INITIAL != 0 {
            b = b.initial_tokens(positive(r.i64()?, "initial tokens")?);
        }
        if blk.kind == KIND_ALIGNED {
            let first = positive(r.i64()?, "first refill")?;
            if first % 1_000_000 != 0 {
                // The builder keeps whole milliseconds: no writer stores anything else.
                return Err(FormatError::Invalid {
                    what: "first refill",
                });
            }
            let first = Duration::from_nanos(first);
            b = if blk.flags & F_ADAPTIVE != 0 {
                b.refill_intervally_aligned_adaptive(refill_tokens, period, first)
            } else {
                b.refill_intervally_aligned(refill_tokens, period, first)
            };
        }
        if blk.flags & F_ID != 0 {
            let len = r.u16()? as usize;
            let end = r.at.checked_add(len).ok_or(FormatError::Truncated)?;
            let id = r.bytes.get(r.at..end).ok_or(FormatError::Truncated)?;
            let id = core::str::from_utf8(id).map_err(|_| FormatError::Invalid { what: "id" })?;
            r.at = end;
            b = b.id(id);
        }
        let built = b.build().map_err(FormatError::Config)?;
        bandwidths.push(built);
        states.push(BandwidthState::from_parts(last, tokens, rem));
    }
    let tail_end = r.at;
    let mut ledger = Ledger::default();
    if version >= 2 {
        // (tokens, remainder) in refill units; tokens -1 with remainder 0 is infinite when
        // `infinite` allows it.
        let units = |r: &mut Reader<'_>, b: &Bandwidth, infinite: bool| {
            let (t, rem) = (r.i64()?, r.i64()?);
            let period = b.refill_period().as_nanos() as i64;
            if infinite && (t, rem) == (-1, 0) {
                return Ok(None);
            }
            if t < 0 || rem < 0 || rem >= period {
                return Err(FormatError::Invalid { what: "ledger" });
            }
            Ok(Some(t as i128 * period as i128 + rem as i128))
        };
        let m = r.u16()? as usize;
        if m > 0 {
            for b in &bandwidths {
                let base = units(&mut r, b, false)?;
                ledger.base.push(base);
            }
        }
        for _ in 0..m {
            let owner = u64::from_be_bytes(r.take()?);
            let seq = u64::from_be_bytes(r.take()?);
            let expires = r.i64()?;
            let (mut taken, mut level) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for b in &bandwidths {
                taken.push(units(&mut r, b, false)?.unwrap_or(0));
                level.push(units(&mut r, b, true)?);
            }
            ledger.entries.push(LedgerEntry {
                owner,
                seq,
                expires,
                taken,
                level,
            });
        }
        let k = r.u16()? as usize;
        for _ in 0..k {
            ledger.tombstones.push(Tombstone {
                owner: u64::from_be_bytes(r.take()?),
                seq: u64::from_be_bytes(r.take()?),
                expires: r.i64()?,
            });
        }
    }
    if r.at != bytes.len() {
        return Err(FormatError::TrailingBytes);
    }
    if checksum(&bytes[..tail_end], n) != stored_sum {
        return Err(FormatError::ChecksumMismatch);
    }
    let config = BucketConfiguration::new(bandwidths).map_err(FormatError::Config)?;
    let state = BucketState::from_bandwidths(states);
    state.check(&config).map_err(FormatError::State)?;
    Ok(Record {
        config,
        state,
        ledger,
    })
}

/// Whether `config` fits the format (at most 65,535 bandwidths, ids of at most 65,535 bytes).
///
/// # Errors
/// [`FormatError::Invalid`] naming what does not fit.
pub(crate) fn check_storable(config: &BucketConfiguration) -> Result<(), FormatError> {
    if config.bandwidths().len() > u16::MAX as usize {
        return Err(FormatError::Invalid {
            what: "bandwidth count",
        });
    }
    if config
        .bandwidths()
        .iter()
        .any(|b| b.id().is_some_and(|id| id.len() > u16::MAX as usize))
    {
        return Err(FormatError::Invalid { what: "id" });
    }
    Ok(())
}
