//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers,
//! structured-field syntax) computed per bandwidth.

use core::cell::RefCell;
use core::fmt::Write as _;

use bucket4rs_core::ops::Refilled;
use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState};
use http::{HeaderName, HeaderValue};

use crate::plan::Plan;

/// `RateLimit-Policy`: the quota policies of the client's plan.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the current state of each quota policy.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-Rate-Limit-Remaining`: tokens left over all bandwidths (the header of Bucket4j's
/// examples; opt in with `RateLimitLayerBuilder::remaining_header`).
pub(crate) const X_RATE_LIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-rate-limit-remaining");

/// Whether `s` is printable ASCII (what a structured-field string holds).
fn printable(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

/// The largest structured-field integer (RFC 9651: 15 decimal digits).
const SF_INT_MAX: u64 = 999_999_999_999_999;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// One quota policy: a bandwidth as `"name";q=<capacity>;w=<seconds to refill it all>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quota {
    name: Box<str>,
    /// The name (the bandwidth's id, or its index) as a structured-field string: quoted, `"` and `\\` escaped.
    quoted: Box<str>,
    quota: u64,
    window: u64,
}

impl Quota {
    /// The quota policy of bandwidth number `index`: named by its id when the id is
    /// printable ASCII, else by the index; `w` is the time to refill the whole capacity,
    /// rounded up to a second (at least 1).
    pub(crate) fn of(index: usize, b: &Bandwidth) -> Self {
        let name = match b.id() {
            Some(id) if printable(id) => id.to_owned(),
            _ => index.to_string(),
        };
        Self::named(&name, b)
    }

    /// The name (unquoted).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The quota policy of `b` named `name` (non-printable characters replaced by `_`).
    pub(crate) fn named(name: &str, b: &Bandwidth) -> Self {
        let name: String = name
            .chars()
            .map(|c| {
                if printable(c.encode_utf8(&mut [0; 4])) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let full = u128::from(b.capacity()) * b.refill_period().as_nanos()
            / u128::from(b.refill_tokens().max(1));
        let window = u64::try_from(full.div_ceil(u128::from(NANOS_PER_SEC)))
            .unwrap_or(u64::MAX)
            .clamp(1, SF_INT_MAX);
        let mut quoted = String::with_capacity(name.len() + 2);
        quoted.push('"');
        for c in name.chars() {
            if c == '"' || c == '\\' {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        quoted.push('"');
        Self {
            name: name.into_boxed_str(),
            quoted: quoted.into_boxed_str(),
            quota: b.capacity().min(SF_INT_MAX),
            window,
        }
    }
}

pub(crate) fn policy_header(quotas: &[Quota]) -> HeaderValue {
    let mut s = String::with_capacity(32 * quotas.len());
    for (i, q) in quotas.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&q.quoted);
        let _ = write!(s, ";q={};w={}", q.quota, q.window);
    }
    // Names are printable ASCII with quotes and backslashes escaped: always a valid value.
    HeaderValue::try_from(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The longest decimal `u64`.
const U64_DIGITS: usize = 20;

/// Writes `n` in decimal at `buf[*at..]` without the formatting machinery (hot path).
fn put_u64(buf: &mut [u8], at: &mut usize, n: u64) {
    put(buf, at, itoa::Buffer::new().format(n).as_bytes());
}

fn put(buf: &mut [u8], at: &mut usize, bytes: &[u8]) {
    buf[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

/// Values up to this length are formatted on the stack.
const STACK_VALUE: usize = 128;

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(nanos: u64) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

/// The `RateLimit` value: per bandwidth, `r` = tokens left in it (after this request when it
/// was allowed) and `t` = seconds until it holds `cost` tokens again (0: it does now).
///
/// A one-bandwidth plan's value depends only on the plan and `(r, t)`, and the same pair
/// recurs request after request (a bucket that stays full answers the same `r` each time; a
/// plan of capacity 20 has at most 21 values of `r`), so those values come from a small
/// per-thread cache ([`cached_value`]): a hit costs a clone of the stored value (a reference
/// count) instead of formatting, validating and allocating it.
pub(crate) fn ratelimit_header(
    plan: &Plan,
    state: &BucketState,
    now: i64,
    cost: u64,
) -> Option<HeaderValue> {
    let (quotas, singles) = (plan.quotas(), plan.singles());
    if let ([_], [single], [s]) = (quotas, singles, state.bandwidths()) {
        let (r, t) = policy_state(single, *s, now, cost);
        return cached_value(plan.id(), r, t, || format_value(quotas, |_| (r, t)));
    }
    several_policies(plan, state, now, cost)
}

/// [`ratelimit_header`] of a plan of several bandwidths (or a state that does not match
/// the plan): formatted, not cached. Out of line, so the one-bandwidth path stays compact.
#[inline(never)]
fn several_policies(plan: &Plan, state: &BucketState, now: i64, cost: u64) -> Option<HeaderValue> {
    let (quotas, singles) = (plan.quotas(), plan.singles());
    let states = state.bandwidths();
    if quotas.len() != states.len() || singles.len() != states.len() {
        return None;
    }
    format_value(quotas, |i| policy_state(&singles[i], states[i], now, cost))
}

/// `(r, t)` of one bandwidth (`single`, in state `s`) at `now` for a request of `cost`.
fn policy_state(
    single: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
    cost: u64,
) -> (u64, u64) {
    let capacity = single.bandwidths().first().map_or(0, Bandwidth::capacity);
    // Refilled at `now` already (the state a consumption just left): the tokens are the
    // state's, and a cost they cover waits for nothing.
    if s.last_refill_nanos() >= now {
        let tokens = u64::try_from(s.tokens()).unwrap_or(0);
        if cost <= tokens && cost <= capacity {
            return (tokens.min(SF_INT_MAX), 0);
        }
    }
    refilled_policy_state(single, s, now, cost, capacity)
}

/// [`policy_state`] of a bandwidth to refill first, or short of `cost` tokens. Out of
/// line: a consumption just left the common case's bandwidth refilled at `now`.
#[inline(never)]
fn refilled_policy_state(
    single: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
    cost: u64,
    capacity: u64,
) -> (u64, u64) {
    let view = Refilled::new(single, now, |_| s);
    let tokens = u64::try_from(view.get(0).tokens()).unwrap_or(0);
    let remaining = tokens.min(SF_INT_MAX);
    let t = if cost <= tokens && cost <= capacity {
        // Enough tokens now, for a cost the bandwidth can ever hold (force-added tokens
        // can exceed the capacity): no wait, as `request_wait` says, without its
        // arithmetic.
        0
    } else {
        ceil_secs(view.request_wait(cost, true)).min(SF_INT_MAX)
    };
    (remaining, t)
}

/// Formats the `RateLimit` value of `quotas`, policy `i` at `(r, t) = rt(i)`.
///
/// Not inlined: a cached value (the common case) needs none of it, and the caller's fast
/// path stays small.
#[inline(never)]
fn format_value(quotas: &[Quota], rt: impl Fn(usize) -> (u64, u64)) -> Option<HeaderValue> {
    // An upper bound of the value's length; one bandwidth (the common case) fits on the
    // stack, so the value's bytes are allocated once, at their exact size.
    let bound: usize = quotas
        .iter()
        .map(|q| q.quoted.len() + ", ;r=;t=".len() + 2 * U64_DIGITS)
        .sum();
    let mut stack = [0u8; STACK_VALUE];
    let mut heap = Vec::new();
    let buf: &mut [u8] = if bound <= STACK_VALUE {
        &mut stack
    } else {
        heap.resize(bound, 0);
        &mut heap
    };
    let mut at = 0;
    for (i, q) in quotas.iter().enumerate() {
        let (r, t) = rt(i);
        if i > 0 {
            put(buf, &mut at, b", ");
        }
        put(buf, &mut at, q.quoted.as_bytes());
        put(buf, &mut at, b";r=");
        put_u64(buf, &mut at, r);
        put(buf, &mut at, b";t=");
        put_u64(buf, &mut at, t);
    }
    // Visible ASCII by construction (names are printable ASCII, escaped).
    HeaderValue::from_bytes(&buf[..at]).ok()
}

/// Slots of the per-thread `RateLimit` value cache (direct-mapped).
const CACHE_SLOTS: usize = 64;

/// A slot of the cache: the last `(plan, r, t)` seen there (`plan` is a [`Plan::id`]) and,
/// once that triple has been seen twice in a row, its formatted value.
struct CachedValue {
    plan: u64,
    r: u64,
    t: u64,
    value: Option<HeaderValue>,
}

thread_local! {
    /// Recently formatted one-bandwidth values, per thread: no sharing between cores, no
    /// lock; 64 slots of a few dozen bytes, plus the values.
    static RATELIMIT_VALUES: RefCell<[Option<CachedValue>; CACHE_SLOTS]> =
        const { RefCell::new([const { None }; CACHE_SLOTS]) };
}

/// The slot of `(plan, r, t)`: consecutive `r` of one plan take consecutive slots, so a
/// small plan's values all fit; plans and waits are spread over the table.
fn slot_of(plan: u64, r: u64, t: u64) -> usize {
    let mix = plan.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    // Truncation intended: only the low bits select the slot.
    #[allow(clippy::cast_possible_truncation)]
    let slot = r.wrapping_add(t.wrapping_mul(31)).wrapping_add(mix) as usize;
    slot % CACHE_SLOTS
}

/// The value of `(plan, r, t)` from this thread's cache, or `format()`ed.
///
/// A value is stored only when its triple is seen a second time in its slot: storing costs
/// more than formatting (a stored value is shared, so its first clone allocates), and a
/// client draining a large plan meets each `r` once — those requests only pay for the
/// formatting, as without a cache. A plan's id is never reused, so a stored value is never
/// another plan's.
pub(crate) fn cached_value(
    plan: u64,
    r: u64,
    t: u64,
    format: impl FnOnce() -> Option<HeaderValue>,
) -> Option<HeaderValue> {
    let slot = slot_of(plan, r, t);
    let seen = RATELIMIT_VALUES.try_with(|cache| {
        let cache = cache.try_borrow().ok()?;
        let e = cache[slot].as_ref()?;
        (e.plan == plan && e.r == r && e.t == t).then(|| e.value.clone())
    });
    let seen = match seen {
        Ok(Some(Some(value))) => return Some(value),
        Ok(Some(None)) => true,
        _ => false,
    };
    format_and_remember(slot, plan, r, t, seen, format)
}

/// A cache miss of [`cached_value`]: formats the value, and stores it when its triple was
/// seen in its slot. Out of line, as a hit needs none of it.
#[inline(never)]
fn format_and_remember(
    slot: usize,
    plan: u64,
    r: u64,
    t: u64,
    seen: bool,
    format: impl FnOnce() -> Option<HeaderValue>,
) -> Option<HeaderValue> {
    let value = format()?;
    remember(slot, plan, r, t, seen.then(|| value.clone()));
    Some(value)
}

/// Stores `(plan, r, t)` and its value (when it is to be kept) in `slot` (see
/// [`cached_value`]); not inlined, as a hit does not store.
#[inline(never)]
fn remember(slot: usize, plan: u64, r: u64, t: u64, value: Option<HeaderValue>) {
    // Nothing is stored while the thread is being torn down (or, never in practice, when
    // re-entered).
    let _ = RATELIMIT_VALUES.try_with(|cache| {
        if let Ok(mut cache) = cache.try_borrow_mut() {
            cache[slot] = Some(CachedValue { plan, r, t, value });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucket4rs_core::Bandwidth;
    use core::cell::Cell;
    use core::time::Duration;

    /// A quota is named by its bandwidth's printable id, else by its index; `q` is the
    /// capacity and `w` the time to refill all of it, rounded up to a second.
    #[test]
    fn quotas_name_capacity_and_window() {
        let header = |bandwidths: &[Bandwidth]| {
            let quotas: Vec<Quota> = bandwidths
                .iter()
                .enumerate()
                .map(|(i, b)| Quota::of(i, b))
                .collect();
            policy_header(&quotas)
        };
        let burst = Bandwidth::builder()
            .capacity(20)
            .refill_greedy(1, Duration::from_secs(3))
            .id("burst")
            .build()
            .unwrap();
        let accented = Bandwidth::builder()
            .capacity(5)
            .refill_greedy(5, Duration::from_millis(1500))
            .id("é")
            .build()
            .unwrap();
        let quoted = Bandwidth::builder()
            .capacity(7)
            .refill_greedy(7, Duration::from_secs(9))
            .id(r#"a"b\c"#)
            .build()
            .unwrap();
        assert_eq!(header(&[burst]), r#""burst";q=20;w=60"#);
        assert_eq!(
            header(&[
                Bandwidth::simple(1, Duration::from_secs(1)).unwrap(),
                accented,
                quoted
            ]),
            r#""0";q=1;w=1, "1";q=5;w=2, "a\"b\\c";q=7;w=9"#
        );
    }

    fn value_of(plan: u64, r: u64, t: u64) -> HeaderValue {
        HeaderValue::try_from(format!("\"p{plan}\";r={r};t={t}")).unwrap()
    }

    /// Every answer of the cache is the value of its own `(plan, r, t)`, whatever was
    /// stored before in its slot (other plans, other pairs, colliding slots), and a value
    /// just stored is served without formatting it again.
    #[test]
    fn the_cache_answers_each_plan_and_pair_with_its_own_value() {
        let formats = Cell::new(0u32);
        let get = |plan: u64, r: u64, t: u64| {
            cached_value(plan, r, t, || {
                formats.set(formats.get() + 1);
                Some(value_of(plan, r, t))
            })
            .unwrap()
        };
        // A deterministic mix of plans, counts and waits: many share slots.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (plan, r, t) = (x % 3, (x >> 8) % 150, (x >> 20) % 4);
            // Seen twice in a row, a triple is stored, then served without formatting.
            assert_eq!(get(plan, r, t), value_of(plan, r, t));
            assert_eq!(get(plan, r, t), value_of(plan, r, t));
            let before = formats.get();
            assert_eq!(get(plan, r, t), value_of(plan, r, t));
            assert_eq!(
                formats.get(),
                before,
                "({plan}, {r}, {t}) was not served from the cache"
            );
        }
        // Triples that take the same slot replace each other: a stored value is never
        // served for another count, nor for another plan at the same pair.
        let (a, b) = ((7, 3, 0), (7, 3 + CACHE_SLOTS as u64, 0));
        assert_eq!(slot_of(a.0, a.1, a.2), slot_of(b.0, b.1, b.2));
        let other = (1..)
            .find(|&p| slot_of(p, 3, 0) == slot_of(7, 3, 0) && p != 7)
            .unwrap();
        let c = (other, 3, 0);
        for (first, then) in [(a, b), (a, c), (c, a), (b, a)] {
            for _ in 0..2 {
                assert_eq!(
                    get(first.0, first.1, first.2),
                    value_of(first.0, first.1, first.2)
                );
            }
            assert_eq!(
                get(then.0, then.1, then.2),
                value_of(then.0, then.1, then.2)
            );
        }
    }

    /// A triple seen once is formatted, not stored: a client draining a large plan meets
    /// each count once and pays no more than the formatting.
    #[test]
    fn a_triple_seen_once_is_not_stored() {
        let formats = Cell::new(0u32);
        let get = |r: u64| {
            cached_value(1_000, r, 0, || {
                formats.set(formats.get() + 1);
                Some(value_of(1_000, r, 0))
            })
        };
        for r in (0..500).rev() {
            assert_eq!(get(r), Some(value_of(1_000, r, 0)));
        }
        assert_eq!(formats.get(), 500);
        RATELIMIT_VALUES.with(|c| {
            let stored = c
                .borrow()
                .iter()
                .flatten()
                .filter(|e| e.value.is_some())
                .count();
            assert_eq!(stored, 0, "values stored for triples seen once");
        });
    }

    /// A failed formatting is not stored, and another thread has its own cache.
    #[test]
    fn failures_are_not_cached_and_threads_do_not_share() {
        assert_eq!(cached_value(99, 1, 0, || None), None);
        assert_eq!(
            cached_value(99, 1, 0, || Some(value_of(99, 1, 0))),
            Some(value_of(99, 1, 0))
        );
        std::thread::spawn(|| {
            let formatted = Cell::new(false);
            let v = cached_value(99, 1, 0, || {
                formatted.set(true);
                Some(value_of(99, 1, 0))
            });
            assert_eq!(v, Some(value_of(99, 1, 0)));
            assert!(formatted.get(), "a new thread starts with an empty cache");
        })
        .join()
        .unwrap();
    }

    /// Plans built separately never share an id (so never a cached value), even with equal
    /// names and configurations; clones share it.
    #[test]
    fn plan_ids_are_unique_and_shared_by_clones() {
        use bucket4rs_core::{Bandwidth, BucketConfiguration};
        use std::time::Duration;
        let config = || {
            BucketConfiguration::builder()
                .add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1)).unwrap())
                .build()
                .unwrap()
        };
        let (a, b) = (Plan::new("same", config()), Plan::new("same", config()));
        assert_ne!(a.id(), b.id());
        assert_eq!(a.clone().id(), a.id());
        let state = BucketState::new(a.configuration(), 0);
        // The same state and pair under two plans whose policies are named differently:
        // each gets its own name, in either order.
        let id_named = Plan::new(
            "named",
            BucketConfiguration::builder()
                .add_bandwidth(
                    Bandwidth::builder()
                        .capacity(5)
                        .refill_greedy(5, Duration::from_secs(1))
                        .id("burst")
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap(),
        );
        for _ in 0..2 {
            assert_eq!(ratelimit_header(&a, &state, 0, 1).unwrap(), "\"0\";r=5;t=0");
            assert_eq!(
                ratelimit_header(&id_named, &state, 0, 1).unwrap(),
                "\"burst\";r=5;t=0"
            );
        }
    }
}
