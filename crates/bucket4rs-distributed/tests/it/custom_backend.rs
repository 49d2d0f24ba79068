//! A user-written backend (the smallest one of docs/custom-backend.md) keeps every promise the
//! backend kit checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, StorageKey, Transaction, Write,
};

/// The smallest correct backend: a mutex around a map. `transact` holds the lock while the
/// transaction runs, which makes it atomic per key (and per map).
#[derive(Debug, Default)]
pub(crate) struct MapBackend {
    map: Mutex<HashMap<StorageKey, Vec<u8>>>,
}

impl MapBackend {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<StorageKey, Vec<u8>>> {
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Backend for MapBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let mut map = self.lock();
        // Past its caller's deadline a transaction must change nothing: its caller has been told
        // it failed.
        if tx
            .deadline()
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                "past the caller's deadline",
            ));
        }
        // This backend has no clock: managers must use TimeSource::client.
        match tx.apply(map.get(key).map(Vec::as_slice), None) {
            Write::Put { record, ttl: _ } => {
                map.insert(key.clone(), record);
            }
            Write::Keep => {}
            _ => {}
        }
        Ok(())
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.lock().get(key).cloned())
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        Ok(self.lock().remove(key).is_some())
    }
}

/// The map keeps expired records (it ignores TTLs): the kit is told so.
#[test]
fn a_custom_backend_replays_the_backend_kit() {
    let store = Arc::new(MapBackend::default());
    bucket4rs_testkit::BackendKit::new("custom MapBackend", move || {
        let store = Arc::clone(&store);
        async move { Ok::<_, String>(store) }
    })
    .keeps_expired_records()
    .run();
}

#[test]
fn a_clockless_backend_cannot_be_asked_for_backend_time() {
    let err = bucket4rs_distributed::ProxyManager::configure(MapBackend::default())
        .time_source(bucket4rs_distributed::TimeSource::backend())
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        bucket4rs_distributed::DistributedError::Backend(_)
    ));
}
