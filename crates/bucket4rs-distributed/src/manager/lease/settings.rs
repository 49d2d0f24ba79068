//! [`Leasing`], the settings of a manager's (or a bucket's) leasing: how a lease is sized,
//! how long it lives, and how many processes share a key.

use core::time::Duration;

use crate::error::DistributedError;

/// The longest lease lifetime.
const MAX_LIFETIME: Duration = Duration::from_secs(30);

/// Hot keys at local speed: a manager takes tokens from a shared bucket in blocks (*leases*)
/// and serves its callers from them in process, giving back exactly what it did not use.
///
/// Off by default; on for every bucket of a manager with
/// [`ManagerBuilder::leasing`](crate::ManagerBuilder::leasing), or for one bucket with
/// [`RemoteBucketBuilder::leasing`](crate::RemoteBucketBuilder::leasing).
///
/// - **No over-grant, ever.** Every token a caller gets was taken from the shared bucket
///   first; a lease's unused tokens go back so that the bucket ends exactly as if the lease
///   had taken only what was used, when it was taken (not "capped at capacity", which gives
///   back tokens the bucket never lacked). A process that dies with a lease loses it from the
///   bucket: under-grant, never over-grant.
/// - **Under-grant bounded.** Each lease holds at most
///   `capacity × max_held_percent / 100 / processes` tokens of the smallest capacity (see
///   [`lease_cap`](Self::lease_cap)), and at most 24 leases are live per key: tokens sit
///   unused in leases, and in returns on their way back, up to `min(processes, 24) ×
///   lease_cap` each; and a process answers refusals from what it last saw of the bucket,
///   which tokens other processes gave back since can make stale by as much again. The
///   under-grant stays below `3 × min(processes, 24) × lease_cap`.
/// - **Adaptive.** A lease is sized to what this process used over the last
///   [`period`](Self::period), up to the cap; a process that uses fewer than two tokens per
///   period takes none, and a lease unused for [`idle`](Self::idle) or older than
///   [`lifetime`](Self::lifetime) is given back, so an idle process holds nothing.
/// - **Approximate**: what a call answered in process reports (remaining tokens, waits,
///   estimates, `available_tokens`) is the shared bucket as this process last saw it, its own
///   lease included; other processes' use since is not in it. Exact for one process.
///
/// See `docs/distributed.md`, "Hot keys: batching and leasing".
///
/// ```
/// use bucket4rs_distributed::Leasing;
/// use std::time::Duration;
/// let leasing = Leasing::new().processes(4).period(Duration::from_millis(50));
/// assert_eq!(leasing.lease_cap(10_000), 250); // 10 % of 10,000 over 4 processes
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Leasing {
    pub(super) period: Duration,
    pub(super) lifetime: Duration,
    pub(super) idle: Duration,
    pub(super) processes: u32,
    pub(super) held_percent: u8,
}

impl Default for Leasing {
    fn default() -> Self {
        Self::new()
    }
}

impl Leasing {
    /// The defaults: leases sized to 100 ms of this process's use, returned after 1 s or
    /// 250 ms unused; one process holding at most 10 % of the capacity.
    ///
    /// ```
    /// let l = bucket4rs_distributed::Leasing::new();
    /// assert_eq!(l.lease_cap(1_000), 100);
    /// ```
    pub const fn new() -> Self {
        Self {
            period: Duration::from_millis(100),
            lifetime: Duration::from_secs(1),
            idle: Duration::from_millis(250),
            processes: 1,
            held_percent: 10,
        }
    }

    /// How much of its own use a lease covers (default 100 ms): a lease is the tokens this
    /// process used over the last period, up to the cap. Longer: fewer round trips, more
    /// tokens held.
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing; use std::time::Duration;
    /// let l = Leasing::new().period(Duration::from_millis(20));
    /// ```
    #[must_use]
    pub const fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// The longest a lease lives (default 1 s, at most 30 s): then its unused tokens go back
    /// and what this process saw of the bucket is read afresh at the next call.
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing; use std::time::Duration;
    /// let l = Leasing::new().lifetime(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub const fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// How long a lease may go unused before it is given back (default 250 ms).
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing; use std::time::Duration;
    /// let l = Leasing::new().idle(Duration::from_millis(100));
    /// ```
    #[must_use]
    pub const fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// How many processes are expected to lease the same key (default 1): the held share is
    /// divided between them.
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing;
    /// assert_eq!(Leasing::new().processes(10).lease_cap(1_000), 10);
    /// ```
    #[must_use]
    pub const fn processes(mut self, processes: u32) -> Self {
        self.processes = processes;
        self
    }

    /// The share of the capacity all leases of a key may hold together, in percent (default
    /// 10, at most 100).
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing;
    /// assert_eq!(Leasing::new().max_held_percent(50).lease_cap(1_000), 500);
    /// ```
    #[must_use]
    pub const fn max_held_percent(mut self, percent: u8) -> Self {
        self.held_percent = percent;
        self
    }

    /// The most tokens one lease holds on a bucket whose smallest capacity is `capacity`:
    /// `capacity × max_held_percent / 100 / processes`, rounded down.
    ///
    /// ```
    /// # use bucket4rs_distributed::Leasing;
    /// assert_eq!(Leasing::new().processes(3).lease_cap(1_000), 33);
    /// ```
    pub fn lease_cap(&self, capacity: u64) -> u64 {
        let share = u128::from(capacity) * u128::from(self.held_percent) / 100;
        u64::try_from(share / u128::from(self.processes.max(1))).unwrap_or(u64::MAX)
    }

    /// Refuses the settings that can only break things, as
    /// [`ManagerBuilder::build`](crate::ManagerBuilder::build) and
    /// [`RemoteBucketBuilder::build`](crate::RemoteBucketBuilder::build) do: no processes, a
    /// held share outside 1–100 %, a zero lifetime or one above 30 s, a zero period or one
    /// longer than the lifetime, a zero idle time. The reason names the setting first (for
    /// settings read from a file, to name the field).
    ///
    /// # Errors
    /// [`DistributedError::InvalidSetting`] (`setting` is `"leasing"`).
    ///
    /// ```
    /// use bucket4rs_distributed::{DistributedError, Leasing};
    /// use std::time::Duration;
    /// assert!(Leasing::new().check().is_ok());
    /// let long = Leasing::new().period(Duration::from_secs(2)); // longer than the 1 s lifetime
    /// assert!(matches!(
    ///     long.check(),
    ///     Err(DistributedError::InvalidSetting { reason, .. }) if reason.starts_with("period ")
    /// ));
    /// ```
    pub fn check(&self) -> Result<(), DistributedError> {
        let refuse = |reason| {
            Err(DistributedError::InvalidSetting {
                setting: "leasing",
                reason,
            })
        };
        if self.processes == 0 {
            return refuse("processes must be at least 1");
        }
        if self.held_percent == 0 || self.held_percent > 100 {
            return refuse("max_held_percent must be from 1 to 100");
        }
        if self.lifetime.is_zero() || self.lifetime > MAX_LIFETIME {
            return refuse(
                "lifetime must be more than zero and at most 30 s (a lease's entry is kept a \
                 minute)",
            );
        }
        if self.period.is_zero() || self.period > self.lifetime {
            return refuse("period must be more than zero and at most the lifetime");
        }
        if self.idle.is_zero() {
            return refuse("idle must be more than zero");
        }
        Ok(())
    }
}
