//! An async API client throttling its outbound calls: 50 concurrent requests share a limit of
//! 25 calls per second, awaiting their turn without blocking the runtime; callers with a
//! deadline give up early, and a request cancelled by a timeout gives its token back.
//!
//! ```text
//! cargo run --release -p bucket4rs-examples --example async_client
//! ```

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bucket4rs_async::AsyncBucketExt;
use bucket4rs_examples::Outcome;
use bucket4rs_local::Bucket;
use tokio::time::Instant;

/// A fake outbound call: 20 ms of "network".
async fn call_api(id: u32) -> String {
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("response #{id}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Outcome {
    run(&mut std::io::stdout()).await
}

/// What happened, and when: the tasks note their lines here; `run` prints them in time order.
type Log = Arc<Mutex<Vec<(Duration, String)>>>;

fn note(log: &Log, at: Duration, line: String) {
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((at, line));
}

async fn run(out: &mut dyn Write) -> Outcome {
    // The provider allows 25 calls per second, bursts of 5.
    let limiter = Arc::new(
        Bucket::builder()
            .add_limit(|l| l.capacity(5).refill_greedy(25, Duration::from_secs(1)))
            .build()?,
    );
    let start = Instant::now();
    let log = Log::default();

    // 40 requests that wait as long as needed, and 10 that give up after 300 ms.
    let mut tasks = Vec::new();
    for id in 0..50u32 {
        let limiter = Arc::clone(&limiter);
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            let patient = id % 5 != 4;
            let allowed = if patient {
                limiter.as_async().consume(1).await.map(|_waited| true)
            } else {
                limiter
                    .as_async()
                    .try_consume(1, Duration::from_millis(300))
                    .await
            };
            let now = start.elapsed();
            let secs = now.as_secs_f64();
            match allowed {
                Ok(true) => {
                    let response = call_api(id).await;
                    let done = start.elapsed();
                    let line = format!(
                        "{:>6.3} s  request {id:>2} -> {response}",
                        done.as_secs_f64()
                    );
                    note(&log, done, line);
                    true
                }
                Ok(false) => {
                    let line = format!(
                        "{secs:>6.3} s  request {id:>2} gave up: its turn was more than 300 ms away"
                    );
                    note(&log, now, line);
                    false
                }
                Err(e) => {
                    note(&log, now, format!("request {id} failed: {e}"));
                    false
                }
            }
        }));
    }
    // Meanwhile the runtime is free: a heartbeat on the same thread keeps ticking.
    let beats = Arc::clone(&log);
    let heartbeat = tokio::spawn(async move {
        for beat in 1.. {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let at = start.elapsed();
            let line = format!(
                "{:>6.3} s  heartbeat {beat} (the executor is not blocked)",
                at.as_secs_f64()
            );
            note(&beats, at, line);
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
    let mut lines = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
    lines.sort();
    for (_, line) in lines {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "{served} calls served and {gave_up} gave up in {:.2} s",
        start.elapsed().as_secs_f64()
    )?;

    // Cancellation safety: a request abandoned by a timeout gives its token back.
    let before = limiter.available_tokens();
    let abandoned =
        tokio::time::timeout(Duration::from_millis(10), limiter.as_async().consume(10)).await;
    writeln!(
        out,
        "a request for 10 abandoned after 10 ms: {}; balance {before} before, {} after",
        if abandoned.is_err() {
            "dropped"
        } else {
            "completed"
        },
        limiter.available_tokens()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Real time: the check is on what happened, not on the measured times. The 10 impatient
    /// requests wait at most 300 ms; how many of them get a turn depends on the scheduling.
    #[tokio::test(flavor = "current_thread")]
    async fn throttles_and_gives_tokens_back() {
        let mut out = Vec::new();
        if let Err(e) = super::run(&mut out).await {
            panic!("the example failed: {e}");
        }
        let text = String::from_utf8(out).expect("UTF-8");
        bucket4rs_examples::assert_prints(&text, &["request  0 -> response #0", "heartbeat 1"]);
        let served: u32 = text
            .lines()
            .find_map(|l| l.split(" calls served and ").next()?.parse().ok())
            .expect("the summary line");
        assert!((40..=50).contains(&served), "{served} served:\n{text}");
        bucket4rs_examples::assert_prints(
            &text,
            &["a request for 10 abandoned after 10 ms: dropped; balance "],
        );
    }
}
