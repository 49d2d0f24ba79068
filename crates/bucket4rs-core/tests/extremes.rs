//! Extreme-value and edge tests for the pure core: the situations of SEMANTICS.md section 11
//! that no conformance trace covers, values at the ends of the 64-bit range, every
//! `ConfigError` variant, validation of deserialized configurations and `ManualClock`.

use bucket4rs_core::ops::{self, Refilled};
use bucket4rs_core::{
    Bandwidth, BandwidthState, BucketConfiguration, BucketState, Clock, ConfigError, ManualClock,
    OperationError, StateError, TokensInheritanceStrategy,
};
use core::time::Duration;
use std::sync::Arc;

const MAX: i64 = i64::MAX;
const MIN: i64 = i64::MIN;
const MAXU: u64 = i64::MAX as u64;
const SEC: i64 = 1_000_000_000;

fn config(bandwidths: Vec<Bandwidth>) -> BucketConfiguration {
    BucketConfiguration::new(bandwidths).unwrap()
}

fn greedy(capacity: u64, tokens: u64, period_nanos: u64) -> Bandwidth {
    Bandwidth::builder()
        .capacity(capacity)
        .refill_greedy(tokens, Duration::from_nanos(period_nanos))
        .build()
        .unwrap()
}

fn tokens_at(config: &BucketConfiguration, state: &BucketState, t: i64) -> Vec<i64> {
    let v = Refilled::new(config, t, |i| state.bandwidths()[i]);
    (0..v.len()).map(|i| v.get(i).tokens()).collect()
}

/// A rejected estimate of `n` reports `w`, succeeds at `now + w` and fails at `now + w - 1`.
fn assert_exact_probe(config: &BucketConfiguration, state: &BucketState, now: i64, n: u64, w: u64) {
    let probe = state
        .clone()
        .apply(config, now, &ops::EstimateAbilityToConsume(n))
        .unwrap();
    assert!(!probe.can_be_consumed());
    assert_eq!(probe.wait_for_refill().as_nanos() as u64, w);
    let at = |t| {
        state
            .clone()
            .apply(config, t, &ops::EstimateAbilityToConsume(n))
            .unwrap()
            .can_be_consumed()
    };
    assert!(at(now + w as i64), "not consumable after {w}");
    assert!(!at(now + w as i64 - 1), "consumable before {w}");
}

// --- Section 11.2: interval and reset waits saturate ------------------------------------------

#[test]
fn interval_wait_beyond_max_saturates_and_reservation_is_refused() {
    let period = 1u64 << 62;
    for capacity in [5, 7, 1_000] {
        let bw = Bandwidth::builder()
            .capacity(capacity)
            .refill_intervally(3, Duration::from_nanos(period))
            .build()
            .unwrap();
        let c = config(vec![bw]);
        let mut state = BucketState::new(&c, 0);
        assert_eq!(
            state.apply(&c, 0, &ops::TryConsumeAsMuchAsPossible(None)),
            Ok(capacity)
        );
        // Two refills of 3 tokens need 2^63 ns: one more than MAX.
        for n in [4, 5] {
            let probe = state
                .apply(&c, 0, &ops::EstimateAbilityToConsume(n))
                .unwrap();
            assert_eq!(probe.wait_for_refill().as_nanos() as u64, MAXU);
        }
        let drained = state.clone();
        assert_eq!(
            state.apply(&c, 0, &ops::ConsumeIgnoringRateLimits(5)),
            Err(OperationError::WaitTooLong)
        );
        assert_eq!(
            state.apply(
                &c,
                0,
                &ops::Reserve {
                    tokens: 5,
                    max_wait_nanos: u64::MAX
                }
            ),
            Ok(None)
        );
        assert_eq!(state, drained);
        // The reset wait (capacity tokens) saturates as well.
        let probe = state
            .apply(&c, 0, &ops::TryConsumeAndReturnRemaining(1))
            .unwrap();
        assert_eq!(probe.wait_for_reset().as_nanos() as u64, MAXU);
        assert_eq!(probe.wait_for_refill().as_nanos() as u64, period);
        // One refill is still exact, and can be reserved.
        assert_exact_probe(&c, &state, 0, 3, period);
        assert_eq!(
            state.apply(&c, 0, &ops::ConsumeIgnoringRateLimits(3)),
            Ok(period)
        );
        assert_eq!(tokens_at(&c, &state, period as i64), vec![0]);
        assert_eq!(tokens_at(&c, &state, period as i64 - 1), vec![-3]);
    }
}

/// Drains a 1-token-per-ns bucket of capacity 1 into debt, then scales it PROPORTIONALLY to a
/// capacity of MAX.
fn deep_debt(debt_tokens: u64) -> (BucketConfiguration, BucketState) {
    let old = config(vec![greedy(1, 1, 1)]);
    let mut state = BucketState::new(&old, 0);
    assert_eq!(
        state.apply(&old, 0, &ops::ConsumeIgnoringRateLimits(debt_tokens + 1)),
        Ok(debt_tokens)
    );
    let new = config(vec![greedy(MAXU, 1, 1)]);
    let state = state
        .replace_configuration(
            &old,
            &new,
            0,
            TokensInheritanceStrategy::Proportionally,
            false,
        )
        .unwrap();
    (new, state)
}

#[test]
fn reset_wait_uses_the_exact_deficit_beyond_max() {
    // -1 of 1 becomes -MAX of MAX: the reset deficit is 2^64 - 2.
    let (c, mut state) = deep_debt(1);
    assert_eq!(state.available_tokens(&c, 0), -MAX);
    let probe = state
        .apply(&c, 0, &ops::TryConsumeAndReturnRemaining(1))
        .unwrap();
    assert!(!probe.is_consumed());
    assert_eq!(probe.remaining_tokens(), 0);
    assert_eq!(probe.wait_for_refill().as_nanos() as u64, MAXU);
    assert_eq!(probe.wait_for_reset().as_nanos() as u64, MAXU);

    // -2 of 1 would be -2 * MAX of MAX: PROPORTIONALLY saturates at MIN.
    let (c, mut state) = deep_debt(2);
    assert_eq!(state.bandwidths()[0], BandwidthState::from_parts(0, MIN, 0));
    let before = state.clone();
    let probe = state
        .apply(&c, 0, &ops::TryConsumeAndReturnRemaining(1))
        .unwrap();
    assert_eq!(probe.wait_for_refill().as_nanos() as u64, MAXU);
    assert_eq!(probe.wait_for_reset().as_nanos() as u64, MAXU);
    assert_eq!(
        state.apply(&c, 0, &ops::ConsumeIgnoringRateLimits(1)),
        Err(OperationError::WaitTooLong)
    );
    assert_eq!(
        state.apply(
            &c,
            0,
            &ops::Reserve {
                tokens: 1,
                max_wait_nanos: u64::MAX
            }
        ),
        Ok(None)
    );
    assert_eq!(
        state.apply(&c, 0, &ops::TryConsumeAsMuchAsPossible(None)),
        Ok(0)
    );
    assert_eq!(state, before);
    // MIN + (2^64 - 1) = MAX reaches the capacity.
    state.apply(&c, 0, &ops::AddTokens(u64::MAX)).unwrap();
    assert_eq!(state.available_tokens(&c, 0), MAX);
}

// --- Section 11.3 and the refill bug: refill far beyond a deep debt -----------------------------

#[test]
fn refill_after_more_than_max_nanoseconds_from_a_deep_debt_does_not_overflow() {
    // Capacity MAX, one token per ns, empty, built at MIN.
    let bw = Bandwidth::builder()
        .capacity(MAXU)
        .refill_greedy(1, Duration::from_nanos(1))
        .initial_tokens(0)
        .build()
        .unwrap();
    let c = config(vec![bw]);
    let mut state = BucketState::new(&c, MIN);
    // A debt of MAX - 1 tokens is repaid after MAX - 1 ns.
    let w = state
        .apply(&c, MIN, &ops::ConsumeIgnoringRateLimits(MAXU - 1))
        .unwrap();
    assert_eq!(w, MAXU - 1);
    assert_eq!(state.available_tokens(&c, MIN + w as i64), 0);
    assert_eq!(state.available_tokens(&c, MIN + w as i64 - 1), -1);
    // 2^63 ns later the refill (2^63 tokens, more than i64::MAX) leaves 2 tokens. This used to
    // overflow (`s + add as i64` with add = 2^63) and panic in debug builds.
    assert_eq!(state.available_tokens(&c, 0), 2);
    assert_eq!(state.available_tokens(&c, MAX), MAX);
    assert!(state.apply(&c, 0, &ops::TryConsume(2)).unwrap());
    assert_eq!(state.bandwidths()[0], BandwidthState::from_parts(0, 0, 0));
}

#[test]
fn refill_across_the_whole_clock_range_with_extreme_rates() {
    for (tokens, period) in [(1, 1), (MAXU - 1, MAXU), (1, MAXU), (MAXU, MAXU), (3, 7)] {
        for interval in [false, true] {
            let b = Bandwidth::builder().capacity(MAXU);
            let b = if interval {
                b.refill_intervally(tokens, Duration::from_nanos(period))
            } else {
                b.refill_greedy(tokens, Duration::from_nanos(period))
            };
            let c = config(vec![b.initial_tokens(0).build().unwrap()]);
            let state = BucketState::new(&c, MIN);
            let full = tokens_at(&c, &state, MAX)[0];
            let span = u128::from(u64::MAX);
            let expected = if interval {
                u128::from(tokens) * (span / u128::from(period))
            } else {
                u128::from(tokens) * span / u128::from(period)
            };
            assert_eq!(full as u128, expected.min(u128::from(MAXU)));
            // A wait reported from MIN is exact even when it spans most of the range.
            let n = (full as u64).clamp(1, MAXU);
            let probe = state
                .clone()
                .apply(&c, MIN, &ops::EstimateAbilityToConsume(n))
                .unwrap();
            let w = probe.wait_for_refill().as_nanos() as u64;
            if w < MAXU {
                assert_exact_probe(&c, &state, MIN, n, w);
            }
        }
    }
}

// --- Section 11.1: the last refill time in the future ------------------------------------------

#[test]
fn greedy_wait_includes_the_gap_after_the_clock_went_backwards() {
    let c = config(vec![greedy(10, 10, SEC as u64)]);
    let mut state = BucketState::new(&c, 0);
    assert!(state.apply(&c, 10 * SEC, &ops::TryConsume(10)).unwrap());
    assert_eq!(state.bandwidths()[0].last_refill_nanos(), 10 * SEC);
    // At 9 s the bucket refills nothing until 10 s, then one token takes 100 ms.
    assert_exact_probe(&c, &state, 9 * SEC, 1, 1_100_000_000);
    let probe = state
        .apply(&c, 9 * SEC, &ops::TryConsumeAndReturnRemaining(1))
        .unwrap();
    assert_eq!(probe.wait_for_refill().as_nanos() as u64, 1_100_000_000);
    assert_eq!(probe.wait_for_reset().as_nanos() as u64, 2 * SEC as u64);
    // No tokens were minted by going back.
    assert_eq!(state.available_tokens(&c, 9 * SEC), 0);
    assert_eq!(state.available_tokens(&c, 10 * SEC), 0);
    let w = state
        .apply(&c, 9 * SEC, &ops::ConsumeIgnoringRateLimits(1))
        .unwrap();
    assert_eq!(w, 1_100_000_000);
    assert_eq!(tokens_at(&c, &state, 9 * SEC + w as i64), vec![0]);
    assert_eq!(tokens_at(&c, &state, 9 * SEC + w as i64 - 1), vec![-1]);
}

fn aligned_ahead(first_refill_secs: u64) -> Bandwidth {
    Bandwidth::builder()
        .capacity(10)
        .refill_intervally_aligned(
            10,
            Duration::from_secs(60),
            Duration::from_secs(first_refill_secs),
        )
        .initial_tokens(0)
        .id("x")
        .build()
        .unwrap()
}

#[test]
fn aligned_first_refill_many_periods_ahead_waits_for_it() {
    let c = config(vec![aligned_ahead(600)]);
    let state = BucketState::new(&c, 0);
    assert_eq!(state.bandwidths()[0].last_refill_nanos(), 540 * SEC);
    assert_exact_probe(&c, &state, 0, 1, 600 * SEC as u64);
    assert_exact_probe(&c, &state, 0, 10, 600 * SEC as u64);
    let mut reserved = state.clone();
    assert_eq!(
        reserved.apply(&c, 0, &ops::ConsumeIgnoringRateLimits(11)),
        Ok(660 * SEC as u64)
    );
}

#[test]
fn greedy_inheriting_a_future_last_refill_waits_for_it() {
    let old = config(vec![aligned_ahead(600)]);
    let state = BucketState::new(&old, 0);
    for (strategy, capacity, n) in [
        (TokensInheritanceStrategy::AsIs, 10, 1),
        (TokensInheritanceStrategy::Proportionally, 10, 1),
        (TokensInheritanceStrategy::Additive, 10, 1),
        (TokensInheritanceStrategy::Additive, 20, 11), // starts with 10 tokens
    ] {
        let bw = Bandwidth::builder()
            .capacity(capacity)
            .refill_greedy(10, Duration::from_secs(60))
            .id("x")
            .build()
            .unwrap();
        let new = config(vec![bw]);
        let mut state = state
            .replace_configuration(&old, &new, 0, strategy, true)
            .unwrap();
        assert_eq!(state.bandwidths()[0].last_refill_nanos(), 540 * SEC);
        // Nothing refills before 540 s; then a token takes 6 s.
        assert_exact_probe(&new, &state, 0, n, 546 * SEC as u64);
        // Going further back only lengthens the wait by the same amount.
        assert_exact_probe(&new, &state, -SEC, n, 547 * SEC as u64);
        let probe = state
            .apply(&new, 0, &ops::TryConsumeAndReturnRemaining(n))
            .unwrap();
        let deficit = capacity as i64 - state.available_tokens(&new, 0);
        assert_eq!(
            probe.wait_for_reset().as_nanos() as u64,
            (540 * SEC + deficit * 6 * SEC) as u64
        );
        let w = state
            .apply(&new, 0, &ops::ConsumeIgnoringRateLimits(n))
            .unwrap();
        assert_eq!(w, 546 * SEC as u64, "{strategy:?}");
        assert!(tokens_at(&new, &state, w as i64)[0] >= 0);
        assert!(tokens_at(&new, &state, w as i64 - 1)[0] < 0);
    }
}

// --- Extreme arguments --------------------------------------------------------------------------

#[test]
fn extreme_token_arguments_are_handled_exactly() {
    let c = config(vec![greedy(10, 10, SEC as u64)]);
    let mut state = BucketState::new(&c, 0);
    for n in [MAXU, MAXU + 1, u64::MAX] {
        assert_eq!(state.apply(&c, 0, &ops::TryConsume(n)), Ok(false));
        let probe = state
            .apply(&c, 0, &ops::TryConsumeAndReturnRemaining(n))
            .unwrap();
        assert_eq!(
            (
                probe.remaining_tokens(),
                probe.wait_for_refill().as_nanos() as u64
            ),
            (10, MAXU)
        );
        assert_eq!(
            state.apply(&c, 0, &ops::ConsumeIgnoringRateLimits(n)),
            Err(OperationError::WaitTooLong)
        );
        assert_eq!(
            state.apply(
                &c,
                0,
                &ops::Reserve {
                    tokens: n,
                    max_wait_nanos: u64::MAX
                }
            ),
            Ok(None)
        );
    }
    assert_eq!(
        state.apply(&c, 0, &ops::TryConsumeAsMuchAsPossible(Some(u64::MAX))),
        Ok(10)
    );
    state.apply(&c, 0, &ops::AddTokens(u64::MAX)).unwrap();
    assert_eq!(state.available_tokens(&c, 0), 10);
    state.apply(&c, 0, &ops::ForceAddTokens(u64::MAX)).unwrap();
    assert_eq!(state.available_tokens(&c, 0), MAX);
    state.apply(&c, 0, &ops::ForceAddTokens(1)).unwrap();
    assert_eq!(state.available_tokens(&c, 0), MAX);
    // Force-added tokens serve requests above the capacity, but probes still report MAX.
    let probe = state
        .apply(&c, 0, &ops::EstimateAbilityToConsume(MAXU))
        .unwrap();
    assert!(probe.can_be_consumed());
    assert_eq!(state.apply(&c, 0, &ops::TryConsume(MAXU)), Ok(true));
    assert_eq!(state.available_tokens(&c, 0), 0);
}

#[test]
fn raw_states_with_extreme_fields_never_panic() {
    let configs = [
        config(vec![greedy(MAXU, MAXU, MAXU)]),
        config(vec![greedy(1, 1, MAXU)]),
        config(vec![greedy(MAXU, 1, 1)]),
        config(vec![
            Bandwidth::builder()
                .capacity(MAXU)
                .refill_intervally(MAXU - 1, Duration::from_nanos(MAXU))
                .build()
                .unwrap(),
        ]),
    ];
    let values = [MIN, MIN + 1, -1, 0, 1, MAX - 1, MAX];
    for c in &configs {
        for l in values {
            for s in values {
                for e in values {
                    let state =
                        BucketState::from_bandwidths(vec![BandwidthState::from_parts(l, s, e)]);
                    for now in [MIN, 0, MAX] {
                        for n in [1, MAXU, u64::MAX] {
                            let mut copy = state.clone();
                            let probe = copy
                                .apply(c, now, &ops::TryConsumeAndReturnRemaining(n))
                                .unwrap();
                            assert!(probe.wait_for_refill().as_nanos() as u64 <= MAXU);
                            assert!(probe.wait_for_reset().as_nanos() as u64 <= MAXU);
                            let _ = copy
                                .clone()
                                .apply(c, now, &ops::ConsumeIgnoringRateLimits(n));
                            let _ = copy.clone().apply(c, now, &ops::ForceAddTokens(n));
                            let _ = copy.clone().apply(c, now, &ops::AddTokens(n));
                            let _ = copy.available_tokens(c, now);
                        }
                    }
                }
            }
        }
    }
}

// --- State checks --------------------------------------------------------------------------------

#[test]
fn check_reports_foreign_states() {
    let c = config(vec![
        greedy(10, 10, 100),
        Bandwidth::builder()
            .capacity(5)
            .refill_intervally(5, Duration::from_nanos(100))
            .build()
            .unwrap(),
    ]);
    let ok = |a: i64, b: i64| {
        BucketState::from_bandwidths(vec![
            BandwidthState::from_parts(0, 0, a),
            BandwidthState::from_parts(0, 0, b),
        ])
        .check(&c)
    };
    assert_eq!(ok(99, 0), Ok(()));
    assert_eq!(ok(100, 0), Err(StateError::Remainder { index: 0 }));
    assert_eq!(ok(-1, 0), Err(StateError::Remainder { index: 0 }));
    assert_eq!(ok(0, 1), Err(StateError::Remainder { index: 1 }));
    assert_eq!(
        BucketState::from_bandwidths(vec![]).check(&c),
        Err(StateError::BandwidthCount {
            expected: 2,
            found: 0
        })
    );
}

// --- Every ConfigError variant is reachable -------------------------------------------------------

#[test]
fn every_config_error_is_reachable_from_the_builders() {
    let one = Duration::from_secs(1);
    let b = || Bandwidth::builder();
    let huge = 1u64 << 63;
    let cases: Vec<(Result<(), ConfigError>, ConfigError)> = vec![
        (
            BucketConfiguration::builder().build().map(drop),
            ConfigError::NoBandwidths,
        ),
        (
            b().refill_greedy(1, one).build().map(drop),
            ConfigError::MissingCapacity,
        ),
        (
            b().capacity(1).build().map(drop),
            ConfigError::MissingRefill,
        ),
        (
            b().capacity(0).refill_greedy(1, one).build().map(drop),
            ConfigError::ZeroCapacity,
        ),
        (
            b().capacity(huge).refill_greedy(1, one).build().map(drop),
            ConfigError::CapacityTooLarge { capacity: huge },
        ),
        (
            b().capacity(1).refill_greedy(0, one).build().map(drop),
            ConfigError::ZeroRefillTokens,
        ),
        (
            b().capacity(1)
                .refill_intervally(huge, one)
                .build()
                .map(drop),
            ConfigError::RefillTokensTooLarge { tokens: huge },
        ),
        (
            b().capacity(1)
                .refill_greedy(1, Duration::ZERO)
                .build()
                .map(drop),
            ConfigError::ZeroRefillPeriod,
        ),
        (
            b().capacity(1)
                .refill_greedy(1, Duration::from_nanos(huge))
                .build()
                .map(drop),
            ConfigError::RefillPeriodTooLong,
        ),
        (
            b().capacity(1)
                .refill_greedy(1001, Duration::from_nanos(1000))
                .build()
                .map(drop),
            ConfigError::RefillRateTooHigh {
                tokens: 1001,
                period_nanos: 1000,
            },
        ),
        (
            b().capacity(1)
                .refill_greedy(1, one)
                .initial_tokens(huge)
                .build()
                .map(drop),
            ConfigError::InitialTokensTooLarge { tokens: huge },
        ),
        (
            b().capacity(1)
                .refill_intervally_aligned_adaptive(1, one, one)
                .initial_tokens(1)
                .build()
                .map(drop),
            ConfigError::InitialTokensWithAdaptiveRefill,
        ),
        (
            b().capacity(1)
                .refill_intervally_aligned(1, one, Duration::from_nanos(huge))
                .build()
                .map(drop),
            ConfigError::FirstRefillTooLate,
        ),
        (
            BucketConfiguration::builder()
                .add_bandwidth(
                    b().capacity(1)
                        .refill_greedy(1, one)
                        .id("a")
                        .build()
                        .unwrap(),
                )
                .add_bandwidth(
                    b().capacity(2)
                        .refill_greedy(1, one)
                        .id("a")
                        .build()
                        .unwrap(),
                )
                .build()
                .map(drop),
            ConfigError::DuplicateId { id: "a".into() },
        ),
        (
            config(vec![
                b().capacity(1)
                    .refill_intervally_aligned(1, one, Duration::ZERO)
                    .build()
                    .unwrap(),
            ])
            .check_clock(false),
            ConfigError::AlignedRefillNeedsWallClock,
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, Err(want.clone()));
        assert!(!want.to_string().is_empty());
    }
    // The boundaries just inside every limit are accepted.
    assert!(
        b().capacity(MAXU)
            .refill_greedy(MAXU, Duration::from_nanos(MAXU))
            .initial_tokens(MAXU)
            .build()
            .is_ok()
    );
    assert!(
        b().capacity(1)
            .refill_greedy(1000, Duration::from_nanos(1000))
            .initial_tokens(0)
            .build()
            .is_ok()
    );
    assert!(
        b().capacity(1)
            .refill_intervally_aligned(1, one, Duration::from_nanos(MAXU))
            .build()
            .is_ok()
    );
}

// --- Serde ----------------------------------------------------------------------------------------

#[cfg(feature = "serde")]
#[test]
fn deserializing_an_invalid_configuration_fails() {
    let json_bw = |cap: u64, tokens: u64, period: u64| {
        format!(
            r#"{{"capacity":{cap},"refill":{{"kind":"greedy","tokens":{tokens},"period_nanos":{period}}}}}"#
        )
    };
    let valid = format!("[{}]", json_bw(10, 10, 1000));
    let parsed: BucketConfiguration = serde_json::from_str(&valid).unwrap();
    assert_eq!(parsed, config(vec![greedy(10, 10, 1000)]));
    let invalid = [
        "[]".to_string(),
        format!("[{}]", json_bw(0, 1, 1)),
        format!("[{}]", json_bw(1u64 << 63, 1, 1)),
        format!("[{}]", json_bw(1, 0, 1)),
        format!("[{}]", json_bw(1, 1, 0)),
        format!("[{}]", json_bw(1, 1001, 1000)),
        r#"[{"capacity":1,"refill":{"kind":"greedy","tokens":1,"period_nanos":1},"initial_tokens":9223372036854775808}]"#.to_string(),
        r#"[{"capacity":1,"refill":{"kind":"intervally_aligned","tokens":1,"period_nanos":1,"time_of_first_refill_nanos":0,"adaptive_initial_tokens":true},"initial_tokens":1}]"#.to_string(),
        r#"[{"capacity":1,"refill":{"kind":"intervally_aligned","tokens":1,"period_nanos":1,"time_of_first_refill_nanos":9223372036854775808}}]"#.to_string(),
        r#"[{"capacity":1,"refill":{"kind":"greedy","tokens":1,"period_nanos":1},"id":"a"},{"capacity":1,"refill":{"kind":"intervally","tokens":1,"period_nanos":1},"id":"a"}]"#.to_string(),
    ];
    for json in &invalid {
        assert!(
            serde_json::from_str::<BucketConfiguration>(json).is_err(),
            "{json}"
        );
    }
}

#[cfg(feature = "serde")]
#[test]
fn serde_round_trip_keeps_every_kind_and_state() {
    let one = Duration::from_secs(1);
    let c = config(vec![
        Bandwidth::builder()
            .capacity(MAXU)
            .refill_greedy(7, Duration::from_nanos(MAXU))
            .initial_tokens(3)
            .id("g")
            .build()
            .unwrap(),
        Bandwidth::builder()
            .capacity(5)
            .refill_intervally(5, one)
            .build()
            .unwrap(),
        Bandwidth::builder()
            .capacity(5)
            .refill_intervally_aligned(5, one, Duration::from_nanos(1_999_999))
            .id("a")
            .build()
            .unwrap(),
        Bandwidth::builder()
            .capacity(5)
            .refill_intervally_aligned_adaptive(5, one, one)
            .id("b")
            .build()
            .unwrap(),
    ]);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(
        serde_json::from_str::<BucketConfiguration>(&json).unwrap(),
        c
    );
    let state = BucketState::from_bandwidths(vec![
        BandwidthState::from_parts(MIN, MAX, 0),
        BandwidthState::from_parts(MAX, MIN, -1),
    ]);
    let json = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<BucketState>(&json).unwrap(), state);
}

/// A one-bandwidth state is held inline: `BucketState` is 32 bytes (the changelog's figure;
/// a keyed store's entry embeds it), and holds one bandwidth without spilling to the heap
/// (its `bandwidths()` slice then points into the value itself).
#[test]
fn a_one_bandwidth_state_is_inline() {
    assert_eq!(core::mem::size_of::<BucketState>(), 32);
    let one = BucketState::from_bandwidths(vec![BandwidthState::from_parts(1, 2, 3)]);
    let start = core::ptr::from_ref(&one).cast::<u8>() as usize;
    let at = one.bandwidths().as_ptr().cast::<u8>() as usize;
    assert!(
        (start..start + 32).contains(&at),
        "one bandwidth's state is on the heap"
    );
    let two = BucketState::from_bandwidths(vec![BandwidthState::from_parts(1, 2, 3); 2]);
    let start = core::ptr::from_ref(&two).cast::<u8>() as usize;
    let at = two.bandwidths().as_ptr().cast::<u8>() as usize;
    assert!(
        !(start..start + 32).contains(&at),
        "two bandwidths' states cannot be inline"
    );
}

/// A state is serialized as a plain sequence of its bandwidths, whether it holds them inline
/// (up to two) or on the heap: the format does not depend on how many there are.
#[cfg(feature = "serde")]
#[test]
fn serde_state_is_a_sequence_inline_or_not() {
    for n in 0..5_i64 {
        let parts: Vec<BandwidthState> = (0..n)
            .map(|i| BandwidthState::from_parts(i, -i, i * 7))
            .collect();
        let state = BucketState::from_bandwidths(parts.clone());
        let json = serde_json::to_value(&state).unwrap();
        let expected: Vec<serde_json::Value> = parts
            .iter()
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        assert_eq!(
            json,
            serde_json::json!({ "bandwidths": expected }),
            "{n} bandwidths"
        );
        assert_eq!(serde_json::from_value::<BucketState>(json).unwrap(), state);
        assert_eq!(state.bandwidths(), &parts[..]);
    }
}

// --- ManualClock ----------------------------------------------------------------------------------

/// Reads a clock through the generic `Clock` impls (`&C`, `Arc<C>`).
fn read<C: Clock>(clock: C) -> (i64, bool) {
    (clock.now_nanos(), clock.is_wall_clock_based())
}

#[test]
fn manual_clock_moves_only_when_told_and_saturates() {
    let clock = ManualClock::new(-7);
    assert_eq!(clock.now_nanos(), -7);
    assert!(!clock.is_wall_clock_based());
    let shared = clock.clone();
    clock.advance(Duration::from_nanos(10));
    assert_eq!(shared.now_nanos(), 3);
    shared.advance_nanos(-5);
    assert_eq!(clock.now_nanos(), -2);
    clock.set_nanos(100);
    assert_eq!(shared.now_nanos(), 100);
    clock.advance(Duration::MAX);
    assert_eq!(clock.now_nanos(), MAX);
    clock.advance_nanos(1);
    assert_eq!(clock.now_nanos(), MAX);
    clock.set_nanos(MIN + 1);
    clock.advance_nanos(MIN);
    assert_eq!(clock.now_nanos(), MIN);

    let default = ManualClock::default();
    assert_eq!(default.now_nanos(), 0);
    assert!(!default.is_wall_clock_based());

    let wall = ManualClock::wall_clock(1_700_000_000_000_000_000);
    assert!(wall.is_wall_clock_based());
    assert!(wall.clone().is_wall_clock_based());
    assert!(read(&wall).1);
    let arc = Arc::new(wall.clone());
    assert!(read(arc.clone()).1);
    wall.advance(Duration::from_millis(1));
    assert_eq!(arc.now_nanos(), 1_700_000_000_001_000_000);
    assert_eq!(read(&wall).0, 1_700_000_000_001_000_000);
    let independent = ManualClock::new(0);
    independent.advance_nanos(5);
    assert_eq!(wall.now_nanos(), 1_700_000_000_001_000_000);
}

/// `CompactForm::plan` at the ends of `i64`, against the GCRA step computed in `i128`: the
/// same decision and value, or a decline only where the new value leaves `i64`. Covers the
/// bound `u − (capacity − need)` below `i64::MIN` (every reading meets it).
#[test]
fn compact_plan_at_the_ends_of_the_range_is_exact() {
    use bucket4rs_core::forms::{CompactForm, CompactStop};
    use bucket4rs_core::ops::TryConsume;
    let edges = [
        MIN,
        MIN + 1,
        MIN + (1 << 17),
        -SEC,
        -1,
        0,
        1,
        SEC,
        MAX - SEC,
        MAX - 1,
        MAX,
    ];
    // (capacity tokens, refill tokens, period): rate 1 (direct) with units 1 and 10^8, and
    // a scaled capacity of i64::MAX.
    for (capacity, tokens, period) in [(MAXU, 1, 1), (10, 10, SEC as u64), (3, 1, 1)] {
        let b = greedy(capacity, tokens, period);
        let unit = i128::from(period as i64 / tokens as i64);
        let cap = i128::from(capacity) * unit;
        let form = CompactForm::new(&b, 0).expect("greedy");
        for (u, now, n) in edges
            .iter()
            .flat_map(|&u| edges.iter().map(move |&now| (u, now)))
            .flat_map(|(u, now)| [1, 2, 3, capacity, MAXU].map(move |n| (u, now, n)))
        {
            let (u128, p) = (i128::from(u), i128::from(now));
            let need = i128::from(n) * unit;
            let after = u128.max(p) + need;
            let taken = need <= cap && after - p <= cap;
            match form.plan(&TryConsume(n), u, now) {
                Ok((out, new)) => {
                    assert_eq!(out, taken, "u {u} now {now} n {n} cap {cap}");
                    let expected = if taken { after } else { u128 };
                    assert_eq!(i128::from(new), expected, "u {u} now {now} n {n} cap {cap}");
                }
                Err(e) => {
                    assert_eq!(e, CompactStop::Decline);
                    assert!(taken && after > i128::from(MAX), "u {u} now {now} n {n}");
                }
            }
        }
    }
}
