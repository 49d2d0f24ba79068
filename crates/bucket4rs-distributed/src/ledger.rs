//! Settlement of in-doubt calls: the record's ledger of recent operations.
//!
//! Every writing operation a manager sends to a remote backend carries an [`OperationId`]:
//! the manager (`owner`, random per manager), a sequence number, and the manager's `floor`
//! (every operation of this owner numbered below it has been answered or settled). An
//! operation that takes tokens leaves an entry in the record: per bandwidth, the *give-back*
//! `D`, the units (tokens × refill period + remainder, the core's exact refill unit) that
//! returning the operation would add. A call whose reply was lost (in doubt) is listed in the
//! owner's next operation on the key; there, its entry is found and given back, or, if it is
//! not there (never applied), a tombstone records that it must never be applied later.
//!
//! ## Why the give-back stays exact
//! In refill units (tokens × refill period + remainder, exact for greedy and interval refill)
//! a bandwidth below capacity evolves by `x ↦ x - k` (every consumption, by what the call
//! took) and `x ↦ min(C, x + a)` (refill, `add_tokens`). Write `u_j` for "entry `j` did not
//! happen" (`u_j = n_j`, what it took) or did (`u_j = 0`). The state as a function of the
//! `u`s is then a minimum of affine terms: `Φ(u) = min_p (M_p + Σ_{j > p} u_j)`, one term per
//! *level* `p` (between entry `p` and entry `p + 1`, in order): a refill that reached capacity
//! while entries `1..=p` existed made a term `C + (what came after)` in which their `u`s
//! vanished. The ledger stores each level as `R_p = M_p - A ≥ 0` (`A = Φ(0)`, the state, so
//! the smallest `R_p` is 0): a consumption shifts every term alike (no `R` changes), a new
//! entry opens a new level (infinite) above the others, and a refill by `a` to
//! `A' = min(C, A + a)` adds the overflow `A + a - A'` to every level but the top one, which
//! becomes `min(R_top + overflow, C - A')`. Settling entry `j` sets `u_j = n_j`: the levels
//! below it gain `n_j`, its level merges with the one below (min), and the state rises by the
//! new smallest level, which is exactly `Φ` at the settled `u` (every other call's answer
//! kept, the failed call gone). Forgetting an entry (answered, expired) merges its level the
//! same way with `u_j = 0`. This is checked against the brute-force counterfactual in the
//! tests below.
//!
//! Where the argument does not hold the levels are made smaller, which gives back less,
//! never more (no over-grant): a counterfactual state above capacity (force-added) is taken
//! as if capped; a batch with `add_tokens`, `force_add_tokens` or `reset` sets every level to
//! 0 (nothing before it is given back), and records no entry of its own; a configuration
//! replacement drops the entries (tombstones stay). A failed call that gave tokens
//! (`add_tokens`) is not taken back.

use bucket4rs_core::ops::Refilled;
use bucket4rs_core::{Bandwidth, BandwidthState, BucketState, RefillKind};

use crate::backend::{Command, OperationId};
use crate::format::{Ledger, LedgerEntry, Level, Record, Tombstone};

/// Entries (and tombstones) a record keeps at most; the oldest go first.
pub(crate) const MAX_ENTRIES: usize = 32;
/// Expiry times are the bucket's clock shifted right by this many bits (1.05 ms units).
pub(crate) const SHIFT: u32 = 20;

/// What a transaction's ledger work found before its operations ran.
pub(crate) struct Prepared {
    /// The state the operations start from (refilled to now when something was settled).
    start: Vec<BandwidthState>,
    /// Whether a settlement changed the record: it must be written.
    pub(crate) changed: bool,
}

/// The operation's id is in the ledger already: it ran, or it was settled. It must not run.
#[derive(Debug)]
pub(crate) struct AlreadySeen;

fn period(b: &Bandwidth) -> i128 {
    b.refill_period().as_nanos() as i128
}

fn units(b: &Bandwidth, s: &BandwidthState) -> i128 {
    s.tokens() as i128 * period(b) + s.remainder() as i128
}

fn cap_units(b: &Bandwidth) -> i128 {
    b.capacity() as i128 * period(b)
}

fn min(a: Level, b: Level) -> Level {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

fn level(l: &mut Ledger, p: usize, i: usize) -> &mut Level {
    if p == 0 {
        &mut l.base[i]
    } else {
        &mut l.entries[p - 1].level[i]
    }
}

/// The refill of `pre` to `now` as the core computes it, before the cap: in refill units
/// (`None`: no refill happens, the state is at or above capacity or the clock did not move).
fn unclamped(b: &Bandwidth, pre: &BandwidthState, now: i64) -> Option<i128> {
    let l = pre.last_refill_nanos();
    if now <= l || pre.tokens() >= b.capacity() as i64 {
        return None;
    }
    let elapsed = now as i128 - l as i128;
    let d = if matches!(b.refill_kind(), RefillKind::Greedy) {
        elapsed
    } else {
        elapsed - elapsed % period(b)
    };
    // No whole period passed (interval refill): no refill, as the core and the script say.
    (d > 0).then(|| units(b, pre) + b.refill_tokens() as i128 * d)
}

/// The levels of bandwidth `i` after its state went from `x` (below capacity) towards
/// `x_plus` (before the cap) and ended at `min(C, x_plus)`.
fn capped(l: &mut Ledger, b: &Bandwidth, i: usize, x_plus: i128) {
    let k = l.entries.len();
    if k == 0 {
        return;
    }
    let cap = cap_units(b);
    if x_plus >= cap {
        let overflow = x_plus - cap;
        for p in 0..k {
            let v = level(l, p, i);
            *v = v.map(|r| r.saturating_add(overflow));
        }
        *level(l, k, i) = Some(0);
    } else {
        let v = level(l, k, i);
        *v = min(*v, Some(cap - x_plus));
    }
}

/// Forgets entry `j` (0-based) with `u_j = 0`: its level merges into the one below.
fn forget(l: &mut Ledger, j: usize) {
    let n = l.base.len();
    for i in 0..n {
        let above = l.entries[j].level[i];
        let below = level(l, j, i);
        *below = min(*below, above);
    }
    l.entries.remove(j);
    if l.entries.is_empty() {
        l.base.clear();
    }
}

/// Settles entry `j` (0-based): `u_j = n_j`, then the state rises by the smallest level.
fn settle(record: &mut Record, j: usize) {
    let n = record.config.bandwidths().len();
    let k = record.ledger.entries.len();
    for i in 0..n {
        let mut lv: Vec<Level> = (0..=k).map(|p| *level(&mut record.ledger, p, i)).collect();
        let taken = record.ledger.entries[j].taken[i];
        for v in &mut lv[..=j] {
            *v = v.map(|r| r.saturating_add(taken));
        }
        lv[j] = min(lv[j], lv[j + 1]);
        lv.remove(j + 1);
        let rise = lv.iter().filter_map(|v| *v).min().unwrap_or(0);
        for v in &mut lv {
            *v = v.map(|r| r - rise);
        }
        // Level p of the ledger without entry j: the base, then the entries before j, then
        // those after it.
        for (p, v) in lv.into_iter().enumerate() {
            match p {
                0 => record.ledger.base[i] = v,
                _ if p - 1 < j => record.ledger.entries[p - 1].level[i] = v,
                _ => record.ledger.entries[p].level[i] = v,
            }
        }
        let b = &record.config.bandwidths()[i];
        let s = record.state.bandwidths()[i];
        let u = units(b, &s).saturating_add(rise);
        let per = period(b);
        record.state.bandwidths_mut()[i] = BandwidthState::from_parts(
            s.last_refill_nanos(),
            i64::try_from(u.div_euclid(per)).unwrap_or(i64::MAX),
            u.rem_euclid(per) as i64,
        );
    }
    record.ledger.entries.remove(j);
    if record.ledger.entries.is_empty() {
        record.ledger.base.clear();
    }
}

fn expiry(id: &OperationId, now: i64) -> i64 {
    (now >> SHIFT).saturating_add(id.window)
}

fn seen(l: &Ledger, owner: u64, seq: u64) -> bool {
    l.entries.iter().any(|e| e.owner == owner && e.seq == seq)
        || l.tombstones
            .iter()
            .any(|t| t.owner == owner && t.seq == seq)
}

/// Forgets the entries `drop` picks, oldest first (each merging its level).
fn forget_where(l: &mut Ledger, drop: impl Fn(&LedgerEntry) -> bool) {
    while let Some(j) = l.entries.iter().position(&drop) {
        forget(l, j);
    }
}

/// Before the operations: forgets expired entries, refuses an operation already seen, moves
/// every level through the refill to `now`, then settles what `id` lists (on the state
/// refilled to `now`, which then replaces the stored one).
pub(crate) fn before(
    record: &mut Record,
    id: &OperationId,
    now: i64,
) -> Result<Prepared, AlreadySeen> {
    let nowq = now >> SHIFT;
    let n = record.config.bandwidths().len();
    forget_where(&mut record.ledger, |e| e.expires <= nowq);
    record.ledger.tombstones.retain(|t| t.expires > nowq);
    if seen(&record.ledger, id.owner, id.seq) {
        return Err(AlreadySeen);
    }
    let pre = record.state.bandwidths().to_vec();
    let refilled: Vec<BandwidthState> = {
        let r = Refilled::new(&record.config, now, |i| {
            pre.get(i).copied().unwrap_or_default()
        });
        (0..n).map(|i| r.get(i)).collect()
    };
    for i in 0..n {
        let b = &record.config.bandwidths()[i];
        if let Some(x_plus) = unclamped(b, &pre[i], now) {
            debug_assert_eq!(x_plus.min(cap_units(b)), units(b, &refilled[i]));
            capped(&mut record.ledger, b, i, x_plus);
        }
    }
    if id.settles.is_empty() {
        // The stored state stays as it is: whether the operations change it decides the
        // write, exactly as without a ledger (and as the Redis script does).
        return Ok(Prepared {
            start: refilled,
            changed: false,
        });
    }
    record.state = BucketState::from_bandwidths(refilled);
    for &seq in &id.settles {
        if let Some(j) = record
            .ledger
            .entries
            .iter()
            .position(|e| e.owner == id.owner && e.seq == seq)
        {
            settle(record, j);
        } else if seen(&record.ledger, id.owner, seq) {
            continue;
        }
        record.ledger.tombstones.push(Tombstone {
            owner: id.owner,
            seq,
            expires: expiry(id, now),
        });
    }
    let over = record.ledger.tombstones.len().saturating_sub(MAX_ENTRIES);
    record.ledger.tombstones.drain(..over);
    Ok(Prepared {
        start: record.state.bandwidths().to_vec(),
        changed: true,
    })
}

/// After operations that changed the record: moves the levels through what `commands`
/// added, forgets the owner's answered operations, and records what this one took.
/// `prepared` is `None` for a record the operations created (it started fresh at `now`).
pub(crate) fn after(
    record: &mut Record,
    id: &OperationId,
    prepared: Option<&Prepared>,
    commands: &[Command],
    now: i64,
) {
    let n = record.config.bandwidths().len();
    let l = &mut record.ledger;
    if commands.contains(&Command::ReplaceConfiguration) {
        l.entries.clear();
        l.base.clear();
        return;
    }
    let start = match prepared {
        Some(p) => p.start.clone(),
        None => BucketState::new(&record.config, now).bandwidths().to_vec(),
    };
    let gives = commands.iter().any(|c| {
        matches!(
            c,
            Command::AddTokens(_) | Command::ForceAddTokens(_) | Command::Reset
        )
    });
    if gives {
        for (i, (b, from)) in record.config.bandwidths().iter().zip(&start).enumerate() {
            match commands {
                // One add_tokens below capacity: the refill's map, exactly.
                [Command::AddTokens(k)] if from.tokens() < b.capacity() as i64 => {
                    let x_plus = units(b, from) + *k as i128 * period(b);
                    capped(l, b, i, x_plus);
                }
                // One force_add_tokens: every term moves alike.
                [Command::ForceAddTokens(_)] => {}
                _ => {
                    for p in 0..=l.entries.len() {
                        if !l.entries.is_empty() {
                            *level(l, p, i) = Some(0);
                        }
                    }
                }
            }
        }
    }
    forget_where(l, |e| e.owner == id.owner && e.seq < id.floor);
    if !gives {
        let taken: Vec<i128> = (0..n)
            .map(|i| {
                let b = &record.config.bandwidths()[i];
                (units(b, &start[i]) - units(b, &record.state.bandwidths()[i])).max(0)
            })
            .collect();
        if taken.iter().any(|&t| t > 0) {
            if l.base.is_empty() {
                l.base = vec![Some(0); n];
            }
            l.entries.push(LedgerEntry {
                owner: id.owner,
                seq: id.seq,
                expires: expiry(id, now),
                taken,
                level: vec![None; n],
            });
        }
    }
    while l.entries.len() > MAX_ENTRIES {
        forget(l, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucket4rs_core::BucketConfiguration;
    use bucket4rs_core::ops::{AddTokens, ConsumeIgnoringRateLimits, TryConsume};
    use core::time::Duration;
    use rand::{Rng, SeedableRng};

    use crate::backend::Write;
    use crate::format;
    use crate::record::apply_bytes;

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Consume(u64),
        Add(u64),
        Ignore(u64),
    }

    fn command(op: Op) -> Command {
        match op {
            Op::Consume(n) => Command::TryConsume(n),
            Op::Add(n) => Command::AddTokens(n),
            Op::Ignore(n) => Command::ConsumeIgnoringRateLimits(n),
        }
    }

    fn id(seq: u64, floor: u64, settles: Vec<u64>) -> OperationId {
        OperationId {
            owner: 7,
            seq,
            floor,
            settles,
            window: 1 << 40,
        }
    }

    /// Runs `op` through the ledger as a manager would; whether it took effect (the tokens
    /// a try_consume took).
    fn run(bytes: &mut Vec<u8>, id: &OperationId, op: Op, now: i64) -> bool {
        let cmd = [command(op)];
        let mut took = false;
        let w = apply_bytes(Some(bytes), now, Duration::ZERO, Some((id, &cmd)), |r| {
            let r = r.as_mut().unwrap();
            let before = r.state.clone();
            took = match op {
                Op::Consume(n) => r.state.apply(&r.config, now, &TryConsume(n)).unwrap(),
                Op::Add(n) => {
                    r.state.apply(&r.config, now, &AddTokens(n)).unwrap();
                    true
                }
                Op::Ignore(n) => {
                    r.state
                        .apply(&r.config, now, &ConsumeIgnoringRateLimits(n))
                        .unwrap();
                    true
                }
            };
            r.state != before
        })
        .unwrap();
        if let Write::Put { record, .. } = w {
            *bytes = record;
        }
        took
    }

    /// The exactness argument, checked: operations at random times on random greedy and
    /// interval configurations, some of them "failed" (their reply lost), then settled. The
    /// settled state is the one every other call's effect leaves without the failed calls,
    /// to the token and the remainder.
    #[test]
    fn settling_gives_back_exactly_what_the_failed_calls_left_behind() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        let mut settled_any = 0;
        for case in 0..3_000 {
            let mut b = bucket4rs_core::Bandwidth::builder().capacity(rng.random_range(1..=50));
            let tokens = rng.random_range(1..=7);
            let period = Duration::from_nanos(rng.random_range(10..=1_000));
            b = if rng.random_bool(0.5) {
                b.refill_greedy(tokens, period)
            } else {
                b.refill_intervally(tokens, period)
            };
            let mut builder = BucketConfiguration::builder().add_bandwidth(b.build().unwrap());
            if rng.random_bool(0.3) {
                builder = builder.add_bandwidth(
                    bucket4rs_core::Bandwidth::simple(
                        rng.random_range(1..=80),
                        Duration::from_nanos(rng.random_range(100..=3_000)),
                    )
                    .unwrap(),
                );
            }
            let config = builder.build().unwrap();
            let mut now = 0i64;
            let mut bytes = format::encode(&config, &BucketState::new(&config, now));
            let mut shadow = BucketState::new(&config, now);
            let mut failed = Vec::new();
            let mut pending = Vec::new();
            let len = rng.random_range(1..=25);
            for seq in 1..=len {
                now += rng.random_range(0..=400);
                let op = match rng.random_range(0..10) {
                    0 => Op::Add(rng.random_range(1..=20)),
                    1 => Op::Ignore(rng.random_range(1..=10)),
                    _ => Op::Consume(rng.random_range(1..=10)),
                };
                // Settlement takes back what a failed call took; a failed add_tokens keeps
                // what it gave (documented), so the failed calls here are consumptions.
                let fails = !matches!(op, Op::Add(_)) && rng.random_bool(0.25);
                // Sometimes the calls in doubt so far are settled by this operation (the
                // owner's next round trip), else at the end.
                let settles = if rng.random_bool(0.2) {
                    core::mem::take(&mut pending)
                } else {
                    Vec::new()
                };
                let floor = pending.first().or(settles.first()).copied().unwrap_or(seq);
                let took = run(&mut bytes, &id(seq, floor, settles), op, now);
                if fails {
                    failed.push(seq);
                    pending.push(seq);
                } else if took {
                    // The same effect without the failed calls: what this call took or added.
                    let effect = match op {
                        Op::Consume(n) | Op::Ignore(n) => Op::Ignore(n),
                        add => add,
                    };
                    let mut s = format::encode(&config, &shadow);
                    run(&mut s, &id(0, 0, Vec::new()), effect, now);
                    shadow = format::decode(&s).unwrap().state;
                }
            }
            now += rng.random_range(0..=400);
            let mut record = format::decode(&bytes).unwrap();
            let settle = id(
                len + 1,
                pending.first().copied().unwrap_or(len + 1),
                pending,
            );
            ledger_settle(&mut record, &settle, now);
            let want: Vec<_> = {
                let r = Refilled::new(&config, now, |i| shadow.bandwidths()[i]);
                (0..config.bandwidths().len()).map(|i| r.get(i)).collect()
            };
            let got: Vec<_> = {
                let r = Refilled::new(&config, now, |i| record.state.bandwidths()[i]);
                (0..config.bandwidths().len()).map(|i| r.get(i)).collect()
            };
            let tokens = |v: &[BandwidthState]| -> Vec<(i64, i64)> {
                v.iter().map(|s| (s.tokens(), s.remainder())).collect()
            };
            assert_eq!(
                tokens(&got),
                tokens(&want),
                "case {case}: {config:?}, failed {failed:?}"
            );
            settled_any += usize::from(!failed.is_empty());
        }
        assert!(settled_any > 1_000);
    }

    fn ledger_settle(record: &mut Record, id: &OperationId, now: i64) {
        before(record, id, now).map(|_| ()).unwrap();
    }

    #[test]
    fn an_operation_already_recorded_or_settled_is_refused() {
        let config = BucketConfiguration::builder()
            .add_bandwidth(bucket4rs_core::Bandwidth::simple(10, Duration::from_secs(1)).unwrap())
            .build()
            .unwrap();
        let mut bytes = format::encode(&config, &BucketState::new(&config, 0));
        assert!(run(&mut bytes, &id(1, 1, vec![]), Op::Consume(3), 0));
        let mut record = format::decode(&bytes).unwrap();
        assert!(
            before(&mut record, &id(1, 1, vec![]), 0).is_err(),
            "applied"
        );
        // Settling an operation that never arrived leaves a tombstone: it never runs later.
        let mut record = format::decode(&bytes).unwrap();
        before(&mut record, &id(2, 1, vec![5]), 0).unwrap();
        assert!(
            before(&mut record, &id(5, 1, vec![]), 0).is_err(),
            "settled"
        );
        assert_eq!(
            record.state.bandwidths()[0].tokens(),
            7,
            "nothing to give back"
        );
    }
}
