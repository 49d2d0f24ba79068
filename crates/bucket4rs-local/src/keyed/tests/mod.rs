//! Unit tests of the keyed map: its memory per entry, the work of the key cap (counted, not
//! timed), forgetting with a second chance, a stress test that counts every token of every key
//! while other threads sweep, remove, replace and hit the cap, and (under
//! `--cfg bucket4rs_loom`, `cargo xtask loom`) the loom models of the map's protocol.

#[cfg(bucket4rs_loom)]
mod loom;
#[cfg(not(bucket4rs_loom))]
mod stress;

#[cfg(not(bucket4rs_loom))]
mod unit {
    use core::time::Duration;

    use crate::{KeyedBucket, KeyedError, ManualClock};

    use super::super::Ordering;

    #[test]
    fn an_entry_is_sixteen_bytes() {
        // A key's whole bucket beside its key in the map: the memory figure per key rests on it.
        assert_eq!(core::mem::size_of::<super::super::Entry>(), 16);
    }

    /// A cap full of buckets that can never be forgotten (they start short of capacity).
    fn never_forgettable(cap: usize, clock: &ManualClock) -> KeyedBucket<u64, ManualClock> {
        KeyedBucket::builder()
            .add_limit(|l| {
                l.capacity(10)
                    .refill_greedy(10, Duration::from_secs(1))
                    .initial_tokens(5)
            })
            .with_clock(clock.clone())
            .max_keys(cap)
            .build()
            .expect("valid")
    }

    #[test]
    fn refused_new_keys_at_a_full_cap_cost_no_sweep() {
        let clock = ManualClock::monotonic(0);
        let cap = 1_000;
        let keyed = never_forgettable(cap, &clock);
        for k in 0..cap as u64 {
            assert!(keyed.try_consume(&k, 1).expect("valid"));
        }
        let visited = || keyed.shared.visited.load(Ordering::Relaxed);
        let before = visited();
        // The first refused key sweeps once (and finds that nothing can ever go); the next
        // ten thousand look at no entry at all, whatever the time.
        for k in 0..10_000_u64 {
            clock.advance(Duration::from_secs(1));
            let new = cap as u64 + k;
            assert_eq!(
                keyed.try_consume(&new, 1),
                Err(KeyedError::TooManyKeys { max: cap })
            );
        }
        assert_eq!(
            visited() - before,
            cap,
            "one sweep of the full map, then none"
        );
        // Known keys are served as before.
        assert!(keyed.try_consume(&7, 1).expect("valid"));
        // A removal makes room at once, without a sweep.
        assert!(keyed.remove(&7));
        assert!(keyed.try_consume(&u64::MAX, 1).expect("valid"));
        assert_eq!(visited() - before, cap);
        assert_eq!(keyed.len(), cap);
        // The bucket it stored can never go either: refusals still look at nothing.
        for k in 0..1_000_u64 {
            clock.advance(Duration::from_secs(1));
            assert!(keyed.try_consume(&(20_000 + k), 1).is_err());
        }
        assert_eq!(visited() - before, cap);
    }

    #[test]
    fn a_bucket_stored_at_the_cap_sets_when_the_next_refusal_looks() {
        let clock = ManualClock::monotonic(0);
        // One token a second: a bucket short of n tokens is full again n seconds later.
        let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(100)))
            .with_clock(clock.clone())
            .max_keys(10)
            .build()
            .expect("valid");
        for k in 0..10_u64 {
            assert!(keyed.try_consume(&k, 50).expect("valid"));
        }
        let visited = || keyed.shared.visited.load(Ordering::Relaxed);
        // Full: the sweep finds that nothing can go for 50 s.
        assert!(keyed.try_consume(&100, 1).is_err());
        assert_eq!(visited(), 10);
        // A removal makes room; the bucket stored there can go after 1 s, not 50.
        assert!(keyed.remove(&0));
        assert!(keyed.try_consume(&200, 1).expect("valid"));
        clock.advance(Duration::from_millis(500));
        assert!(keyed.try_consume(&300, 1).is_err(), "nothing can go yet");
        assert_eq!(visited(), 10, "and the map knows it without looking");
        clock.advance(Duration::from_millis(500));
        assert!(keyed.try_consume(&400, 1).expect("key 200 went"));
        assert_eq!(visited(), 20);
        assert!(keyed.snapshot(&200).is_none());
    }

    #[test]
    fn at_the_cap_a_sweep_waits_for_the_first_bucket_that_can_go() {
        let clock = ManualClock::monotonic(0);
        let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(100)))
            .with_clock(clock.clone())
            .max_keys(100)
            .build()
            .expect("valid");
        // Key k is full again k + 1 seconds from now.
        for k in 0..100_u64 {
            assert!(keyed.try_consume(&k, k + 1).expect("valid"));
        }
        let visited = || keyed.shared.visited.load(Ordering::Relaxed);
        assert_eq!(
            keyed.try_consume(&1_000, 1),
            Err(KeyedError::TooManyKeys { max: 100 })
        );
        assert_eq!(visited(), 100);
        // Until key 0 is full (1 s), new keys are refused without a look.
        clock.advance(Duration::from_millis(999));
        for k in 1_001..2_000_u64 {
            assert!(keyed.try_consume(&k, 1).is_err());
        }
        assert_eq!(visited(), 100);
        // Then one sweep forgets key 0 and the new key takes its place.
        clock.advance(Duration::from_millis(1));
        assert!(keyed.try_consume(&2_000, 1).expect("valid"));
        assert_eq!(visited(), 200);
        assert_eq!(keyed.len(), 100);
        assert!(keyed.snapshot(&0).is_none());
        // The new key's bucket can go at 2 s, as key 1's: the next refusal looks again then.
        clock.advance(Duration::from_secs(1));
        assert!(keyed.try_consume(&3_000, 1).expect("valid"));
        assert_eq!(visited(), 300);
        assert!(keyed.snapshot(&1).is_none() && keyed.snapshot(&2_000).is_none());
    }

    #[test]
    fn a_replaced_configuration_at_the_cap_makes_the_next_refusal_look_again() {
        use crate::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
        let clock = ManualClock::monotonic(0);
        let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(10)))
            .with_clock(clock.clone())
            .max_keys(1)
            .build()
            .expect("valid");
        // Key 0 under another configuration: never forgotten, so a new key finds no room,
        // and the map notes that none will come.
        let other = BucketConfiguration::new(vec![
            Bandwidth::simple(5, Duration::from_secs(1)).expect("valid"),
        ])
        .expect("valid");
        keyed
            .replace_configuration(&0, other, TokensInheritanceStrategy::AsIs)
            .expect("room");
        assert!(keyed.try_consume(&1, 1).is_err());
        // Back to the key's own configuration, full: it can go, and a new key then finds room.
        keyed
            .replace_configuration(
                &0,
                BucketConfiguration::new(vec![
                    Bandwidth::simple(10, Duration::from_secs(10)).expect("valid"),
                ])
                .expect("valid"),
                TokensInheritanceStrategy::Reset,
            )
            .expect("valid");
        clock.advance(Duration::from_secs(1));
        assert_eq!(keyed.try_consume(&1, 1), Ok(true), "key 0 went");
        assert!(keyed.snapshot(&0).is_none());
    }

    #[test]
    fn light_keys_that_come_back_keep_their_buckets() {
        // 5,000 keys in turn, a microsecond apart; each is full again 1 ms after its call,
        // long before it comes back (5 ms later): the regime of a per-client limit most
        // clients stay well under.
        let clock = ManualClock::monotonic(0);
        let keyed: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_millis(10)))
            .with_clock(clock.clone())
            .build()
            .expect("valid");
        let keys: Vec<String> = (0..5_000).map(|i| format!("k{i}")).collect();
        let visited = || keyed.shared.visited.load(Ordering::Relaxed);
        let mut after_round = Vec::new();
        for _ in 0..10 {
            for k in &keys {
                assert!(keyed.try_consume(k.as_str(), 1).expect("valid"));
                clock.advance(Duration::from_micros(1));
            }
            after_round.push((visited(), keyed.len()));
        }
        // The map grows to the working set while it is first met, then is left alone: no
        // sweep forgets keys that come straight back, so nothing is stored again.
        assert_eq!(after_round[1], after_round[9], "rounds: {after_round:?}");
        assert_eq!(keyed.len(), keys.len());
        // Every bucket is forgettable (full) a millisecond after the last round, and an
        // explicit sweep forgets them all.
        clock.advance(Duration::from_millis(1));
        assert_eq!(keyed.sweep(), keys.len());
        assert!(keyed.is_empty());
    }

    #[test]
    fn an_automatic_sweep_spares_what_was_touched_since_the_last_one() {
        let clock = ManualClock::monotonic(0);
        let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_millis(1)))
            .with_clock(clock.clone())
            .build()
            .expect("valid");
        let mut next = 0_u64;
        let mut store = |n: u64| {
            for _ in 0..n {
                assert!(keyed.try_consume(&next, 1).expect("valid"));
                next += 1;
            }
        };
        // 1,025 keys make the first automatic sweep (after 1,024): nothing was forgettable
        // before it, so it forgets nothing, although all but the last are full by then.
        store(1_024);
        clock.advance(Duration::from_secs(2));
        store(1);
        assert_eq!(keyed.len(), 1_025);
        // Touch key 0 again; 1,026 more keys make the next sweep (the map doubled past 2,050):
        // it forgets the 1,023 keys full at the last sweep (and for over a second) and
        // untouched since, and keeps key 0.
        assert!(keyed.try_consume(&0, 1).expect("valid"));
        clock.advance(Duration::from_secs(2));
        store(1_026);
        assert_eq!(keyed.len(), 1 + 1 + 1_026, "key 0, key 1,024, the new keys");
        assert!(keyed.snapshot(&0).is_some());
        assert!(keyed.snapshot(&1).is_none());
    }

    #[test]
    fn a_working_set_visited_in_turn_is_not_forgotten_key_by_key() {
        // 10,000 keys in turn, a microsecond apart, each full again a nanosecond after its
        // call: larger than what a sweep during the first round leaves. Every key was full at
        // the last sweep; none has been for a second, so none is forgotten, and after the
        // first round no call stores its key again.
        let clock = ManualClock::monotonic(0);
        let keyed: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
            .add_limit(|l| {
                l.capacity(1_000)
                    .refill_greedy(1_000, Duration::from_micros(1))
            })
            .with_clock(clock.clone())
            .build()
            .expect("valid");
        let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
        let visited = || keyed.shared.visited.load(Ordering::Relaxed);
        let mut after_round = Vec::new();
        for _ in 0..5 {
            for k in &keys {
                assert!(keyed.try_consume(k.as_str(), 1).expect("valid"));
                clock.advance(Duration::from_micros(1));
            }
            after_round.push((visited(), keyed.len()));
        }
        assert_eq!(after_round[1], after_round[4], "rounds: {after_round:?}");
        assert_eq!(keyed.len(), keys.len());
        // Two seconds later, new keys make the map sweep (twice: a second chance), and it
        // forgets the working set that went idle; the new keys, met within a second, stay.
        clock.advance(Duration::from_secs(2));
        for i in 0..40_000 {
            assert!(
                keyed
                    .try_consume(format!("new{i}").as_str(), 1)
                    .expect("valid")
            );
            clock.advance(Duration::from_micros(1));
        }
        assert!(
            keys.iter().all(|k| keyed.snapshot(k.as_str()).is_none()),
            "idle for 2 s: forgotten"
        );
        assert_eq!(keyed.len(), 40_000);
    }
}
