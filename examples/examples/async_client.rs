//! An async API client throttling its outbound calls: 50 concurrent requests share a limit of
//! 25 calls per second, awaiting their turn without blocking the runtime; callers with a
//! deadline give up early, and a request cancelled by a timeout gives its token back.
//!
//! ```text
//! cargo run --release -p bucket4rs-examples --example async_client
//! ```

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_async::AsyncBucketExt;
use bucket4rs_local::Bucket;
use tokio::time::Instant;

/// A fake outbound call: 20 ms of "network".
async fn call_api(id: u32) -> String {
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("response #{id}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The provider allows 25 calls per second, bursts of 5.
    let limiter = Arc::new(
        Bucket::builder()
            .add_limit(|l| l.capacity(5).refill_greedy(25, Duration::from_secs(1)))
            .build()?,
    );
    let start = Instant::now();

    // 40 requests that wait as long as needed, and 10 that give up after 300 ms.
    let mut tasks = Vec::new();
    for id in 0..50u32 {
        let limiter = Arc::clone(&limiter);
        tasks.push(tokio::spawn(async move {
            let patient = id % 5 != 4;
            let allowed = if patient {
                limiter.as_async().consume(1).await.map(|()| true)
            } else {
                limiter
                    .as_async()
                    .try_consume(1, Duration::from_millis(300))
                    .await
            };
            let now = || start.elapsed().as_secs_f64();
            match allowed {
                Ok(true) => {
                    let response = call_api(id).await;
                    println!("{:>6.3} s  request {id:>2} -> {response}", now());
                    true
                }
                Ok(false) => {
                    println!(
                        "{:>6.3} s  request {id:>2} gave up: its turn was more than 300 ms away",
                        now()
                    );
                    false
                }
                Err(e) => {
                    println!("request {id} failed: {e}");
                    false
                }
            }
        }));
    }
    // Meanwhile the runtime is free: a heartbeat on the same thread keeps ticking.
    let heartbeat = tokio::spawn(async move {
        let mut beats = 0u32;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            beats += 1;
            println!(
                "{:>6.3} s  heartbeat {beats} (the executor is not blocked)",
                start.elapsed().as_secs_f64()
            );
        }
    });
    let mut served = 0;
    let mut gave_up = 0;
    for task in tasks {
        if task.await? {
            served += 1;
        } else {
            gave_up += 1;
        }
    }
    heartbeat.abort();
    println!(
        "{served} calls served and {gave_up} gave up in {:.2} s",
        start.elapsed().as_secs_f64()
    );

    // Cancellation safety: a request abandoned by a timeout gives its token back.
    let before = limiter.available_tokens();
    let abandoned =
        tokio::time::timeout(Duration::from_millis(10), limiter.as_async().consume(10)).await;
    println!(
        "a request for 10 abandoned after 10 ms: {}; balance {before} before, {} after",
        if abandoned.is_err() {
            "dropped"
        } else {
            "completed"
        },
        limiter.available_tokens()
    );
    Ok(())
}
