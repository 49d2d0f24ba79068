//! Integration tests of the blocking view (one binary, see the house style).

mod cancel;
mod conformance;
mod listener;
mod queue;
mod real_clock;
mod support;
mod verbose;
