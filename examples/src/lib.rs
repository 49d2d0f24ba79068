//! Runnable examples for bucket4rs. The programs are in `examples/`
//! (`cargo run -p bucket4rs-examples --example <name>`); this library holds what their tests
//! share.
//!
//! The tour, one program per section of Bucket4j's guide to its Bucket API, each printing what
//! it shows (on a manual clock, or tokio's paused time, so every number is exact):
//!
//! | example | shows |
//! |---|---|
//! | `builder` | both ways to add a limit, several limits, initial tokens, ids, the build errors |
//! | `probes` | `try_consume`, probes, estimates, as much as possible, add / force-add / reset, debt |
//! | `verbose_headers` | the verbose API and the rate-limit headers it gives |
//! | `blocking` | blocking consumption, park strategies, cancellation, verbose waits |
//! | `async_scheduling` | async consumption: queueing, lazy reservation, cancellation |
//! | `replacement` | configuration replacement with the four strategies and bandwidth ids |
//! | `listeners` | counting listeners, replacing and adding listeners, a listener of your own |
//! | `manual_clock` | a controllable clock: greedy, interval and aligned refill, exact waits |
//! | `strategies` | the three synchronization strategies, one chosen at run time, generic code |
//! | `http_429` | mapping a probe to 200 / 429 with `Retry-After`, without an HTTP crate |
//!
//! Also: `quickstart` (the pure core step by step), `batch_job` (a throttled job on threads)
//! and `async_client` (an API client on tokio).
//!
//! Each example writes to a `&mut dyn Write`: `main` passes stdout, and the example's own
//! `#[test]` passes a buffer and checks the text with [`assert_prints`].

use std::error::Error;
use std::io::Write;

/// What an example's `run` returns.
pub type Outcome = Result<(), Box<dyn Error>>;

/// Runs an example's `run` into a buffer and returns what it printed.
///
/// # Panics
/// When `run` fails or prints invalid UTF-8 (a failing example is a failing test).
pub fn output_of(run: impl FnOnce(&mut dyn Write) -> Outcome) -> String {
    let mut out = Vec::new();
    if let Err(e) = run(&mut out) {
        panic!(
            "the example failed: {e}\nit printed:\n{}",
            String::from_utf8_lossy(&out)
        );
    }
    String::from_utf8(out).expect("the example prints UTF-8")
}

/// Checks that `text` contains every string of `expected`, in that order.
///
/// # Panics
/// Naming the first string missing, with the whole text.
pub fn assert_prints(text: &str, expected: &[&str]) {
    let mut rest = text;
    for want in expected {
        match rest.find(want) {
            Some(at) => rest = &rest[at + want.len()..],
            None => panic!("expected {want:?} (after the previous expected lines) in:\n{text}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{assert_prints, output_of};

    #[test]
    fn finds_lines_in_order() {
        let text = output_of(|out| {
            writeln!(out, "a 1\nb 2\nc 3")?;
            Ok(())
        });
        assert_prints(&text, &["a 1", "c 3"]);
        let wrong_order = std::panic::catch_unwind(|| assert_prints(&text, &["c 3", "a 1"]));
        assert!(wrong_order.is_err());
    }
}
