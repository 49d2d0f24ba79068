//! A small program per feature of the facade, written as a user would, naming only
//! `bucket4rs::…`: the types, traits and builders a user spells out in their own code (a
//! function generic over the strategy needs `Storage`, a configuration built apart needs
//! `ConfigurationBuilder`, …).
//!
//! Each module compiles with its feature alone: `cargo xtask test` runs
//! `cargo check -p bucket4rs --tests --no-default-features --features <feature>` for every
//! feature (and none), so a re-export missing under one feature fails there, which
//! `--all-features` alone would hide. `cargo test` runs the programs with every feature.

/// No feature: the pure core.
mod core_only {
    use std::time::Duration;

    use bucket4rs::{
        Bandwidth, BucketConfiguration, BucketState, Clock, ConfigError, ConfigurationBuilder,
        ConsumptionProbe, ManualClock, TokensInheritanceStrategy, VerboseResult,
    };

    /// A configuration built in a helper, as an application does from its settings.
    fn per_minute(builder: ConfigurationBuilder, n: u64) -> ConfigurationBuilder {
        builder.add_limit(|l| l.capacity(n).refill_greedy(n, Duration::from_secs(60)))
    }

    fn retry_after(probe: &ConsumptionProbe) -> Option<u64> {
        probe.retry_after_secs()
    }

    #[test]
    fn core_only() -> Result<(), Box<dyn std::error::Error>> {
        let config = per_minute(BucketConfiguration::builder(), 20)
            .add_bandwidth(Bandwidth::simple(1_000, Duration::from_secs(3600))?)
            .build()?;
        let clock = ManualClock::new(0);
        let mut state = BucketState::new(&config, clock.now_nanos());
        assert!(state.apply(
            &config,
            clock.now_nanos(),
            &bucket4rs::core::ops::TryConsume(20)
        )?);
        let probe = state.apply(
            &config,
            clock.now_nanos(),
            &bucket4rs::core::ops::TryConsumeAndReturnRemaining(1),
        )?;
        assert_eq!(retry_after(&probe), Some(3));
        let verbose: VerboseResult<ConsumptionProbe> =
            VerboseResult::new(probe, config.clone(), state.clone(), clock.now_nanos());
        assert_eq!(verbose.available_tokens_per_bandwidth(), [0, 980]);
        let bigger = per_minute(BucketConfiguration::builder(), 40).build()?;
        let wall = clock.is_wall_clock_based();
        let state = state.replace_configuration(
            &config,
            &bigger,
            0,
            TokensInheritanceStrategy::Reset,
            wall,
        )?;
        assert_eq!(state.available_tokens(&bigger, 0), 40);
        let bad: Result<_, ConfigError> = BucketConfiguration::builder()
            .add_limit(|l| l.capacity(0).refill_greedy(1, Duration::from_secs(1)))
            .build();
        assert_eq!(bad, Err(ConfigError::ZeroCapacity));
        Ok(())
    }
}

#[cfg(feature = "local")]
mod local {
    use std::time::Duration;

    use bucket4rs::{
        Bucket, BucketListener, Clock, NewStorage, Storage, SynchronizationStrategy,
        UnknownStrategy, VerboseBucket,
    };

    /// Generic over the synchronization strategy (and clock and listener).
    fn drain<S: Storage, C: Clock, L: BucketListener>(bucket: &Bucket<S, C, L>) -> u64 {
        bucket.try_consume_as_much_as_possible()
    }

    fn make<S: NewStorage>() -> Result<Bucket<S>, bucket4rs::ConfigError> {
        Bucket::builder()
            .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
            .build_storage::<S>()
    }

    fn headers<S: Storage, C: Clock, L: BucketListener>(v: &VerboseBucket<'_, S, C, L>) -> i64 {
        v.available_tokens().into_value()
    }

    #[test]
    fn local() -> Result<(), Box<dyn std::error::Error>> {
        let bucket = make::<bucket4rs::Synchronized>()?;
        assert_eq!(headers(&bucket.as_verbose()), 10);
        assert_eq!(drain(&bucket), 10);
        let strategy: Result<SynchronizationStrategy, UnknownStrategy> = "spin".parse();
        assert!(strategy.is_err());
        let shared = Bucket::builder()
            .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(60)))
            .build_with("lock_free".parse()?)?;
        assert!(shared.try_consume(2)?);
        Ok(())
    }
}

#[cfg(feature = "serde")]
mod serde {
    use std::time::Duration;

    use bucket4rs::{BucketConfiguration, BucketState};

    #[test]
    fn serde() -> Result<(), Box<dyn std::error::Error>> {
        let config = BucketConfiguration::builder()
            .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
            .build()?;
        let state = BucketState::new(&config, 0);
        let text = serde_json::to_string(&(&config, &state))?;
        let (back, _): (BucketConfiguration, BucketState) = serde_json::from_str(&text)?;
        assert_eq!(back, config);
        Ok(())
    }
}

#[cfg(feature = "blocking")]
mod blocking {
    use std::time::Duration;

    use bucket4rs::blocking::{BlockingBucketExt, ManualClockPark, WaitError};
    use bucket4rs::{Bucket, ManualClock};

    #[test]
    fn blocking() -> Result<(), Box<dyn std::error::Error>> {
        let clock = ManualClock::new(0);
        let bucket = Bucket::builder()
            .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
            .with_clock(clock.clone())
            .build()?;
        let park = ManualClockPark::new(clock);
        let waited: Result<_, WaitError> =
            bucket.as_blocking().as_verbose().consume_with(12, &park);
        assert_eq!(*waited?.value(), Duration::from_millis(200));
        // Empty now: the next token is 100 ms away, more than the 1 ms allowed.
        assert!(
            !bucket
                .as_blocking()
                .try_consume(1, Duration::from_millis(1))?
        );
        Ok(())
    }
}

#[cfg(feature = "async")]
mod asynchronous {
    use std::time::Duration;

    use bucket4rs::Bucket;
    use bucket4rs::asynchronous::{AsyncBucketExt, Sleeper};

    /// Any runtime's sleep: here one that does not sleep at all.
    fn instant() -> impl Sleeper + Clone {
        |_: Duration| std::future::ready(())
    }

    #[test]
    fn asynchronous() -> Result<(), Box<dyn std::error::Error>> {
        let bucket = Bucket::builder()
            .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1)))
            .build()?;
        let limiter = bucket.with_sleeper(instant());
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        let r = rt.block_on(limiter.as_verbose().consume(3))?;
        assert_eq!(r.available_tokens(), -1);
        Ok(())
    }
}

#[cfg(feature = "tokio")]
mod tokio_runtime {
    use std::time::Duration;

    use bucket4rs::Bucket;
    use bucket4rs::asynchronous::{AsyncBucketExt, TokioClock};

    #[tokio::test(start_paused = true)]
    async fn tokio_runtime() -> Result<(), Box<dyn std::error::Error>> {
        let bucket = Bucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
            .with_clock(TokioClock::new())
            .build()?;
        let start = tokio::time::Instant::now();
        bucket.as_async().consume(2).await?;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        Ok(())
    }
}

#[cfg(feature = "listeners")]
mod listeners {
    use bucket4rs::BucketListener;
    use bucket4rs::listeners::SimpleBucketListener;

    #[test]
    fn listeners() {
        let counts = SimpleBucketListener::new();
        counts.on_consumed(3);
        counts.on_rejected(1);
        assert_eq!((counts.consumed(), counts.rejected()), (3, 1));
    }
}

#[cfg(feature = "metrics")]
mod metrics {
    use bucket4rs::BucketListener;
    use bucket4rs::listeners::MetricsListener;

    #[test]
    fn metrics() {
        let listener = MetricsListener::new("login");
        listener.on_consumed(1); // no recorder installed: a no-op
        assert_eq!(listener.name(), "login");
    }
}

#[cfg(feature = "tracing")]
mod tracing {
    use bucket4rs::BucketListener;
    use bucket4rs::listeners::TracingListener;

    #[test]
    fn tracing() {
        let listener = TracingListener::new("login");
        listener.on_rejected(1); // no subscriber: nothing printed
        assert_eq!(listener.name(), "login");
    }
}

#[cfg(feature = "distributed")]
mod distributed {
    use std::time::Duration;

    use bucket4rs::BucketConfiguration;
    use bucket4rs::distributed::{EmbeddedBackend, ProxyManager};

    #[test]
    fn distributed() -> Result<(), Box<dyn std::error::Error>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let manager = ProxyManager::new(EmbeddedBackend::new());
            let config = BucketConfiguration::builder()
                .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60)))
                .build()?;
            let bucket = manager
                .builder()
                .build("tenant-7", move || config.clone())?;
            let probe = bucket.try_consume_and_return_remaining(1).await?;
            assert_eq!(probe.remaining_tokens(), 99);
            Ok(())
        })
    }
}

#[cfg(feature = "redis")]
mod redis {
    use bucket4rs::distributed::{RedisBackend, RedisOptions};

    #[test]
    fn redis() {
        let _options = RedisOptions::default();
        let _type_exists: Option<RedisBackend> = None;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use bucket4rs::distributed::{PostgresBackend, PostgresOptions};

    #[test]
    fn postgres() {
        let _options = PostgresOptions::default();
        let _type_exists: Option<PostgresBackend> = None;
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use bucket4rs::distributed::{SqliteBackend, SqliteOptions};

    #[test]
    fn sqlite() {
        let _options = SqliteOptions::default();
        let _type_exists: Option<SqliteBackend> = None;
    }
}

#[cfg(feature = "tower")]
mod tower {
    use std::time::Duration;

    use bucket4rs::BucketConfiguration;
    use bucket4rs::tower::{FailurePolicy, KeyExtractor, Plan, RateLimitLayer};

    #[test]
    fn tower() -> Result<(), Box<dyn std::error::Error>> {
        let free = BucketConfiguration::builder()
            .add_limit(|l| l.capacity(20).refill_greedy(20, Duration::from_secs(60)))
            .build()?;
        let _layer = RateLimitLayer::builder()
            .key(KeyExtractor::header("x-api-key"))
            .plans(Plan::new("free", free))
            .failure_policy(FailurePolicy::deny())
            .build()?;
        Ok(())
    }

    /// With `distributed` too, the layer takes a shared store.
    #[cfg(feature = "distributed")]
    #[test]
    fn tower_on_a_shared_store() {
        use bucket4rs::distributed::{EmbeddedBackend, ProxyManager};
        let _builder = RateLimitLayer::builder().backend(ProxyManager::new(EmbeddedBackend::new()));
    }
}

#[cfg(feature = "axum")]
mod axum {
    use bucket4rs::tower::KeyExtractor;

    #[test]
    fn axum() {
        let _by_ip = KeyExtractor::client_ip(); // also reads axum's `ConnectInfo`
    }
}
