//! Leasing through the layer, on a shared store: a leased plan answers as an unleased one
//! (one process: a leased bucket answers exactly as an unleased one) with far fewer
//! transactions, and a leased further limit is not charged for requests another limit
//! refuses.

use std::time::Duration;

use bucket4rs_core::{BucketConfiguration, ManualClock};
use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager, TimeSource};
use bucket4rs_tower::{Limit, Plan, RateLimitLayer};
use http::StatusCode;
use tower::Layer;

use super::counted::{Counted, Counts, on, total};
use super::{bw, call, hello, req};

/// Leases that outlive the test (a slow debug build must not see them expire), sized as
/// by default.
fn leasing() -> Leasing {
    Leasing::new()
        .lifetime(Duration::from_secs(30))
        .idle(Duration::from_secs(10))
}

/// A manager over a counting embedded backend, the buckets (and leases' views) on `clock`.
fn counted_manager(clock: &ManualClock) -> (ProxyManager<Counted<EmbeddedBackend>>, Counts) {
    let (backend, counts) = Counted::new(EmbeddedBackend::with_clock(clock.clone()));
    let manager = ProxyManager::configure(backend)
        .time_source(TimeSource::client(clock.clone()))
        .ttl_margin(Duration::ZERO)
        .build()
        .unwrap();
    (manager, counts)
}

/// What a client sees of a response.
type Seen = (
    StatusCode,
    Option<http::HeaderValue>,
    Option<http::HeaderValue>,
    Option<http::HeaderValue>,
    Option<http::HeaderValue>,
);

fn seen(r: &super::Resp) -> Seen {
    let h = |name: &str| r.headers().get(name).cloned();
    (
        r.status(),
        h("ratelimit-policy"),
        h("ratelimit"),
        h("retry-after"),
        h("x-rate-limit-remaining"),
    )
}

/// 1,000 a minute and 100,000 a day.
fn hot() -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(bw("burst", 1_000, Duration::from_secs(60)))
        .add_bandwidth(bw("daily", 100_000, Duration::from_secs(86_400)))
        .build()
        .unwrap()
}

/// 1,500 requests of one client on the hot plan (leased or not), the clock a second further
/// every 100: the answers, the requests allowed and the store's transactions.
async fn hot_client(leased: bool) -> (Vec<Seen>, usize, u64) {
    let clock = ManualClock::new(1_000_000_000);
    let (manager, counts) = counted_manager(&clock);
    let plan = Plan::new("hot", hot());
    let plan = if leased {
        plan.with_leasing(leasing()).unwrap()
    } else {
        plan
    };
    let svc = RateLimitLayer::builder()
        .backend(manager.clone())
        .plans(plan)
        .remaining_header(true)
        .build()
        .unwrap()
        .layer(hello());
    let mut answers = Vec::new();
    for i in 0..1_500 {
        if i % 100 == 99 {
            clock.advance(Duration::from_secs(1));
        }
        answers.push(seen(&call(&svc, req(Some("k"), "/books/1")).await));
    }
    let allowed = answers.iter().filter(|a| a.0 == StatusCode::OK).count();
    if leased {
        assert!(manager.leased_tokens() > 0, "the hot key holds a lease");
    }
    (answers, allowed, total(&counts))
}

#[tokio::test]
async fn a_leased_plan_answers_as_an_unleased_one_with_far_fewer_transactions() {
    let (plain, allowed, plain_tx) = hot_client(false).await;
    let (leased, leased_allowed, leased_tx) = hot_client(true).await;
    // Every answer alike: status, both RateLimit fields, Retry-After, the remaining tokens.
    for (i, (a, b)) in plain.iter().zip(&leased).enumerate() {
        assert_eq!(a, b, "request {i}");
    }
    assert_eq!(plain.len(), leased.len());
    // The limit holds exactly: 1,000 at once, and what 15 s at 1,000 a minute refill.
    assert_eq!(leased_allowed, allowed);
    assert!((1_000..=1_250).contains(&allowed), "{allowed} allowed");
    assert!(plain.iter().any(|a| a.0 == StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(plain_tx, 1_500, "one transaction a request without leasing");
    assert!(
        leased_tx * 10 <= plain_tx,
        "{leased_tx} transactions leased, {plain_tx} without"
    );
    println!(
        "leasing through the layer: 1,500 requests of one client ({allowed} allowed), \
         {plain_tx} transactions without leasing, {leased_tx} with"
    );
}

/// Clients of 20 a minute under a global limit of 300 a minute (leased or not), the clock
/// standing still: ten clients make 30 requests each in turn (each client's plan refuses its
/// last 10; the global limit allows 200), then ten more make 20 each (the global limit
/// allows 100 more, then refuses). The answers, the requests allowed, the transactions on
/// the global limit's key and in all.
async fn global_limit(leased: bool) -> (Vec<Seen>, usize, u64, u64) {
    let clock = ManualClock::new(1_000_000_000);
    let (manager, counts) = counted_manager(&clock);
    let per_client = BucketConfiguration::builder()
        .add_bandwidth(bw("burst", 20, Duration::from_secs(60)))
        .build()
        .unwrap();
    let all = BucketConfiguration::builder()
        .add_bandwidth(bw("all", 300, Duration::from_secs(60)))
        .build()
        .unwrap();
    let limit = Limit::global("all", all);
    let limit = if leased {
        limit.with_leasing(leasing()).unwrap()
    } else {
        limit
    };
    let svc = RateLimitLayer::builder()
        .backend(manager.clone())
        .plans(Plan::new("free", per_client))
        .limit(limit)
        .remaining_header(true)
        .build()
        .unwrap()
        .layer(hello());
    let mut answers = Vec::new();
    for (clients, rounds) in [(0..10, 30), (10..20, 20)] {
        for _ in 0..rounds {
            for c in clients.clone() {
                let key = format!("client-{c}");
                answers.push(seen(&call(&svc, req(Some(&key), "/books/1")).await));
            }
        }
    }
    let allowed = answers.iter().filter(|a| a.0 == StatusCode::OK).count();
    let global = on(&counts, &manager.storage_key("\0all").unwrap());
    (answers, allowed, global, total(&counts))
}

#[tokio::test]
async fn a_leased_global_limit_is_not_charged_for_requests_another_limit_refuses() {
    let (plain, allowed, plain_global, plain_tx) = global_limit(false).await;
    let (leased, leased_allowed, leased_global, leased_tx) = global_limit(true).await;
    for (i, (a, b)) in plain.iter().zip(&leased).enumerate() {
        assert_eq!(a, b, "request {i}");
    }
    // The limits hold exactly: the clock stands still, so 300 and not one more.
    assert_eq!(allowed, 300);
    assert_eq!(leased_allowed, 300);
    // Without leasing, one transaction on the global key per request, and one more for each
    // of the 100 requests a client's plan refused while the global limit allowed them (the
    // tokens it took given back); with leasing, those are only read, from the lease's view.
    assert_eq!(plain_global, 600);
    assert!(
        leased_global * 10 <= plain_global,
        "{leased_global} transactions on the global key leased, {plain_global} without"
    );
    println!(
        "a global limit through the layer: 500 requests of 20 clients ({allowed} allowed), \
         transactions on the global key {plain_global} without leasing, {leased_global} with; \
         in all {plain_tx} and {leased_tx}"
    );
}
