//! An interleaved, single-thread comparison for noisy machines: the success and rejection paths
//! of each local strategy and of governor, and of the keyed limiters (`KeyedBucket` on foldhash
//! and on SipHash, governor's keyed limiter; `String` keys, 1 and 10,000 of them, busy and
//! light), measured in short alternating bursts.
//!
//! Criterion measures one function for seconds, then the next; when other work shares the
//! cores, the load differs between the two windows and the ratio drifts. Here every round
//! runs one short burst of each case in turn, so all cases see the same background; a burst
//! that was preempted is slow, so the *minimum* over many rounds is each case's undisturbed
//! cost and the *median* shows the typical one. Ratios are printed against governor.
//!
//! `cargo run --release -p bucket4rs-benches --bin bucket4rs-interleaved [rounds] [only]`
//!
//! With `only`, just the cases whose name contains it run (for profiling one of them, e.g.
//! under `valgrind --tool=callgrind`); the ratio column then needs governor among them.

use std::cell::Cell;
use std::hash::RandomState;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use bucket4rs_benches::{
    QuantaClock, governor_light, governor_never_dry, governor_slow, keyed_light, keyed_never_dry,
    keyed_slow, keys, never_dry, slow,
};
use bucket4rs_local::{BucketBuilder, Clock as _, FastClock, KeyedBucket, KeyedBucketBuilder};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Operations per burst: long enough to dwarf the timer, short enough to fit a time slice.
const BURST: u32 = 20_000;

struct Case<'a> {
    name: &'static str,
    run: Box<dyn Fn() -> bool + 'a>,
    samples: Vec<f64>,
}

fn case<'a>(name: &'static str, run: impl Fn() -> bool + 'a) -> Case<'a> {
    Case {
        name,
        run: Box::new(run),
        samples: Vec::new(),
    }
}

#[allow(clippy::cast_precision_loss)]
fn measure(cases: &mut [Case<'_>], rounds: usize, only: &str) {
    for _ in 0..rounds {
        for c in cases.iter_mut().filter(|c| c.name.contains(only)) {
            let start = Instant::now();
            for _ in 0..BURST {
                black_box((c.run)());
            }
            c.samples
                .push(start.elapsed().as_nanos() as f64 / f64::from(BURST));
        }
    }
}

/// Like [`measure`], with `threads` threads running each case's `runs` entry together
/// (released by a barrier; `cases` keeps the samples); a sample is the wall time of the burst
/// divided by all operations.
#[allow(clippy::cast_precision_loss)]
fn measure_threads(
    cases: &mut [Case<'_>],
    runs: &[&(dyn Fn() -> bool + Sync)],
    rounds: usize,
    threads: usize,
) {
    for _ in 0..rounds {
        for (c, run) in cases.iter_mut().zip(runs) {
            let barrier = std::sync::Barrier::new(threads);
            let start = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            let start = Instant::now();
                            for _ in 0..BURST * 10 {
                                black_box(run());
                            }
                            start
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("no panic"))
                    .min()
                    .expect("threads")
            });
            let ops = f64::from(BURST * 10) * threads as f64;
            c.samples.push(start.elapsed().as_nanos() as f64 / ops);
        }
    }
}

fn report(title: &str, cases: &mut [Case<'_>], reference: &str) {
    for c in cases.iter_mut() {
        c.samples.sort_by(f64::total_cmp);
    }
    let stat = |c: &Case<'_>| (c.samples[0], c.samples[c.samples.len() / 2]);
    let measured = || cases.iter().filter(|c| !c.samples.is_empty());
    let base = measured().find(|c| c.name == reference).map(stat);
    println!("{title}");
    println!(
        "  {:<14} {:>9} {:>9} {:>12} {:>12}",
        "case", "min ns", "median ns", "min ratio", "median ratio"
    );
    for c in measured() {
        let (min, med) = stat(c);
        let ratio = |x: f64, base: Option<f64>| {
            base.map_or_else(|| "-".to_owned(), |b| format!("{:.2}x", x / b))
        };
        println!(
            "  {:<14} {:>9.2} {:>9.2} {:>12} {:>12}",
            c.name,
            min,
            med,
            ratio(min, base.map(|b| b.0)),
            ratio(med, base.map(|b| b.1))
        );
    }
}

fn main() {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(300);
    let only = std::env::args().nth(2).unwrap_or_default();

    let (lf, sy, un) = (never_dry(), never_dry(), never_dry());
    let gov = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
    compare(
        "success path (try_consume(1) / check())",
        [lf, sy, un],
        gov,
        rounds,
        &only,
    );

    let (lf, sy, un) = (slow(), slow(), slow());
    let gov = RateLimiter::direct(Quota::per_hour(NonZeroU32::MIN));
    compare("rejection path", [lf, sy, un], gov, rounds, &only);

    let all = keys(10_000);
    for n in [1, 10_000] {
        let keys = &all[..n];
        keyed(
            &format!("keyed success path, {n} keys (try_consume(&key, 1) / check_key(&key))"),
            keys,
            [keyed_never_dry(), keyed_never_dry()],
            governor_never_dry(),
            true,
            true,
            rounds,
            &only,
        );
        keyed(
            &format!("keyed rejection path, {n} keys"),
            keys,
            [keyed_slow(), keyed_slow()],
            governor_slow(),
            false,
            true,
            rounds,
            &only,
        );
        keyed(
            &format!("keyed light keys, {n} keys (full again before they come back)"),
            keys,
            [keyed_light(), keyed_light()],
            governor_light(),
            true,
            false,
            rounds,
            &only,
        );
    }

    // Two threads on one limiter, interleaved the same way: aggregate ns per operation.
    if "contention".contains(only.as_str()) {
        let lf = never_dry().build().expect("config");
        let gov = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
        let lf_run = || lf.try_consume(1).expect("valid");
        let gov_run = || gov.check().is_ok();
        let runs: [&(dyn Fn() -> bool + Sync); 2] = [&lf_run, &gov_run];
        let mut cases = [case("lock-free", lf_run), case("governor", gov_run)];
        measure_threads(&mut cases, &runs, rounds / 4 + 1, 2);
        report(
            "success path, 2 threads on one limiter (aggregate ns per operation)",
            &mut cases,
            "governor",
        );
    }

    // The clock reads under both: on one thread the read is most of either limiter's cost.
    let (fast, quanta, gov) = (
        FastClock,
        QuantaClock::new(),
        governor::clock::QuantaClock::default(),
    );
    let origin = governor::clock::Clock::now(&gov);
    let mut cases = [
        case("clock/fast", || fast.now_nanos() > 0),
        case("clock/quanta", || quanta.now_nanos() > 0),
        case("clock/governor", || {
            governor::clock::Clock::now(&gov) >= origin
        }),
    ];
    measure(&mut cases, rounds, &only);
    report("clock read", &mut cases, "clock/governor");
}

/// Builds the three strategies from `builders`, and measures them with `gov` side by side.
fn compare(
    title: &str,
    [lf, sy, un]: [BucketBuilder; 3],
    gov: DefaultDirectRateLimiter,
    rounds: usize,
    only: &str,
) {
    let lf = lf.build().expect("config");
    let sy = sy.build_synchronized().expect("config");
    let un = un.build_unsynchronized().expect("config");
    // One warm-up call each (on the slow configuration it takes the only token).
    let _ = (
        lf.try_consume(1),
        sy.try_consume(1),
        un.try_consume(1),
        gov.check(),
    );
    let mut cases = [
        case("lock-free", || lf.try_consume(1).expect("valid")),
        case("synchronized", || sy.try_consume(1).expect("valid")),
        case("unsync", || un.try_consume(1).expect("valid")),
        case("governor", || gov.check().is_ok()),
    ];
    measure(&mut cases, rounds, only);
    report(title, &mut cases, "governor");
}

/// The keyed limiters on `keys` (each used once first: stored, and drained where `allowed` is
/// false), visited round-robin, each case with its own running index; every answer must be
/// `allowed`, and with `held` every key must still have its bucket at the end (light keys
/// may be forgotten and stored again).
#[allow(clippy::too_many_arguments)]
fn keyed(
    title: &str,
    keys: &[String],
    [fold, sip]: [KeyedBucketBuilder<String>; 2],
    quota: Quota,
    allowed: bool,
    held: bool,
    rounds: usize,
    only: &str,
) {
    let fold: KeyedBucket<String> = fold.build().expect("config");
    let sip: KeyedBucket<String, _, _, RandomState> =
        sip.with_hasher(RandomState::new()).build().expect("config");
    let gov: DefaultKeyedRateLimiter<String> = RateLimiter::dashmap(quota);
    for k in keys {
        let _ = (
            fold.try_consume(k, 1),
            sip.try_consume(k, 1),
            gov.check_key(k),
        );
    }
    let next = |i: &Cell<usize>| {
        let k = i.get();
        i.set(if k + 1 == keys.len() { 0 } else { k + 1 });
        &keys[k]
    };
    let (a, b, c) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let check = |ok: bool| {
        assert!(ok, "an answer other than {allowed}");
        ok
    };
    let mut cases = [
        case("keyed/foldhash", || {
            check(matches!(fold.try_consume(next(&a), 1), Ok(x) if x == allowed))
        }),
        case("keyed/siphash", || {
            check(matches!(sip.try_consume(next(&b), 1), Ok(x) if x == allowed))
        }),
        case("governor keyed", || {
            check(gov.check_key(next(&c)).is_ok() == allowed)
        }),
    ];
    measure(&mut cases, rounds, only);
    report(title, &mut cases, "governor keyed");
    if !held {
        return;
    }
    assert_eq!(
        (fold.len(), sip.len(), gov.len()),
        (keys.len(), keys.len(), keys.len()),
        "a key was dropped"
    );
}
