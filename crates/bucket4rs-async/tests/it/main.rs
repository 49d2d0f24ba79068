//! Integration tests of the async view (one binary; needs the `tokio` feature).

mod cancellation;
mod listener;
mod real_clock;
mod support;
mod virtual_time;
