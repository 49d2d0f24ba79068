//! `ConsumptionProbe::retry_after_secs` and `is_never_possible`, and the deferred errors of
//! `ConfigurationBuilder::add_limit`.

use core::time::Duration;

use bucket4rs_core::{BucketConfiguration, BucketState, ConfigError, ConsumptionProbe, MAX_NANOS};

const SEC: u64 = 1_000_000_000;

fn refused(wait_nanos: u64) -> ConsumptionProbe {
    ConsumptionProbe::new(false, 0, wait_nanos, wait_nanos)
}

#[test]
fn retry_after_is_none_when_consumed() {
    assert_eq!(
        ConsumptionProbe::new(true, 3, 0, 5).retry_after_secs(),
        None
    );
    // Even a consumed probe with a nonsensical wait: consumed means no header.
    assert_eq!(
        ConsumptionProbe::new(true, 0, 7 * SEC, 0).retry_after_secs(),
        None
    );
}

#[test]
fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
    let cases = [
        (0, 1), // a refused probe never reports 0, but a decoded one might: still 1
        (1, 1),
        (400_000_000, 1),
        (SEC - 1, 1),
        (SEC, 1),
        (SEC + 1, 2),
        (2 * SEC + 500_000_000, 3),
        (60 * SEC, 60),
    ];
    for (nanos, secs) in cases {
        assert_eq!(refused(nanos).retry_after_secs(), Some(secs), "{nanos} ns");
    }
}

#[test]
fn retry_after_saturates_for_a_request_that_can_never_be_served() {
    let never = refused(MAX_NANOS);
    assert!(never.is_never_possible());
    assert_eq!(never.retry_after_secs(), Some(MAX_NANOS.div_ceil(SEC)));
    assert_eq!(never.retry_after_secs(), Some(9_223_372_037));
    // Above MAX_NANOS (a decoded value) cannot overflow either.
    assert_eq!(
        refused(u64::MAX).retry_after_secs(),
        Some(u64::MAX.div_ceil(SEC))
    );
    assert!(refused(u64::MAX).is_never_possible());
}

#[test]
fn never_possible_only_for_refused_requests_above_a_capacity()
-> Result<(), Box<dyn std::error::Error>> {
    let config = BucketConfiguration::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(4)))
        .build()?;
    let mut state = BucketState::new(&config, 0);
    let served = state.apply(
        &config,
        0,
        &bucket4rs_core::ops::TryConsumeAndReturnRemaining(10),
    )?;
    assert!(!served.is_never_possible());
    let later = state.apply(
        &config,
        0,
        &bucket4rs_core::ops::TryConsumeAndReturnRemaining(10),
    )?;
    assert!(!later.is_consumed());
    assert!(!later.is_never_possible());
    assert_eq!(later.retry_after_secs(), Some(4));
    let one = state.apply(
        &config,
        0,
        &bucket4rs_core::ops::TryConsumeAndReturnRemaining(1),
    )?;
    assert_eq!(one.wait_for_refill(), Duration::from_millis(400));
    assert_eq!(one.retry_after_secs(), Some(1));
    let too_big = state.apply(
        &config,
        0,
        &bucket4rs_core::ops::TryConsumeAndReturnRemaining(11),
    )?;
    assert!(too_big.is_never_possible());
    assert_eq!(too_big.retry_after_secs(), Some(9_223_372_037));
    Ok(())
}

#[test]
fn waiting_retry_after_seconds_is_always_enough() -> Result<(), Box<dyn std::error::Error>> {
    // 7 tokens per 3 s: waits that are not whole seconds (nor whole milliseconds).
    let config = BucketConfiguration::builder()
        .add_limit(|l| l.capacity(7).refill_greedy(7, Duration::from_secs(3)))
        .build()?;
    for tokens in 1..=7 {
        let mut state = BucketState::new(&config, 0);
        state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(7))?;
        let probe = state.apply(
            &config,
            0,
            &bucket4rs_core::ops::TryConsumeAndReturnRemaining(tokens),
        )?;
        let secs = probe.retry_after_secs().ok_or("refused")?;
        assert!(secs * SEC >= probe.wait_for_refill().as_nanos() as u64);
        assert!((secs - 1) * SEC < probe.wait_for_refill().as_nanos() as u64);
        let at = i64::try_from(secs * SEC)?;
        assert!(
            state.apply(&config, at, &bucket4rs_core::ops::TryConsume(tokens))?,
            "{tokens} tokens after {secs} s"
        );
    }
    Ok(())
}

#[test]
fn configuration_builder_reports_the_first_bad_limit_at_build() {
    let secs = Duration::from_secs;
    let err = BucketConfiguration::builder()
        .add_limit(|l| l.capacity(5).refill_greedy(5, secs(1)).id("a"))
        .add_limit(|l| l.capacity(0).refill_greedy(1, secs(1)))
        .add_limit(|l| l.capacity(1)) // no refill: a second error, not reported
        .add_limit(|l| l.capacity(5).refill_greedy(5, secs(1)).id("a")) // duplicate id too
        .build();
    assert_eq!(err, Err(ConfigError::ZeroCapacity));

    // A bad limit is reported before the configuration's own rules.
    let only_bad = BucketConfiguration::builder()
        .add_limit(|l| l.refill_greedy(1, secs(1)))
        .build();
    assert_eq!(only_bad, Err(ConfigError::MissingCapacity));

    // Good limits from both forms, in order.
    let ok = BucketConfiguration::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, secs(1)))
        .add_bandwidth(bucket4rs_core::Bandwidth::simple(2, secs(1)).expect("a valid bandwidth"))
        .build()
        .expect("a valid configuration");
    let capacities: Vec<u64> = ok.bandwidths().iter().map(|b| b.capacity()).collect();
    assert_eq!(capacities, [1, 2]);
}
