//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers,
//! structured-field syntax) computed per bandwidth.

use core::fmt::Write as _;

use bucket4rs_core::ops::Refilled;
use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
use http::{HeaderName, HeaderValue};

/// `RateLimit-Policy`: the quota policies of the client's plan.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the current state of each quota policy.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-Rate-Limit-Remaining`: tokens left over all bandwidths (the header of Bucket4j's
/// examples; opt in with `RateLimitLayerBuilder::remaining_header`).
pub const X_RATE_LIMIT_REMAINING: HeaderName = HeaderName::from_static("x-rate-limit-remaining");

/// The largest structured-field integer (RFC 9651: 15 decimal digits).
const SF_INT_MAX: u64 = 999_999_999_999_999;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// One quota policy: a bandwidth as `"name";q=<capacity>;w=<seconds to refill it all>`.
///
/// ```
/// use bucket4rs_core::Bandwidth;
/// use bucket4rs_tower::Quota;
/// use std::time::Duration;
/// let b = Bandwidth::builder().capacity(20).refill_greedy(1, Duration::from_secs(3)).id("burst").build()?;
/// let q = Quota::of(0, &b);
/// assert_eq!((q.name(), q.quota(), q.window_secs()), ("burst", 20, 60));
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    name: String,
    /// `name` as a structured-field string: quoted, `"` and `\\` escaped.
    quoted: Box<str>,
    quota: u64,
    window: u64,
}

impl Quota {
    /// The quota policy of bandwidth number `index`: named by its id when the id is
    /// printable ASCII, else by the index; `w` is the time to refill the whole capacity,
    /// rounded up to a second (at least 1).
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use bucket4rs_tower::Quota; use std::time::Duration;
    /// let b = Bandwidth::builder().capacity(5).refill_greedy(5, Duration::from_millis(1500)).id("é").build()?;
    /// let q = Quota::of(3, &b);
    /// assert_eq!((q.name(), q.window_secs()), ("3", 2));
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn of(index: usize, b: &Bandwidth) -> Self {
        let name = match b.id() {
            Some(id) if !id.is_empty() && id.bytes().all(|c| (0x20..=0x7e).contains(&c)) => {
                id.to_owned()
            }
            _ => index.to_string(),
        };
        let full = u128::from(b.capacity()) * u128::from(b.refill_period_nanos())
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
            name,
            quoted: quoted.into_boxed_str(),
            quota: b.capacity().min(SF_INT_MAX),
            window,
        }
    }

    /// The policy name.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use bucket4rs_tower::Quota; use std::time::Duration;
    /// assert_eq!(Quota::of(0, &Bandwidth::simple(1, Duration::from_secs(1))?).name(), "0");
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `q`: the capacity.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use bucket4rs_tower::Quota; use std::time::Duration;
    /// assert_eq!(Quota::of(0, &Bandwidth::simple(7, Duration::from_secs(1))?).quota(), 7);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// `w`: seconds to refill the whole capacity.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use bucket4rs_tower::Quota; use std::time::Duration;
    /// assert_eq!(Quota::of(0, &Bandwidth::simple(7, Duration::from_secs(9))?).window_secs(), 9);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn window_secs(&self) -> u64 {
        self.window
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
pub(crate) fn ratelimit_header(
    quotas: &[Quota],
    singles: &[BucketConfiguration],
    state: &BucketState,
    now: i64,
    cost: u64,
) -> Option<HeaderValue> {
    let states = state.bandwidths();
    if quotas.len() != states.len() || singles.len() != states.len() {
        return None;
    }
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
    for (i, (q, single)) in quotas.iter().zip(singles).enumerate() {
        let view = Refilled::new(single, now, |_| states[i]);
        let tokens = u64::try_from(view.get(0).tokens()).unwrap_or(0);
        let remaining = tokens.min(SF_INT_MAX);
        let t = if cost <= tokens && cost <= single.bandwidths()[0].capacity() {
            // Enough tokens now, for a cost the bandwidth can ever hold (force-added tokens
            // can exceed the capacity): no wait, as `request_wait` says, without its
            // arithmetic.
            0
        } else {
            ceil_secs(view.request_wait(cost, true)).min(SF_INT_MAX)
        };
        if i > 0 {
            put(buf, &mut at, b", ");
        }
        put(buf, &mut at, q.quoted.as_bytes());
        put(buf, &mut at, b";r=");
        put_u64(buf, &mut at, remaining);
        put(buf, &mut at, b";t=");
        put_u64(buf, &mut at, t);
    }
    // Visible ASCII by construction (names are printable ASCII, escaped).
    HeaderValue::from_bytes(&buf[..at]).ok()
}
