//! Every atomic the lock-free bucket uses comes from here, so `--cfg bucket4rs_loom` swaps in
//! loom's model-checked versions (the crossbeam pattern).

#[cfg(bucket4rs_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

#[cfg(not(bucket4rs_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

/// A 128-bit atomic word: `CMPXCHG16B` on x86-64 (detected at run time unless the target
/// enables it), `CASP`/`LDXP` on AArch64, through `portable-atomic`.
#[cfg(not(bucket4rs_loom))]
pub(crate) use portable_atomic::AtomicU128;

/// Loom has no 128-bit atomic; a word behind a loom mutex has the same atomicity (every access
/// is one indivisible step) and gives the model checker the same scheduling points.
#[cfg(bucket4rs_loom)]
#[derive(Debug)]
pub(crate) struct AtomicU128(loom::sync::Mutex<u128>);

#[cfg(bucket4rs_loom)]
impl AtomicU128 {
    pub(crate) fn new(v: u128) -> Self {
        Self(loom::sync::Mutex::new(v))
    }

    pub(crate) fn is_lock_free() -> bool {
        true
    }

    pub(crate) fn load(&self, _order: Ordering) -> u128 {
        *self.0.lock().expect("not poisoned")
    }

    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        _success: Ordering,
        _failure: Ordering,
    ) -> Result<u128, u128> {
        let mut v = self.0.lock().expect("not poisoned");
        if *v == current {
            *v = new;
            Ok(current)
        } else {
            Err(*v)
        }
    }
}
