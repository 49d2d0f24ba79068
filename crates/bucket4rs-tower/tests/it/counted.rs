//! A backend that counts its transactions (its round trips) by storage key. Bookshelf's tests
//! use this file too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bucket4rs_distributed::{Backend, BackendClock, BackendError, StorageKey, Transaction};

/// Transactions by storage key.
pub(crate) type Counts = Arc<Mutex<HashMap<String, u64>>>;

/// `inner`, counting its transactions into `counts`.
#[derive(Debug)]
pub(crate) struct Counted<B> {
    pub(crate) inner: B,
    pub(crate) counts: Counts,
}

impl<B> Counted<B> {
    /// `inner` counted, and the counts.
    pub(crate) fn new(inner: B) -> (Self, Counts) {
        let counts = Counts::default();
        (
            Self {
                inner,
                counts: Arc::clone(&counts),
            },
            counts,
        )
    }
}

/// The transactions on `key` so far.
pub(crate) fn on(counts: &Counts, key: &StorageKey) -> u64 {
    counts
        .lock()
        .unwrap()
        .get(key.as_str())
        .copied()
        .unwrap_or(0)
}

/// The transactions so far, on every key.
pub(crate) fn total(counts: &Counts) -> u64 {
    counts.lock().unwrap().values().sum()
}

#[async_trait]
impl<B: Backend> Backend for Counted<B> {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(key.as_str().to_owned())
            .or_default() += 1;
        self.inner.transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.inner.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.inner.remove(key).await
    }
    fn clock(&self) -> BackendClock {
        self.inner.clock()
    }
    fn is_in_process(&self) -> bool {
        self.inner.is_in_process()
    }
}
