//! Every atomic the lock-free bucket uses comes from here, so `--cfg bucket4rs_loom` swaps in
//! loom's model-checked versions (the crossbeam pattern).

#[cfg(bucket4rs_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

#[cfg(not(bucket4rs_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

/// A 128-bit atomic word, through `portable-atomic`: `CMPXCHG16B` for compare-and-swap and
/// `VMOVDQA` for loads on x86-64 (both detected at run time unless the target enables them).
#[cfg(not(bucket4rs_loom))]
pub(crate) use portable_atomic::AtomicU128;

/// Whether [`AtomicU128`] is native *and* loads it without writing, so that read-only outcomes
/// stay plain reads of the shared line: x86-64 with `CMPXCHG16B` and AVX (Intel and AMD make
/// aligned 16-byte `VMOVDQA` atomic). Elsewhere — including CPUs where `portable-atomic` would
/// load with a compare-and-swap or emulate the word with a lock — buckets use the slots only.
#[cfg(not(bucket4rs_loom))]
pub(crate) fn wide_word_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        AtomicU128::is_lock_free()
            && std::arch::is_x86_feature_detected!("cmpxchg16b")
            && std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Under loom the word is modelled, so packed mode is always checked.
#[cfg(bucket4rs_loom)]
pub(crate) fn wide_word_supported() -> bool {
    true
}

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
