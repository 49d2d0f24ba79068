//! A fleet of processes leasing one hot key, simulated deterministically.
//!
//! One thread, one tokio current-thread runtime on paused time (`start_paused`): simulated
//! seconds cost only the work done in them, and the same seed gives the same run. Every
//! process is a real [`ProxyManager`] with [`Leasing`] on (`processes(n)`, the other settings
//! the defaults), a client clock reading tokio's clock ([`TokioClock`]), the circuit breaker
//! off and three attempts without backoff (the retry jitter would draw from a thread RNG). All
//! of them reach one shared [`EmbeddedBackend`] through a simulated network of their own
//! ([`Link`], a public [`Backend`] that says it is not in process): each request waits half
//! of a round trip drawn from the latency range, is lost (not applied: a retryable
//! `Unavailable`) or applied, then its reply waits the other half and is lost (applied: an
//! `InDoubt` error, which the manager settles) or delivered. Round trips are counted there.
//!
//! **Traffic** on the key `hot` (`capacity` tokens, refilled `capacity` per second), one
//! token per request, every millisecond: skewed (the processes' shares follow Zipf's law,
//! `1 / rank`) and bursty (the fleet alternates surges offered twice the refill and lulls
//! offered 0.2 to 0.9 of it, 250 ms to 1.5 s each, so that some lulls fill the bucket and
//! others do not; every process is on for 50 to 750 ms, then off for 50 to 350 ms, and sends
//! nothing while off). Processes crash: an exponential clock picks one; it is killed (its
//! calls in flight aborted, its link cut so that nothing of it reaches the store again, its
//! manager never dropped, as a killed process's is not: a drop would give the leases back),
//! what it held is read just before (`leased_tokens`), and it comes back 200 ms later as a
//! new manager. After the traffic stops, the run goes on for three seconds so that every
//! call is answered and every doubt settled.
//!
//! **Checks**, at every answer, in the order the answers came (`u` its time; `K` the
//! capacity, `P` = 1 s the refill period; `G(u)` the tokens granted by then):
//! - *No over-grant, total*: `G(u) ≤ K + K·u/P` (the shared bucket starts full).
//! - *No over-grant, windowed* (lease-time accounting, as `docs/distributed.md` states it):
//!   for every `a ≤ u`, `G(u) − G(a⁻) ≤ K + K·(u − a + W)/P` with `W` = the lease lifetime
//!   (a lease serves until a lifetime after its round trip was sent, before the shared
//!   bucket gave it out).
//! - *No over-grant, attributed*: for every millisecond `a ≤ u`, the grants answered in
//!   `[a, u]` whose call was sent at or after `a` by a process whose latest round trip that
//!   took a lease (as the network saw it) started at or after `a` are at most
//!   `K + K·(u − a)/P`. A grant's tokens left the shared bucket at its own round trip (its
//!   batch's, after the call was sent) or at the start of the round trip that took the lease
//!   it was served from (a round trip ends the lease before it), so these tokens left the
//!   shared bucket in `[a, u]`; with exact returns the bucket's
//!   history is one bucket's, each take reduced to what was used of it, which gives out at
//!   most `K` plus the refill over `[a, u]`. Unlike the windowed form it has no lifetime of
//!   slack, so it sees a return that gives back tokens the bucket never lacked (one "capped
//!   at capacity"): the windowed form forgives up to a lifetime of refill.
//! - *Under-grant bounded*, against a reference: one exact core bucket (the same
//!   configuration) fed every answered request at its answer time, in answer order. `D(u)` =
//!   the reference's grants minus the fleet's. A *busy period* starts at every millisecond at
//!   which the reference is full and the fleet holds as much (the shared bucket, read from
//!   the store, plus every live lease: `σ + H ≥ K`); from its start `f`,
//!   `D(u) − D(f) ≤ 3·min(n, 24)·lease_cap` (tokens in live leases, in returns on their way
//!   back, and views made stale by others' returns) `+ ⌈K·d/P⌉` (`d` the longest reply leg: the
//!   reference decides a round trip's call that much later) `+` the calls in flight at `f`
//!   `+` for every crash since `f`, what it held `+ (1 + lease_cap)` per transaction in
//!   flight or call in doubt `+ lease_cap` (a return not yet made) `+` per call in doubt in a
//!   live process (at the last millisecond, or whose reply was lost since), `1 + lease_cap`
//!   (its token and its lease are out until it is settled).
//!   Per busy period, because what was not granted before the buckets filled up again is
//!   gone for both and stays in `D`, which is cumulative. Calls that failed (an error) are
//!   answered by neither: the reference does not see them.
//!
//! The report's under-grant is `D` at the end (the reference's grants minus the fleet's, a
//! sum over the busy periods), and the worst busy period against its bound.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_async::TokioClock;
use bucket4rs_core::ops::TryConsume;
use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, Clock};
use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, CircuitBreaker, Command, EmbeddedBackend, Leasing,
    ProxyManager, RemoteBucket, RetryPolicy, StorageKey, TimeSource, Transaction, format,
};
use rand::distr::weighted::WeightedIndex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

/// One step of the driver: arrivals, phases and checks of the busy periods run every
/// millisecond (answers are checked at their own times).
const TICK: i64 = 1_000_000;
const SECOND: i64 = 1_000_000_000;
/// The lease lifetime of `Leasing::new()`.
const LIFETIME: i64 = SECOND;
/// How long the run goes on after the traffic stops.
const DRAIN_TICKS: i64 = 3_000;
/// How long a crashed process stays down.
const DOWN: i64 = 200 * TICK;

/// What to simulate.
#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    /// Processes (each a manager).
    pub(crate) processes: usize,
    /// The key's capacity, refilled as many tokens per second.
    pub(crate) capacity: u64,
    /// Simulated seconds of traffic.
    pub(crate) seconds: u64,
    /// Seeds the traffic, the network and the crashes.
    pub(crate) seed: u64,
    /// The round trip's range (uniform), split evenly between request and reply.
    pub(crate) latency: (Duration, Duration),
    /// The fraction of requests lost (not applied) and of replies lost (applied).
    pub(crate) loss: (f64, f64),
    /// Crashes per process and simulated second.
    pub(crate) crash_rate: f64,
}

impl Scenario {
    /// The standard fleet: 0.5 to 1.5 ms round trips, 0.5 % of requests and 0.5 % of
    /// replies lost, a crash per process every 20 s on average.
    pub(crate) fn fleet(processes: usize, capacity: u64, seconds: u64) -> Self {
        Self {
            processes,
            capacity,
            seconds,
            seed: 31,
            latency: (Duration::from_micros(500), Duration::from_micros(1500)),
            loss: (0.005, 0.005),
            crash_rate: 0.05,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Report {
    pub(crate) processes: usize,
    pub(crate) capacity: u64,
    pub(crate) lease_cap: u64,
    /// Calls made, granted, refused, failed (an error: timeouts, lost replies).
    pub(crate) requests: u64,
    pub(crate) granted: u64,
    pub(crate) refused: u64,
    pub(crate) failed: u64,
    /// What the reference granted of the answered calls.
    pub(crate) reference_granted: u64,
    /// Requests sent over the simulated network (retries and settlements included).
    pub(crate) round_trips: u64,
    /// Requests lost (not applied) and replies lost (applied, in doubt).
    pub(crate) lost: (u64, u64),
    pub(crate) crashes: u64,
    /// What the crashed processes held in leases just before.
    pub(crate) lost_to_crashes: u64,
    /// The most tokens the live processes held in leases at once (read every millisecond).
    pub(crate) max_held: u64,
    /// Busy periods begun (the reference full and the fleet holding as much).
    pub(crate) busy_periods: u64,
    /// The worst busy period: its under-grant, and its bound then.
    pub(crate) worst_under: i64,
    pub(crate) worst_bound: i64,
    /// How close the grants came to the nearest no-over-grant bound, in tokens.
    pub(crate) closest_over: i64,
    /// The 99th percentile of the time from a call to its answer, in microseconds.
    pub(crate) p99_micros: u64,
    /// A hash of every answer (time, process, outcome): equal for equal runs.
    pub(crate) digest: u64,
}

impl Report {
    /// Round trips per call.
    pub(crate) fn round_trips_per_call(&self) -> f64 {
        self.round_trips as f64 / self.requests.max(1) as f64
    }

    /// The table's header (markdown).
    pub(crate) fn header() -> &'static str {
        "| processes | calls | round trips / call | granted | under-grant (% of grants) | worst busy period: under-grant / bound | over-grant | failed calls | p99 answer | most tokens in leases | crashes: tokens lost |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }

    /// What the table leaves out: the key, the lease cap, refusals, the reference's grants,
    /// losses on the network, busy periods and the run's digest.
    pub(crate) fn details(&self) -> String {
        format!(
            "{} processes: a key of {} tokens refilled {} a second, leases of at most {}; \
             {} refused; the reference granted {}; {} requests and {} replies lost; {} busy \
             periods; digest {:016x}",
            self.processes,
            self.capacity,
            self.capacity,
            self.lease_cap,
            self.refused,
            self.reference_granted,
            self.lost.0,
            self.lost.1,
            self.busy_periods,
            self.digest,
        )
    }

    /// One row of the table.
    pub(crate) fn row(&self) -> String {
        let under = self.reference_granted as i64 - self.granted as i64;
        format!(
            "| {} | {} | {:.3} | {} | {} ({:.2} %) | {} / {} | 0 (margin {}) | {} | {:.1} ms | {} | {}: {} |",
            self.processes,
            self.requests,
            self.round_trips_per_call(),
            self.granted,
            under,
            100.0 * under as f64 / self.granted.max(1) as f64,
            self.worst_under,
            self.worst_bound,
            self.closest_over,
            self.failed,
            self.p99_micros as f64 / 1000.0,
            self.max_held,
            self.crashes,
            self.lost_to_crashes,
        )
    }
}

/// Runs a scenario on a runtime of its own; a check that fails ends the run with what it saw.
pub(crate) fn run(scenario: &Scenario) -> Result<Report, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(simulate(scenario))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The network every process reaches the store through.
#[derive(Debug)]
struct Net {
    store: EmbeddedBackend,
    rng: Mutex<StdRng>,
    /// Round trip range, nanoseconds.
    latency: (u64, u64),
    loss: (f64, f64),
    round_trips: Mutex<u64>,
    /// Requests and replies lost.
    lost: Mutex<(u64, u64)>,
}

/// What the network knows of one process (one incarnation): when its latest leased round
/// trip started, its transactions in flight, and whether it crashed.
#[derive(Debug, Default)]
struct Mark {
    trip_start: AtomicI64,
    in_flight: AtomicU32,
    dead: AtomicBool,
}

/// One process's way to the store.
#[derive(Debug)]
struct Link {
    net: Arc<Net>,
    mark: Arc<Mark>,
    clock: TokioClock,
}

/// Calls in flight in one transaction, counted out when it ends.
struct Flying<'a>(&'a Mark, u32);

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(self.1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Backend for Link {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        if self.mark.dead.load(Ordering::Relaxed) {
            return Err(BackendError::new(BackendErrorKind::Unavailable, "crashed"));
        }
        let (up, down, lose_request, lose_reply) = {
            let mut rng = lock(&self.net.rng);
            let rtt = rng.random_range(self.net.latency.0..=self.net.latency.1);
            let (lose_request, lose_reply) = (
                rng.random::<f64>() < self.net.loss.0,
                rng.random::<f64>() < self.net.loss.1,
            );
            (rtt / 2, rtt - rtt / 2, lose_request, lose_reply)
        };
        *lock(&self.net.round_trips) += 1;
        // A round trip that takes a lease (its last operation is `Command::Lease`).
        let ops = tx.batch().map_or(&[][..], |b| b);
        if ops.iter().any(|c| matches!(c, Command::Lease { .. })) {
            self.mark
                .trip_start
                .store(self.clock.now_nanos(), Ordering::Relaxed);
        }
        // The calls it carries (a batch carries several).
        let calls = ops
            .iter()
            .filter(|c| !matches!(c, Command::Lease { .. }))
            .count()
            .max(1);
        let calls = u32::try_from(calls).unwrap_or(u32::MAX);
        self.mark.in_flight.fetch_add(calls, Ordering::Relaxed);
        let _flying = Flying(&self.mark, calls);
        tokio::time::sleep(Duration::from_nanos(up)).await;
        if lose_request {
            lock(&self.net.lost).0 += 1;
            return Err(
                BackendError::new(BackendErrorKind::Unavailable, "request lost").retryable(true),
            );
        }
        self.net.store.transact(key, tx).await?;
        tokio::time::sleep(Duration::from_nanos(down)).await;
        if lose_reply {
            lock(&self.net.lost).1 += 1;
            return Err(BackendError::new(BackendErrorKind::InDoubt, "reply lost"));
        }
        Ok(())
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        if self.mark.dead.load(Ordering::Relaxed) {
            return Err(BackendError::new(BackendErrorKind::Unavailable, "crashed"));
        }
        *lock(&self.net.round_trips) += 1;
        self.net.store.read(key).await
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        if self.mark.dead.load(Ordering::Relaxed) {
            return Err(BackendError::new(BackendErrorKind::Unavailable, "crashed"));
        }
        *lock(&self.net.round_trips) += 1;
        self.net.store.remove(key).await
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Granted,
    Refused,
    Failed,
}

/// One answered call.
#[derive(Clone, Copy, Debug)]
struct Answer {
    at: i64,
    sent: i64,
    process: usize,
    outcome: Outcome,
    /// When the process's latest leased round trip started, as of the answer.
    trip_start: i64,
}

/// A running process.
struct Live {
    manager: ProxyManager<Link>,
    bucket: RemoteBucket<Link>,
    mark: Arc<Mark>,
    calls: JoinSet<()>,
}

struct Process {
    live: Option<Live>,
    on: bool,
    toggle_at: i64,
    back_at: i64,
}

fn start(
    net: &Arc<Net>,
    clock: TokioClock,
    leasing: Leasing,
    config: &BucketConfiguration,
) -> Live {
    let mark = Arc::new(Mark::default());
    let link = Link {
        net: Arc::clone(net),
        mark: Arc::clone(&mark),
        clock,
    };
    let manager = ProxyManager::configure(link)
        .time_source(TimeSource::client(clock))
        .leasing(leasing)
        .circuit_breaker(CircuitBreaker::off())
        .retry(RetryPolicy::new(3, Duration::ZERO, Duration::ZERO))
        .build()
        .expect("the simulation's settings are valid");
    let config = config.clone();
    let bucket = manager
        .builder()
        .build("hot", move || config.clone())
        .expect("the key is valid");
    Live {
        manager,
        bucket,
        mark,
        calls: JoinSet::new(),
    }
}

/// For every window start (one per tick) `k`: `V_k = P·N_k + K·a_k`, where `N_k` counts the
/// grants attributed to takes at or after `a_k`; a segment tree with additions to every
/// start up to one, and the maximum over the starts up to one.
struct Windows {
    size: usize,
    max: Vec<i128>,
    add: Vec<i128>,
}

impl Windows {
    const NONE: i128 = i128::MIN / 4;

    fn new(starts: usize, init: impl Fn(usize) -> i128) -> Self {
        let size = starts.next_power_of_two();
        let mut max = vec![Self::NONE; 2 * size];
        for i in 0..starts {
            max[size + i] = init(i);
        }
        for i in (1..size).rev() {
            max[i] = max[2 * i].max(max[2 * i + 1]);
        }
        Self {
            size,
            max,
            add: vec![0; 2 * size],
        }
    }

    /// Adds `v` to the starts `0..=last`.
    fn add_up_to(&mut self, last: usize, v: i128) {
        self.add_in(1, 0, self.size - 1, last, v);
    }

    fn add_in(&mut self, node: usize, lo: usize, hi: usize, last: usize, v: i128) {
        if lo > last {
            return;
        }
        if hi <= last {
            self.max[node] += v;
            self.add[node] += v;
            return;
        }
        let mid = (lo + hi) / 2;
        self.add_in(2 * node, lo, mid, last, v);
        self.add_in(2 * node + 1, mid + 1, hi, last, v);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]) + self.add[node];
    }

    /// The largest value among the starts `0..=last`.
    fn max_up_to(&self, last: usize) -> i128 {
        self.max_in(1, 0, self.size - 1, last)
    }

    fn max_in(&self, node: usize, lo: usize, hi: usize, last: usize) -> i128 {
        if lo > last {
            return Self::NONE;
        }
        if hi <= last {
            return self.max[node];
        }
        let mid = (lo + hi) / 2;
        self.max_in(2 * node, lo, mid, last)
            .max(self.max_in(2 * node + 1, mid + 1, hi, last))
            + self.add[node]
    }
}

/// The checks' state.
struct Checks {
    /// `K` and `P` (ns), as `i128` for the products.
    k: i128,
    p: i128,
    /// The windowed form's slack `W` (ns).
    w: i128,
    /// Tokens granted.
    g: i128,
    /// `min (P·G(a⁻) − K·a)` over the answers so far (and `a = 0`).
    min_before: i128,
    windows: Windows,
    reference: BucketState,
    config: BucketConfiguration,
    /// Reference grants minus the fleet's (answered calls only), and at the busy period's
    /// start.
    d: i64,
    d_start: i64,
    /// The parts of the bound that accumulate over the busy period.
    period_extra: i64,
    /// The parts that are constant.
    fixed: i64,
    /// Per call in doubt in a live process.
    per_doubt: i64,
    /// Calls in doubt in live processes now.
    doubts: i64,
    closest_over: i128,
    /// The worst busy period so far: its under-grant, and its bound then.
    worst: (i64, i64),
}

impl Checks {
    fn answer(&mut self, a: &Answer, report: &mut Report) -> Result<(), String> {
        let granted = match a.outcome {
            Outcome::Failed => {
                report.failed += 1;
                return Ok(());
            }
            Outcome::Refused => {
                report.refused += 1;
                false
            }
            Outcome::Granted => {
                report.granted += 1;
                true
            }
        };
        let reference = self
            .reference
            .apply(&self.config, a.at, &TryConsume(1))
            .map_err(|e| e.to_string())?;
        report.reference_granted += u64::from(reference);
        if granted {
            self.grant(a)?;
        }
        self.d += i64::from(reference) - i64::from(granted);
        let under = self.d - self.d_start;
        let bound = self.fixed + self.period_extra + self.per_doubt * self.doubts;
        if under > self.worst.0 {
            self.worst = (under, bound);
        }
        if under > bound {
            return Err(format!(
                "under-grant above its bound at {} ns: {under} tokens in this busy period, bound \
                 {bound} (fixed {}, crashes {}, doubts {} x {})",
                a.at, self.fixed, self.period_extra, self.doubts, self.per_doubt
            ));
        }
        Ok(())
    }

    fn grant(&mut self, a: &Answer) -> Result<(), String> {
        let (k, p, u) = (self.k, self.p, i128::from(a.at));
        self.min_before = self.min_before.min(p * self.g - k * u);
        self.g += 1;
        let total = k * p + k * u - p * self.g;
        let windowed = k * p + k * self.w - (p * self.g - k * u - self.min_before);
        let last = usize::try_from(a.trip_start.max(0) / TICK).unwrap_or(0);
        self.windows.add_up_to(last, p);
        let now = usize::try_from(a.at / TICK).unwrap_or(0);
        let attributed = k * p - (self.windows.max_up_to(now) - k * u);
        self.closest_over = self.closest_over.min(total.min(windowed).min(attributed));
        let fail = |form: &str, slack: i128| {
            Err(format!(
                "over-grant ({form}) at {u} ns: {} tokens granted, {} above the bound",
                self.g,
                (-slack) / p + 1
            ))
        };
        if total < 0 {
            return fail("total", total);
        }
        if windowed < 0 {
            return fail("windowed", windowed);
        }
        if attributed < 0 {
            return fail("attributed", attributed);
        }
        Ok(())
    }
}

async fn simulate(s: &Scenario) -> Result<Report, String> {
    let n = s.processes;
    let clock = TokioClock::new();
    let origin = tokio::time::Instant::now();
    let k = s.capacity;
    let config = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(k, Duration::from_secs(1)).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let net = Arc::new(Net {
        store: EmbeddedBackend::with_clock(clock),
        rng: Mutex::new(StdRng::seed_from_u64(s.seed ^ 0x006e_6574_776f_726b)),
        latency: (nanos(s.latency.0), nanos(s.latency.1)),
        loss: s.loss,
        round_trips: Mutex::new(0),
        lost: Mutex::new((0, 0)),
    });
    let leasing = Leasing::new().processes(u32::try_from(n).unwrap_or(u32::MAX));
    let cap = leasing.lease_cap(k);
    let reply_leg = i64::try_from(net.latency.1 - net.latency.1 / 2).unwrap_or(i64::MAX);
    let mut rng = StdRng::seed_from_u64(s.seed);
    let shares: Vec<f64> = (1..=n).map(|rank| 1.0 / rank as f64).collect();
    let pick = WeightedIndex::new(&shares).map_err(|e| e.to_string())?;
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let mut procs: Vec<Process> = (0..n)
        .map(|_| Process {
            live: Some(start(&net, clock, leasing, &config)),
            on: rng.random::<f64>() < 0.66,
            toggle_at: rng.random_range(0..500) * TICK,
            back_at: 0,
        })
        .collect();
    let key = procs[0]
        .live
        .as_ref()
        .map(|l| l.bucket.key().clone())
        .ok_or("no process")?;
    let ticks = i64::try_from(s.seconds).unwrap_or(0) * 1000;
    let (kk, pp) = (i128::from(k), i128::from(SECOND));
    let cap_i = i64::try_from(cap).unwrap_or(i64::MAX);
    let mut checks = Checks {
        k: kk,
        p: pp,
        w: i128::from(LIFETIME),
        g: 0,
        min_before: 0,
        windows: Windows::new(usize::try_from(ticks + DRAIN_TICKS + 1).unwrap_or(0), |i| {
            kk * i as i128 * i128::from(TICK)
        }),
        reference: BucketState::new(&config, 0),
        config: config.clone(),
        d: 0,
        d_start: 0,
        period_extra: 0,
        fixed: 3 * i64::try_from(n.min(24)).unwrap_or(24) * cap_i
            + i64::try_from((i128::from(reply_leg) * kk + pp - 1) / pp).unwrap_or(i64::MAX),
        per_doubt: 1 + cap_i,
        doubts: 0,
        closest_over: i128::MAX,
        worst: (i64::MIN, 0),
    };
    let mut report = Report {
        processes: n,
        capacity: k,
        lease_cap: cap,
        ..Report::default()
    };
    let mut digest = DefaultHasher::new();
    let mut latencies: Vec<u64> = Vec::new();
    let mut surge = false;
    let mut load = 0.0;
    let mut phase_end = 0;
    let mut owed = 0.0f64;
    let mut replies_lost_before = 0;
    let crash_rate = s.crash_rate * n as f64;
    let mut next_crash = exponential(&mut rng, crash_rate);
    // Offered calls per tick at a load of 1 (the refill), for processes on 2/3 of the time.
    let per_tick = k as f64 / 1000.0 / 0.66;

    for tick in 0..=ticks + DRAIN_TICKS {
        let now = tick * TICK;
        tokio::time::sleep_until(origin + Duration::from_nanos(now.unsigned_abs())).await;
        // The fleet's leases and calls in doubt now.
        let mut held = 0;
        let mut doubts = 0;
        for live in procs.iter_mut().filter_map(|p| p.live.as_mut()) {
            while live.calls.try_join_next().is_some() {}
            held += live.manager.leased_tokens();
            doubts += live.manager.unsettled();
        }
        report.max_held = report.max_held.max(held);
        // The answers since the last tick, in order. A call in doubt at any moment since was
        // in doubt at the last tick or its reply was lost since (a live process's call ends
        // in doubt only so: its round trips take far less than the timeout).
        let doubts = i64::try_from(doubts).unwrap_or(i64::MAX);
        let replies_lost = lock(&net.lost).1;
        checks.doubts += i64::try_from(replies_lost - replies_lost_before).unwrap_or(i64::MAX);
        replies_lost_before = replies_lost;
        let batch = std::mem::take(&mut *lock(&answers));
        for a in &batch {
            (a.at, a.process, a.outcome).hash(&mut digest);
            latencies.push(u64::try_from((a.at - a.sent) / 1000).unwrap_or(0));
            checks.answer(a, &mut report)?;
        }
        checks.doubts = doubts;
        // A busy period starts when the reference is full and the fleet holds as much.
        if checks.reference.available_tokens(&config, now) >= k as i64 {
            let shared = match net.store.read(&key).await.map_err(|e| e.to_string())? {
                Some(bytes) => {
                    let record = format::decode(&bytes).map_err(|e| e.to_string())?;
                    record.state.available_tokens(&record.config, now)
                }
                None => k as i64,
            };
            if shared + held as i64 >= k as i64 {
                let flying: u32 = procs
                    .iter()
                    .filter_map(|p| p.live.as_ref())
                    .map(|l| l.mark.in_flight.load(Ordering::Relaxed))
                    .sum();
                report.busy_periods += 1;
                checks.d_start = checks.d;
                checks.period_extra = i64::from(flying);
            }
        }
        if tick >= ticks {
            continue;
        }
        // Phases, processes turning on and off, coming back, crashing.
        if now >= phase_end {
            surge = !surge;
            phase_end = now + rng.random_range(250..1500) * TICK;
            load = if surge {
                2.0
            } else {
                rng.random_range(0.2..0.9)
            };
        }
        for p in &mut procs {
            if now >= p.toggle_at {
                p.on = !p.on;
                let spell = if p.on { 50..750 } else { 50..350 };
                p.toggle_at = now + rng.random_range(spell) * TICK;
            }
            if p.live.is_none() && now >= p.back_at {
                p.live = Some(start(&net, clock, leasing, &config));
            }
        }
        while next_crash * 1e9 <= now as f64 {
            next_crash += exponential(&mut rng, crash_rate);
            let p = &mut procs[rng.random_range(0..n)];
            // Killed: its calls aborted, nothing of it reaches the store again, and its
            // manager is never dropped (a drop would give the leases back).
            if let Some(live) = p.live.take() {
                let held = live.manager.leased_tokens();
                let flying = u64::from(live.mark.in_flight.load(Ordering::Relaxed));
                let doubts = live.manager.unsettled() as u64;
                report.crashes += 1;
                report.lost_to_crashes += held;
                checks.period_extra +=
                    i64::try_from(held + (flying + doubts) * (1 + cap) + cap).unwrap_or(i64::MAX);
                live.mark.dead.store(true, Ordering::Relaxed);
                drop(live.calls);
                std::mem::forget(live.manager);
                std::mem::forget(live.bucket);
                p.back_at = now + DOWN;
            }
        }
        // This tick's calls.
        owed += per_tick * load;
        let calls = owed as u64;
        owed -= calls as f64;
        for _ in 0..calls {
            let i = rng.sample(&pick);
            let p = &mut procs[i];
            let Some(live) = p.live.as_mut().filter(|_| p.on) else {
                continue;
            };
            report.requests += 1;
            let bucket = live.bucket.clone();
            let mark = Arc::clone(&live.mark);
            let answers = Arc::clone(&answers);
            live.calls.spawn(async move {
                let outcome = match bucket.try_consume(1).await {
                    Ok(true) => Outcome::Granted,
                    Ok(false) => Outcome::Refused,
                    Err(_) => Outcome::Failed,
                };
                lock(&answers).push(Answer {
                    at: clock.now_nanos(),
                    sent: now,
                    process: i,
                    outcome,
                    // Its tokens left the bucket no sooner: at its own round trip (its batch's),
                    // after it was sent, or at the start of the round trip that took the lease
                    // it was served from, the latest one.
                    trip_start: mark.trip_start.load(Ordering::Relaxed).min(now),
                });
            });
        }
    }
    report.round_trips = *lock(&net.round_trips);
    report.lost = *lock(&net.lost);
    (report.worst_under, report.worst_bound) = (checks.worst.0.max(0), checks.worst.1);
    report.closest_over = i64::try_from(checks.closest_over / pp).unwrap_or(i64::MAX);
    latencies.sort_unstable();
    report.p99_micros = latencies
        .get(latencies.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0);
    report.digest = digest.finish();
    Ok(report)
}

/// An exponential draw with the given rate (per second), in seconds.
fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    -rng.random_range(f64::EPSILON..1.0).ln() / rate
}
