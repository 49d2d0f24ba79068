//! The backend kit: [`BackendKit`] runs every named check on a store, [`Faults`] breaks it.

mod checks;
mod engine;

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::time::Duration;
use std::sync::Arc;

use async_trait::async_trait;
use bucket4rs_distributed::{Backend, ManagerBuilder, ProxyManager, StorageKey};

/// A way to break the store under test, for the kit's fault checks.
///
/// ```
/// use bucket4rs_testkit::Fault;
/// assert_ne!(Fault::Stop, Fault::Start);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Stop the store: it refuses connections (or is gone) until [`Start`](Fault::Start).
    Stop,
    /// Start a stopped store again, with its data.
    Start,
    /// Freeze the store: connections stay open but nothing is answered (a paused server, a
    /// database locked by another writer) until [`Thaw`](Fault::Thaw).
    Freeze,
    /// Let a frozen store go on.
    Thaw,
    /// Restart the store (stop it and start it again) keeping its data.
    Restart,
}

/// Breaks the store under test on the kit's demand ([`BackendKit::faults`]).
///
/// `inject` answers `Ok(true)` once the fault is in effect, `Ok(false)` for a fault this store
/// cannot have (the check that needs it is then reported as not run), and `Err` when breaking
/// or mending it failed.
///
/// ```
/// use bucket4rs_testkit::{Fault, Faults};
///
/// /// A store that can only be restarted (reopening a file, say).
/// struct RestartOnly;
///
/// #[async_trait::async_trait]
/// impl Faults for RestartOnly {
///     async fn inject(&self, fault: Fault) -> Result<bool, String> {
///         Ok(fault == Fault::Restart)
///     }
/// }
/// ```
#[async_trait]
pub trait Faults: Send + Sync + 'static {
    /// Brings `fault` about; whether this store supports it.
    ///
    /// # Errors
    /// A description of what went wrong.
    async fn inject(&self, fault: Fault) -> Result<bool, String>;
}

type Connect<B> = dyn Fn() -> Pin<Box<dyn Future<Output = Result<B, String>> + Send>> + Send + Sync;

/// The backend test kit: every promise of the [`Backend`] trait, checked on one store.
///
/// `connect` gives a new client of the store under test each time it is called (a new
/// connection, a new handle on the same file, or a clone of one in-process store): the
/// checks for several managers use several. Keys are made unique to the run, so a shared
/// server may be used; the kit removes what it wrote.
///
/// ```
/// use bucket4rs_distributed::EmbeddedBackend;
/// use bucket4rs_testkit::BackendKit;
/// use std::sync::Arc;
///
/// let store = Arc::new(EmbeddedBackend::new());
/// let kit = BackendKit::new("embedded", move || {
///     let store = Arc::clone(&store);
///     async move { Ok::<_, String>(store) }
/// });
/// # drop(kit);
/// ```
pub struct BackendKit<B> {
    name: String,
    connect: Arc<Connect<B>>,
    faults: Option<Arc<dyn Faults>>,
    expires: bool,
}

impl<B> fmt::Debug for BackendKit<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendKit")
            .field("name", &self.name)
            .field("faults", &self.faults.is_some())
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> BackendKit<B> {
    /// A kit for the store that `connect` connects to, named `name` in every line it prints.
    ///
    /// ```
    /// # use bucket4rs_distributed::EmbeddedBackend;
    /// # use std::sync::Arc;
    /// let store = Arc::new(EmbeddedBackend::new());
    /// let kit = bucket4rs_testkit::BackendKit::new("embedded", move || {
    ///     let store = Arc::clone(&store);
    ///     async move { Ok::<_, String>(store) }
    /// });
    /// # drop(kit);
    /// ```
    pub fn new<F, Fut, E>(name: impl Into<String>, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, E>> + Send + 'static,
        E: fmt::Display,
    {
        let connect = Arc::new(move || {
            let fut = connect();
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
                as Pin<Box<dyn Future<Output = Result<B, String>> + Send>>
        });
        Self {
            name: name.into(),
            connect,
            faults: None,
            expires: true,
        }
    }

    /// Also runs the fault checks, breaking the store with `faults`.
    ///
    /// ```
    /// # use bucket4rs_distributed::EmbeddedBackend;
    /// # use bucket4rs_testkit::{Fault, Faults};
    /// # struct Nothing;
    /// # #[async_trait::async_trait]
    /// # impl Faults for Nothing { async fn inject(&self, _: Fault) -> Result<bool, String> { Ok(false) } }
    /// let kit = bucket4rs_testkit::BackendKit::new("embedded", || async {
    ///     Ok::<_, String>(EmbeddedBackend::new())
    /// })
    /// .faults(Nothing);
    /// # drop(kit);
    /// ```
    pub fn faults(mut self, faults: impl Faults) -> Self {
        self.faults = Some(Arc::new(faults));
        self
    }

    /// Declares that the store keeps records past their TTL (a plain map): the `expiry` check
    /// then only requires that expiry never changes an answer, not that records expire.
    ///
    /// ```
    /// # use bucket4rs_distributed::EmbeddedBackend;
    /// let kit = bucket4rs_testkit::BackendKit::new("no expiry", || async {
    ///     Ok::<_, String>(EmbeddedBackend::new())
    /// })
    /// .keeps_expired_records();
    /// # drop(kit);
    /// ```
    pub fn keeps_expired_records(mut self) -> Self {
        self.expires = false;
        self
    }

    /// Runs every check on its own tokio runtime (two workers), printing a line for each.
    ///
    /// # Panics
    /// When any check fails, naming each failed check and what broke; when called inside a
    /// tokio runtime.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::EmbeddedBackend;
    /// # use std::sync::Arc;
    /// let store = Arc::new(EmbeddedBackend::new());
    /// bucket4rs_testkit::BackendKit::new("embedded", move || {
    ///     let store = Arc::clone(&store);
    ///     async move { Ok::<_, String>(store) }
    /// })
    /// .run();
    /// ```
    pub fn run(self) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("the kit's tokio runtime");
        let started = std::time::Instant::now();
        let ctx = Arc::new(Ctx {
            name: self.name,
            connect: self.connect,
            faults: self.faults,
            expires: self.expires,
            prefix: unique_prefix(),
        });
        let mut failed = Vec::new();
        let mut report = |name: &str, result: Result<String, String>| match result {
            Ok(note) if note.starts_with("not run") => {
                println!("kit: {}: {name}: {note}", ctx.name)
            }
            Ok(note) => println!("kit: {}: {name}: ok ({note})", ctx.name),
            Err(e) => {
                println!("kit: {}: {name}: FAILED: {e}", ctx.name);
                failed.push(format!("{name}: {e}"));
            }
        };
        report("conformance", engine::conformance(&rt, &ctx, false));
        report("conformance leased", engine::conformance(&rt, &ctx, true));
        for (name, check) in checks::all::<B>() {
            let c = Arc::clone(&ctx);
            let result = rt.block_on(async move {
                match tokio::spawn(check(c)).await {
                    Ok(r) => r,
                    Err(e) => Err(format!("panicked: {}", panic_message(e))),
                }
            });
            report(name, result);
        }
        println!(
            "kit: {}: {} checks, {} failed, in {:.1} s",
            ctx.name,
            2 + checks::all::<B>().len(),
            failed.len(),
            started.elapsed().as_secs_f64()
        );
        assert!(
            failed.is_empty(),
            "the backend kit found {} broken promise(s) of {}:\n  {}",
            failed.len(),
            ctx.name,
            failed.join("\n  ")
        );
    }
}

/// What every check is given.
pub(crate) struct Ctx<B> {
    pub(crate) name: String,
    connect: Arc<Connect<B>>,
    pub(crate) faults: Option<Arc<dyn Faults>>,
    pub(crate) expires: bool,
    /// Unique to the run: every check's managers prefix their keys with it and a suffix.
    prefix: String,
}

impl<B: Backend> Ctx<B> {
    /// A new client of the store.
    pub(crate) async fn connect(&self) -> Result<Arc<B>, String> {
        (self.connect)()
            .await
            .map(Arc::new)
            .map_err(|e| format!("connecting: {e}"))
    }

    /// A manager's builder on `backend` whose keys start with the run's prefix and `check`,
    /// with a patient timeout (checks of latency set their own).
    pub(crate) fn manager<X: Backend>(&self, backend: X, check: &str) -> ManagerBuilder<X> {
        ProxyManager::configure(backend)
            .key_prefix(format!("{}-{check}", self.prefix))
            .timeout(Duration::from_secs(10))
    }

    /// Applies `fault` when the store supports it: `Ok(false)` without [`Faults`] or support.
    pub(crate) async fn inject(&self, fault: Fault) -> Result<bool, String> {
        match &self.faults {
            None => Ok(false),
            Some(f) => f.inject(fault).await.map_err(|e| format!("{fault:?}: {e}")),
        }
    }
}

/// A key prefix no other run uses (stores may be shared servers).
fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("b4kit{}x{nanos}", std::process::id())
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".into()),
        Err(e) => e.to_string(),
    }
}

/// Reads `key`'s raw record through `backend` (for checks that compare bytes).
pub(crate) async fn raw<B: Backend>(
    backend: &B,
    key: &StorageKey,
) -> Result<Option<Vec<u8>>, String> {
    backend
        .read(key)
        .await
        .map_err(|e| format!("reading {key}: {e}"))
}
