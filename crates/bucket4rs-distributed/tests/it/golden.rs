//! Golden files: the bytes of format version 1 are frozen in `tests/golden/`. A newer
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
        ("v1_simple.bin", simple, simple_state),
        ("v1_multi.bin", multi, multi_state),
    ]
}

#[test]
fn version_1_golden_files_decode_to_the_same_record_and_reencode_identically() {
    let bless = std::env::var_os("BUCKET4RS_BLESS").is_some();
    for (file, config, state) in cases() {
        let path = dir().join(file);
        if bless {
            std::fs::write(&path, format::encode(&config, &state)).unwrap();
        }
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let record = format::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(record.config, config, "{file}");
        assert_eq!(record.state, state, "{file}");
        assert_eq!(
            format::encode(&config, &state),
            bytes,
            "{file}: encoding changed"
        );
    }
}

#[test]
fn a_future_version_is_a_typed_error() {
    let bytes = std::fs::read(dir().join("v2_future.bin")).unwrap();
    assert_eq!(
        format::decode(&bytes),
        Err(FormatError::UnsupportedVersion {
            found: 2,
            newest_supported: 1
        })
    );
}

#[test]
fn every_truncation_and_every_single_byte_corruption_is_a_typed_error_or_the_same_record() {
    let bytes = std::fs::read(dir().join("v1_multi.bin")).unwrap();
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
    // state fields either stay a valid state (then the record must decode as exactly that)
    // or are rejected.
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
                    assert!(in_state, "config byte {i} bit {bit} flipped but accepted");
                    assert_eq!(r.config, original.config);
                    assert_ne!(r.state, original.state);
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
