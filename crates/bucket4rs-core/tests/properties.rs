//! Property tests for the pure core (SEMANTICS.md, especially section 11).
//!
//! Random configurations (greedy, interval and aligned bandwidths, up to six of them, with
//! capacities, refill rates and clock readings anywhere in the 64-bit range) run random
//! operation sequences, with the clock jumping forwards and backwards and configurations being
//! replaced. Every step is compared with an independent `i128` reference model written straight
//! from the semantics: its refill is the section 4.1 procedure and its waits are found by binary
//! search over time (the least whole number of nanoseconds after which refill suffices), not by
//! the closed formulas of section 5. On top of that, every reported wait is checked on the core
//! itself by advancing a copy of the state by `W` and `W - 1` nanoseconds.
//!
//! Failures are persisted next to this file in `properties.proptest-regressions`.

use bucket4rs_core::forms::ScaledState;
use bucket4rs_core::ops::{self, Refilled};
use bucket4rs_core::{
    Bandwidth, BandwidthState, BucketConfiguration, BucketState, ConfigError, ConsumptionProbe,
    EstimationProbe, OperationError, RefillKind, TokensInheritanceStrategy,
};
use core::time::Duration;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const MAX: i64 = i64::MAX;
const MIN: i64 = i64::MIN;
const MAXU: u64 = i64::MAX as u64;

/// A wait in nanoseconds (every wait fits: at most `i64::MAX`).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("a wait fits in u64")
}

fn proptest_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum KindSpec {
    Greedy,
    Intervally,
    Aligned { first_refill: u64, adaptive: bool },
}

#[derive(Clone, Debug)]
struct BwSpec {
    capacity: u64,
    tokens: u64,
    period: u64,
    kind: KindSpec,
    initial: Option<u64>,
    id: Option<&'static str>,
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=40,
        2 => 1u64..=1_000_000_000,
        1 => (MAXU - 64)..=MAXU,
        1 => 1u64..=MAXU,
    ]
}

fn period() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..=64,
        3 => 1u64..=10_000_000_000,
        1 => (1u64 << 62)..=MAXU,
        1 => 1u64..=MAXU,
    ]
}

fn kind(aligned: bool) -> BoxedStrategy<KindSpec> {
    let plain = prop_oneof![3 => Just(KindSpec::Greedy), 2 => Just(KindSpec::Intervally)];
    if !aligned {
        return plain.boxed();
    }
    let first = prop_oneof![3 => 0u64..=2_000_000_000_000, 1 => 0u64..=MAXU];
    prop_oneof![
        5 => plain,
        2 => (first, any::<bool>())
            .prop_map(|(first_refill, adaptive)| KindSpec::Aligned { first_refill, adaptive }),
    ]
    .boxed()
}

fn bandwidth_spec(aligned: bool) -> impl Strategy<Value = BwSpec> {
    (
        capacity(),
        period(),
        any::<u64>(),
        0u8..3,
        kind(aligned),
        prop::option::of((0u8..3, any::<u64>())),
        prop::option::of(prop::sample::select(vec!["a", "b", "c"])),
    )
        .prop_map(|(capacity, period, r, pick, kind, initial, id)| {
            let tokens = match pick {
                0 => 1 + r % period.min(16),
                1 => period - r % period.min(16),
                _ => 1 + r % period,
            };
            let initial = match kind {
                KindSpec::Aligned { adaptive: true, .. } => None,
                _ => initial.map(|(how, x)| match how {
                    0 => x % (capacity + 1),
                    1 => capacity.saturating_add(x % 50).min(MAXU),
                    _ => x & MAXU,
                }),
            };
            BwSpec {
                capacity,
                tokens,
                period,
                kind,
                initial,
                id,
            }
        })
}

fn specs(max: usize, aligned: bool) -> impl Strategy<Value = Vec<BwSpec>> {
    prop::collection::vec(bandwidth_spec(aligned), 1..=max)
}

fn build_bandwidth(s: &BwSpec, id: Option<&'static str>) -> Bandwidth {
    let p = Duration::from_nanos(s.period);
    let b = Bandwidth::builder().capacity(s.capacity);
    let mut b = match s.kind {
        KindSpec::Greedy => b.refill_greedy(s.tokens, p),
        KindSpec::Intervally => b.refill_intervally(s.tokens, p),
        KindSpec::Aligned {
            first_refill,
            adaptive: false,
        } => b.refill_intervally_aligned(s.tokens, p, Duration::from_nanos(first_refill)),
        KindSpec::Aligned {
            first_refill,
            adaptive: true,
        } => b.refill_intervally_aligned_adaptive(s.tokens, p, Duration::from_nanos(first_refill)),
    };
    if let Some(t) = s.initial {
        b = b.initial_tokens(t);
    }
    if let Some(id) = id {
        b = b.id(id);
    }
    b.build().expect("generated bandwidths are valid")
}

fn build_config(specs: &[BwSpec]) -> BucketConfiguration {
    let mut seen: Vec<&str> = Vec::new();
    let bandwidths = specs
        .iter()
        .map(|s| {
            let id = s.id.filter(|id| !seen.contains(id));
            if let Some(id) = id {
                seen.push(id);
            }
            build_bandwidth(s, id)
        })
        .collect();
    BucketConfiguration::new(bandwidths).expect("generated ids are distinct")
}

fn token_arg() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..=40,
        2 => 1u64..=2_000_000_000,
        1 => (MAXU - 3)..=(MAXU + 3),
        1 => (u64::MAX - 3)..=u64::MAX,
        1 => any::<u64>(),
        1 => Just(0u64),
    ]
}

fn start_time() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..=1_000_000_000_000,
        1 => any::<i64>(),
        1 => (MAX - 1_000_000_000)..=MAX,
        1 => MIN..=(MIN + 1_000_000_000),
    ]
}

fn clock_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..=1_000,
        4 => 0i64..=20_000_000_000,
        2 => -2_000_000_000i64..=0,
        1 => any::<i64>(),
    ]
}

fn inheritance() -> impl Strategy<Value = TokensInheritanceStrategy> {
    prop_oneof![
        Just(TokensInheritanceStrategy::Proportionally),
        Just(TokensInheritanceStrategy::AsIs),
        Just(TokensInheritanceStrategy::Additive),
        Just(TokensInheritanceStrategy::Reset),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Advance(i64),
    TryConsume(u64),
    Probe(u64),
    Estimate(u64),
    AsMuch(Option<u64>),
    Add(u64),
    ForceAdd(u64),
    Reset,
    Available,
    Ignoring(u64),
    Reserve(u64, u64),
    Replace(Vec<BwSpec>, TokensInheritanceStrategy),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => clock_step().prop_map(Op::Advance),
        4 => token_arg().prop_map(Op::TryConsume),
        3 => token_arg().prop_map(Op::Probe),
        3 => token_arg().prop_map(Op::Estimate),
        2 => prop::option::of(token_arg()).prop_map(Op::AsMuch),
        1 => token_arg().prop_map(Op::Add),
        1 => token_arg().prop_map(Op::ForceAdd),
        1 => Just(Op::Reset),
        1 => Just(Op::Available),
        3 => token_arg().prop_map(Op::Ignoring),
        3 => (token_arg(), prop_oneof![Just(0u64), 1u64..=10_000_000_000, any::<u64>()])
            .prop_map(|(n, w)| Op::Reserve(n, w)),
        1 => (specs(3, true), inheritance()).prop_map(|(s, k)| Op::Replace(s, k)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Reference model (i128, straight from SEMANTICS.md)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Wide {
    l: i128,
    s: i128,
    e: i128,
}

impl Wide {
    fn of(st: BandwidthState) -> Self {
        Self {
            l: st.last_refill_nanos().into(),
            s: st.tokens().into(),
            e: st.remainder().into(),
        }
    }

    fn narrow(self) -> BandwidthState {
        BandwidthState::from_parts(
            i64::try_from(self.l).expect("reference L fits"),
            i64::try_from(self.s).expect("reference s fits"),
            i64::try_from(self.e).expect("reference e fits"),
        )
    }
}

fn cap(b: &Bandwidth) -> i128 {
    b.capacity().into()
}

fn is_greedy(b: &Bandwidth) -> bool {
    b.refill_kind() == RefillKind::Greedy
}

/// Section 4.1, for a valid state (`0 <= e < P`) and any instant `t`, even beyond `i64`.
fn ref_refill(b: &Bandwidth, w: Wide, t: i128) -> Wide {
    let (c, tk, p) = (
        cap(b),
        i128::from(b.refill_tokens()),
        (b.refill_period().as_nanos() as i128),
    );
    if t <= w.l {
        return w;
    }
    let u = if is_greedy(b) {
        t
    } else {
        t - (t - w.l).rem_euclid(p)
    };
    if u <= w.l {
        return w;
    }
    let d = u - w.l;
    if w.s >= c {
        return Wide { l: u, ..w };
    }
    // T * d only overflows i128 for instants beyond i64; then it is at least 2^127, i.e. at least
    // 2^64 tokens, more than any deficit below capacity.
    match tk.checked_mul(d).and_then(|x| x.checked_add(w.e)) {
        Some(v) if w.s + v.div_euclid(p) < c => Wide {
            l: u,
            s: w.s + v.div_euclid(p),
            e: v.rem_euclid(p),
        },
        _ => Wide { l: u, s: c, e: 0 },
    }
}

/// The least `w` in `[0, MAX)` such that `w` refilled at `now + w` has at least `target`
/// tokens, or `MAX` if there is none: found by binary search, not by formula.
fn oracle_wait(b: &Bandwidth, w: Wide, now: i64, target: i128) -> i64 {
    let reached = |dt: i128| ref_refill(b, w, i128::from(now) + dt).s >= target;
    if reached(0) {
        return 0;
    }
    let (mut lo, mut hi) = (0i128, i128::from(MAX) - 1);
    if !reached(hi) {
        return MAX;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if reached(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi as i64
}

/// Section 5.2 on a refilled view.
fn ref_request_wait(
    config: &BucketConfiguration,
    view: &[Wide],
    now: i64,
    n: u64,
    strict: bool,
) -> i64 {
    let n = i128::from(n);
    config
        .bandwidths()
        .iter()
        .zip(view)
        .map(|(b, w)| {
            if strict && n > cap(b) {
                MAX
            } else if n <= w.s {
                0
            } else if n - w.s > i128::from(MAX) {
                MAX
            } else {
                // Wait until the balance, reduced by n, is back at 0.
                oracle_wait(b, Wide { s: w.s - n, ..*w }, now, 0)
            }
        })
        .max()
        .expect("configurations are non-empty")
}

/// Section 5.3 on a refilled view.
fn ref_reset_wait(config: &BucketConfiguration, view: &[Wide], now: i64) -> i64 {
    config
        .bandwidths()
        .iter()
        .zip(view)
        .map(|(b, w)| {
            if w.s >= cap(b) {
                0
            } else {
                oracle_wait(b, *w, now, cap(b))
            }
        })
        .max()
        .expect("configurations are non-empty")
}

/// Section 3.2.
fn ref_fresh(b: &Bandwidth, t0: i64) -> BandwidthState {
    let (c, t, p) = (
        cap(b),
        i128::from(b.refill_tokens()),
        (b.refill_period().as_nanos() as i128),
    );
    match b.refill_kind() {
        RefillKind::IntervallyAligned {
            first_refill_nanos: f,
            adaptive_initial_tokens,
        } => {
            let f = i128::from(f);
            let s = if !adaptive_initial_tokens {
                i128::from(b.initial_tokens())
            } else if i128::from(t0) >= f {
                c
            } else {
                c.min((c - t).max(0) + ((f - i128::from(t0)) * t).div_euclid(p))
            };
            Wide { l: f - p, s, e: 0 }.narrow()
        }
        _ => BandwidthState::from_parts(t0, b.initial_tokens() as i64, 0),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    Bool(bool),
    Probe(ConsumptionProbe),
    Estimate(EstimationProbe),
    Count(u64),
    Unit,
    Tokens(i64),
    Wait(u64),
    Reserved(Option<u64>),
}

fn nonzero(n: u64) -> Result<i128, OperationError> {
    if n == 0 {
        Err(OperationError::ZeroTokens)
    } else {
        Ok(n.into())
    }
}

/// Section 6 on the reference state.
fn model_apply(
    config: &BucketConfiguration,
    states: &mut Vec<BandwidthState>,
    now: i64,
    op: &Op,
) -> Result<Out, OperationError> {
    let bws = config.bandwidths();
    let view: Vec<Wide> = bws
        .iter()
        .zip(states.iter())
        .map(|(b, s)| ref_refill(b, Wide::of(*s), now.into()))
        .collect();
    let a = view.iter().map(|w| w.s).min().expect("non-empty");
    let consume =
        |n: i128| -> Vec<Wide> { view.iter().map(|w| Wide { s: w.s - n, ..*w }).collect() };
    let map = |f: &dyn Fn(&Bandwidth, Wide) -> Wide| -> Vec<Wide> {
        bws.iter().zip(&view).map(|(b, w)| f(b, *w)).collect()
    };
    let mut commit = |v: Vec<Wide>| *states = v.into_iter().map(Wide::narrow).collect();
    Ok(match op {
        Op::TryConsume(n) => {
            let n = nonzero(*n)?;
            if n <= a {
                commit(consume(n));
                Out::Bool(true)
            } else {
                Out::Bool(false)
            }
        }
        Op::Probe(n) => {
            let n = nonzero(*n)?;
            if n <= a {
                let after = consume(n);
                let reset = ref_reset_wait(config, &after, now);
                commit(after);
                Out::Probe(ConsumptionProbe::new(true, (a - n) as u64, 0, reset as u64))
            } else {
                let wait = ref_request_wait(config, &view, now, n as u64, true);
                let reset = ref_reset_wait(config, &view, now);
                Out::Probe(ConsumptionProbe::new(
                    false,
                    a.max(0) as u64,
                    wait as u64,
                    reset as u64,
                ))
            }
        }
        Op::Estimate(n) => {
            let n = nonzero(*n)?;
            if n <= a {
                Out::Estimate(EstimationProbe::new(true, a as u64, 0))
            } else {
                let wait = ref_request_wait(config, &view, now, n as u64, true);
                Out::Estimate(EstimationProbe::new(false, a.max(0) as u64, wait as u64))
            }
        }
        Op::AsMuch(limit) => {
            let limit = match limit {
                Some(0) => return Err(OperationError::ZeroLimit),
                Some(l) => i128::from(*l),
                None => i128::from(u64::MAX),
            };
            let c = limit.min(a);
            if c <= 0 {
                Out::Count(0)
            } else {
                commit(consume(c));
                Out::Count(c as u64)
            }
        }
        Op::Add(n) => {
            let n = nonzero(*n)?;
            commit(map(&|b, w| {
                if w.s + n >= cap(b) {
                    Wide {
                        s: cap(b),
                        e: 0,
                        ..w
                    }
                } else {
                    Wide { s: w.s + n, ..w }
                }
            }));
            Out::Unit
        }
        Op::ForceAdd(n) => {
            let n = nonzero(*n)?;
            commit(map(&|_, w| {
                if w.s + n > i128::from(MAX) {
                    Wide {
                        s: MAX.into(),
                        e: 0,
                        ..w
                    }
                } else {
                    Wide { s: w.s + n, ..w }
                }
            }));
            Out::Unit
        }
        Op::Reset => {
            commit(map(&|b, w| Wide {
                s: cap(b),
                e: 0,
                ..w
            }));
            Out::Unit
        }
        Op::Available => Out::Tokens(a as i64),
        Op::Ignoring(n) => {
            let n = nonzero(*n)?;
            let wait = ref_request_wait(config, &view, now, n as u64, false);
            if wait == MAX {
                return Err(OperationError::WaitTooLong);
            }
            commit(consume(n));
            Out::Wait(wait as u64)
        }
        Op::Reserve(n, max_wait) => {
            let n = nonzero(*n)?;
            if *max_wait == 0 {
                return Err(OperationError::ZeroMaxWait);
            }
            let wait = ref_request_wait(config, &view, now, n as u64, false);
            if wait == MAX || wait as u64 > *max_wait {
                Out::Reserved(None)
            } else {
                commit(consume(n));
                Out::Reserved(Some(wait as u64))
            }
        }
        Op::Advance(_) | Op::Replace(..) => unreachable!("handled by the runner"),
    })
}

/// Section 7.4 for one matched bandwidth; `None` where the direct 189-bit formula of
/// `PROPORTIONALLY` does not fit in `i128` (the result is then only range-checked).
fn ref_inherit(
    ob: &Bandwidth,
    w: Wide,
    nb: &Bandwidth,
    strategy: TokensInheritanceStrategy,
) -> Option<BandwidthState> {
    let (c, p) = (cap(ob), (ob.refill_period().as_nanos() as i128));
    let (c2, p2) = (cap(nb), (nb.refill_period().as_nanos() as i128));
    let carry = if is_greedy(ob) && is_greedy(nb) {
        (w.e * p2).div_euclid(p)
    } else {
        0
    };
    let (s, e) = match strategy {
        TokensInheritanceStrategy::AsIs => {
            if w.s >= c2 {
                (c2, 0)
            } else {
                (w.s, carry)
            }
        }
        TokensInheritanceStrategy::Additive if c2 <= c => {
            if w.s >= c2 {
                (c2, 0)
            } else {
                (w.s, carry)
            }
        }
        TokensInheritanceStrategy::Additive => {
            if w.s >= c {
                (c2, 0)
            } else {
                (w.s + c2 - c, carry)
            }
        }
        TokensInheritanceStrategy::Proportionally => {
            if w.s >= c {
                (c2, 0)
            } else {
                // X = (s * P + e) * C' / (P * C), directly.
                let num = (w.s * p + w.e).checked_mul(c2)?;
                let den = p * c;
                let q = num.div_euclid(den);
                if q < i128::from(MIN) {
                    (MIN.into(), 0)
                } else if is_greedy(nb) {
                    (q, num.rem_euclid(den).checked_mul(p2)?.div_euclid(den))
                } else {
                    (q, 0)
                }
            }
        }
        other => panic!("no inheritance for {other:?}"),
    };
    Some(Wide { l: w.l, s, e }.narrow())
}

/// Section 7: for every new bandwidth its expected state (when computable) and whether it is
/// fresh (unmatched or `RESET`).
fn model_replace(
    old: &BucketConfiguration,
    states: &[BandwidthState],
    new: &BucketConfiguration,
    now: i64,
    strategy: TokensInheritanceStrategy,
) -> Vec<(Option<BandwidthState>, bool)> {
    let anonymous =
        |c: &BucketConfiguration| c.bandwidths().iter().filter(|b| b.id().is_none()).count();
    let by_position = anonymous(old) < 2 && anonymous(new) < 2;
    new.bandwidths()
        .iter()
        .map(|nb| {
            let matched = if strategy == TokensInheritanceStrategy::Reset {
                None
            } else {
                old.bandwidths()
                    .iter()
                    .position(|ob| match (nb.id(), ob.id()) {
                        (Some(x), Some(y)) => x == y,
                        (None, None) => by_position,
                        _ => false,
                    })
            };
            match matched {
                None => (Some(ref_fresh(nb, now)), true),
                Some(i) => {
                    let ob = &old.bandwidths()[i];
                    let w = ref_refill(ob, Wide::of(states[i]), now.into());
                    (ref_inherit(ob, w, nb, strategy), false)
                }
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Checks on the core itself
// ---------------------------------------------------------------------------------------------

fn view_tokens(config: &BucketConfiguration, state: &BucketState, t: i64) -> Vec<i64> {
    let v = Refilled::new(config, t, |i| state.bandwidths()[i]);
    (0..v.len()).map(|i| v.get(i).tokens()).collect()
}

/// A rejected probe's wait `w`: the request succeeds on a copy advanced by `w`, not by `w - 1`.
fn check_probe_wait(
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    n: u64,
    w: u64,
) -> Result<(), TestCaseError> {
    prop_assert!(w >= 1, "a rejected request reported a wait of 0");
    prop_assert!(w <= MAXU);
    if w < MAXU
        && let Some(t) = now.checked_add(w as i64)
    {
        let at = |t| {
            state
                .clone()
                .apply(config, t, &ops::EstimateAbilityToConsume(n))
                .map(|p| p.can_be_consumed())
        };
        prop_assert_eq!(at(t), Ok(true), "not consumable after the wait {}", w);
        prop_assert_eq!(
            at(t - 1),
            Ok(false),
            "consumable 1 ns before the wait {}",
            w
        );
        let mut copy = state.clone();
        prop_assert_eq!(copy.apply(config, t, &ops::TryConsume(n)), Ok(true));
    }
    Ok(())
}

/// A reset wait `r`: every bandwidth full at `now + r`, some not full at `now + r - 1`.
fn check_reset_wait(
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    r: u64,
) -> Result<(), TestCaseError> {
    prop_assert!(r <= MAXU);
    if r < MAXU
        && let Some(t) = now.checked_add(r as i64)
    {
        let full = |t| {
            view_tokens(config, state, t)
                .iter()
                .zip(config.bandwidths())
                .all(|(s, b)| *s as i128 >= cap(b))
        };
        prop_assert!(full(t), "not full after the reset wait {}", r);
        if r > 0 {
            prop_assert!(
                !full(t - 1),
                "already full 1 ns before the reset wait {}",
                r
            );
        }
    }
    Ok(())
}

/// A reservation's wait `w` on the state after it: every balance is at least 0 at `now + w`,
/// some is negative at `now + w - 1`.
fn check_debt_wait(
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    w: u64,
) -> Result<(), TestCaseError> {
    prop_assert!(w < MAXU, "a reservation was accepted with a wait of MAX");
    if let Some(t) = now.checked_add(w as i64) {
        let solvent = |t| view_tokens(config, state, t).iter().all(|s| *s >= 0);
        prop_assert!(solvent(t), "still in debt after the wait {}", w);
        if w > 0 {
            prop_assert!(!solvent(t - 1), "debt repaid 1 ns before the wait {}", w);
        }
    }
    Ok(())
}

fn core_apply(
    config: &BucketConfiguration,
    state: &mut BucketState,
    now: i64,
    op: &Op,
) -> Result<Out, OperationError> {
    Ok(match op {
        Op::TryConsume(n) => Out::Bool(state.apply(config, now, &ops::TryConsume(*n))?),
        Op::Probe(n) => {
            Out::Probe(state.apply(config, now, &ops::TryConsumeAndReturnRemaining(*n))?)
        }
        Op::Estimate(n) => {
            Out::Estimate(state.apply(config, now, &ops::EstimateAbilityToConsume(*n))?)
        }
        Op::AsMuch(l) => {
            Out::Count(state.apply(config, now, &ops::TryConsumeAsMuchAsPossible(*l))?)
        }
        Op::Add(n) => {
            state.apply(config, now, &ops::AddTokens(*n))?;
            Out::Unit
        }
        Op::ForceAdd(n) => {
            state.apply(config, now, &ops::ForceAddTokens(*n))?;
            Out::Unit
        }
        Op::Reset => {
            state.apply(config, now, &ops::Reset)?;
            Out::Unit
        }
        Op::Available => Out::Tokens(state.available_tokens(config, now)),
        Op::Ignoring(n) => {
            Out::Wait(state.apply(config, now, &ops::ConsumeIgnoringRateLimits(*n))?)
        }
        Op::Reserve(n, w) => Out::Reserved(state.apply(
            config,
            now,
            &ops::Reserve {
                tokens: *n,
                max_wait_nanos: *w,
            },
        )?),
        Op::Advance(_) | Op::Replace(..) => unreachable!("handled by the runner"),
    })
}

/// A bucket run in lockstep by the core and the reference model.
struct Sim {
    config: BucketConfiguration,
    state: BucketState,
    model: Vec<BandwidthState>,
    now: i64,
    /// Whether a bandwidth may legitimately hold more than its capacity (initial tokens above
    /// capacity, or `force_add_tokens`) until it is next seen at or below capacity.
    may_exceed: Vec<bool>,
}

impl Sim {
    fn new(specs: &[BwSpec], now: i64) -> Result<Self, TestCaseError> {
        let config = build_config(specs);
        let state = BucketState::new(&config, now);
        let model: Vec<_> = config
            .bandwidths()
            .iter()
            .map(|b| ref_fresh(b, now))
            .collect();
        prop_assert_eq!(state.bandwidths(), &model[..], "fresh state");
        prop_assert_eq!(state.check(&config), Ok(()));
        let may_exceed = config
            .bandwidths()
            .iter()
            .map(|b| {
                b.explicit_initial_tokens()
                    .is_some_and(|i| i > b.capacity())
            })
            .collect();
        let sim = Self {
            config,
            state,
            model,
            now,
            may_exceed,
        };
        sim.check_capacity()?;
        Ok(sim)
    }

    /// Property 1: no balance above capacity unless allowed.
    fn check_capacity(&self) -> Result<(), TestCaseError> {
        for ((b, s), may) in self
            .config
            .bandwidths()
            .iter()
            .zip(self.state.bandwidths())
            .zip(&self.may_exceed)
        {
            prop_assert!(
                *may || i128::from(s.tokens()) <= cap(b),
                "balance {} above capacity {}",
                s.tokens(),
                b.capacity()
            );
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Advance(d) => {
                self.now = self.now.saturating_add(*d);
                Ok(())
            }
            Op::Replace(specs, strategy) => self.replace(specs, *strategy),
            _ => self.operate(op),
        }
    }

    fn replace(
        &mut self,
        specs: &[BwSpec],
        strategy: TokensInheritanceStrategy,
    ) -> Result<(), TestCaseError> {
        let new = build_config(specs);
        let got = self
            .state
            .replace_configuration(&self.config, &new, self.now, strategy, true);
        prop_assert!(got.is_ok(), "valid replacement failed: {:?}", got);
        let got = got.expect("checked");
        prop_assert_eq!(got.check(&new), Ok(()));
        let expected = model_replace(&self.config, &self.model, &new, self.now, strategy);
        let mut may_exceed = Vec::new();
        for ((b, s), (want, fresh)) in new.bandwidths().iter().zip(got.bandwidths()).zip(&expected)
        {
            match want {
                Some(want) => prop_assert_eq!(s, want, "replacement with {:?}", strategy),
                None => {
                    prop_assert!(i128::from(s.tokens()) < cap(b));
                    prop_assert!(
                        s.remainder() >= 0
                            && (s.remainder() as u64) < (b.refill_period().as_nanos() as u64)
                    );
                }
            }
            may_exceed.push(
                *fresh
                    && b.explicit_initial_tokens()
                        .is_some_and(|i| i > b.capacity()),
            );
        }
        self.config = new;
        self.model = got.bandwidths().to_vec();
        self.state = got;
        self.may_exceed = may_exceed;
        self.check_capacity()
    }

    fn operate(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let (config, now) = (&self.config, self.now);
        let before = self.state.clone();
        let got = core_apply(config, &mut self.state, now, op);
        let want = model_apply(config, &mut self.model, now, op);
        prop_assert_eq!(&got, &want, "{:?} at {} on {:?}", op, now, before);
        prop_assert_eq!(
            self.state.bandwidths(),
            &self.model[..],
            "{:?} at {}",
            op,
            now
        );
        if got.is_err() {
            prop_assert_eq!(
                &self.state,
                &before,
                "a failing operation changed the state"
            );
        }
        prop_assert_eq!(self.state.check(config), Ok(()));
        // Exact waits, checked on the core by moving the clock.
        match (op, got) {
            (Op::Probe(n), Ok(Out::Probe(p))) => {
                if p.is_consumed() {
                    prop_assert_eq!(nanos(p.wait_for_refill()), 0);
                } else {
                    check_probe_wait(config, &before, now, *n, nanos(p.wait_for_refill()))?;
                }
                check_reset_wait(config, &self.state, now, nanos(p.wait_for_reset()))?;
            }
            (Op::Estimate(n), Ok(Out::Estimate(p))) if !p.can_be_consumed() => {
                check_probe_wait(config, &before, now, *n, nanos(p.wait_for_refill()))?;
            }
            (Op::Ignoring(_), Ok(Out::Wait(w))) | (Op::Reserve(..), Ok(Out::Reserved(Some(w)))) => {
                check_debt_wait(config, &self.state, now, w)?;
            }
            _ => {}
        }
        // Property 1: no operation but force_add_tokens raises a balance above
        // max(capacity, previous balance).
        let forced = matches!(op, Op::ForceAdd(_));
        for (i, b) in config.bandwidths().iter().enumerate() {
            let (old, new) = (
                before.bandwidths()[i].tokens(),
                self.state.bandwidths()[i].tokens(),
            );
            if forced {
                self.may_exceed[i] |= i128::from(new) > cap(b);
            } else {
                prop_assert!(
                    i128::from(new) <= cap(b).max(old.into()),
                    "{:?} raised {} to {}",
                    op,
                    old,
                    new
                );
            }
            if i128::from(new) <= cap(b) {
                self.may_exceed[i] = false;
            }
        }
        self.check_capacity()
    }
}

fn run_prefix(specs: &[BwSpec], t0: i64, ops: &[Op]) -> (BucketConfiguration, BucketState, i64) {
    let mut config = build_config(specs);
    let mut state = BucketState::new(&config, t0);
    let mut now = t0;
    for op in ops {
        match op {
            Op::Advance(d) => now = now.saturating_add(*d),
            Op::Replace(s, k) => {
                let new = build_config(s);
                state = state
                    .replace_configuration(&config, &new, now, *k, true)
                    .expect("valid replacement");
                config = new;
            }
            _ => {
                let _ = core_apply(&config, &mut state, now, op);
            }
        }
    }
    (config, state, now)
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(proptest_config(700))]

    /// Properties 1, 3 and 6 on random sequences: every result and every state equals the
    /// reference model's, every reported wait (refill, reset, reservation) is exact on the core,
    /// balances stay within capacity unless force-added or initialised above it, and failing
    /// operations change nothing.
    #[test]
    fn random_sequences_match_the_reference_model(
        specs in specs(6, true),
        t0 in start_time(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut sim = Sim::new(&specs, t0)?;
        for op in &ops {
            sim.step(op)?;
        }
    }

    /// Property 2: refilling at t1 and then at t2 equals refilling once at t2, to the token, the
    /// remainder and the last refill time; both equal the reference refill. Refill never lowers
    /// the balance, never raises it above max(capacity, balance), and refilling again at an
    /// earlier instant changes nothing (property 4).
    #[test]
    fn refill_composes_over_split_intervals(
        specs in specs(6, true),
        t0 in start_time(),
        prefix in prop::collection::vec(op(), 0..12),
        a in prop_oneof![0i64..=1_000, 0i64..=100_000_000_000, 0i64..=MAX],
        b in prop_oneof![0i64..=1_000, 0i64..=100_000_000_000, 0i64..=MAX],
        back in 0i64..=MAX,
    ) {
        let (config, state, now) = run_prefix(&specs, t0, &prefix);
        let st = state.bandwidths();
        let t1 = now.saturating_add(a);
        let t2 = t1.saturating_add(b);
        let first = Refilled::new(&config, t1, |i| st[i]);
        let mid: Vec<BandwidthState> = (0..first.len()).map(|i| first.get(i)).collect();
        let twice = Refilled::new(&config, t2, |i| mid[i]);
        let once = Refilled::new(&config, t2, |i| st[i]);
        let earlier = Refilled::new(&config, t1.saturating_sub(back), |i| mid[i]);
        for (i, bw) in config.bandwidths().iter().enumerate() {
            prop_assert_eq!(twice.get(i), once.get(i), "bandwidth {}", i);
            prop_assert_eq!(once.get(i), ref_refill(bw, Wide::of(st[i]), t2.into()).narrow());
            prop_assert_eq!(earlier.get(i), mid[i], "refill at an earlier instant changed bandwidth {}", i);
            prop_assert!(once.get(i).tokens() >= mid[i].tokens());
            prop_assert!(mid[i].tokens() >= st[i].tokens());
            prop_assert!(i128::from(once.get(i).tokens()) <= cap(bw).max(st[i].tokens().into()));
        }
        prop_assert!(once.available() >= first.available());
    }

    /// Property 4: with the clock jumping backwards and forwards, the tokens a bucket hands out
    /// never exceed its initial tokens plus what its rate earns up to the latest clock reading.
    #[test]
    fn time_going_backwards_mints_no_tokens(
        specs in specs(3, false),
        t0 in 0i64..=1_000_000_000_000,
        steps in prop::collection::vec(
            (prop_oneof![-50_000_000_000i64..=0, 0i64..=50_000_000_000, -100i64..=100], 0u8..5, 1u64..=50),
            1..40,
        ),
    ) {
        let config = build_config(&specs);
        let mut state = BucketState::new(&config, t0);
        let (mut now, mut latest, mut consumed) = (t0, t0, 0i128);
        for (dt, which, n) in steps {
            now = now.saturating_add(dt);
            latest = latest.max(now);
            let taken = match which {
                0 => u64::from(state.apply(&config, now, &ops::TryConsume(n)).unwrap()) * n,
                1 => state.apply(&config, now, &ops::TryConsumeAsMuchAsPossible(Some(n))).unwrap(),
                2 => state.apply(&config, now, &ops::ConsumeIgnoringRateLimits(n)).map_or(0, |_| n),
                3 => state.apply(&config, now, &ops::Reserve { tokens: n, max_wait_nanos: 1_000_000_000 }).unwrap().map_or(0, |_| n),
                _ => {
                    let p = state.apply(&config, now, &ops::TryConsumeAndReturnRemaining(n)).unwrap();
                    u64::from(p.is_consumed()) * n
                }
            };
            consumed += i128::from(taken);
        }
        let view = Refilled::new(&config, latest, |i| state.bandwidths()[i]);
        for (i, b) in config.bandwidths().iter().enumerate() {
            let (t, p) = (i128::from(b.refill_tokens()), (b.refill_period().as_nanos() as i128));
            let span = i128::from(latest) - i128::from(t0);
            let earned = if is_greedy(b) { (t * span) / p } else { t * (span / p) };
            let gained = i128::from(view.get(i).tokens()) + consumed - i128::from(b.initial_tokens());
            prop_assert!(gained <= earned, "bandwidth {} gained {} but can earn only {}", i, gained, earned);
        }
    }

}

proptest! {
    // Cheap cases, and the rarest corners (a balance near MIN refilled across more than 2^63 ns)
    // need many of them.
    #![proptest_config(proptest_config(2000))]

    /// Property 5: every operation is total for arbitrary raw states (torn reads), extreme
    /// configurations, any clock reading and any token argument; reported waits never exceed
    /// MAX, and refilling at `now + W` for a reported `W < MAX` does not overflow.
    #[test]
    fn every_operation_is_total(
        specs in specs(6, true),
        raw in prop::collection::vec((raw_i64(), raw_i64(), raw_i64()), 0..=7),
        now in prop_oneof![any::<i64>(), Just(MIN), Just(MAX), start_time()],
        n in prop_oneof![any::<u64>(), Just(u64::MAX), Just(MAXU), Just(MAXU + 1), 1u64..=3],
        limit in prop::option::of(any::<u64>()),
        max_wait in any::<u64>(),
        new_specs in specs(4, true),
        strategy in inheritance(),
    ) {
        let config = build_config(&specs);
        let state = BucketState::from_bandwidths(
            raw.iter().map(|(l, s, e)| BandwidthState::from_parts(*l, *s, *e)).collect(),
        );
        let matching = state.bandwidths().len() == config.bandwidths().len();
        let refill_at = |st: &BucketState, w: u64| {
            prop_assert!(w <= MAXU, "wait {} above MAX", w);
            if w < MAXU
                && let Some(t) = now.checked_add(w as i64) {
                    let _ = view_tokens(&config, st, t);
                }
            Ok(())
        };
        if matching {
            let v = Refilled::new(&config, now, |i| state.bandwidths()[i]);
            refill_at(&state, v.request_wait(n, true))?;
            refill_at(&state, v.request_wait(n, false))?;
            refill_at(&state, v.reset_wait(0))?;
            refill_at(&state, v.reset_wait(n))?;
            for t in [MIN, -1, 0, MAX] {
                let _ = view_tokens(&config, &state, t);
            }
            // Every mutation applies to any state without panicking.
            let _ = state.clone().apply(&config, now, &ops::ConsumeIgnoringRateLimits(n));
            let _ = state.clone().apply(&config, now, &ops::AddTokens(n));
            let _ = state.clone().apply(&config, now, &ops::ForceAddTokens(n));
            let _ = state.clone().apply(&config, now, &ops::Reset);
        }
        let mut s = state.clone();
        match s.apply(&config, now, &ops::TryConsumeAndReturnRemaining(n)) {
            Ok(p) => {
                refill_at(&s, nanos(p.wait_for_refill()))?;
                refill_at(&s, nanos(p.wait_for_reset()))?;
            }
            Err(e) => prop_assert!(matches!(e, OperationError::ZeroTokens | OperationError::StateMismatch)),
        }
        if let Ok(p) = state.clone().apply(&config, now, &ops::EstimateAbilityToConsume(n)) {
            refill_at(&state, nanos(p.wait_for_refill()))?;
        }
        let mut s = state.clone();
        if let Ok(w) = s.apply(&config, now, &ops::ConsumeIgnoringRateLimits(n)) {
            prop_assert!(w < MAXU);
            refill_at(&s, w)?;
        }
        let mut s = state.clone();
        if let Ok(Some(w)) = s.apply(&config, now, &ops::Reserve { tokens: n, max_wait_nanos: max_wait }) {
            prop_assert!(w < MAXU && w <= max_wait);
            refill_at(&s, w)?;
        }
        let _ = state.clone().apply(&config, now, &ops::TryConsume(n));
        let _ = state.clone().apply(&config, now, &ops::TryConsumeAsMuchAsPossible(limit));
        let _ = state.clone().apply(&config, now, &ops::AddTokens(n));
        let _ = state.clone().apply(&config, now, &ops::ForceAddTokens(n));
        let _ = state.clone().apply(&config, now, &ops::Reset);
        let _ = state.available_tokens(&config, now);
        let _ = state.check(&config);
        let new = build_config(&new_specs);
        for wall in [false, true] {
            if let Ok(r) = state.replace_configuration(&config, &new, now, strategy, wall) {
                prop_assert_eq!(r.bandwidths().len(), new.bandwidths().len());
                let _ = r.available_tokens(&new, now);
            }
        }
    }

    /// Property 6: zero arguments, a state of the wrong shape and replacements that break
    /// validation return the typed error and leave the state exactly as it was.
    #[test]
    fn bad_arguments_are_typed_errors_and_change_nothing(
        specs in specs(6, true),
        t0 in start_time(),
        prefix in prop::collection::vec(op(), 0..12),
        n in 1u64..=100,
        at in clock_step(),
        extra in any::<bool>(),
        aligned in (0u64..=MAXU, any::<bool>()),
    ) {
        use OperationError::*;
        let (config, state, now) = run_prefix(&specs, t0, &prefix);
        let now = now.saturating_add(at);
        let expect = |op: &dyn Fn(&mut BucketState) -> Result<(), OperationError>, err: OperationError, st: &BucketState| {
            let mut copy = st.clone();
            prop_assert_eq!(op(&mut copy), Err(err));
            prop_assert_eq!(&copy, st);
            Ok(())
        };
        let c = &config;
        expect(&|s| s.apply(c, now, &ops::TryConsume(0)).map(drop), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::TryConsumeAndReturnRemaining(0)).map(drop), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::EstimateAbilityToConsume(0)).map(drop), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::TryConsumeAsMuchAsPossible(Some(0))).map(drop), ZeroLimit, &state)?;
        expect(&|s| s.apply(c, now, &ops::AddTokens(0)), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::ForceAddTokens(0)), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::ConsumeIgnoringRateLimits(0)).map(drop), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::Reserve { tokens: 0, max_wait_nanos: 0 }).map(drop), ZeroTokens, &state)?;
        expect(&|s| s.apply(c, now, &ops::Reserve { tokens: n, max_wait_nanos: 0 }).map(drop), ZeroMaxWait, &state)?;
        // A reservation that can never be repaid is refused and changes nothing.
        expect(&|s| s.apply(c, now, &ops::ConsumeIgnoringRateLimits(u64::MAX)).map(drop), WaitTooLong, &state)?;
        let mut copy = state.clone();
        prop_assert_eq!(copy.apply(c, now, &ops::Reserve { tokens: u64::MAX, max_wait_nanos: u64::MAX }), Ok(None));
        prop_assert_eq!(&copy, &state);

        // A state with one bandwidth too many or too few.
        let mut wrong = state.bandwidths().to_vec();
        if extra || wrong.len() == 1 {
            wrong.push(BandwidthState::from_parts(now, 0, 0));
        } else {
            wrong.pop();
        }
        let wrong = BucketState::from_bandwidths(wrong);
        prop_assert!(wrong.check(c).is_err());
        expect(&|s| s.apply(c, now, &ops::TryConsume(n)).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::TryConsumeAndReturnRemaining(n)).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::EstimateAbilityToConsume(n)).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::TryConsumeAsMuchAsPossible(None)).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::AddTokens(n)), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::ForceAddTokens(n)), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::ConsumeIgnoringRateLimits(n)).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::Reserve { tokens: n, max_wait_nanos: u64::MAX }).map(drop), StateMismatch, &wrong)?;
        expect(&|s| s.apply(c, now, &ops::Reset), StateMismatch, &wrong)?;

        // Aligned refill on a clock that is not wall-clock based: rejected for every strategy.
        let aligned = Bandwidth::builder()
            .capacity(10)
            .refill_intervally_aligned(10, Duration::from_secs(1), Duration::from_nanos(aligned.0))
            .id("a")
            .build()
            .unwrap();
        let new = BucketConfiguration::builder().add_bandwidth(aligned).build().unwrap();
        for strategy in [
            TokensInheritanceStrategy::Proportionally,
            TokensInheritanceStrategy::AsIs,
            TokensInheritanceStrategy::Additive,
            TokensInheritanceStrategy::Reset,
        ] {
            let copy = state.clone();
            prop_assert_eq!(
                copy.replace_configuration(c, &new, now, strategy, false),
                Err(ConfigError::AlignedRefillNeedsWallClock)
            );
            prop_assert_eq!(&copy, &state);
        }
    }
}

/// A valid state for bandwidth `b` from raw draws: any last refill time, a balance anywhere
/// from `MIN` to `MAX`, a remainder in `[0, P)` (0 for interval kinds).
fn valid_state(b: &Bandwidth, l: i64, s: i64, e: u64) -> BandwidthState {
    let e = if is_greedy(b) {
        (e % (b.refill_period().as_nanos() as u64)) as i64
    } else {
        0
    };
    BandwidthState::from_parts(l, s, e)
}

fn balance() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -50i64..=50,
        1 => any::<i64>(),
        1 => Just(MIN),
        1 => Just(MAX),
        1 => (MIN + 1)..=(MIN + 3),
    ]
}

proptest! {
    #![proptest_config(proptest_config(600))]

    /// Replacement (section 7) from arbitrary valid states equals the reference model:
    /// matching by id, fresh state for unmatched bandwidths, the kept last refill time and the
    /// exact token and remainder arithmetic of every strategy.
    #[test]
    fn replacement_matches_the_reference_model(
        old_specs in specs(4, true),
        new_specs in specs(4, true),
        raw in prop::collection::vec((raw_i64(), balance(), any::<u64>()), 4),
        now in start_time(),
        strategy in inheritance(),
    ) {
        let old = build_config(&old_specs);
        let states: Vec<BandwidthState> = old
            .bandwidths()
            .iter()
            .zip(&raw)
            .map(|(b, (l, s, e))| valid_state(b, *l, *s, *e))
            .collect();
        let state = BucketState::from_bandwidths(states.clone());
        let new = build_config(&new_specs);
        let got = state.replace_configuration(&old, &new, now, strategy, true).unwrap();
        prop_assert_eq!(got.check(&new), Ok(()));
        let want = model_replace(&old, &states, &new, now, strategy);
        for (i, (b, (w, _))) in new.bandwidths().iter().zip(&want).enumerate() {
            let s = got.bandwidths()[i];
            match w {
                Some(w) => prop_assert_eq!(s, *w, "bandwidth {} with {:?}", i, strategy),
                None => prop_assert!(i128::from(s.tokens()) < cap(b)),
            }
        }
    }

    /// Section 11.1: waits stay exact when a bandwidth's last refill lies in the future, because
    /// an aligned bandwidth's first refill is more than one period ahead, because a greedy or
    /// interval bandwidth inherited such a last refill time through AS_IS, ADDITIVE or
    /// PROPORTIONALLY, or because the clock went backwards afterwards.
    #[test]
    fn waits_are_exact_with_the_last_refill_in_the_future(
        old in bandwidth_spec(false),
        periods_ahead in 1u64..=5,
        offset in 0u64..=1_000_000_000,
        adaptive in any::<bool>(),
        t0 in 0i64..=1_000_000_000_000,
        new in bandwidth_spec(false),
        strategy in prop_oneof![
            Just(TokensInheritanceStrategy::AsIs),
            Just(TokensInheritanceStrategy::Additive),
            Just(TokensInheritanceStrategy::Proportionally),
        ],
        before in prop::collection::vec(op(), 0..6),
        after in prop::collection::vec(op(), 1..25),
    ) {
        // Whole milliseconds, so that the first refill is not truncated below t0 + 2P.
        let first_refill = (t0 as u64)
            .saturating_add(old.period.saturating_mul(periods_ahead + 1))
            .saturating_add(offset)
            .div_ceil(1_000_000)
            .saturating_mul(1_000_000)
            .min(MAXU);
        let old = BwSpec {
            kind: KindSpec::Aligned { first_refill, adaptive },
            initial: if adaptive { None } else { old.initial },
            id: Some("x"),
            ..old
        };
        let new = BwSpec { id: Some("x"), ..new };
        let mut sim = Sim::new(&[old], t0)?;
        let l = sim.state.bandwidths()[0].last_refill_nanos();
        // Only a first refill clamped at MAX can fail to lie more than one period ahead.
        prop_assume!(l > t0);
        for op in before.iter().filter(|op| !matches!(op, Op::Replace(..))) {
            sim.step(op)?;
        }
        sim.step(&Op::Replace(vec![new], strategy))?;
        for op in after.iter().filter(|op| !matches!(op, Op::Replace(..))) {
            sim.step(op)?;
        }
    }
}

fn raw_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => any::<i64>(),
        1 => Just(MIN),
        1 => Just(MAX),
        1 => -3i64..=3,
        1 => (MAX - 3)..=MAX,
        1 => MIN..=(MIN + 3),
        2 => 0i64..=1_000_000_000_000,
    ]
}

#[cfg(feature = "serde")]
proptest! {
    #![proptest_config(proptest_config(200))]

    /// Serde round trip of random configurations and arbitrary states: equal after
    /// serializing and deserializing.
    #[test]
    fn serde_round_trips(
        specs in specs(6, true),
        raw in prop::collection::vec((raw_i64(), raw_i64(), raw_i64()), 0..=6),
    ) {
        let config = build_config(&specs);
        let json = serde_json::to_string(&config).unwrap();
        let back: BucketConfiguration = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &config);
        let state = BucketState::from_bandwidths(
            raw.iter().map(|(l, s, e)| BandwidthState::from_parts(*l, *s, *e)).collect(),
        );
        let json = serde_json::to_string(&state).unwrap();
        let back: BucketState = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &state);
    }
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

proptest! {
    #![proptest_config(proptest_config(2000))]

    /// The two-word encoding used by one-bandwidth lock-free buckets is exact: every scaled
    /// balance decodes to a state whose remainder is a multiple of the quantum in `0..period`
    /// and that encodes back to it; every encodable state decodes back to itself; and a state
    /// is encodable exactly when its remainder is such a multiple and `tokens × unit +
    /// remainder / quantum` fits `i64` (checked in `i128`). The quantum is recomputed here:
    /// `gcd(refill tokens, period)` for greedy refills, the period for interval refills.
    #[test]
    fn scaled_balance_round_trips(
        spec in bandwidth_spec(true),
        last in raw_i64(),
        scaled in raw_i64(),
        (tokens, remainder) in (raw_i64(), raw_i64()),
        quanta in -3i64..=3,
    ) {
        let b = build_bandwidth(&spec, None);
        let p = b.refill_period().as_nanos() as i128;
        let q = if b.refill_kind() != bucket4rs_core::RefillKind::Greedy { p } else { gcd(b.refill_tokens() as i128, p) };
        let unit = p / q;
        let decoded = ScaledState::new(last, scaled).to_state(&b);
        prop_assert_eq!(decoded.last_refill_nanos(), last);
        let e = decoded.remainder() as i128;
        prop_assert!((0..p).contains(&e) && e % q == 0);
        prop_assert_eq!(decoded.tokens() as i128 * unit + e / q, scaled as i128);
        prop_assert_eq!(ScaledState::from_state(&b, decoded).map(ScaledState::balance), Some(scaled));

        // Remainders near multiples of the quantum as well as arbitrary ones.
        for remainder in [remainder, (remainder as i128 / q * q + quanta as i128) as i64] {
            let state = BandwidthState::from_parts(last, tokens, remainder);
            let e = remainder as i128;
            let wide = tokens as i128 * unit + e / q;
            let fits = (0..p).contains(&e)
                && e % q == 0
                && (i64::MIN as i128..=i64::MAX as i128).contains(&wide);
            match ScaledState::from_state(&b, state).map(ScaledState::balance) {
                Some(s) => {
                    prop_assert!(fits);
                    prop_assert_eq!(s as i128, wide);
                    prop_assert_eq!(ScaledState::new(last, s).to_state(&b), state);
                }
                None => prop_assert!(!fits),
            }
        }
    }
}
