//! The background task that deletes expired records of a store that does not expire them
//! itself (PostgreSQL, SQLite).

/// A periodic reaper of expired records (`spawn_reaper` of the PostgreSQL and SQLite
/// backends); it stops when dropped.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// # use bucket4rs_distributed::{SqliteBackend, SqliteOptions}; use std::time::Duration;
/// let backend = SqliteBackend::open("limits.db", SqliteOptions::default()).await?;
/// let reaper = backend.spawn_reaper(Duration::from_secs(30), 500);
/// drop(reaper); // stops it
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Reaper {
    task: tokio::task::JoinHandle<()>,
}

impl Reaper {
    /// The reaper running `task`.
    pub(crate) fn new(task: tokio::task::JoinHandle<()>) -> Self {
        Self { task }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
