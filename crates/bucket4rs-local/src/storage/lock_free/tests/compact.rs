//! Differential test of the compact word: a lock-free bucket on a monotonic clock (one greedy
//! bandwidth in one 64-bit word, the default case) answers every operation of the API exactly as
//! the single-threaded bucket does on the same readings, including the operations that decode the
//! word, and those that move it to the slots (a forced addition above capacity, a configuration
//! replacement).

use std::time::Duration;

use crate::{
    Bandwidth, Bucket, BucketConfiguration, LockFreeBucket, ManualClock, TokensInheritanceStrategy,
    UnsyncBucket,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    TryConsume(u64),
    Probe(u64),
    Estimate(u64),
    AsMuchAsPossible(Option<u64>),
    Add(u64),
    ForceAdd(u64),
    Reset,
    Available,
    IgnoringLimits(u64),
    Reserve(u64, u64),
    Replace(u64, u8),
    Verbose(u64),
    Snapshot,
}

fn op(capacity: u64) -> impl Strategy<Value = Op> {
    let n = prop_oneof![0..=capacity + 2, Just(1u64), any::<u64>()];
    prop_oneof![
        4 => prop_oneof![Just(0u64), 1u64..1_000, 1u64..10_000_000_000].prop_map(Op::Advance),
        6 => n.clone().prop_map(Op::TryConsume),
        2 => n.clone().prop_map(Op::Probe),
        1 => n.clone().prop_map(Op::Estimate),
        1 => prop::option::of(n.clone()).prop_map(Op::AsMuchAsPossible),
        1 => n.clone().prop_map(Op::Add),
        1 => (0..=capacity).prop_map(Op::ForceAdd),
        1 => Just(Op::Reset),
        1 => Just(Op::Available),
        1 => (0..=capacity).prop_map(Op::IgnoringLimits),
        1 => (n.clone(), 0u64..5_000_000_000).prop_map(|(n, w)| Op::Reserve(n, w)),
        1 => (1u64..50, 0u8..4).prop_map(|(c, s)| Op::Replace(c, s)),
        1 => n.prop_map(Op::Verbose),
        1 => Just(Op::Snapshot),
    ]
}

/// One greedy limit: rates of one scaled unit per nanosecond (the compact word's fast case,
/// counted from reading 0) and others (counted from the creation reading, with a multiplication).
/// Always a valid configuration: at most one token per nanosecond (the period is raised to the
/// refill tokens when it is shorter), so every generated case runs.
fn limit() -> impl Strategy<Value = (u64, u64, u64, Option<u64>)> {
    (
        1u64..50,
        prop_oneof![1u64..10, Just(1_000), Just(7)],
        prop_oneof![1u64..1_000_000, Just(1_000_000_000), Just(60_000_000_000)],
        prop::option::of(0u64..50),
    )
        .prop_map(|(capacity, tokens, period, initial)| {
            (capacity, tokens, period.max(tokens), initial)
        })
}

fn config(capacity: u64, tokens: u64, period: u64, initial: Option<u64>) -> BucketConfiguration {
    let b = Bandwidth::builder()
        .capacity(capacity)
        .refill_greedy(tokens, Duration::from_nanos(period))
        .id("only");
    let b = match initial {
        Some(i) => b.initial_tokens(i.min(capacity)),
        None => b,
    };
    BucketConfiguration::builder()
        .add_bandwidth(b.build().expect("valid"))
        .build()
        .expect("valid")
}

fn strategy(s: u8) -> TokensInheritanceStrategy {
    match s {
        0 => TokensInheritanceStrategy::AsIs,
        1 => TokensInheritanceStrategy::Proportionally,
        2 => TokensInheritanceStrategy::Additive,
        _ => TokensInheritanceStrategy::Reset,
    }
}

/// Runs `op` on `bucket` and renders everything it answered.
macro_rules! answer {
    ($bucket:expr, $op:expr) => {{
        let b = $bucket;
        match $op {
            Op::Advance(_) => String::new(),
            Op::TryConsume(n) => format!("{:?}", b.try_consume(*n)),
            Op::Probe(n) => format!("{:?}", b.try_consume_and_return_remaining(*n)),
            Op::Estimate(n) => format!("{:?}", b.estimate_ability_to_consume(*n)),
            Op::AsMuchAsPossible(None) => format!("{:?}", b.try_consume_as_much_as_possible()),
            Op::AsMuchAsPossible(Some(n)) => {
                format!("{:?}", b.try_consume_as_much_as_possible_with_limit(*n))
            }
            Op::Add(n) => format!("{:?}", b.add_tokens(*n)),
            Op::ForceAdd(n) => format!("{:?}", b.force_add_tokens(*n)),
            Op::Reset => {
                b.reset();
                String::new()
            }
            Op::Available => format!("{:?}", b.available_tokens()),
            Op::IgnoringLimits(n) => format!("{:?}", b.consume_ignoring_rate_limits(*n)),
            Op::Reserve(n, w) => format!("{:?}", b.reserve(*n, Duration::from_nanos(*w))),
            Op::Replace(c, s) => {
                // Verbosely: the state it answers is the state the bucket then holds.
                let to = config(*c, 3, 1_000_000_000, None);
                let r = b.as_verbose().replace_configuration(to, strategy(*s));
                if let Ok(r) = &r {
                    assert_eq!(
                        r.state(),
                        b.snapshot().state(),
                        "the verbose replacement's state"
                    );
                    assert_eq!(r.configuration(), &b.configuration());
                }
                format!(
                    "{:?}",
                    r.map(|r| (r.available_tokens_per_bandwidth(), r.time_until_full()))
                )
            }
            Op::Verbose(n) => {
                let v = b.as_verbose().try_consume(*n);
                format!(
                    "{:?}",
                    v.map(|r| (
                        *r.value(),
                        r.available_tokens_per_bandwidth(),
                        r.time_until_full()
                    ))
                )
            }
            Op::Snapshot => {
                // A restored copy, read at the same reading, has the same tokens.
                let copy = Bucket::builder()
                    .with_snapshot(b.snapshot())
                    .expect("a snapshot restores")
                    .with_clock(b.clock().clone())
                    .build_unsynchronized()
                    .expect("valid");
                format!("{:?}", copy.available_tokens())
            }
        }
    }};
}

fn config_500() -> ProptestConfig {
    ProptestConfig {
        cases: 500,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config_500())]

    #[test]
    fn the_compact_word_answers_like_the_single_threaded_bucket(
        (capacity, tokens, period, initial) in limit(),
        start in prop_oneof![Just(0i64), -1_000_000i64..1_000_000, Just(1_700_000_000_000_000_000)],
        ops in prop::collection::vec(op(60), 1..60),
    ) {
        let config = config(capacity, tokens, period, initial);
        let (fast, exact) = (ManualClock::monotonic(start), ManualClock::new(start));
        let compact: LockFreeBucket<ManualClock> = Bucket::builder()
            .with_configuration(&config)
            .with_clock(fast.clone())
            .build()
            .expect("valid");
        let reference: UnsyncBucket<ManualClock> = Bucket::builder()
            .with_configuration(&config)
            .with_clock(exact.clone())
            .build_unsynchronized()
            .expect("valid");
        prop_assert!(compact.storage().is_compact(), "one greedy limit on a monotonic clock");
        for (i, op) in ops.iter().enumerate() {
            if let Op::Advance(by) = op {
                fast.advance(Duration::from_nanos(*by));
                exact.advance(Duration::from_nanos(*by));
                continue;
            }
            let (got, want) = (answer!(&compact, op), answer!(&reference, op));
            prop_assert_eq!(got, want, "step {} {:?} (compact now: {})", i, op, compact.storage().is_compact());
            prop_assert_eq!(compact.available_tokens(), reference.available_tokens());
        }
        prop_assert_eq!(compact.configuration(), reference.configuration());
    }
}

#[test]
fn leaving_the_compact_word_is_one_way_and_keeps_the_tokens() {
    let clock = ManualClock::monotonic(0);
    let bucket: LockFreeBucket<ManualClock> = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(clock.clone())
        .build()
        .expect("valid");
    assert!(bucket.storage().is_compact());
    assert!(bucket.try_consume(4).expect("valid"));
    // Above capacity: the word cannot hold it, the slots can.
    bucket.force_add_tokens(20).expect("valid");
    assert!(!bucket.storage().is_compact());
    assert!(!bucket.storage().is_packed());
    assert_eq!(bucket.available_tokens(), 26);
    // Back under capacity, the bucket stays on the slots.
    assert!(bucket.try_consume(20).expect("valid"));
    assert!(!bucket.storage().is_compact());
    clock.advance(Duration::from_millis(500));
    assert_eq!(bucket.available_tokens(), 10);
}
