//! Every atomic the lock-free bucket uses comes from here, so `--cfg bucket4rs_loom` swaps in
//! loom's model-checked versions (the crossbeam pattern).

#[cfg(bucket4rs_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

#[cfg(not(bucket4rs_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};
