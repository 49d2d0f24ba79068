//! The keyed bucket: lookups, what a key without a bucket stores, forgetting, the key cap,
//! listeners, verbose results; a property test of many keys against one single-threaded
//! bucket per key, with sweeps in between; and a stress test that counts every token.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bucket4rs_core::ops;
use bucket4rs_local::{
    Bandwidth, Bucket, BucketConfiguration, BucketListener, ConfigError, KeyedBucket, KeyedError,
    ManualClock, OperationError, TokensInheritanceStrategy, UnsyncBucket,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

fn greedy(capacity: u64, per: Duration) -> BucketConfiguration {
    BucketConfiguration::new(vec![Bandwidth::simple(capacity, per).expect("valid")]).expect("valid")
}

fn limiter(clock: &ManualClock, config: &BucketConfiguration) -> KeyedBucket<String, ManualClock> {
    KeyedBucket::builder()
        .with_configuration(config)
        .with_clock(clock.clone())
        .build()
        .expect("valid")
}

#[test]
fn keys_have_buckets_of_their_own_and_lookups_borrow() {
    let clock = ManualClock::monotonic(0);
    let keyed = limiter(&clock, &greedy(3, Duration::from_secs(3)));
    let alice = String::from("alice");
    assert!(keyed.try_consume(alice.as_str(), 3).expect("valid"));
    assert!(!keyed.try_consume("alice", 1).expect("valid"));
    assert!(keyed.try_consume("bob", 3).expect("valid"));
    assert_eq!(keyed.len(), 2);
    let numbers: KeyedBucket<u64> = KeyedBucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(60)))
        .build()
        .expect("valid");
    assert!(numbers.try_consume(&7, 1).expect("valid"));
    assert!(!numbers.try_consume(&7, 1).expect("valid"));
    assert!(numbers.try_consume(&8, 1).expect("valid"));
}

#[test]
fn a_key_without_a_bucket_stores_one_only_when_it_must() {
    let clock = ManualClock::monotonic(0);
    let keyed = limiter(&clock, &greedy(5, Duration::from_secs(5)));
    // Reads and refusals on a fresh, forgettable bucket store nothing.
    assert_eq!(keyed.available_tokens("a").expect("valid"), 5);
    assert!(
        keyed
            .estimate_ability_to_consume("a", 5)
            .expect("valid")
            .can_be_consumed()
    );
    assert!(!keyed.try_consume("a", 6).expect("valid"));
    // Invalid requests store nothing either.
    assert_eq!(
        keyed.try_consume("a", 0),
        Err(KeyedError::Operation(OperationError::ZeroTokens))
    );
    assert!(keyed.is_empty());
    assert!(keyed.snapshot("a").is_none());
    // A change does.
    assert!(keyed.try_consume("a", 1).expect("valid"));
    assert_eq!(keyed.len(), 1);

    // A bucket that starts short cannot be forgotten: its first use is remembered, reads
    // included, because a bucket created later would start short again.
    let short = BucketConfiguration::new(vec![
        Bandwidth::builder()
            .capacity(5)
            .refill_greedy(5, Duration::from_secs(5))
            .initial_tokens(0)
            .build()
            .expect("valid"),
    ])
    .expect("valid");
    let keyed = limiter(&clock, &short);
    assert_eq!(keyed.available_tokens("a").expect("valid"), 0);
    assert_eq!(keyed.len(), 1);
    clock.advance(Duration::from_secs(5));
    assert_eq!(keyed.available_tokens("a").expect("valid"), 5);
    assert_eq!(keyed.sweep(), 0);
    assert_eq!(keyed.available_tokens("a").expect("valid"), 5);
}

#[test]
fn only_buckets_a_fresh_one_would_replace_are_forgotten() {
    let clock = ManualClock::monotonic(0);
    let config = greedy(10, Duration::from_secs(10));
    let keyed = limiter(&clock, &config);
    for key in ["full", "half", "replaced"] {
        keyed.try_consume(key, 5).expect("valid");
    }
    let other = greedy(10, Duration::from_secs(20));
    keyed
        .replace_configuration("replaced", other, TokensInheritanceStrategy::AsIs)
        .expect("valid");
    clock.advance(Duration::from_secs(4));
    keyed.add_tokens("full", 1).expect("valid");
    assert_eq!(keyed.sweep(), 1, "only the bucket that is full again");
    assert!(keyed.snapshot("full").is_none());
    // Forgotten, it answers as a fresh bucket, which is what it was.
    assert_eq!(keyed.available_tokens("full").expect("valid"), 10);
    clock.advance(Duration::from_secs(100));
    // "half" is full again; "replaced" too, but its configuration is not the keys' own.
    assert_eq!(keyed.sweep(), 1);
    assert!(keyed.snapshot("half").is_none());
    assert!(keyed.snapshot("replaced").is_some());
}

#[test]
fn a_key_whose_source_changed_keeps_its_bucket() {
    let clock = ManualClock::monotonic(0);
    let free = greedy(2, Duration::from_secs(2));
    let pro = greedy(20, Duration::from_secs(2));
    let tier = Arc::new(AtomicU64::new(0));
    let source = Arc::clone(&tier);
    let (f, p) = (free.clone(), pro.clone());
    let keyed: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
        .configuration_per_key(move |key: &String| match key.as_str() {
            "client" if source.load(Ordering::Relaxed) == 0 => Some(f.clone()),
            "client" => Some(p.clone()),
            _ => None,
        })
        .with_clock(clock.clone())
        .build()
        .expect("valid");
    assert_eq!(
        keyed.try_consume("stranger", 1),
        Err(KeyedError::UnknownKey)
    );
    assert!(keyed.try_consume("client", 2).expect("valid"));
    clock.advance(Duration::from_secs(2));
    tier.store(1, Ordering::Relaxed);
    // Full again, but a new bucket would be a pro one: kept (still free).
    assert_eq!(keyed.sweep(), 0);
    assert!(!keyed.try_consume("client", 3).expect("valid"));
    keyed
        .replace_configuration("client", pro, TokensInheritanceStrategy::Reset)
        .expect("valid");
    assert!(keyed.try_consume("client", 20).expect("valid"));
}

#[test]
fn the_key_cap_refuses_new_keys_until_one_can_be_forgotten() {
    let clock = ManualClock::monotonic(0);
    let keyed: KeyedBucket<u32, ManualClock> = KeyedBucket::builder()
        .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(2)))
        .with_clock(clock.clone())
        .max_keys(2)
        .build()
        .expect("valid");
    assert!(keyed.try_consume(&1, 1).expect("valid"));
    assert!(keyed.try_consume(&2, 1).expect("valid"));
    assert_eq!(
        keyed.try_consume(&3, 1),
        Err(KeyedError::TooManyKeys { max: 2 })
    );
    // Known keys still work, and reads of a fresh bucket need no room.
    assert!(keyed.try_consume(&1, 1).expect("valid"));
    assert_eq!(keyed.available_tokens(&3).expect("valid"), 2);
    clock.advance(Duration::from_secs(1));
    // Key 2 is full again and makes room.
    assert!(keyed.try_consume(&3, 1).expect("valid"));
    assert_eq!(keyed.len(), 2);
    assert!(keyed.snapshot(&2).is_none());
    let zero = KeyedBucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
        .max_keys(0)
        .build();
    let zero: Result<KeyedBucket<u32>, _> = zero;
    assert_eq!(zero.err(), Some(ConfigError::ZeroMaxKeys));
}

#[derive(Debug, Default)]
struct Counts {
    consumed: AtomicU64,
    rejected: AtomicU64,
}

impl BucketListener for Counts {
    fn on_consumed(&self, tokens: u64) {
        self.consumed.fetch_add(tokens, Ordering::Relaxed);
    }
    fn on_rejected(&self, tokens: u64) {
        self.rejected.fetch_add(tokens, Ordering::Relaxed);
    }
}

#[test]
fn the_listener_hears_every_key() {
    let keyed: KeyedBucket<String, _, Counts> = KeyedBucket::builder()
        .add_limit(|l| l.capacity(3).refill_greedy(3, Duration::from_secs(60)))
        .with_listener(Counts::default())
        .build()
        .expect("valid");
    keyed.try_consume("a", 2).expect("valid");
    keyed.try_consume("b", 3).expect("valid");
    keyed.try_consume("b", 1).expect("valid");
    keyed.as_verbose().try_consume("a", 1).expect("valid");
    let counts = keyed.listener();
    assert_eq!(counts.consumed.load(Ordering::Relaxed), 6);
    assert_eq!(counts.rejected.load(Ordering::Relaxed), 1);
}

#[test]
fn a_state_the_word_cannot_hold_moves_the_key_to_a_bucket_of_its_own() {
    let clock = ManualClock::monotonic(0);
    let keyed = limiter(&clock, &greedy(10, Duration::from_secs(10)));
    keyed.try_consume("k", 4).expect("valid");
    keyed.force_add_tokens("k", 20).expect("valid");
    assert_eq!(keyed.available_tokens("k").expect("valid"), 26);
    assert!(keyed.try_consume("k", 26).expect("valid"));
    clock.advance(Duration::from_secs(3));
    assert_eq!(keyed.available_tokens("k").expect("valid"), 3);
    let verbose = keyed
        .as_verbose()
        .try_consume_and_return_remaining("k", 1)
        .expect("valid");
    assert_eq!(verbose.value().remaining_tokens(), 2);
    assert_eq!(verbose.time_until_full(), Duration::from_secs(8));
}

#[test]
fn the_verbose_view_adds_and_resets_tokens_on_the_same_buckets() {
    let clock = ManualClock::monotonic(0);
    let keyed = limiter(&clock, &greedy(10, Duration::from_secs(10)));
    let verbose = keyed.as_verbose();
    assert!(*verbose.try_consume("k", 6).expect("valid").value());
    let added = verbose.add_tokens("k", 2).expect("valid");
    assert_eq!(added.available_tokens(), 6);
    let forced = verbose.force_add_tokens("k", 10).expect("valid");
    assert_eq!(forced.available_tokens_per_bandwidth(), [16]);
    assert_eq!(keyed.available_tokens("k").expect("valid"), 16);
    let reset = verbose.reset("k").expect("valid");
    assert_eq!(reset.available_tokens(), 10);
    assert_eq!(reset.time_until_full(), Duration::ZERO);
    assert_eq!(keyed.available_tokens("k").expect("valid"), 10);
}

// ---------------------------------------------------------------------------------------------
// Many keys against one single-threaded bucket per key.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Sweep,
    On(usize, Op),
}

#[derive(Clone, Debug)]
enum Op {
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
}

fn op() -> impl Strategy<Value = Op> {
    let n = prop_oneof![0u64..=12, Just(1u64)];
    prop_oneof![
        6 => n.clone().prop_map(Op::TryConsume),
        2 => n.clone().prop_map(Op::Probe),
        1 => n.clone().prop_map(Op::Estimate),
        1 => prop::option::of(n.clone()).prop_map(Op::AsMuchAsPossible),
        1 => n.clone().prop_map(Op::Add),
        1 => (0u64..=12).prop_map(Op::ForceAdd),
        1 => Just(Op::Reset),
        1 => Just(Op::Available),
        1 => (0u64..=12).prop_map(Op::IgnoringLimits),
        1 => (n.clone(), 0u64..3_000_000_000).prop_map(|(n, w)| Op::Reserve(n, w)),
        1 => (1u64..=12, 0u8..4).prop_map(|(c, s)| Op::Replace(c, s)),
        1 => n.prop_map(Op::Verbose),
    ]
}

fn step(keys: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => prop_oneof![Just(0u64), 1u64..1_000_000, 1u64..3_000_000_000].prop_map(Step::Advance),
        1 => Just(Step::Sweep),
        8 => (0..keys, op()).prop_map(|(k, o)| Step::On(k, o)),
    ]
}

/// A configuration per key: greedy (compact when the clock allows), greedy starting short,
/// interval, or two bandwidths.
fn config_of(kind: u8) -> BucketConfiguration {
    let b = |c: u64, t: u64, p: u64| {
        Bandwidth::builder()
            .capacity(c)
            .refill_greedy(t, Duration::from_millis(p))
    };
    match kind {
        0 => BucketConfiguration::new(vec![b(10, 10, 1_000).build().expect("valid")]),
        1 => BucketConfiguration::new(vec![b(8, 3, 700).initial_tokens(2).build().expect("valid")]),
        2 => BucketConfiguration::new(vec![
            Bandwidth::builder()
                .capacity(6)
                .refill_intervally(6, Duration::from_millis(900))
                .build()
                .expect("valid"),
        ]),
        _ => BucketConfiguration::new(vec![
            b(5, 5, 500).id("a").build().expect("valid"),
            b(12, 12, 6_000).id("b").build().expect("valid"),
        ]),
    }
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

fn keyed_answer(k: &KeyedBucket<String, ManualClock>, key: &str, op: &Op) -> String {
    match op {
        Op::TryConsume(n) => format!("{:?}", k.try_consume(key, *n).ok()),
        Op::Probe(n) => format!("{:?}", k.try_consume_and_return_remaining(key, *n).ok()),
        Op::Estimate(n) => format!("{:?}", k.estimate_ability_to_consume(key, *n).ok()),
        Op::AsMuchAsPossible(l) => format!(
            "{:?}",
            k.execute(key, ops::TryConsumeAsMuchAsPossible(*l)).ok()
        ),
        Op::Add(n) => format!("{:?}", k.add_tokens(key, *n).ok()),
        Op::ForceAdd(n) => format!("{:?}", k.force_add_tokens(key, *n).ok()),
        Op::Reset => format!("{:?}", k.reset(key).ok()),
        Op::Available => format!("{:?}", k.available_tokens(key).ok()),
        Op::IgnoringLimits(n) => format!(
            "{:?}",
            k.execute(key, ops::ConsumeIgnoringRateLimits(*n))
                .ok()
                .map(Duration::from_nanos)
        ),
        Op::Reserve(n, w) => format!(
            "{:?}",
            k.execute(
                key,
                ops::Reserve {
                    tokens: *n,
                    max_wait_nanos: *w
                }
            )
            .ok()
            .map(|r| r.map(Duration::from_nanos))
        ),
        Op::Replace(c, s) => format!(
            "{:?}",
            k.replace_configuration(key, config_of((*c % 4) as u8), strategy(*s))
                .ok()
        ),
        Op::Verbose(n) => format!(
            "{:?}",
            k.as_verbose().try_consume(key, *n).ok().map(|r| (
                *r.value(),
                r.available_tokens_per_bandwidth(),
                r.time_until_full()
            ))
        ),
    }
}

fn bucket_answer(b: &UnsyncBucket<ManualClock>, op: &Op) -> String {
    match op {
        Op::TryConsume(n) => format!("{:?}", b.try_consume(*n).ok()),
        Op::Probe(n) => format!("{:?}", b.try_consume_and_return_remaining(*n).ok()),
        Op::Estimate(n) => format!("{:?}", b.estimate_ability_to_consume(*n).ok()),
        Op::AsMuchAsPossible(None) => format!("{:?}", Some(b.try_consume_as_much_as_possible())),
        Op::AsMuchAsPossible(Some(l)) => {
            format!(
                "{:?}",
                b.try_consume_as_much_as_possible_with_limit(*l).ok()
            )
        }
        Op::Add(n) => format!("{:?}", b.add_tokens(*n).ok()),
        Op::ForceAdd(n) => format!("{:?}", b.force_add_tokens(*n).ok()),
        Op::Reset => {
            b.reset();
            format!("{:?}", Some(()))
        }
        Op::Available => format!("{:?}", Some(b.available_tokens())),
        Op::IgnoringLimits(n) => format!("{:?}", b.consume_ignoring_rate_limits(*n).ok()),
        Op::Reserve(n, w) => format!("{:?}", b.reserve(*n, Duration::from_nanos(*w)).ok()),
        Op::Replace(c, s) => format!(
            "{:?}",
            b.replace_configuration(config_of((*c % 4) as u8), strategy(*s))
                .ok()
        ),
        Op::Verbose(n) => format!(
            "{:?}",
            b.as_verbose().try_consume(*n).ok().map(|r| (
                *r.value(),
                r.available_tokens_per_bandwidth(),
                r.time_until_full()
            ))
        ),
    }
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn every_key_answers_like_a_bucket_of_its_own(
        kinds in prop::collection::vec(0u8..4, 1..5),
        monotonic in any::<bool>(),
        steps in prop::collection::vec(step(4), 1..80),
    ) {
        let start = 1_700_000_000_000_000_000;
        let clock = if monotonic { ManualClock::monotonic(start) } else { ManualClock::new(start) };
        let configs: Vec<BucketConfiguration> = kinds.iter().map(|k| config_of(*k)).collect();
        let by_key = configs.clone();
        let keyed: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
            .configuration_per_key(move |key: &String| {
                key.parse::<usize>().ok().and_then(|i| by_key.get(i).cloned())
            })
            .with_clock(clock.clone())
            .build()
            .expect("valid");
        // A key's bucket is created when the key is first used: both are, at its first step.
        let mut reference: Vec<Option<UnsyncBucket<ManualClock>>> = (0..configs.len()).map(|_| None).collect();
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Advance(by) => clock.advance(Duration::from_nanos(*by)),
                Step::Sweep => {
                    keyed.sweep();
                }
                Step::On(k, op) => {
                    let k = k % configs.len();
                    let key = k.to_string();
                    let bucket = reference[k].get_or_insert_with(|| {
                        keyed.available_tokens(key.as_str()).expect("a known key");
                        Bucket::builder()
                            .with_configuration(&configs[k])
                            .with_clock(clock.clone())
                            .build_unsynchronized()
                            .expect("valid")
                    });
                    let (got, want) = (keyed_answer(&keyed, &key, op), bucket_answer(bucket, op));
                    prop_assert_eq!(got, want, "step {} key {} {:?}", i, k, op);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Threads: every token counted.
// ---------------------------------------------------------------------------------------------

/// Four threads on 64 keys (on a clock that stands still, so nothing refills): each key gives
/// out exactly its capacity plus what was force-added to it — which moves a key off the compact
/// word, under the map's exclusive lock, while the others consume in place.
#[test]
fn threads_take_exactly_every_token_of_every_key() {
    const KEYS: u64 = 64;
    const CAPACITY: u64 = 500;
    let clock = ManualClock::monotonic(0);
    let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
        .add_limit(|l| {
            l.capacity(CAPACITY)
                .refill_greedy(1, Duration::from_secs(3_600))
        })
        .with_clock(clock)
        .build()
        .expect("valid");
    let taken: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let added: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (keyed, taken, added) = (&keyed, &taken, &added);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t + 1);
                for _ in 0..60_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = x % KEYS;
                    if x.is_multiple_of(97) {
                        keyed.force_add_tokens(&key, 3).expect("valid");
                        added[key as usize].fetch_add(3, Ordering::Relaxed);
                    } else if keyed.try_consume(&key, 1 + x % 2).expect("valid") {
                        taken[key as usize].fetch_add(1 + x % 2, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    for key in 0..KEYS {
        let left = keyed.available_tokens(&key).expect("valid");
        let (t, a) = (
            taken[key as usize].load(Ordering::Relaxed),
            added[key as usize].load(Ordering::Relaxed),
        );
        assert!(left >= 0, "key {key}: {left} tokens");
        assert_eq!(
            t + left as u64,
            CAPACITY + a,
            "key {key}: {t} taken, {left} left, {a} added"
        );
    }
}
