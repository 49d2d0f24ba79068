//! From a probe to an HTTP answer, without an HTTP crate: 200 with the remaining tokens, 429
//! with `Retry-After` in whole seconds rounded up, and an error for a request that no wait
//! can serve. (With tower or axum, the facade's `tower` feature does this for you.)
//!
//! The pitfall this avoids: `probe.wait_for_refill().as_secs()` truncates, so a 0.4 s wait
//! would tell the client "retry after 0 seconds".
//!
//! ```text
//! cargo run -p bucket4rs-examples --example http_429
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bucket, BucketListener, Clock, ManualClock, Storage};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

/// The status and headers a handler answers for a request of `cost` tokens.
fn respond<S: Storage, C: Clock, L: BucketListener>(
    bucket: &Bucket<S, C, L>,
    cost: u64,
) -> Result<(u16, Vec<String>), bucket4rs::OperationError> {
    let probe = bucket.try_consume_and_return_remaining(cost)?;
    let remaining = format!("X-Rate-Limit-Remaining: {}", probe.remaining_tokens());
    Ok(match probe.retry_after_secs() {
        None => (200, vec![remaining]),
        // More than the capacity: waiting cannot help, so do not ask the client to.
        Some(_) if probe.is_never_possible() => (400, vec![]),
        Some(secs) => (429, vec![remaining, format!("Retry-After: {secs}")]),
    })
}

fn run(out: &mut dyn Write) -> Outcome {
    // 5 requests per 2 s: one token every 400 ms.
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(2)))
        .with_clock(clock.clone())
        .build()?;

    for n in 1..=6 {
        let (status, headers) = respond(&bucket, 1)?;
        writeln!(out, "request {n}: {status} {headers:?}")?;
    }
    let probe = bucket.try_consume_and_return_remaining(1)?;
    writeln!(
        out,
        "the wait is {:?}: as_secs() says {}, retry_after_secs() says {:?}",
        probe.wait_for_refill(),
        probe.wait_for_refill().as_secs(),
        probe.retry_after_secs()
    )?;
    let (status, headers) = respond(&bucket, 3)?;
    writeln!(out, "a request costing 3: {status} {headers:?}")?;
    let (status, headers) = respond(&bucket, 6)?;
    writeln!(
        out,
        "a request costing 6 (capacity 5): {status} {headers:?}"
    )?;

    clock.advance(Duration::from_millis(400));
    let (status, headers) = respond(&bucket, 1)?;
    writeln!(out, "400 ms later: {status} {headers:?}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn prints_the_guide_values() {
        let text = bucket4rs_examples::output_of(super::run);
        bucket4rs_examples::assert_prints(
            &text,
            &[
                r#"request 1: 200 ["X-Rate-Limit-Remaining: 4"]"#,
                r#"request 5: 200 ["X-Rate-Limit-Remaining: 0"]"#,
                r#"request 6: 429 ["X-Rate-Limit-Remaining: 0", "Retry-After: 1"]"#,
                "the wait is 400ms: as_secs() says 0, retry_after_secs() says Some(1)",
                r#"a request costing 3: 429 ["X-Rate-Limit-Remaining: 0", "Retry-After: 2"]"#,
                "a request costing 6 (capacity 5): 400 []",
                r#"400 ms later: 200 ["X-Rate-Limit-Remaining: 0"]"#,
            ],
        );
    }
}
