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
//! - `bucket4rs_http_store_errors_total{kind}`: requests the store did not answer
//!   (`unavailable`, `full`, `key`, `unreadable`, `other`).
//! - `bucket4rs_http_failure_policy_total{decision}`: the failure policy's answers
//!   (`error`, `deny`, `fallback_allowed`, `fallback_refused`).
//! - `bucket4rs_http_give_back_failures_total`: tokens a request refused by another limit
//!   could not give back (a store that failed meanwhile).

use metrics::{Counter, counter};

pub(crate) const DECISIONS: &str = "bucket4rs_http_decisions_total";
pub(crate) const EXEMPT: &str = "bucket4rs_http_exempt_total";
pub(crate) const STORE_ERRORS: &str = "bucket4rs_http_store_errors_total";
pub(crate) const FAILURE_POLICY: &str = "bucket4rs_http_failure_policy_total";
pub(crate) const GIVE_BACK_FAILURES: &str = "bucket4rs_http_give_back_failures_total";

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

/// A request the store did not answer.
#[cold]
pub(crate) fn store_error(kind: &'static str) {
    counter!(STORE_ERRORS, "kind" => kind).increment(1);
}

/// The failure policy's answer.
#[cold]
pub(crate) fn failure_policy(decision: &'static str) {
    counter!(FAILURE_POLICY, "decision" => decision).increment(1);
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
