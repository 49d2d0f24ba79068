//! A recording listener and bucket helpers shared by the tests.

pub(crate) use bucket4rs_test::recorder::{Event, Recorder};
