//! Every atomic, lock and concurrent map the lock-free and keyed buckets use comes from here,
//! so `--cfg bucket4rs_loom` swaps in loom's model-checked versions (the crossbeam pattern).

#[cfg(bucket4rs_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering, fence,
};

#[cfg(not(bucket4rs_loom))]
pub(crate) use core::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering, fence,
};

pub(crate) use map::{Map, Mutex, Probe};

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

/// The keyed bucket's concurrent map and its locks.
///
/// Normally the map is `papaya`'s: lookups are a guarded read that writes no shared line (a
/// thread pins its own epoch slot), a removed value stays readable by a thread that found it
/// until that thread lets go. Under loom it is a list behind a loom mutex whose values are
/// `Arc`s, which keeps that property (a removed value stays usable by whoever holds it) while
/// loom explores every interleaving of the keyed code's own steps around it.
mod map {
    use core::hash::{BuildHasher, Hash};

    /// How the map compares a borrowed key with a stored one.
    pub(crate) trait Probe<K>: Hash {
        fn is(&self, key: &K) -> bool;
    }

    /// A lock, the keyed bucket's only ones: a key's general bucket and the map's structural
    /// changes.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(Inner<T>);

    #[cfg(not(bucket4rs_loom))]
    type Inner<T> = parking_lot::Mutex<T>;
    #[cfg(bucket4rs_loom)]
    type Inner<T> = loom::sync::Mutex<T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(Inner::new(value))
        }

        /// Runs `f` with the lock held.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
            #[cfg(not(bucket4rs_loom))]
            let mut guard = self.0.lock();
            #[cfg(bucket4rs_loom)]
            let mut guard = self.0.lock().expect("not poisoned");
            f(&mut guard)
        }

        /// Runs `f` with the lock held if it is free now; `None` otherwise.
        pub(crate) fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
            #[cfg(not(bucket4rs_loom))]
            let guard = self.0.try_lock();
            #[cfg(bucket4rs_loom)]
            let guard = self.0.try_lock().ok();
            guard.map(|mut g| f(&mut g))
        }
    }

    /// A `Probe` as papaya's `Equivalent`.
    #[cfg(not(bucket4rs_loom))]
    #[derive(Hash)]
    struct Equivalent<'a, Q: ?Sized>(&'a Q);

    #[cfg(not(bucket4rs_loom))]
    impl<K, Q: Probe<K> + ?Sized> equivalent::Equivalent<K> for Equivalent<'_, Q> {
        #[inline]
        fn equivalent(&self, key: &K) -> bool {
            self.0.is(key)
        }
    }

    /// The concurrent map from keys to values.
    #[cfg(not(bucket4rs_loom))]
    pub(crate) struct Map<K, V, S>(papaya::HashMap<K, V, S>);

    #[cfg(not(bucket4rs_loom))]
    impl<K: Hash + Eq, V, S: BuildHasher> Map<K, V, S> {
        pub(crate) fn with_hasher(hasher: S) -> Self {
            Self(papaya::HashMap::builder().hasher(hasher).build())
        }

        /// `f` of `key`'s value, if any, which stays valid (if removed meanwhile, readable)
        /// while `f` runs.
        #[inline(always)]
        pub(crate) fn get<Q: Probe<K> + ?Sized, T>(
            &self,
            key: &Q,
            f: impl FnOnce(Option<&V>) -> T,
        ) -> T {
            let guard = self.0.guard();
            f(self.0.get(&Equivalent(key), &guard))
        }

        /// Stores `value` for `key` unless the key has a value: `f` of `Ok(stored)`, or of
        /// `Err(present)` (and `value` is dropped).
        pub(crate) fn try_insert<T>(
            &self,
            key: K,
            value: V,
            f: impl FnOnce(Result<&V, &V>) -> T,
        ) -> T {
            let guard = self.0.guard();
            match self.0.try_insert(key, value, &guard) {
                Ok(stored) => f(Ok(stored)),
                Err(e) => f(Err(e.current)),
            }
        }

        /// Stores `value` for `key` in place of whatever it had.
        pub(crate) fn insert(&self, key: K, value: V) {
            let guard = self.0.guard();
            self.0.insert(key, value, &guard);
        }

        /// Removes `key`'s value if `remove` says so; whether it did.
        pub(crate) fn remove_if<Q: Probe<K> + ?Sized>(
            &self,
            key: &Q,
            mut remove: impl FnMut(&V) -> bool,
        ) -> bool {
            let guard = self.0.guard();
            matches!(
                self.0.remove_if(&Equivalent(key), |_, v| remove(v), &guard),
                Ok(Some(_))
            )
        }

        /// Keeps the entries for which `keep` answers `true`.
        pub(crate) fn retain(&self, keep: impl FnMut(&K, &V) -> bool) {
            let guard = self.0.guard();
            self.0.retain(keep, &guard);
        }
    }

    /// The concurrent map under loom: a list behind a loom mutex, values behind `Arc`s.
    #[cfg(bucket4rs_loom)]
    pub(crate) struct Map<K, V, S>(
        loom::sync::Mutex<Vec<(K, std::sync::Arc<V>)>>,
        core::marker::PhantomData<S>,
    );

    #[cfg(bucket4rs_loom)]
    impl<K: Hash + Eq, V, S: BuildHasher> Map<K, V, S> {
        pub(crate) fn with_hasher(_hasher: S) -> Self {
            Self(
                loom::sync::Mutex::new(Vec::new()),
                core::marker::PhantomData,
            )
        }

        fn list(&self) -> loom::sync::MutexGuard<'_, Vec<(K, std::sync::Arc<V>)>> {
            self.0.lock().expect("not poisoned")
        }

        pub(crate) fn get<Q: Probe<K> + ?Sized, T>(
            &self,
            key: &Q,
            f: impl FnOnce(Option<&V>) -> T,
        ) -> T {
            let found = self
                .list()
                .iter()
                .find(|(k, _)| key.is(k))
                .map(|(_, v)| std::sync::Arc::clone(v));
            f(found.as_deref())
        }

        pub(crate) fn try_insert<T>(
            &self,
            key: K,
            value: V,
            f: impl FnOnce(Result<&V, &V>) -> T,
        ) -> T {
            let mut list = self.list();
            if let Some((_, v)) = list.iter().find(|(k, _)| *k == key) {
                let present = std::sync::Arc::clone(v);
                drop(list);
                return f(Err(&present));
            }
            let stored = std::sync::Arc::new(value);
            list.push((key, std::sync::Arc::clone(&stored)));
            drop(list);
            f(Ok(&stored))
        }

        pub(crate) fn insert(&self, key: K, value: V) {
            let mut list = self.list();
            list.retain(|(k, _)| *k != key);
            list.push((key, std::sync::Arc::new(value)));
        }

        pub(crate) fn remove_if<Q: Probe<K> + ?Sized>(
            &self,
            key: &Q,
            mut remove: impl FnMut(&V) -> bool,
        ) -> bool {
            let mut list = self.list();
            match list.iter().position(|(k, v)| key.is(k) && remove(v)) {
                Some(i) => {
                    list.swap_remove(i);
                    true
                }
                None => false,
            }
        }

        pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
            self.list().retain(|(k, v)| keep(k, v));
        }
    }
}
