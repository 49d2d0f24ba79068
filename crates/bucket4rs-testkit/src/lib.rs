//! # bucket4rs-testkit
//!
//! Every promise a [`bucket4rs_distributed`] backend makes, checked from one test. A backend
//! author gives [`BackendKit`] a way to connect to the store under test (and, optionally, a
//! way to break it: [`Faults`]); [`BackendKit::run`] then runs each named check and panics
//! naming every promise that broke:
//!
//! | check | the promise |
//! |---|---|
//! | `conformance` | every Bucket4j conformance trace replays exactly (the bundled traces, or the directory named by `BUCKET4RS_CONFORMANCE_DIR`) |
//! | `exact_under_concurrency` | several managers and several tasks each on one key grant exactly what the limit allows |
//! | `creation_race` | many first calls on an absent key at once create one bucket and grant exactly its capacity |
//! | `expiry` | a record's TTL never changes an answer: a record without one is kept, and one with one expires (as asked) |
//! | `corrupt_records` | a damaged record gives a typed error to every operation and stays byte for byte |
//! | `foreign_records` | bytes that are not a record of ours (text, a future format version, nothing) likewise |
//! | `hostile_keys` | keys of any content and of the maximum length are distinct buckets, found and removed by their storage key |
//! | `deadline` | a transaction that reaches the store after its caller's deadline writes nothing |
//! | `batching` | operations queued on one key and sent together answer as the core applying them one by one |
//! | `retryable_errors` | an error the backend marks retryable took no token: retried calls never charge twice, and a call that gives up after its retries took nothing |
//! | `stopped` (with [`Fault::Stop`]) | calls fail with an "unavailable" error while the store is down, charge nothing, and work once it is back |
//! | `frozen` (with [`Fault::Freeze`]) | calls time out while the store answers nothing, and nothing is charged after their deadline once it thaws |
//! | `restart` (with [`Fault::Restart`]) | after a restart the first call succeeds and every bucket is as it was |
//!
//! It prints one `conformance: … (engine: NAME; …)` line and one `kit: NAME: …` line per
//! check. Name the test so that it contains `replays` if your CI runs conformance runners
//! uncaptured by that name, as bucket4rs's own does.
//!
//! ```
//! use bucket4rs_distributed::EmbeddedBackend;
//! use bucket4rs_testkit::BackendKit;
//! use std::sync::Arc;
//!
//! # fn main() { if std::env::var_os("BUCKET4RS_CONFORMANCE_DIR").is_some() { return; }
//! // One store for the whole run: every "connection" is a handle on it.
//! let store = Arc::new(EmbeddedBackend::new());
//! BackendKit::new("embedded", move || {
//!     let store = Arc::clone(&store);
//!     async move { Ok::<_, String>(store) }
//! })
//! .run();
//! # }
//! ```
//!
//! The [`conformance`] module is the trace replayer on its own, for any bucket implementation.
//!
//! # Crate features
//! - `backend` (default): [`BackendKit`] and [`Faults`] (pulls `bucket4rs-distributed` and
//!   tokio). Without it the crate is the conformance traces and their replayer.
#![forbid(unsafe_code)]

pub mod conformance;

#[cfg(feature = "backend")]
mod backend;

#[cfg(feature = "backend")]
pub use backend::{BackendKit, Fault, Faults};
