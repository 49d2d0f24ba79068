//! Configuration replacement and the four token inheritance strategies (SEMANTICS.md section 7).

use alloc::vec::Vec;

use crate::config::{Bandwidth, BucketConfiguration, RefillKind};
use crate::error::ConfigError;
use crate::math;
use crate::state::{BandwidthState, BucketState};

/// How tokens carry over when a bucket's configuration is replaced. Bandwidths are matched by
/// id; a single id-less bandwidth on each side also matches.
///
/// For a capacity-100 bucket holding 40 tokens:
///
/// | strategy | new capacity 200 | new capacity 20 |
/// |---|---|---|
/// | `Proportionally` | 80 | 8 |
/// | `AsIs` | 40 | 20 |
/// | `Additive` | 140 | 20 |
/// | `Reset` | full | full |
///
/// ```
/// use bucket4rs_core::TokensInheritanceStrategy;
/// assert_eq!(TokensInheritanceStrategy::default(), TokensInheritanceStrategy::Proportionally);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum TokensInheritanceStrategy {
    /// Keep the same fraction of the capacity (Bucket4j's default).
    #[default]
    Proportionally,
    /// Keep the balance, cut down to the new capacity.
    AsIs,
    /// Keep the balance and add the capacity increase.
    Additive,
    /// Start every bandwidth afresh, as if the bucket were new.
    Reset,
}

/// Builds the state for `new` from the state of `old` read through `read`, at `now`.
pub(crate) fn replace(
    old: &BucketConfiguration,
    read: impl Fn(usize) -> BandwidthState,
    new: &BucketConfiguration,
    now: i64,
    strategy: TokensInheritanceStrategy,
    wall_clock_based: bool,
) -> Result<BucketState, ConfigError> {
    new.check_clock(wall_clock_based)?;
    let old_bws = old.bandwidths();
    let anonymous =
        |c: &BucketConfiguration| c.bandwidths().iter().filter(|b| b.id.is_none()).count();
    let match_anonymous = anonymous(old) < 2 && anonymous(new) < 2;
    let states: Vec<BandwidthState> = new
        .bandwidths()
        .iter()
        .map(|nb| {
            if strategy == TokensInheritanceStrategy::Reset {
                return math::fresh(nb, now);
            }
            let matched = old_bws.iter().position(|ob| match (&nb.id, &ob.id) {
                (Some(a), Some(b)) => a == b,
                (None, None) => match_anonymous,
                _ => false,
            });
            match matched {
                Some(i) => inherit(
                    &old_bws[i],
                    math::refill(&old_bws[i], read(i), now),
                    nb,
                    strategy,
                ),
                None => math::fresh(nb, now),
            }
        })
        .collect();
    Ok(BucketState::from_bandwidths(states))
}

/// The new state of `nb`, matched to the old bandwidth `ob` whose refilled state is `s`.
fn inherit(
    ob: &Bandwidth,
    s: BandwidthState,
    nb: &Bandwidth,
    strategy: TokensInheritanceStrategy,
) -> BandwidthState {
    let (c, p, e) = (
        ob.capacity as i128,
        ob.refill_period as i128,
        s.remainder as i128,
    );
    let (c2, p2) = (nb.capacity as i128, nb.refill_period as i128);
    let tokens = s.tokens as i128;
    let both_greedy = ob.kind == RefillKind::Greedy && nb.kind == RefillKind::Greedy;
    let carry = if both_greedy {
        (e * p2).div_euclid(p)
    } else {
        0
    };
    let full = BandwidthState {
        last_refill: s.last_refill,
        tokens: nb.capacity,
        remainder: 0,
    };
    let keep = |t: i128, rem: i128| BandwidthState {
        last_refill: s.last_refill,
        tokens: t.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
        remainder: rem as i64,
    };
    match strategy {
        TokensInheritanceStrategy::AsIs => {
            if tokens >= c2 {
                full
            } else {
                keep(tokens, carry)
            }
        }
        TokensInheritanceStrategy::Additive if c2 <= c => {
            if tokens >= c2 {
                full
            } else {
                keep(tokens, carry)
            }
        }
        TokensInheritanceStrategy::Additive => {
            if tokens >= c {
                full
            } else {
                keep(tokens + c2 - c, carry)
            }
        }
        TokensInheritanceStrategy::Proportionally | TokensInheritanceStrategy::Reset => {
            if tokens >= c {
                return full;
            }
            // X = (s*P + e) * C' / (P*C), computed without exceeding 2^127.
            let a = tokens * c2 + (e * c2).div_euclid(p);
            let a0 = (e * c2).rem_euclid(p);
            let q = a.div_euclid(c);
            let a1 = a.rem_euclid(c);
            if q < i64::MIN as i128 {
                return keep(i64::MIN as i128, 0);
            }
            if q >= c2 {
                return full;
            }
            let rem = if nb.kind == RefillKind::Greedy {
                (a1 * p2 + (a0 * p2).div_euclid(p)).div_euclid(c)
            } else {
                0
            };
            keep(q, rem)
        }
    }
}
