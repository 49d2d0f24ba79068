//! Golden files: the bytes of format versions 1 and 2 are frozen in `tests/golden/`. A newer
//! library must keep reading them; corrupt or future bytes give typed errors.
//!
//! To (re)create the files after an intentional *new* version, run with
//! `BUCKET4RS_BLESS=1` — never for an existing version.

use std::path::PathBuf;
use std::time::Duration;

use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState};
use bucket4rs_distributed::{FormatError, format};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn cases() -> Vec<(&'static str, BucketConfiguration, BucketState)> {
    let simple = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1)).unwrap())
        .build()
        .unwrap();
    let simple_state = BucketState::from_bandwidths(vec![BandwidthState::from_parts(
        1_700_000_000_123_456_789,
        7,
        5,
    )]);
    let multi = BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(1_000)
                .refill_greedy(7, Duration::from_nanos(3_000_000_001))
                .initial_tokens(13)
                .id("burst")
                .build()
                .unwrap(),
        )
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(i64::MAX as u64)
                .refill_intervally(5, Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(600)
                .refill_intervally_aligned_adaptive(
                    600,
                    Duration::from_secs(3_600),
                    Duration::from_millis(1_700_000_000_000),
                )
                .id("hourly ✓")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let multi_state = BucketState::from_bandwidths(vec![
        BandwidthState::from_parts(-5, -42, 3_000_000_000),
        BandwidthState::from_parts(i64::MIN + 1, i64::MAX, 0),
        BandwidthState::from_parts(1_699_999_996_400_000_000, 266, 0),
    ]);
    vec![
        ("v2_simple.bin", simple, simple_state),
        ("v2_multi.bin", multi, multi_state),
    ]
}

/// One entry of a ledger as stored: owner, seq, expires, and per bandwidth (taken tokens,
/// taken remainder, level tokens, level remainder).
type Entry<'a> = (u64, u64, i64, &'a [(i64, i64, i64, i64)]);

/// A version 2 record: `bytes` of [`format::encode`] (an empty ledger) with a ledger put in,
/// laid out as the format says: the entry count, the base level per bandwidth (when there
/// are entries), the entries, the tombstone count and the tombstones (owner, seq, expires),
/// every number big-endian.
fn with_ledger(
    mut bytes: Vec<u8>,
    base: &[(i64, i64)],
    entries: &[Entry<'_>],
    tombstones: &[(u64, u64, i64)],
) -> Vec<u8> {
    bytes.truncate(bytes.len() - 4);
    bytes.extend_from_slice(&(entries.len() as u16).to_be_bytes());
    if !entries.is_empty() {
        for (t, r) in base {
            bytes.extend_from_slice(&t.to_be_bytes());
            bytes.extend_from_slice(&r.to_be_bytes());
        }
    }
    for (owner, seq, expires, per) in entries {
        bytes.extend_from_slice(&owner.to_be_bytes());
        bytes.extend_from_slice(&seq.to_be_bytes());
        bytes.extend_from_slice(&expires.to_be_bytes());
        for (a, b, c, d) in per.iter() {
            for v in [a, b, c, d] {
                bytes.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    bytes.extend_from_slice(&(tombstones.len() as u16).to_be_bytes());
    for (owner, seq, expires) in tombstones {
        bytes.extend_from_slice(&owner.to_be_bytes());
        bytes.extend_from_slice(&seq.to_be_bytes());
        bytes.extend_from_slice(&expires.to_be_bytes());
    }
    bytes
}

#[test]
fn version_1_golden_files_decode_to_the_same_record_with_an_empty_ledger() {
    for (file, config, state) in cases() {
        let v1 = file.replace("v2_", "v1_");
        let path = dir().join(&v1);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(bytes[4], 1, "{v1}");
        let record = format::decode(&bytes).unwrap_or_else(|e| panic!("{v1}: {e}"));
        assert_eq!(record.config, config, "{v1}");
        assert_eq!(record.state, state, "{v1}");
        assert!(record.ledger.is_empty(), "{v1}");
        // Rewritten as version 2: the same bytes but the version, and an empty ledger.
        let mut v2 = bytes.clone();
        v2[4] = 2;
        let checksum_input_changed = format::encode(&config, &state);
        assert_eq!(&checksum_input_changed[..4], &v2[..4]);
        assert_eq!(checksum_input_changed[4], 2);
        assert_eq!(checksum_input_changed.len(), bytes.len() + 4, "{v1}");
        assert_eq!(
            &checksum_input_changed[12..bytes.len()],
            &bytes[12..],
            "{v1}"
        );
    }
}

#[test]
fn version_2_golden_files_decode_to_the_same_record_and_reencode_identically() {
    let bless = std::env::var_os("BUCKET4RS_BLESS").is_some();
    for (file, config, state) in cases() {
        let n = config.bandwidths().len();
        let base: Vec<(i64, i64)> = (0..n as i64).map(|i| (i, 0)).collect();
        // Taken, then a finite level; taken, then an infinite level (-1, 0).
        let first: Vec<_> = (0..n as i64).map(|i| (i + 1, 0, 0, i)).collect();
        let second: Vec<_> = (0..n as i64).map(|i| (2 * i + 3, 1, -1, 0)).collect();
        let expected = with_ledger(
            format::encode(&config, &state),
            &base,
            &[
                (0x0123_4567_89ab_cdef, 41, 1_621_246_372_000, &first),
                (u64::MAX, 43, -3, &second),
            ],
            &[(0x0123_4567_89ab_cdef, 42, 1_621_246_372_001)],
        );
        let path = dir().join(file);
        if bless {
            std::fs::write(&path, &expected).unwrap();
        }
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(bytes, expected, "{file}: the layout changed");
        let record = format::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(record.config, config, "{file}");
        assert_eq!(record.state, state, "{file}");
        assert_eq!(record.ledger.len(), 3, "{file}");
        assert_eq!(
            format::encode_record(&record),
            bytes,
            "{file}: encoding changed"
        );
    }
}

#[test]
fn a_ledger_remainder_outside_the_period_is_rejected() {
    let (_, config, state) = cases().remove(0);
    let bytes = || format::encode(&config, &state);
    for bad in [
        (1, 1_000_000_000, 0, 0),
        (-1, 0, 0, 0),
        (1, 0, 0, 1_000_000_000),
        (1, 0, -1, 1),
        (1, 0, -2, 0),
    ] {
        let record = with_ledger(bytes(), &[(0, 0)], &[(1, 1, 0, &[bad])], &[]);
        assert_eq!(
            format::decode(&record),
            Err(FormatError::Invalid { what: "ledger" }),
            "{bad:?}"
        );
    }
    let infinite = with_ledger(bytes(), &[(0, 0)], &[(1, 1, 0, &[(1, 0, -1, 0)])], &[]);
    assert_eq!(format::decode(&infinite).unwrap().ledger.len(), 1);
}

#[test]
fn a_future_version_is_a_typed_error() {
    let bytes = std::fs::read(dir().join("v3_future.bin")).unwrap();
    assert_eq!(
        format::decode(&bytes),
        Err(FormatError::UnsupportedVersion {
            found: 3,
            newest_supported: 2
        })
    );
}

#[test]
fn every_truncation_and_every_single_byte_corruption_is_a_typed_error_or_the_same_record() {
    let bytes = std::fs::read(dir().join("v2_multi.bin")).unwrap();
    let original = format::decode(&bytes).unwrap();
    for len in 0..bytes.len() {
        assert!(
            format::decode(&bytes[..len]).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert_eq!(format::decode(&extra), Err(FormatError::TrailingBytes));
    // Flipping any bit of the configuration is caught (structure or checksum). Bits of the
    // state fields and of the ledger's entries (which scripts rewrite, outside the checksum)
    // either stay a valid record (then it must decode as exactly that) or are rejected.
    // The ledger: its count, three base levels, two entries, the tombstone count and one.
    let entries_at = bytes.len() - (2 + 48 + 2 * (24 + 32 * 3) + 2 + 24) + 2;
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            let in_state = (0..3).any(|k| {
                let at = format::HEADER_LEN + k * format::BLOCK_LEN + format::STATE_OFFSET;
                (at..at + 24).contains(&i)
            });
            match format::decode(&b) {
                Err(_) => {}
                Ok(r) => {
                    let in_ledger = i >= entries_at;
                    assert!(
                        in_state || in_ledger,
                        "config byte {i} bit {bit} flipped but accepted"
                    );
                    assert_eq!(r.config, original.config);
                    assert_ne!((&r.state, &r.ledger), (&original.state, &original.ledger));
                }
            }
        }
    }
    assert_eq!(
        format::decode(b"nope-not-a-record"),
        Err(FormatError::BadMagic)
    );
    assert_eq!(format::decode(b""), Err(FormatError::Truncated));
}

#[test]
fn invalid_remainders_are_rejected() {
    let (_, config, _) = cases().remove(0);
    let bad = BucketState::from_bandwidths(vec![BandwidthState::from_parts(0, 1, 1_000_000_000)]);
    let bytes = format::encode(&config, &bad);
    assert!(matches!(format::decode(&bytes), Err(FormatError::State(_))));
}
