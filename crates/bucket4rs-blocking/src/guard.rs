//! The guard rail against blocking an async runtime: a blocking view made on a thread that
//! runs tokio tasks would park that thread, and every task it drives would stall with it.
//!
//! Detection needs tokio's own answer (`tokio::runtime::worker_index`, tokio 1.54), so it is
//! behind the optional `tokio` feature: a program without tokio has nothing to detect and
//! does not pay for the dependency. `worker_index` tells a thread that drives tasks (a worker
//! of the multi-thread runtime, the thread inside a current-thread runtime's `block_on`)
//! from one of tokio's blocking threads (`spawn_blocking`, where parking is the point), which
//! a "is there a runtime context?" test or the threads' shared name cannot.
//!
//! Debug builds only, and a warning rather than an error: the same program must behave the
//! same in release, and a view used only with a `ManualClockPark` never parks a thread.

/// Checks the calling thread when a blocking view is made: in a debug build with the `tokio`
/// feature, on a thread that drives tokio tasks, prints a warning to stderr (once per
/// process). Otherwise does nothing.
#[inline]
pub(crate) fn check_thread() {
    #[cfg(all(debug_assertions, feature = "tokio"))]
    if let Some(worker) = tokio_worker() {
        warn_once(worker);
    }
}

/// The index of the tokio worker the calling thread is, if it drives tokio tasks.
#[cfg(all(feature = "tokio", any(debug_assertions, test)))]
pub(crate) fn tokio_worker() -> Option<usize> {
    tokio::runtime::worker_index()
}

#[cfg(all(debug_assertions, feature = "tokio"))]
static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(all(debug_assertions, feature = "tokio"))]
#[cold]
fn warn_once(worker: usize) {
    use std::sync::atomic::Ordering;
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "warning: bucket4rs-blocking: `as_blocking()` was called on a thread that runs tokio \
             tasks (worker {worker}). A wait parks this thread, and every task it drives stalls \
             until the wait is over. In async code use bucket4rs-async (`as_async()`, which \
             awaits instead), or move the blocking call to `tokio::task::spawn_blocking`. \
             (Printed once per process, in debug builds with bucket4rs-blocking's `tokio` \
             feature.)"
        );
    }
}

/// Whether the warning was printed (for the tests).
#[cfg(all(test, debug_assertions, feature = "tokio"))]
pub(crate) fn warned() -> bool {
    WARNED.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::tokio_worker;

    #[test]
    fn a_plain_thread_is_not_a_worker() {
        assert_eq!(tokio_worker(), None);
    }

    #[test]
    fn the_thread_inside_a_current_thread_runtime_is_a_worker() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        assert_eq!(rt.block_on(async { tokio_worker() }), Some(0));
    }

    #[test]
    fn multi_thread_workers_are_workers_and_blocking_threads_are_not() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .expect("a runtime");
        let (in_task, in_blocking) = rt.block_on(async {
            let task = tokio::spawn(async { tokio_worker() });
            let blocking = tokio::task::spawn_blocking(tokio_worker);
            (task.await, blocking.await)
        });
        assert!(matches!(in_task, Ok(Some(i)) if i < 2), "{in_task:?}");
        assert!(matches!(in_blocking, Ok(None)), "{in_blocking:?}");
    }

    #[cfg(debug_assertions)]
    #[test]
    fn a_blocking_view_made_on_a_worker_warns() -> Result<(), Box<dyn std::error::Error>> {
        use crate::BlockingBucketExt;
        use bucket4rs_local::Bucket;
        use std::time::Duration;

        let bucket = Bucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
            .build()?;
        // Off the runtime: no warning (this test is the only one that makes a view).
        let _ = bucket.as_blocking();
        assert!(!super::warned());
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        rt.block_on(async {
            let _ = bucket.as_blocking();
        });
        assert!(super::warned());
        Ok(())
    }
}
