//! What the layer reports through the [`metrics`] facade. Nothing is recorded without a
//! recorder; a decision's counters are registered once per plan (on its first decision,
//! with the recorder installed then) and are a branch each afterwards.
//!
//! - `bucket4rs_http_decisions_total{plan, limit, outcome}`: each limit's decision of each
//!   metered request; `outcome` is `allowed`, `refused` or `shadow_refused` (refused by a
//!   limit in shadow mode, and served). `plan` is the plan that decided (a further limit's
//!   plan is named after the limit); `limit` is `client` for the client's plan, else the
//!   further limit's name.
//! - `bucket4rs_http_exempt_total`: requests let through by the allowlist.
//! - `bucket4rs_http_store_errors_total{plan, limit, kind}`: requests the store did not
//!   answer (`unavailable`, `full`, `key`, `unknown_key`, `unreadable`, `other`), by the
//!   limit whose store failed.
//! - `bucket4rs_http_failure_policy_total{plan, limit, decision}`: the failure policy's
//!   answers (`error`, `deny`, `fallback_allowed`, `fallback_refused`).
//! - `bucket4rs_http_store_breaker_open` (gauge): 1 while the shared store's circuit breaker
//!   is open, 0 while it is closed; set when a request sees it change.
//! - `bucket4rs_http_give_back_failures_total`: tokens a request refused by another limit
//!   could not give back (a store that failed meanwhile).

#[cfg(feature = "distributed")]
use metrics::gauge;
use metrics::{Counter, counter};

pub(crate) const DECISIONS: &str = "bucket4rs_http_decisions_total";
pub(crate) const EXEMPT: &str = "bucket4rs_http_exempt_total";
pub(crate) const STORE_ERRORS: &str = "bucket4rs_http_store_errors_total";
pub(crate) const FAILURE_POLICY: &str = "bucket4rs_http_failure_policy_total";
pub(crate) const GIVE_BACK_FAILURES: &str = "bucket4rs_http_give_back_failures_total";
/// The `limit` label of the client's plan (a further limit is labelled with its name).
pub(crate) const CLIENT: &str = "client";
#[cfg(feature = "distributed")]
pub(crate) const BREAKER_OPEN: &str = "bucket4rs_http_store_breaker_open";

/// One plan's decision counters.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) allowed: Counter,
    pub(crate) refused: Counter,
    pub(crate) shadow_refused: Counter,
}

impl Counters {
    pub(crate) fn new(plan: &str, limit: &str) -> Self {
        let (plan, limit) = (plan.to_owned(), limit.to_owned());
        Self {
            allowed: counter!(DECISIONS, "plan" => plan.clone(), "limit" => limit.clone(), "outcome" => "allowed"),
            refused: counter!(DECISIONS, "plan" => plan.clone(), "limit" => limit.clone(), "outcome" => "refused"),
            shadow_refused: counter!(DECISIONS, "plan" => plan, "limit" => limit, "outcome" => "shadow_refused"),
        }
    }
}

/// A request whose `limit` of `plan` the store did not answer.
#[cold]
pub(crate) fn store_error(plan: &str, limit: &str, kind: &'static str) {
    counter!(STORE_ERRORS, "plan" => plan.to_owned(), "limit" => limit.to_owned(), "kind" => kind)
        .increment(1);
}

/// The failure policy's answer for `limit` of `plan`.
#[cold]
pub(crate) fn failure_policy(plan: &str, limit: &str, decision: &'static str) {
    counter!(FAILURE_POLICY, "plan" => plan.to_owned(), "limit" => limit.to_owned(), "decision" => decision)
        .increment(1);
}

/// The shared store's circuit breaker as a request last saw it: 0 not yet seen, 1 closed,
/// 2 open. The gauge is set only when that changes (one load per remote answer otherwise).
#[cfg(feature = "distributed")]
#[derive(Debug, Default)]
pub(crate) struct BreakerGauge(std::sync::atomic::AtomicU8);

#[cfg(feature = "distributed")]
impl BreakerGauge {
    #[inline]
    pub(crate) fn observe(&self, open: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = if open { 2 } else { 1 };
        if self.0.load(Relaxed) != now && self.0.swap(now, Relaxed) != now {
            gauge!(BREAKER_OPEN).set(f64::from(u8::from(open)));
        }
    }
}

/// A request let through by the allowlist.
pub(crate) fn exempt() {
    counter!(EXEMPT).increment(1);
}

/// A give-back that failed.
#[cold]
pub(crate) fn give_back_failed() {
    counter!(GIVE_BACK_FAILURES).increment(1);
}
