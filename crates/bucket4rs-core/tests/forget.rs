//! `BucketState::forgettable_at`: from the reading it gives, a bucket created afresh answers
//! every later operation exactly as the kept state does (soundness), and it gives a reading
//! whenever the configuration allows one (a function that never lets go would be sound and
//! useless).
//!
//! Random configurations of one to three bandwidths (greedy, interval, aligned; initial tokens
//! absent, below, at or above capacity) reach a state through random operations; then the kept
//! state and a fresh one, created at or after the reading, run the same random operations and
//! must give the same answers throughout.

use bucket4rs_core::ops::{
    self, AddTokens, AvailableTokens, ConsumeIgnoringRateLimits, EstimateAbilityToConsume,
    ForceAddTokens, Operation, Reserve, Reset, TryConsume, TryConsumeAndReturnRemaining,
    TryConsumeAsMuchAsPossible,
};
use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, RefillKind};
use core::time::Duration;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Clone, Debug)]
enum Kind {
    Greedy,
    Intervally,
    Aligned { first: u64, adaptive: bool },
}

#[derive(Clone, Debug)]
struct Spec {
    capacity: u64,
    tokens: u64,
    period: u64,
    kind: Kind,
    initial: Option<u64>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        1u64..=20,
        1u64..=20,
        1u64..=200,
        prop_oneof![
            3 => Just(Kind::Greedy),
            1 => Just(Kind::Intervally),
            2 => (0u64..=2_000, any::<bool>()).prop_map(|(first, adaptive)| Kind::Aligned { first, adaptive }),
        ],
        prop_oneof![3 => Just(None), 1 => (0u64..=25).prop_map(Some)],
    )
        .prop_map(|(capacity, tokens, period, kind, initial)| Spec {
            capacity,
            // At most one token per nanosecond.
            tokens: tokens.min(period),
            period,
            initial: match kind {
                Kind::Aligned { adaptive: true, .. } => None,
                _ => initial,
            },
            kind,
        })
}

fn bandwidth(s: &Spec) -> Bandwidth {
    let p = Duration::from_nanos(s.period);
    let b = Bandwidth::builder().capacity(s.capacity);
    let b = match s.kind {
        Kind::Greedy => b.refill_greedy(s.tokens, p),
        Kind::Intervally => b.refill_intervally(s.tokens, p),
        Kind::Aligned {
            first,
            adaptive: false,
        } => b.refill_intervally_aligned(s.tokens, p, Duration::from_nanos(first)),
        Kind::Aligned {
            first,
            adaptive: true,
        } => b.refill_intervally_aligned_adaptive(s.tokens, p, Duration::from_nanos(first)),
    };
    let b = match s.initial {
        Some(i) => b.initial_tokens(i),
        None => b,
    };
    b.build().expect("a valid bandwidth")
}

#[derive(Clone, Debug)]
enum Step {
    Advance(i64),
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
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0i64..=300).prop_map(Step::Advance),
        4 => (1u64..=25).prop_map(Step::TryConsume),
        2 => (1u64..=25).prop_map(Step::Probe),
        1 => (1u64..=25).prop_map(Step::Estimate),
        1 => prop::option::of(1u64..=25).prop_map(Step::AsMuchAsPossible),
        1 => (1u64..=25).prop_map(Step::Add),
        1 => (1u64..=5).prop_map(Step::ForceAdd),
        1 => Just(Step::Reset),
        1 => Just(Step::Available),
        1 => (1u64..=25).prop_map(Step::IgnoringLimits),
        1 => ((1u64..=25), (1u64..=500)).prop_map(|(n, w)| Step::Reserve(n, w)),
    ]
}

/// Runs `step` on `state` at `*now` (advancing it for `Advance`), rendering the answer.
fn run(
    config: &BucketConfiguration,
    state: &mut BucketState,
    now: &mut i64,
    step: &Step,
) -> String {
    fn op<O: Operation>(c: &BucketConfiguration, s: &mut BucketState, now: i64, o: O) -> String
    where
        O::Output: core::fmt::Debug,
    {
        format!("{:?}", s.apply(c, now, &o))
    }
    let t = *now;
    match step {
        Step::Advance(by) => {
            // The clock stops at its end (the extremes test runs there).
            *now = now.saturating_add(*by);
            String::new()
        }
        Step::TryConsume(n) => op(config, state, t, TryConsume(*n)),
        Step::Probe(n) => op(config, state, t, TryConsumeAndReturnRemaining(*n)),
        Step::Estimate(n) => op(config, state, t, EstimateAbilityToConsume(*n)),
        Step::AsMuchAsPossible(l) => op(config, state, t, TryConsumeAsMuchAsPossible(*l)),
        Step::Add(n) => op(config, state, t, AddTokens(*n)),
        Step::ForceAdd(n) => op(config, state, t, ForceAddTokens(*n)),
        Step::Reset => op(config, state, t, Reset),
        Step::Available => op(config, state, t, AvailableTokens),
        Step::IgnoringLimits(n) => op(config, state, t, ConsumeIgnoringRateLimits(*n)),
        Step::Reserve(n, w) => op(
            config,
            state,
            t,
            Reserve {
                tokens: *n,
                max_wait_nanos: *w,
            },
        ),
    }
}

/// Whether a reading must exist: every bandwidth could be forgotten once full (greedy with
/// initial tokens at capacity, or aligned and not above capacity from the start) and no
/// operation put tokens above capacity.
fn must_be_forgettable(config: &BucketConfiguration, history: &[Step]) -> bool {
    let forced = history.iter().any(|s| matches!(s, Step::ForceAdd(_)));
    !forced
        && config.bandwidths().iter().all(|b| match b.refill_kind() {
            RefillKind::Greedy => b.initial_tokens() == b.capacity(),
            RefillKind::Intervally => false,
            RefillKind::IntervallyAligned { .. } => b.initial_tokens() <= b.capacity(),
            _ => false,
        })
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// The property, from a history that starts at `start`.
fn forgotten_answers_like_kept(
    specs: &[Spec],
    start: i64,
    before: &[Step],
    asked_after: i64,
    later: i64,
    after: &[Step],
) -> Result<(), TestCaseError> {
    let config = BucketConfiguration::new(specs.iter().map(bandwidth).collect())
        .expect("ids are absent, so no duplicate");
    let mut state = BucketState::new(&config, start);
    let mut now = start;
    for s in before {
        run(&config, &mut state, &mut now, s);
    }
    let asked = now.saturating_add(asked_after);
    let at = state.forgettable_at(&config, asked);
    if config
        .bandwidths()
        .iter()
        .any(|b| b.refill_kind() == RefillKind::Intervally)
    {
        prop_assert_eq!(at, None, "an interval bandwidth is never forgettable");
    }
    let Some(at) = at else {
        // Near the end of the clock the moment may lie past it: then there is none.
        prop_assert!(
            !must_be_forgettable(&config, before) || asked > i64::MAX - 1_000_000,
            "no reading for a bucket that could be forgotten once full: {:?}",
            state
        );
        return Ok(());
    };
    prop_assert!(
        at >= asked,
        "{} is before the reading asked about, {}",
        at,
        asked
    );
    // Forgotten at `at`, recreated at the first request `later` nanoseconds on.
    let mut recreated_at = at.saturating_add(later);
    let mut fresh = BucketState::new(&config, recreated_at);
    let mut kept_now = recreated_at;
    let mut kept = state.clone();
    for (i, s) in after.iter().enumerate() {
        let want = run(&config, &mut kept, &mut kept_now, s);
        let got = run(&config, &mut fresh, &mut recreated_at, s);
        prop_assert_eq!(&got, &want, "step {} {:?}", i, s);
    }
    Ok(())
}

/// Readings at the ends of the clock and around zero.
fn extreme_start() -> impl Strategy<Value = i64> {
    prop_oneof![
        (i64::MAX - 30_000)..=i64::MAX,
        i64::MIN..=(i64::MIN + 30_000),
        -30_000i64..=30_000,
    ]
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn a_forgotten_bucket_recreated_later_answers_like_the_kept_one(
        specs in prop::collection::vec(spec(), 1..=3),
        start in -500i64..=3_000,
        before in prop::collection::vec(step(), 0..25),
        asked_after in 0i64..=400,
        later in 0i64..=400,
        after in prop::collection::vec(step(), 1..40),
    ) {
        forgotten_answers_like_kept(&specs, start, &before, asked_after, later, &after)?;
    }

    /// Total at the extremes: no overflow (tests build with overflow checks), never a moment
    /// before the reading asked about, and a recreated bucket answers as the kept one.
    #[test]
    fn forgetting_is_total_and_sound_at_the_extremes_of_the_clock(
        specs in prop::collection::vec(spec(), 1..=3),
        start in extreme_start(),
        before in prop::collection::vec(step(), 0..25),
        asked_after in 0i64..=400,
        later in 0i64..=400,
        after in prop::collection::vec(step(), 1..40),
    ) {
        forgotten_answers_like_kept(&specs, start, &before, asked_after, later, &after)?;
    }
}

#[test]
fn an_initial_shortfall_keeps_a_greedy_bucket_but_not_an_aligned_one_once_filled() {
    let greedy = BucketConfiguration::new(vec![
        Bandwidth::builder()
            .capacity(5)
            .refill_greedy(5, Duration::from_secs(2))
            .initial_tokens(0)
            .build()
            .expect("valid"),
    ])
    .expect("valid");
    // The plan: a fresh bucket starts empty, so a full one must be kept (recreating
    // it would answer 429 to a client that has five tokens).
    let mut state = BucketState::new(&greedy, 0);
    state
        .apply(&greedy, 2_500_000_000, &ops::TryConsume(1))
        .expect("valid");
    assert_eq!(state.forgettable_at(&greedy, 20_000_000_000), None);

    // Aligned to a grid from F = 10 s, 2 per second from zero: a fresh bucket is full five
    // periods after F − P = 9 s, at 14 s; a kept full one can be forgotten from then on.
    let aligned = BucketConfiguration::new(vec![
        Bandwidth::builder()
            .capacity(10)
            .refill_intervally_aligned(2, Duration::from_secs(1), Duration::from_secs(10))
            .initial_tokens(0)
            .build()
            .expect("valid"),
    ])
    .expect("valid");
    let state = BucketState::new(&aligned, 0);
    assert_eq!(
        state.forgettable_at(&aligned, 11_000_000_000),
        Some(14_000_000_000)
    );
}
