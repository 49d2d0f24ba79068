//! A backend connected in the background: the server starts serving at once, and until the
//! store is reachable every limited request gets the failure policy's answer.

use core::fmt;
use core::future::Future;
use core::time::Duration;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bucket4rs_distributed::{
    Backend, BackendClock, BackendError, BackendErrorKind, StorageKey, Transaction,
};

/// The first wait between two connection attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A connected backend, with what must live as long as it (the PostgreSQL reaper).
struct Connected<B> {
    backend: B,
    _guard: Box<dyn Send + Sync>,
}

/// A [`Backend`] that connects in the background, retrying (250 ms, doubling up to 5 s)
/// until it succeeds. Until then every call fails at once with an unavailable error, which
/// the layer's failure policy answers; afterwards it is the connected backend.
///
/// ```
/// use bucket4rs_distributed::{BackendClock, EmbeddedBackend};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let backend = bookshelf::Deferred::connect("the embedded store", BackendClock::WallClock, || async {
///     Ok::<_, String>((EmbeddedBackend::new(), ()))
/// });
/// while !backend.is_connected() {
///     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Deferred<B> {
    what: &'static str,
    clock: BackendClock,
    state: Arc<OnceLock<Connected<B>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<B> fmt::Debug for Deferred<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deferred")
            .field("what", &self.what)
            .field("connected", &self.state.get().is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Drop for Deferred<B> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<B: Backend> Deferred<B> {
    /// Starts connecting with `connect` (on the current tokio runtime) to `what` (named in
    /// the logs), whose clock is `clock` (the manager asks before the backend exists). The
    /// second value `connect` returns lives as long as the backend.
    pub fn connect<F, Fut, G>(what: &'static str, clock: BackendClock, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(B, G), String>> + Send,
        G: Send + Sync + 'static,
    {
        let state = Arc::new(OnceLock::new());
        let slot = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let mut wait = FIRST_BACKOFF;
            let mut failed = 0u32;
            loop {
                match connect().await {
                    Ok((backend, guard)) => {
                        let _ = slot.set(Connected {
                            backend,
                            _guard: Box::new(guard),
                        });
                        if failed > 0 {
                            tracing::warn!("{what}: connected after {failed} failed attempts");
                        } else {
                            tracing::info!("{what}: connected");
                        }
                        return;
                    }
                    Err(e) => {
                        failed = failed.saturating_add(1);
                        tracing::warn!("{what}: cannot connect ({e}); retrying in {wait:?}");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_BACKOFF);
                    }
                }
            }
        });
        Self {
            what,
            clock,
            state,
            task,
        }
    }

    /// Whether the backend is connected.
    pub fn is_connected(&self) -> bool {
        self.state.get().is_some()
    }

    fn backend(&self) -> Result<&B, BackendError> {
        match self.state.get() {
            Some(c) => Ok(&c.backend),
            None => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("{}: not connected yet", self.what),
            )),
        }
    }
}

#[async_trait]
impl<B: Backend> Backend for Deferred<B> {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.backend()?.transact(key, tx).await
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.backend()?.read(key).await
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.backend()?.remove(key).await
    }

    fn clock(&self) -> BackendClock {
        self.clock
    }
}
