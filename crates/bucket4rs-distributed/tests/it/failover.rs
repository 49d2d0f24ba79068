//! The load of the failover tests (a Redis Cluster master, a Sentinel's master killed under
//! it): tasks that consume one token at a time until stopped, counting grants and failures,
//! and noting the first success of a call that started after the kill.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucket4rs_distributed::{Backend, RemoteBucket};

#[derive(Default)]
struct Tally {
    stop: AtomicBool,
    granted: AtomicU64,
    failed: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
    first_after: Mutex<Option<Instant>>,
}

/// One task per bucket, each calling `try_consume(1)` in a loop; every bucket must have
/// tokens enough for the whole test (a refusal fails it), and a failed call must end within
/// 2 s (its deadline).
pub(crate) struct Load {
    tally: Arc<Tally>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a stopped [`Load`] counted.
pub(crate) struct Counted {
    pub(crate) granted: u64,
    pub(crate) failed: u64,
    /// The first success of a call that started after [`Load::killed`].
    pub(crate) first_after_kill: Instant,
    /// Tokens left in the probed bucket after the stop.
    pub(crate) left: u64,
    /// Granted and left beyond the capacity (over-granted), and short of it (taken by calls
    /// in doubt at the kill).
    pub(crate) over: u64,
    pub(crate) under: u64,
}

impl Load {
    pub(crate) fn start<B: Backend>(buckets: Vec<RemoteBucket<B>>) -> Self {
        let tally = Arc::new(Tally::default());
        let tasks = buckets
            .into_iter()
            .map(|b| {
                let tally = Arc::clone(&tally);
                tokio::spawn(async move {
                    while !tally.stop.load(Ordering::Acquire) {
                        let t = Instant::now();
                        match b.try_consume(1).await {
                            Ok(true) => {
                                tally.granted.fetch_add(1, Ordering::Relaxed);
                                let killed = *tally.killed_at.lock().unwrap();
                                if killed.is_some_and(|k| t > k) {
                                    tally
                                        .first_after
                                        .lock()
                                        .unwrap()
                                        .get_or_insert(Instant::now());
                                }
                            }
                            Ok(false) => panic!("denied with tokens left"),
                            Err(_) => {
                                tally.failed.fetch_add(1, Ordering::Relaxed);
                                assert!(
                                    t.elapsed() < Duration::from_secs(2),
                                    "a failed call took {:?}, past its deadline",
                                    t.elapsed()
                                );
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Self { tally, tasks }
    }

    /// Tokens granted so far.
    pub(crate) fn granted(&self) -> u64 {
        self.tally.granted.load(Ordering::Relaxed)
    }

    /// Waits until `n` tokens were granted.
    pub(crate) async fn until_granted(&self, n: u64) {
        while self.granted() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Notes that the master was killed now; the moment.
    pub(crate) fn killed(&self) -> Instant {
        let now = Instant::now();
        *self.tally.killed_at.lock().unwrap() = Some(now);
        now
    }

    /// Whether a call that started after the kill succeeded.
    pub(crate) fn succeeded_after_kill(&self) -> bool {
        self.tally.first_after.lock().unwrap().is_some()
    }

    /// Lets the tasks run 300 ms more (calls on the new master), stops them, and counts,
    /// reading what is left through `probe`, a bucket of `capacity` on the same key.
    pub(crate) async fn stop<B: Backend>(self, probe: &RemoteBucket<B>, capacity: u64) -> Counted {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.tally.stop.store(true, Ordering::Release);
        for t in self.tasks {
            t.await.unwrap();
        }
        let first = self
            .tally
            .first_after
            .lock()
            .unwrap()
            .expect("a success after the kill");
        let granted = self.tally.granted.load(Ordering::Relaxed);
        let left = u64::try_from(probe.available_tokens().await.unwrap()).expect("not in debt");
        Counted {
            granted,
            failed: self.tally.failed.load(Ordering::Relaxed),
            first_after_kill: first,
            left,
            over: (granted + left).saturating_sub(capacity),
            under: capacity.saturating_sub(granted + left),
        }
    }
}

/// A field of `INFO replication` (`name:value` lines).
fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        .map(str::to_owned)
}

/// Lets the replica on `replica` catch up with its master on `master` (the offsets agree),
/// then cuts it off for good: the master disables the ACL user it replicates as (`user`,
/// `ACL SETUSER … off`) and kills its connection (`CLIENT KILL TYPE replica`), so the
/// replica cannot resync and misses every later write. `cli(port, args)` runs `redis-cli`.
pub(crate) fn cut_replication(
    cli: &dyn Fn(u16, &[&str]) -> String,
    master: u16,
    replica: u16,
    user: &str,
) {
    caught_up(cli, master, replica);
    let deadline = Instant::now() + Duration::from_secs(10);
    cli(master, &["ACL", "SETUSER", user, "off"]);
    cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    loop {
        let link = info_field(
            &cli(replica, &["INFO", "replication"]),
            "master_link_status",
        );
        let replicas = info_field(&cli(master, &["INFO", "replication"]), "connected_slaves");
        if link.as_deref() == Some("down") && replicas.as_deref() == Some("0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica is still linked: {link:?}, {replicas:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the replica on `replica` has everything its master on `master` has (their
/// replication offsets agree), within 10 s.
pub(crate) fn caught_up(cli: &dyn Fn(u16, &[&str]) -> String, master: u16, replica: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sent = info_field(&cli(master, &["INFO", "replication"]), "master_repl_offset");
        let had = info_field(&cli(replica, &["INFO", "replication"]), "slave_repl_offset");
        if sent.is_some() && sent == had {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not catch up: {sent:?} vs {had:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What [`over_grant`] counted.
#[derive(Debug)]
pub(crate) struct OverGrant {
    /// Tokens granted before the replication was cut (all of them replicated).
    pub(crate) before: u64,
    /// Tokens the old master granted after the cut, and calls of that time in doubt.
    pub(crate) after_cut: u64,
    pub(crate) in_doubt: u64,
    /// Tokens left on the promoted replica.
    pub(crate) left: u64,
    /// Granted and left beyond the capacity, and short of it.
    pub(crate) over: u64,
    pub(crate) under: u64,
}

/// The over-grant of a failover to a replica that lacks the old master's last writes,
/// provoked deterministically: each of `buckets` (one manager each, on one key of
/// `capacity` tokens, breaker off) takes 25 tokens one at a time, then `cut` stops the
/// replication, then each makes 10 more calls of one token (on the old master only), then
/// `fail_over` kills the master and returns once the replica is promoted; what is left is
/// read through `probe`. Every call before the cut must be granted; after it, a call is
/// granted or in doubt (never another failure).
pub(crate) async fn over_grant<B: Backend>(
    buckets: &[RemoteBucket<B>],
    probe: &RemoteBucket<B>,
    capacity: u64,
    cut: impl FnOnce(),
    fail_over: impl FnOnce(),
) -> OverGrant {
    let mut before = 0;
    for _ in 0..25 {
        for b in buckets {
            assert!(b.try_consume(1).await.expect("a call before the cut"));
            before += 1;
        }
    }
    tokio::task::block_in_place(cut);
    let calls: Vec<_> = buckets
        .iter()
        .map(|b| {
            let b = b.clone();
            tokio::spawn(async move {
                let (mut granted, mut in_doubt) = (0, 0);
                for _ in 0..10 {
                    match b.try_consume(1).await {
                        Ok(true) => granted += 1,
                        Ok(false) => panic!("denied with tokens left"),
                        Err(e) => {
                            assert!(e.is_in_doubt() && !e.is_retryable(), "after the cut: {e}");
                            in_doubt += 1;
                        }
                    }
                }
                (granted, in_doubt)
            })
        })
        .collect();
    let (mut after_cut, mut in_doubt) = (0, 0);
    for c in calls {
        let (g, d) = c.await.expect("a caller");
        after_cut += g;
        in_doubt += d;
    }
    tokio::task::block_in_place(fail_over);
    let by = Instant::now() + Duration::from_secs(30);
    let left = loop {
        match probe.available_tokens().await {
            Ok(left) => break u64::try_from(left).expect("not in debt"),
            Err(e) => {
                assert!(
                    Instant::now() < by,
                    "no reading on the promoted replica: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let granted = before + after_cut;
    OverGrant {
        before,
        after_cut,
        in_doubt,
        left,
        over: (granted + left).saturating_sub(capacity),
        under: capacity.saturating_sub(granted + left),
    }
}

impl OverGrant {
    /// How a run is named: with or without waiting for a replica.
    pub(crate) fn label(waited: bool) -> &'static str {
        if waited {
            "wait_for_replicas(1, 50 ms)"
        } else {
            "no wait for replicas"
        }
    }

    /// What a run must count. Without waiting for replicas: all 40 calls after the cut
    /// granted, and granted again by the promoted replica (over-granted exactly those). With
    /// it: all 40 in doubt, none granted, nothing over-granted. Either way nothing is
    /// unaccounted (the replica had every write before the cut).
    pub(crate) fn check(&self, waited: bool) {
        if waited {
            assert_eq!((self.after_cut, self.in_doubt), (0, 40), "{self}");
            assert_eq!(self.over, 0, "{self}");
        } else {
            assert_eq!((self.after_cut, self.in_doubt), (40, 0), "{self}");
            assert_eq!(self.over, self.after_cut, "{self}");
        }
        assert_eq!(self.under, 0, "{self}");
    }
}

/// Waits (10 s at most) until `probe`'s backend answers: it connects in the background.
pub(crate) async fn reached<B: Backend>(probe: &RemoteBucket<B>, what: &str) {
    let by = Instant::now() + Duration::from_secs(10);
    while probe.available_tokens().await.is_err() {
        assert!(Instant::now() < by, "the backend never reached {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl std::fmt::Display for OverGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "granted {} before the cut and {} after it ({} calls in doubt), {} left on the \
             promoted replica: over-granted {}, unaccounted {}",
            self.before, self.after_cut, self.in_doubt, self.left, self.over, self.under
        )
    }
}
