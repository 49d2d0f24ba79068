//! The three synchronization strategies (Bucket4j's `LOCK_FREE`, `SYNCHRONIZED` and `NONE`)
//! are three bucket types, chosen by the build method; a thread-safe one can also be chosen
//! at run time from a string. Code generic over the strategy names `Storage`.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example strategies
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{
    Bucket, BucketBuilder, BucketListener, Clock, LockFreeBucket, Storage, SynchronizationStrategy,
    SynchronizedBucket, UnsyncBucket,
};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

/// 1,000 tokens that (practically) never refill.
fn thousand() -> BucketBuilder {
    Bucket::builder().add_limit(|l| {
        l.capacity(1_000)
            .refill_greedy(1, Duration::from_secs(1_000_000))
    })
}

/// Works on a bucket of any strategy, clock and listener.
fn hammer<S: Storage + Sync, C: Clock + Sync, L: BucketListener + Sync>(
    bucket: &Bucket<S, C, L>,
) -> u64 {
    // Four threads each try 400 times: exactly 1,000 requests get a token, whatever the
    // interleaving.
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..400)
                        .filter(|_| bucket.try_consume(1).unwrap_or(false))
                        .count() as u64
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    })
}

fn run(out: &mut dyn Write) -> Outcome {
    let lock_free: LockFreeBucket = thousand().build()?;
    writeln!(out, "lock-free, 4 threads: {} served", hammer(&lock_free))?;

    let synchronized: SynchronizedBucket = thousand().build_synchronized()?;
    writeln!(
        out,
        "synchronized, 4 threads: {} served",
        hammer(&synchronized)
    )?;

    // Single-threaded: `!Sync`, so `hammer(&unsync)` would not compile. To share a bucket,
    // build it with `build()` instead of putting this one behind a lock.
    let unsync: UnsyncBucket = thousand().build_unsynchronized()?;
    let served = (0..1_600)
        .filter(|_| unsync.try_consume(1).unwrap_or(false))
        .count();
    writeln!(out, "unsynchronized, 1 thread: {served} served")?;

    // Chosen at run time, e.g. from a configuration file.
    for name in ["lock_free", "synchronized", "none"] {
        match name.parse::<SynchronizationStrategy>() {
            Ok(strategy) => {
                let bucket = thousand().build_with(strategy)?;
                writeln!(
                    out,
                    "{name:?} -> {strategy:?}, 4 threads: {} served",
                    hammer(&bucket)
                )?;
            }
            Err(e) => writeln!(out, "{name:?} -> {e}")?,
        }
    }
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
                "lock-free, 4 threads: 1000 served",
                "synchronized, 4 threads: 1000 served",
                "unsynchronized, 1 thread: 1000 served",
                r#""lock_free" -> LockFree, 4 threads: 1000 served"#,
                r#""synchronized" -> Synchronized, 4 threads: 1000 served"#,
                r#""none" -> unknown synchronization strategy "none" (expected lock_free or synchronized)"#,
            ],
        );
    }
}
