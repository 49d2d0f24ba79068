//! Per-bandwidth formulas: fresh state, refill and waits (SEMANTICS.md sections 3–5).
//!
//! Every function here is total: for *any* field values (even a torn or corrupted state) it
//! returns without panicking or overflowing. Intermediates are `i128`; results are saturated or
//! clamped into `i64` only at the end.

use strength_reduce::StrengthReducedU64;

use crate::config::{Bandwidth, RefillKind};
use crate::state::{BandwidthState, ScaledState};

/// `i64::MAX`, the saturation value of every wait.
pub(crate) const MAX: i64 = i64::MAX;

/// `min(x, MAX)` and never below zero: the reported form of a wait.
#[inline]
pub(crate) fn sat_wait(x: i128) -> i64 {
    if x >= MAX as i128 {
        MAX
    } else if x <= 0 {
        0
    } else {
        x as i64
    }
}

/// `ceil(a / b)` for `b > 0`.
#[inline]
fn div_ceil(a: i128, b: i128) -> i128 {
    // The usual operands fit u64: a hardware division instead of the 128-bit routine.
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) if b > 0 => i128::from(a.div_ceil(b)),
        _ => -((-a).div_euclid(b)),
    }
}

/// State of a bandwidth created at clock reading `t0` (section 3.2).
pub(crate) fn fresh(b: &Bandwidth, t0: i64) -> BandwidthState {
    match b.kind {
        RefillKind::IntervallyAligned {
            first_refill_nanos: f,
            adaptive_initial_tokens,
        } => {
            let tokens = if !adaptive_initial_tokens {
                b.initial_tokens.unwrap_or(b.capacity)
            } else if t0 >= f {
                b.capacity
            } else {
                let (c, t, p) = (
                    b.capacity as i128,
                    b.refill_tokens as i128,
                    b.refill_period as i128,
                );
                let ahead = (f as i128 - t0 as i128) * t;
                let s = (c - t).max(0) + ahead.div_euclid(p);
                s.min(c) as i64
            };
            // F >= 0 and P <= MAX, so F - P >= -MAX.
            BandwidthState {
                last_refill: f - b.refill_period,
                tokens,
                remainder: 0,
            }
        }
        _ => BandwidthState {
            last_refill: t0,
            tokens: b.initial_tokens.unwrap_or(b.capacity),
            remainder: 0,
        },
    }
}

/// The earliest clock reading, at or after `now`, from which bandwidth `b` left alone in state
/// `st` holds exactly what a fresh bandwidth created then or later would hold, refilled to the
/// same reading — so that forgetting the state and creating it afresh changes no later answer;
/// `None` when no such reading exists (see [`BucketState::forgettable_at`]).
///
/// A candidate is found per refill kind, then checked by computing both states at it: from
/// the candidate on, both evolve identically (refill composes, and a fresh state of these kinds
/// refilled to a later reading is the fresh state of that reading).
///
/// [`BucketState::forgettable_at`]: crate::BucketState::forgettable_at
pub(crate) fn forgettable_at(b: &Bandwidth, st: BandwidthState, now: i64) -> Option<i64> {
    let c = b.capacity;
    let s = refill(b, st, now);
    // Tokens above capacity never decay (section 4.2), and a fresh bandwidth never has them
    // unless its initial tokens do, which a full one then never equals.
    if s.tokens > c || (s.tokens == c && s.remainder != 0) {
        return None;
    }
    // Nothing refills before a last refill in the future: the wait is counted from there, so
    // that a moment after `now` by more than `MAX` nanoseconds is still found.
    let from = now.max(s.last_refill);
    let full = if s.tokens == c {
        from
    } else {
        let wait = reset_wait(b, &s, from);
        if wait == MAX {
            return None;
        }
        from.checked_add(wait)?
    };
    let initial = b.initial_tokens.unwrap_or(c);
    let candidate = match b.kind {
        // A fresh interval bandwidth starts its own grid at its creation: a kept one keeps
        // the old grid, so forgetting it moves every later refill.
        RefillKind::Intervally => return None,
        RefillKind::Greedy => {
            if initial != c {
                return None;
            }
            full
        }
        RefillKind::IntervallyAligned {
            first_refill_nanos: f,
            adaptive_initial_tokens,
        } => {
            // A fresh aligned bandwidth holds its initial tokens (or the adaptive amount,
            // which is the capacity from the first refill on) and gains T per period from
            // F − P: full from the period that covers the shortfall.
            let fresh_full = if adaptive_initial_tokens {
                f
            } else if initial > c {
                return None;
            } else {
                let (p, t) = (b.refill_period as i128, b.refill_tokens as i128);
                let periods = div_ceil((c - initial) as i128, t);
                i64::try_from(f as i128 - p + periods * p).ok()?
            };
            full.max(fresh_full)
        }
    };
    let kept = refill(b, s, candidate);
    (kept == refill(b, fresh(b, candidate), candidate)).then_some(candidate)
}

/// Refills `st` to clock reading `t` (section 4.1).
///
/// The common case runs in 64-bit arithmetic only: a difference `b - a` of two `i64` values
/// with `a < b` always fits in `u64`, and `wrapping_sub`/`wrapping_add` compute it exactly.
#[inline]
pub(crate) fn refill(b: &Bandwidth, st: BandwidthState, t: i64) -> BandwidthState {
    let l = st.last_refill;
    if t <= l {
        return st;
    }
    // t > l: the exact difference is in (0, 2^64).
    let elapsed = t.wrapping_sub(l) as u64;
    let d = if b.kind.is_interval() {
        elapsed - StrengthReducedU64::div_rem(elapsed, b.period_divisor).1
    } else {
        elapsed
    };
    if d == 0 {
        return st;
    }
    // l < l + d <= t: the sum fits in i64, and wrapping_add computes it exactly.
    let last_refill = l.wrapping_add(d as i64);
    let (s, e) = (st.tokens, st.remainder);
    if s >= b.capacity {
        return BandwidthState {
            last_refill,
            tokens: s,
            remainder: e,
        };
    }
    // s < C: the exact headroom C - s is in (0, 2^64).
    let headroom = b.capacity.wrapping_sub(s) as u64;
    // Fast path: T * d + e fits in u64 (the usual case).
    if e >= 0
        && let Some(v) = (b.refill_tokens as u64)
            .checked_mul(d)
            .and_then(|x| x.checked_add(e as u64))
    {
        let (add, rem) = StrengthReducedU64::div_rem(v, b.period_divisor);
        return if add >= headroom {
            BandwidthState {
                last_refill,
                tokens: b.capacity,
                remainder: 0,
            }
        } else {
            // s + add < C: the sum fits, and wrapping_add computes it exactly.
            BandwidthState {
                last_refill,
                tokens: s.wrapping_add(add as i64),
                remainder: rem as i64,
            }
        };
    }
    refill_wide(b, last_refill, s, e, d, headroom)
}

/// [`refill`] in the scaled form, for a greedy bandwidth whose scaled capacity fits `i64`
/// (`None` otherwise). Exact: `refill(st)` scaled equals `refill_scaled(st scaled)`, because a
/// greedy refill of `d` nanoseconds adds `refill_tokens × d / quantum` units up to capacity.
#[inline]
pub(crate) fn refill_scaled(b: &Bandwidth, st: ScaledState, t: i64) -> Option<ScaledState> {
    if b.kind.is_interval() {
        return None;
    }
    let cap = b.scaled_capacity?;
    let (l, s) = (st.last_refill_nanos(), st.balance());
    if t <= l {
        return Some(st);
    }
    if s >= cap {
        // At or above capacity (force-added): a refill moves only the time.
        return Some(ScaledState::new(t, s));
    }
    // t > l and s < cap: both differences are exact in u64.
    let elapsed = t.wrapping_sub(l) as u64;
    let headroom = cap.wrapping_sub(s) as u64;
    let balance = match b.scaled_rate.checked_mul(elapsed) {
        // s + add < cap: fits, and wrapping_add computes it exactly.
        Some(add) if add < headroom => s.wrapping_add(add as i64),
        _ => cap,
    };
    Some(ScaledState::new(t, balance))
}

/// The rare case of [`refill`] whose product `T * d + e` needs more than 64 bits.
#[cold]
fn refill_wide(
    b: &Bandwidth,
    last_refill: i64,
    s: i64,
    e: i64,
    d: u64,
    headroom: u64,
) -> BandwidthState {
    let p = b.refill_period as i128;
    // T * d < 2^127 - 2^64 and |e| < 2^63: no i128 overflow.
    let v = b.refill_tokens as i128 * d as i128 + e as i128;
    let add = v.div_euclid(p);
    if add >= headroom as i128 {
        BandwidthState {
            last_refill,
            tokens: b.capacity,
            remainder: 0,
        }
    } else {
        // s + add < C fits; a garbage negative `e` could push it below i64::MIN, so clamp.
        let tokens = (s as i128 + add).max(i64::MIN as i128) as i64;
        BandwidthState {
            last_refill,
            tokens,
            remainder: v.rem_euclid(p) as i64,
        }
    }
}

/// Least whole number of nanoseconds after `now` at which refill will have added `deficit`
/// tokens to the refilled state `st` (section 5.1), saturated at `MAX`.
///
/// `deficit` must be at least 1; values up to `2^64` are computed exactly.
#[inline]
pub(crate) fn wait_for(b: &Bandwidth, st: &BandwidthState, now: i64, deficit: i128) -> i64 {
    let p = b.refill_period as i128;
    let t = b.refill_tokens as i128;
    let (l, now) = (st.last_refill as i128, now as i128);
    if b.kind.is_interval() {
        let periods = div_ceil(deficit, t) - 1;
        let first = l + p - now;
        match periods.checked_mul(p).and_then(|x| x.checked_add(first)) {
            Some(w) => sat_wait(w),
            None => MAX,
        }
    } else {
        let gap = (l - now).max(0);
        // P * D < 2^127 for D <= 2^64 - 1 and P <= MAX.
        match p
            .checked_mul(deficit)
            .and_then(|x| x.checked_sub(st.remainder as i128))
        {
            Some(need) => match gap.checked_add(div_ceil(need, t)) {
                Some(w) => sat_wait(w),
                None => MAX,
            },
            None => MAX,
        }
    }
}

/// The wait for a request of `n` tokens on one refilled bandwidth (section 5.2).
#[inline]
pub(crate) fn request_wait(
    b: &Bandwidth,
    st: &BandwidthState,
    now: i64,
    n: u64,
    strict: bool,
) -> i64 {
    let n = n as i128;
    let s = st.tokens as i128;
    if strict && n > b.capacity as i128 {
        MAX
    } else if n <= s {
        0
    } else if n - s > MAX as i128 {
        MAX
    } else {
        wait_for(b, st, now, n - s)
    }
}

/// Time until this refilled bandwidth is full again (section 5.3), 0 when it is.
#[inline]
pub(crate) fn reset_wait(b: &Bandwidth, st: &BandwidthState, now: i64) -> i64 {
    if st.tokens >= b.capacity {
        0
    } else {
        wait_for(b, st, now, b.capacity as i128 - st.tokens as i128)
    }
}

#[cfg(test)]
mod tests {
    use super::div_ceil;

    /// The u64 shortcut agrees with the 128-bit formula, inside its range and at its edges.
    #[test]
    fn div_ceil_agrees_with_the_128_bit_formula() {
        let edges = [
            0i128,
            1,
            2,
            3,
            7,
            1_000_000_007,
            i128::from(u32::MAX),
            i128::from(i64::MAX),
            i128::from(u64::MAX) - 1,
            i128::from(u64::MAX),
            i128::from(u64::MAX) + 1,
            i128::MAX / 3,
        ];
        for &a in &edges {
            for &b in edges.iter().filter(|b| **b > 0) {
                for a in [a, -a] {
                    assert_eq!(div_ceil(a, b), -((-a).div_euclid(b)), "{a} / {b}");
                }
            }
        }
    }
}
