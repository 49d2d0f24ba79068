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
use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState, RefillKind};

use crate::backend::{Command, OperationId};
use crate::format::{Ledger, LedgerEntry, Level, Record, Tombstone};

/// Entries (and tombstones) a record keeps at most; the oldest go first.
pub(crate) const MAX_ENTRIES: usize = 32;
/// The mark of a lease's entry: its sequence number with this bit set (sequence numbers stay
/// far below it, and the mark keeps them below 2^53, exact for the Redis script). A marked
/// entry is never forgotten by its owner's floor: its return removes it, or its owner's next
/// lease (a lease whose tokens were all used gives nothing back), or its expiry. Only marked
/// entries count towards the leases a key may hold.
pub(crate) const LEASE_BIT: u64 = 1 << 52;
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

/// Whether the key may take another lease for `owner`: fewer than `room` marked entries of
/// other owners (this owner's earlier ones are forgotten by its lease).
pub(crate) fn lease_room(l: &Ledger, owner: u64, room: usize) -> bool {
    l.entries
        .iter()
        .filter(|e| e.seq & LEASE_BIT != 0 && e.owner != owner)
        .count()
        < room
}

/// `tokens` in refill units, per bandwidth of `config` (what a lease of `tokens` took from
/// each).
pub(crate) fn units_of(config: &BucketConfiguration, tokens: u64) -> Vec<u128> {
    config
        .bandwidths()
        .iter()
        .map(|b| u128::from(tokens) * b.refill_period().as_nanos())
        .collect()
}

/// Per bandwidth, the refill units that refilling `state` to `now` loses to the capacity
/// (zero where it stays below, or does not refill).
pub(crate) fn overflow(config: &BucketConfiguration, state: &BucketState, now: i64) -> Vec<u128> {
    config
        .bandwidths()
        .iter()
        .zip(state.bandwidths())
        .map(|(b, s)| {
            unclamped(b, s, now).map_or(0, |x| u128::try_from(x - cap_units(b)).unwrap_or(0))
        })
        .collect()
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

/// Gives entry `j` (0-based) back in part and forgets it: `u_j = g_i` on bandwidth `i` (`g`
/// is `give(i, taken_i)`, at most what it took), then the state rises by the smallest level.
/// A settlement gives back everything it took; a lease's return what it did not use.
fn give_back(record: &mut Record, j: usize, give: impl Fn(usize, i128) -> i128) {
    let n = record.config.bandwidths().len();
    let k = record.ledger.entries.len();
    for i in 0..n {
        let mut lv: Vec<Level> = (0..=k).map(|p| *level(&mut record.ledger, p, i)).collect();
        let taken = record.ledger.entries[j].taken[i];
        let given = give(i, taken).clamp(0, taken.max(0));
        for v in &mut lv[..=j] {
            *v = v.map(|r| r.saturating_add(given));
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
    l.entries
        .iter()
        .any(|e| e.owner == owner && (e.seq == seq || e.seq == seq | LEASE_BIT))
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
/// every level through the refill to `now`, then makes the returns and settlements `id`
/// lists (on the state refilled to `now`, which then replaces the stored one).
///
/// A transaction that returns or settles finds entries past their expiry that no write has
/// forgotten yet, and forgets them after: an entry stays exact for as long as it is in the
/// record (forgetting first or last commutes with the levels' refill), so a lease returned
/// after a clock jump with no other write in between gives back what it did not use. The
/// Redis script never returns or settles, so its order (forget first) is this one's for
/// every transaction it runs.
pub(crate) fn before(
    record: &mut Record,
    id: &OperationId,
    now: i64,
) -> Result<Prepared, AlreadySeen> {
    let nowq = now >> SHIFT;
    let n = record.config.bandwidths().len();
    let settling = !id.settles.is_empty() || !id.returns.is_empty();
    if !settling {
        forget_where(&mut record.ledger, |e| e.expires <= nowq);
    }
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
    let find = |l: &Ledger, seq: u64| {
        l.entries
            .iter()
            .position(|e| e.owner == id.owner && e.seq == seq)
    };
    let returns = id
        .returns
        .iter()
        .any(|(seq, _)| find(&record.ledger, *seq).is_some());
    if id.settles.is_empty() && !returns {
        // The stored state stays as it is: whether the operations change it decides the
        // write, exactly as without a ledger (and as the Redis script does).
        forget_where(&mut record.ledger, |e| e.expires <= nowq);
        return Ok(Prepared {
            start: refilled,
            changed: false,
        });
    }
    record.state = BucketState::from_bandwidths(refilled);
    // A lease's return: what it did not use goes back, and the entry is forgotten (the rest
    // was used). A return whose entry is gone (expired, or pushed out of a full ledger) gives
    // nothing back: less, never more.
    for (seq, unused) in &id.returns {
        if let Some(j) = find(&record.ledger, *seq) {
            give_back(record, j, |i, _| {
                unused
                    .get(i)
                    .map_or(0, |&u| i128::try_from(u).unwrap_or(i128::MAX))
            });
        }
    }
    for &seq in &id.settles {
        // The operation's entry, marked if it took a lease.
        let entry = find(&record.ledger, seq).or_else(|| find(&record.ledger, seq | LEASE_BIT));
        if let Some(j) = entry {
            give_back(record, j, |_, taken| taken);
        } else if seen(&record.ledger, id.owner, seq) {
            continue;
        }
        record.ledger.tombstones.push(Tombstone {
            owner: id.owner,
            seq,
            expires: expiry(id, now),
        });
    }
    forget_where(&mut record.ledger, |e| e.expires <= nowq);
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
    // A lease: this owner's earlier leases of the key have ended (their returns were made
    // first, in `before`); what is left of them was used.
    let leasing = commands.iter().any(|c| matches!(c, Command::Lease { .. }));
    if leasing {
        forget_where(l, |e| e.owner == id.owner && e.seq & LEASE_BIT != 0);
    }
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
                seq: if leasing { id.seq | LEASE_BIT } else { id.seq },
                expires: expiry(id, now),
                taken,
                level: vec![None; n],
            });
        }
    }
    // A full ledger forgets its oldest entry, a lease's last: a lease forgotten gives none of
    // its unused tokens back.
    while l.entries.len() > MAX_ENTRIES {
        let j = l.entries.iter().position(|e| e.seq & LEASE_BIT == 0);
        forget(l, j.unwrap_or(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucket4rs_core::BucketConfiguration;
    use bucket4rs_core::ops::{
        AddTokens, ConsumeIgnoringRateLimits, TryConsume, TryConsumeAsMuchAsPossible,
    };
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
        Lease(u64),
    }

    fn command(op: Op) -> Command {
        match op {
            Op::Consume(n) => Command::TryConsume(n),
            Op::Add(n) => Command::AddTokens(n),
            Op::Ignore(n) => Command::ConsumeIgnoringRateLimits(n),
            Op::Lease(n) => Command::Lease {
                tokens: n,
                processes: 1,
            },
        }
    }

    fn id(seq: u64, floor: u64, settles: Vec<u64>) -> OperationId {
        OperationId {
            owner: 7,
            seq,
            floor,
            settles,
            returns: Vec::new(),
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
                Op::Lease(n) => {
                    r.state
                        .apply(&r.config, now, &TryConsumeAsMuchAsPossible(Some(n)))
                        .unwrap()
                        > 0
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

    /// A lease's return is exact: operations at random times on random configurations, some
    /// of them leases (`Command::Lease`: as many tokens as every bandwidth has, up to a size)
    /// whose unused part is returned at a random later moment (in any order, before or after
    /// other leases' returns, with consumptions, additions and refills in between). After the
    /// last return the state is the one every call leaves when each lease took only what it
    /// used, at the moment it took it: to the token and the remainder. (Returning the unused
    /// part "capped at capacity" instead over-gives whenever the bucket would have been full
    /// in between without the lease; this test fails for that rule.)
    #[test]
    fn returning_a_lease_leaves_the_state_as_if_it_had_taken_only_what_it_used() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let mut returned_any = 0;
        for case in 0..3_000 {
            let mut b = bucket4rs_core::Bandwidth::builder().capacity(rng.random_range(1..=60));
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
            // Live leases, each of a manager of its own (one lease per key and manager):
            // (owner, its entry's mark, unused part to return in refill units per bandwidth).
            let mut live: Vec<(u64, u64, Vec<u128>)> = Vec::new();
            let len = rng.random_range(1..=30);
            let effect = |shadow: &mut BucketState, op: Op, now: i64| {
                let mut s = format::encode(&config, shadow);
                run(&mut s, &id(0, 0, Vec::new()), op, now);
                *shadow = format::decode(&s).unwrap().state;
            };
            let mut seq = 0;
            while seq < len || !live.is_empty() {
                seq += 1;
                now += rng.random_range(0..=400);
                // Some leases come back now, each by a transaction of its own manager that
                // only returns (a lease's return rides on its manager's next transaction).
                if seq > len || rng.random_bool(0.3) {
                    while !live.is_empty() && (seq > len || rng.random_bool(0.5)) {
                        let (owner, mark, unused) =
                            live.swap_remove(rng.random_range(0..live.len()));
                        let mut back = id(seq, seq, Vec::new());
                        back.owner = owner;
                        back.returns = vec![(mark, unused)];
                        run_lease(&mut bytes, &back, Op::Consume(0), now);
                        returned_any += 1;
                    }
                }
                if seq > len {
                    continue;
                }
                let op = match rng.random_range(0..10) {
                    0 => Op::Add(rng.random_range(1..=20)),
                    1 => Op::Ignore(rng.random_range(1..=10)),
                    2..=5 => Op::Lease(rng.random_range(1..=30)),
                    _ => Op::Consume(rng.random_range(1..=10)),
                };
                let mut op_id = id(seq, seq, Vec::new());
                if matches!(op, Op::Lease(_)) {
                    op_id.owner = 1_000 + seq;
                }
                let took = run_lease(&mut bytes, &op_id, op, now);
                match (op, took) {
                    (Op::Lease(_), m) if m > 0 => {
                        let unused = rng.random_range(0..=m);
                        // A lease's entry is marked (`LEASE_BIT`): its return names it so.
                        live.push((op_id.owner, seq | LEASE_BIT, units_of(&config, unused)));
                        if m > unused {
                            effect(&mut shadow, Op::Ignore(m - unused), now);
                        }
                    }
                    (Op::Consume(n) | Op::Ignore(n), 1) => effect(&mut shadow, Op::Ignore(n), now),
                    (Op::Add(n), 1) => effect(&mut shadow, Op::Add(n), now),
                    _ => {}
                }
            }
            let record = format::decode(&bytes).unwrap();
            let tokens = |s: &BucketState| -> Vec<(i64, i64)> {
                let r = Refilled::new(&config, now, |i| s.bandwidths()[i]);
                (0..config.bandwidths().len())
                    .map(|i| (r.get(i).tokens(), r.get(i).remainder()))
                    .collect()
            };
            assert_eq!(
                tokens(&record.state),
                tokens(&shadow),
                "case {case}: {config:?}"
            );
        }
        assert!(returned_any > 3_000);
    }

    /// [`run`] for the lease test: a lease takes as many tokens as it can (up to its size);
    /// what an operation took (a lease), or 1 when it took effect. `Consume(0)` only returns.
    fn run_lease(bytes: &mut Vec<u8>, id: &OperationId, op: Op, now: i64) -> u64 {
        let Op::Lease(n) = op else {
            if matches!(op, Op::Consume(0)) {
                let cmd = [Command::AvailableTokens];
                let w = apply_bytes(Some(bytes), now, Duration::ZERO, Some((id, &cmd)), |_| {
                    false
                })
                .unwrap();
                if let Write::Put { record, .. } = w {
                    *bytes = record;
                }
                return 0;
            }
            return u64::from(run(bytes, id, op, now));
        };
        let cmd = [Command::Lease {
            tokens: n,
            processes: 1,
        }];
        let mut took = 0;
        let w = apply_bytes(Some(bytes), now, Duration::ZERO, Some((id, &cmd)), |r| {
            let r = r.as_mut().unwrap();
            took = r
                .state
                .apply(&r.config, now, &TryConsumeAsMuchAsPossible(Some(n)))
                .unwrap();
            took > 0
        })
        .unwrap();
        if let Write::Put { record, .. } = w {
            *bytes = record;
        }
        took
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
