//! Integration tests of the async view (one binary; needs the `tokio` feature).

mod cancellation;
mod listener;
mod real_clock;
mod support;
mod verbose;
mod virtual_time;
