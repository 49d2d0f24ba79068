//! Differential test of the single-bandwidth shortcut: for one-bandwidth configurations,
//! `Operation::plan_single` (what every storage runs first, through `ops::plan_one`) must give
//! exactly the output and the new state that the general engine gives (`Operation::plan` on a
//! `Refilled` view, then `Mutation::apply`) — for any state, including garbage ones.

use core::time::Duration;

use crate::forms::{CompactForm, CompactStop, ScaledState};
use crate::ops::{
    AvailableTokens, EstimateAbilityToConsume, Operation, Refilled, TryConsume,
    TryConsumeAndReturnRemaining,
};
use crate::{Bandwidth, BandwidthState, BucketConfiguration, OperationError, RefillKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::boxed::Box;

fn config() -> impl Strategy<Value = BucketConfiguration> {
    let limits = (
        1u64..=i64::MAX as u64,
        1u64..=u32::MAX as u64,
        0u8..3,
        any::<u64>(),
    );
    limits.prop_filter_map("valid bandwidth", |(capacity, period, kind, extra)| {
        let period_d = Duration::from_nanos(period);
        let tokens = 1 + extra % period.min(capacity.max(1));
        let b = Bandwidth::builder().capacity(capacity);
        let b = match kind {
            0 => b.refill_greedy(tokens, period_d),
            1 => b.refill_intervally(tokens, period_d),
            _ => b.refill_intervally_aligned(tokens, period_d, Duration::from_nanos(extra >> 2)),
        };
        let bandwidth = b.build().ok()?;
        BucketConfiguration::builder()
            .add_bandwidth(bandwidth)
            .build()
            .ok()
    })
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Greedy bandwidths whose scaled capacity fits `i64`, where the scaled path must be taken.
fn small_greedy() -> impl Strategy<Value = BucketConfiguration> {
    (1u64..1_000_000, 1u64..=u32::MAX as u64, any::<u64>()).prop_map(|(capacity, period, extra)| {
        let tokens = 1 + extra % period.min(capacity);
        greedy(capacity, tokens, period)
    })
}

/// A configuration of one greedy bandwidth.
fn greedy(capacity: u64, tokens: u64, period_nanos: u64) -> BucketConfiguration {
    let b = Bandwidth::builder()
        .capacity(capacity)
        .refill_greedy(tokens, Duration::from_nanos(period_nanos))
        .build()
        .expect("valid");
    BucketConfiguration::builder()
        .add_bandwidth(b)
        .build()
        .expect("valid")
}

/// Greedy bandwidths whose refill divides its period in nanoseconds (rate 1 scaled unit per
/// nanosecond, the common case, which the compact path runs without multiplication).
fn round_greedy() -> impl Strategy<Value = BucketConfiguration> {
    (1u64..1_000_000, 1u64..1_000_000, 1u64..1_000)
        .prop_map(|(capacity, tokens, k)| greedy(capacity, tokens, tokens * k))
}

fn state() -> impl Strategy<Value = BandwidthState> {
    prop_oneof![
        // Plausible states.
        (
            -1_000_000_000i64..1_000_000_000,
            -1_000i64..1_000_000,
            0i64..1_000_000
        )
            .prop_map(|(l, s, e)| BandwidthState::from_parts(l, s, e)),
        // Anything at all (torn reads, corrupted storage).
        (any::<i64>(), any::<i64>(), any::<i64>())
            .prop_map(|(l, s, e)| BandwidthState::from_parts(l, s, e)),
    ]
}

fn tokens() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        1u64..100,
        any::<u64>(),
        Just(i64::MAX as u64),
        Just(u64::MAX)
    ]
}

/// 3000 cases, failures persisted next to this file.
fn config_3000() -> ProptestConfig {
    ProptestConfig {
        cases: 3000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

type Outcome<T> = Result<(T, Option<BandwidthState>), OperationError>;

/// The general engine on a single bandwidth: plan on the refilled view, apply the mutation.
fn general<O: Operation>(
    op: &O,
    c: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
) -> Outcome<O::Output> {
    let view = Refilled::new(c, now, |_| s);
    let (out, mutation) = op.plan(&view)?;
    Ok((
        out,
        mutation.map(|m| m.apply(&c.bandwidths()[0], view.get(0))),
    ))
}

fn shortcut<O: Operation>(
    op: &O,
    c: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
) -> Outcome<O::Output> {
    crate::ops::plan_one(op, c, now, || s).expect("every operation here has a shortcut")
}

fn same<O: Operation>(
    op: &O,
    c: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
) -> Result<(), TestCaseError>
where
    O::Output: PartialEq + core::fmt::Debug,
{
    prop_assert!(O::HAS_SINGLE);
    prop_assert_eq!(shortcut(op, c, s, now), general(op, c, s, now));
    Ok(())
}

proptest! {
    #![proptest_config(config_3000())]

    #[test]
    fn the_shortcut_equals_the_general_engine(
        c in config(),
        s in state(),
        now in prop_oneof![any::<i64>(), -2_000_000_000i64..2_000_000_000],
        n in tokens(),
    ) {
        same(&TryConsume(n), &c, s, now)?;
        same(&TryConsumeAndReturnRemaining(n), &c, s, now)?;
        same(&EstimateAbilityToConsume(n), &c, s, now)?;
        same(&AvailableTokens, &c, s, now)?;
        // The verbose wrapper runs the wrapped shortcut: the same output and state after.
        same(&crate::ops::Verbose(TryConsumeAndReturnRemaining(n)), &c, s, now)?;
    }
}

proptest! {
    #![proptest_config(config_3000())]

    /// The division-free scaled path (`ops::plan_scaled`, what one-bandwidth lock-free buckets
    /// run) decides exactly as the decoded shortcut does, on the same state in both forms; and
    /// it is really taken for a greedy bandwidth whose capacity × period fits `i64`.
    #[test]
    fn the_scaled_path_equals_the_shortcut(
        c in prop_oneof![config(), small_greedy()],
        last in prop_oneof![any::<i64>(), -1_000_000_000i64..1_000_000_000],
        balance in prop_oneof![any::<i64>(), -1_000_000i64..1_000_000_000_000, -3i64..=3],
        now in prop_oneof![any::<i64>(), -2_000_000_000i64..2_000_000_000],
        n in prop_oneof![tokens(), 1u64..=3],
        edge in prop::option::of(-2i64..=2),
    ) {
        let b = &c.bandwidths()[0];
        // Optionally a balance right at the edge of `n` tokens, with no refill in between.
        let (balance, now) = match (edge, i64::try_from(n)) {
            (Some(delta), Ok(n)) if n <= 3 => {
                let p = b.refill_period().as_nanos() as i64;
                let unit = p / gcd(b.refill_tokens() as i64, p);
                (n * unit + delta, last)
            }
            _ => (balance, now),
        };
        let scaled = ScaledState::new(last, balance);
        let s = scaled.to_state(b);
        prop_assert_eq!(ScaledState::from_state(b, s), Some(scaled));
        let op = TryConsume(n);
        match crate::ops::plan_scaled(&op, b, now, scaled) {
            Some(fast) => {
                let fast = fast.map(|(out, new)| (out, new.map(|new| new.to_state(b))));
                prop_assert_eq!(fast, shortcut(&op, &c, s, now));
            }
            None => {
                let small = b.capacity() as i128 * b.refill_period().as_nanos() as i128
                    <= i64::MAX as i128;
                prop_assert!(
                    b.refill_kind() != RefillKind::Greedy || !small,
                    "the scaled path must be taken for {:?}", b
                );
            }
        }
    }
}

#[test]
fn the_shortcut_is_taken_only_for_one_bandwidth() {
    let one = Bandwidth::simple(10, Duration::from_secs(1)).expect("valid");
    let two = BucketConfiguration::builder()
        .add_bandwidth(one.clone())
        .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60)).expect("valid"))
        .build()
        .expect("valid");
    let s = BandwidthState::from_parts(0, 5, 0);
    assert!(crate::ops::plan_one(&TryConsume(1), &two, 0, || s).is_none());
    let single = BucketConfiguration::builder()
        .add_bandwidth(one)
        .build()
        .expect("valid");
    assert!(crate::ops::plan_one(&TryConsume(1), &single, 0, || s).is_some());
    // An operation without a shortcut never reads the state.
    let read = || -> BandwidthState { panic!("must not be read") };
    assert!(crate::ops::plan_one(&crate::ops::Reset, &single, 0, read).is_none());
}

/// A balance of `b` in scaled units: anything, or near 0, or near the capacity.
fn compact_case() -> impl Strategy<Value = (i64, i64, i64, u64)> {
    (
        prop_oneof![any::<i64>(), -1_000_000_000i64..1_000_000_000, Just(0)],
        prop_oneof![any::<i64>(), -1_000_000_000i64..1_000_000_000],
        prop_oneof![any::<i64>(), -1_000_000i64..1_000_000, -3i64..=3],
        prop_oneof![
            Just(0u64),
            0u64..1_000_000,
            0u64..10_000_000_000,
            any::<u64>()
        ],
    )
}

proptest! {
    #![proptest_config(config_3000())]

    /// The compact path (`CompactForm::plan`, what one-bandwidth lock-free buckets on a
    /// monotonic clock run) decides exactly as the decoded shortcut does for every reading not
    /// before the last refill, and decodes to exactly the refilled state; it declines only for
    /// bandwidths without a compact form or values beyond `i64`.
    #[test]
    fn the_compact_path_equals_the_shortcut(
        c in prop_oneof![config(), small_greedy(), round_greedy()],
        (base, last, offset, elapsed) in compact_case(),
        n in prop_oneof![tokens(), 1u64..=3],
        near_capacity in any::<bool>(),
        edge in prop::option::of(-2i64..=2),
    ) {
        let b = &c.bandwidths()[0];
        let unit = b.refill_period().as_nanos() as i128
            / gcd(b.refill_tokens() as i64, b.refill_period().as_nanos() as i64) as i128;
        let cap = b.capacity() as i128 * unit;
        // A balance at or below capacity: `offset` units below it, or `offset` units itself,
        // or (with `edge`, and no time passing) right at the edge of `n` tokens.
        let (balance, elapsed) = match edge {
            Some(delta) if n <= 3 => (n as i128 * unit + delta as i128, 0),
            _ if near_capacity => (cap - offset.unsigned_abs() as i128, elapsed),
            _ => (offset as i128, elapsed),
        };
        let (Ok(balance), Ok(cap64)) = (i64::try_from(balance), i64::try_from(cap)) else {
            return Ok(());
        };
        prop_assume!(balance <= cap64);
        let greedy = b.refill_kind() == RefillKind::Greedy;
        let scaled = ScaledState::new(last, balance);
        let rate = b.refill_tokens() as i128
            / gcd(b.refill_tokens() as i64, b.refill_period().as_nanos() as i64) as i128;
        let exact_v = (last as i128 - base as i128) * rate + (cap - balance as i128);
        let Some(form) = CompactForm::new(b, base) else {
            prop_assert!(!greedy, "no compact form for {:?}", b);
            return Ok(());
        };
        prop_assert!(greedy);
        let Some(v) = form.encode(scaled) else {
            prop_assert!(i64::try_from(exact_v).is_err(), "refused {:?} for {:?}", scaled, b);
            return Ok(());
        };
        prop_assert_eq!(v as i128, exact_v);
        let Some(now) = last.checked_add_unsigned(elapsed) else { return Ok(()); };
        let s = scaled.to_state(b);
        // Decoding at `now` is the refilled state.
        let decoded = form.decode(v, now);
        prop_assert_eq!(decoded.to_state(b), Refilled::new(&c, now, |_| s).get(0));
        let op = TryConsume(n);
        match form.plan(&op, v, now) {
            Ok((out, nv)) => {
                // An unchanged value is "no new state".
                let new = (nv != v).then(|| form.decode(nv, now).to_state(b));
                prop_assert_eq!(Ok((out, new)), shortcut(&op, &c, s, now));
            }
            Err(CompactStop::Invalid(e)) => prop_assert_eq!(Err(e), shortcut(&op, &c, s, now)),
            Err(CompactStop::Decline) => {
                // Only when a value leaves i64: (now − base) × rate (not computed for base 0
                // and rate 1), or the new compact value or its distance to p.
                let p = (now as i128 - base as i128) * rate;
                let need = n as i128 * b.refill_period().as_nanos() as i128
                    / gcd(b.refill_tokens() as i64, b.refill_period().as_nanos() as i64) as i128;
                let after = (v as i128).max(p) + need;
                let direct = base == 0 && rate == 1;
                prop_assert!(
                    (!direct && (i64::try_from(now as i128 - base as i128).is_err()
                        || i64::try_from(p).is_err()))
                        || i64::try_from(after).is_err()
                        || i64::try_from(after - p).is_err(),
                    "the compact path must be taken for {:?} at {}", scaled, now
                );
            }
        }
    }

    /// A reading before the last refill (a clock that broke its monotonic promise, or a thread
    /// that read the clock just before another one's change) is conservative: never more tokens
    /// than the exact state has, never a success the exact state would refuse.
    #[test]
    fn a_reading_back_in_time_is_never_generous(
        c in prop_oneof![small_greedy(), round_greedy()],
        (base, last, offset, back) in compact_case(),
        n in 1u64..=3,
    ) {
        let b = &c.bandwidths()[0];
        let unit = b.refill_period().as_nanos() as i64
            / gcd(b.refill_tokens() as i64, b.refill_period().as_nanos() as i64);
        // small_greedy: capacity × unit fits; a balance from a small debt up to the capacity.
        let cap = b.capacity() as i64 * unit;
        let balance = if offset >= 0 { offset % (cap + 1) } else { offset };
        let scaled = ScaledState::new(last, balance);
        let form = CompactForm::new(b, base).expect("greedy");
        let Some(v) = form.encode(scaled) else { return Ok(()); };
        let Some(now) = last.checked_sub_unsigned(back) else { return Ok(()); };
        let exact = scaled.to_state(b);
        prop_assert!(form.decode(v, now).balance() <= scaled.balance());
        if let Ok((true, _)) = form.plan(&TryConsume(n), v, now) {
            prop_assert!(matches!(shortcut(&TryConsume(n), &c, exact, now), Ok((true, _))));
        }
    }
}
