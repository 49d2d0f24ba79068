//! The Redis backend through Redis Sentinel, on servers each test starts itself: a master, a
//! replica of it and three sentinels on free loopback ports, killed when the test ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bucket4rs_distributed::{CircuitBreaker, ProxyManager, RedisBackend, RedisOptions};

use crate::certs::Certs;
use crate::common::{multi_thread_runtime, simple, unique_prefix};
use crate::failover::{Counted, Load, OverGrant, cut_replication, over_grant, reached};
use crate::redis_cluster::cli;

const SERVICE: &str = "limits";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a loopback port")
        .local_addr()
        .expect("its address")
        .port()
}

/// How an [`OwnSentinels`] is set up (the default: plaintext, no password, replication as
/// the default user).
#[derive(Default)]
pub(crate) struct Setup<'a> {
    /// The replica replicates as the ACL user [`REPL_USER`] (`masteruser`/`masterauth`), so
    /// that its master can cut it off ([`OwnSentinels::cut_replication`]).
    pub(crate) replication_user: bool,
    /// The master and replica require this password (`requirepass`; the replica and the
    /// sentinels authenticate with it), and so do the sentinels.
    pub(crate) password: Option<&'a str>,
    /// Everything on TLS only (clients, replication, the sentinels' own connections), with the
    /// certificates of `tls` (for `localhost`, which the sentinels name the servers by).
    pub(crate) tls: Option<&'a Certs>,
}

/// The ACL user a replica replicates as with [`Setup::replication_user`], and its password.
pub(crate) const REPL_CREDENTIALS: (&str, &str) = ("repl", "replpass");
pub(crate) const REPL_USER: &str = REPL_CREDENTIALS.0;
const REPL_PASS: &str = REPL_CREDENTIALS.1;

/// A master, its replica and three sentinels monitoring them as [`SERVICE`] (quorum 2, a
/// master is down after 1 s), each on a free loopback port; all killed on drop.
pub(crate) struct OwnSentinels {
    pub(crate) master: u16,
    pub(crate) replica: u16,
    sentinels: Vec<u16>,
    dir: PathBuf,
    password: Option<String>,
    tls: Option<PathBuf>,
    /// The master first, then the replica, then the sentinels.
    children: Vec<Option<Child>>,
}

fn spawn(args: &[String], dir: &PathBuf) -> Child {
    Command::new("redis-server")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("redis-server must be installed for the sentinel tests: {e}"))
}

/// Waits until `state` is `Ok`; panics with `what` and the last state after `deadline`.
fn wait_for(what: &str, deadline: Instant, mut state: impl FnMut() -> Result<(), String>) {
    while let Err(last) = state() {
        assert!(
            Instant::now() < deadline,
            "sentinel setup: {what} within 30 s; last seen: {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_until(what: &str, deadline: Instant, mut done: impl FnMut() -> bool) {
    wait_for(what, deadline, || {
        if done() {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    });
}

impl OwnSentinels {
    /// Plaintext, no password ([`Setup::default`]).
    pub(crate) fn start() -> Self {
        Self::start_with(&Setup::default())
    }

    /// Starts them and returns once the replica is in sync and every sentinel sees the
    /// replica and the two other sentinels (`SENTINEL CKQUORUM` answers OK); panics with the
    /// reason otherwise.
    pub(crate) fn start_with(setup: &Setup<'_>) -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("redis-sentinel"));
        std::fs::create_dir_all(&dir).expect("the sentinels' directory");
        let (master, replica) = (free_port(), free_port());
        let sentinels: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut me = Self {
            master,
            replica,
            sentinels: sentinels.clone(),
            dir: dir.clone(),
            password: setup.password.map(str::to_owned),
            tls: setup.tls.map(|c| c.path("ca.pem")),
            children: Vec::new(),
        };
        let host = if setup.tls.is_some() {
            "localhost"
        } else {
            "127.0.0.1"
        };
        let server = |port: u16| -> Vec<String> {
            let mut args: Vec<String> = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                .map(str::to_owned)
                .to_vec();
            match setup.tls {
                None => args.extend(["--port".to_owned(), port.to_string()]),
                Some(certs) => {
                    args.extend(["--port", "0", "--tls-port"].map(str::to_owned));
                    args.push(port.to_string());
                    args.extend(tls_args(certs));
                    args.extend(["--tls-replication", "yes"].map(str::to_owned));
                    // Named by host name, which the certificate holds (not 127.0.0.1).
                    args.extend(["--replica-announce-ip", "localhost"].map(str::to_owned));
                }
            }
            if setup.replication_user {
                args.extend(
                    ["--user", REPL_USER, "on", &format!(">{REPL_PASS}")].map(str::to_owned),
                );
                args.extend(["+psync", "+replconf", "+ping"].map(str::to_owned));
                args.extend(
                    ["--masteruser", REPL_USER, "--masterauth", REPL_PASS].map(str::to_owned),
                );
            }
            if let Some(p) = setup.password {
                args.extend(["--requirepass", p, "--masterauth", p].map(str::to_owned));
            }
            args
        };
        me.children.push(Some(spawn(&server(master), &dir)));
        let mut args = server(replica);
        args.extend([
            "--replicaof".to_owned(),
            host.to_owned(),
            master.to_string(),
        ]);
        me.children.push(Some(spawn(&args, &dir)));
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in [master, replica] {
            wait_until("the master and replica listen", deadline, || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        }
        wait_until("the replica is in sync", deadline, || {
            me.cli(replica, &["INFO", "replication"])
                .contains("master_link_status:up")
        });
        for &port in &sentinels {
            // A sentinel rewrites its configuration file: one of its own.
            let conf = dir.join(format!("sentinel-{port}.conf"));
            let mut text = format!("bind 127.0.0.1\ndir {}\n", dir.display());
            match setup.tls {
                None => text.push_str(&format!("port {port}\n")),
                Some(certs) => {
                    text.push_str(&format!("port 0\ntls-port {port}\ntls-replication yes\n"));
                    for pair in tls_args(certs).chunks(2) {
                        text.push_str(&format!("{} {}\n", &pair[0][2..], pair[1]));
                    }
                    text.push_str(
                        "sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n",
                    );
                }
            }
            text.push_str(&format!(
                "sentinel monitor {SERVICE} {host} {master} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 10000\n\
                 sentinel parallel-syncs {SERVICE} 1\n"
            ));
            if let Some(p) = setup.password {
                text.push_str(&format!(
                    "sentinel auth-pass {SERVICE} {p}\nrequirepass {p}\n"
                ));
                // The sentinels authenticate to each other with it too.
                text.push_str(&format!("sentinel sentinel-pass {p}\n"));
            }
            std::fs::write(&conf, text).expect("the sentinel's configuration");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("redis-server must be installed for the sentinel tests: {e}")
                });
            me.children.push(Some(child));
        }
        for &port in &sentinels {
            wait_until("the sentinels listen", deadline, || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        }
        let r = replica.to_string();
        for &port in &sentinels {
            wait_for(
                "every sentinel sees the replica and the other two",
                deadline,
                || {
                    let quorum = me.cli(port, &["SENTINEL", "CKQUORUM", SERVICE]);
                    let replicas = me.cli(port, &["SENTINEL", "REPLICAS", SERVICE]);
                    if quorum.contains("OK 3 usable") && replicas.contains(&r) {
                        Ok(())
                    } else {
                        Err(format!("sentinel {port}: {quorum}; replicas: {replicas}"))
                    }
                },
            );
        }
        me
    }

    /// `redis-cli` on `port` with this setup's TLS and password; its output (an error's too).
    pub(crate) fn cli(&self, port: u16, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        if let Some(ca) = &self.tls {
            cmd.args(["--tls", "-h", "localhost", "--cacert"]).arg(ca);
        }
        if let Some(p) = &self.password {
            cmd.args(["--no-auth-warning", "-a", p]);
        }
        cmd.arg("-p")
            .arg(port.to_string())
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// The sentinels' URLs (`rediss://localhost:…` on TLS), with `password` if any.
    pub(crate) fn urls_with(&self, password: Option<&str>) -> Vec<String> {
        let (scheme, host) = match self.tls {
            None => ("redis", "127.0.0.1"),
            Some(_) => ("rediss", "localhost"),
        };
        let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
        self.sentinels
            .iter()
            .map(|p| format!("{scheme}://{auth}{host}:{p}"))
            .collect()
    }

    /// The sentinels' ports.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.sentinels.clone()
    }

    /// The sentinels' URLs with this setup's password.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.urls_with(self.password.as_deref())
    }

    /// The master's port as the first sentinel names it.
    pub(crate) fn named_master(&self) -> Option<u16> {
        let out = self.cli(
            self.sentinels[0],
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// `kill -9` of the master, waited for.
    pub(crate) fn kill_master(&mut self) {
        if let Some(mut c) = self.children[0].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `--tls-…` arguments of a server on TLS only with the certificates of `certs`.
fn tls_args(certs: &Certs) -> Vec<String> {
    let path = |f: &str| certs.path(f).display().to_string();
    vec![
        "--tls-cert-file".to_owned(),
        path("server.pem"),
        "--tls-key-file".to_owned(),
        path("server.key"),
        "--tls-ca-cert-file".to_owned(),
        path("ca.pem"),
        // A sentinel's and a replica's own connections present the client certificate.
        "--tls-client-cert-file".to_owned(),
        path("client.pem"),
        "--tls-client-key-file".to_owned(),
        path("client.key"),
        "--tls-auth-clients".to_owned(),
        "no".to_owned(),
    ]
}

impl Drop for OwnSentinels {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Through three sentinels, 4 tasks consume from one key; the master is killed mid-load.
/// Calls fail within their deadline while the sentinels still name the dead master, and
/// succeed on the promoted replica without a new backend. Prints the time from the kill to
/// the promotion and to the first success after it, and the tokens granted against the
/// limit (writes the master acknowledged and did not replicate are lost: over-grant).
#[test]
fn fault_sentinel_failover_under_load_moves_to_the_promoted_replica() {
    let mut servers = OwnSentinels::start();
    let rt = multi_thread_runtime();
    let capacity = 100_000u64;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    rt.block_on(async {
        let options = RedisOptions::default()
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300));
        let backend = RedisBackend::connect_sentinel(servers.urls(), SERVICE, options)
            .await
            .expect("a valid sentinel configuration");
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("sentinel").as_str())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let probe = manager.builder().build("hot", config).unwrap();
        reached(&probe, "the master").await;
        let load = Load::start(
            (0..4)
                .map(|_| manager.builder().build("hot", config).unwrap())
                .collect(),
        );
        load.until_granted(500).await;
        let old = servers.master;
        let granted_before = load.granted();
        tokio::task::block_in_place(|| servers.kill_master());
        let killed = load.killed();
        let deadline = killed + Duration::from_secs(20);
        let promoted = loop {
            let named = tokio::task::block_in_place(|| servers.named_master());
            if named == Some(servers.replica) {
                break Instant::now();
            }
            assert!(Instant::now() < deadline, "no promotion within 20 s of the kill");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        loop {
            if load.succeeded_after_kill() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no success within 20 s of the kill (promoted after {:?})",
                promoted - killed
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Some more calls on the new master, then the tally.
        let Counted {
            granted,
            failed,
            first_after_kill: first,
            left,
            over,
            under,
        } = load.stop(&probe, capacity).await;
        println!(
            "fault: sentinel failover (master :{old} killed -9 under 4 tasks, down-after 1 s): \
             first success {:.0} ms after the kill; the promotion seen by a 20 ms poll of \
             the sentinels after {:.0} ms; {failed} calls failed; granted {granted} ({granted_before} before the \
             kill), {left} left of {capacity}: over-granted {over}, unaccounted {under} (calls \
             in doubt at the kill)",
            (first - killed).as_secs_f64() * 1e3,
            (promoted - killed).as_secs_f64() * 1e3,
        );
        assert!(first > killed);
        assert!(failed > 0, "calls while no master answered must fail");
        assert_eq!(
            cli(servers.replica, &["ROLE"]).lines().next(),
            Some("master"),
            "the replica was promoted"
        );
        // The replica had every acknowledged write but those in flight at the kill: tokens
        // are over-granted by at most what the replication stream had not carried yet.
        assert!(over <= 100, "over-granted {over}");
        assert!(under <= 8, "more calls in doubt than tasks: {under}");
    });
}

/// A backend on a replica (a master demoted by a failover looks the same): the script's write
/// is refused with `READONLY`, a retryable `Unavailable`, and nothing is written.
#[test]
fn a_replica_answers_readonly_a_retryable_refusal_that_writes_nothing() {
    let master = crate::redis_faults::OwnRedis::start(None, None);
    let port = master.port.to_string();
    let replica =
        crate::redis_faults::OwnRedis::start_with(None, None, &["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(30);
    wait_until("the replica is in sync", deadline, || {
        cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up")
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = RedisBackend::connect(&replica.url(), RedisOptions::default())
            .await
            .unwrap();
        let manager = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(10, Duration::from_secs(60)))
            .unwrap();
        let e = b.try_consume(1).await.unwrap_err();
        println!("a replica's refusal: {e}");
        let bucket4rs_distributed::DistributedError::Backend(be) = &e else {
            panic!("a backend error: {e}");
        };
        assert_eq!(
            be.kind(),
            bucket4rs_distributed::BackendErrorKind::Unavailable,
            "{e}"
        );
        assert!(e.is_retryable(), "refused, not run: {e}");
        assert!(e.to_string().contains("read only replica"), "{e}");
        assert!(backend.stats().round_trips > 0, "the script was sent");
        assert_eq!(cli(master.port, &["EXISTS", b.key().as_str()]), "0");
    });
}

/// The over-grant of a Sentinel failover to a replica that lacks the old master's last
/// writes (`failover::over_grant`: the replica cut off, 40 calls on the old master alone,
/// then `kill -9` of the master), with or without the backend waiting for one replica per
/// write (`RedisOptions::wait_for_replicas(1, 50 ms)`).
fn sentinel_over_grant(wait: bool) -> OverGrant {
    let mut servers = OwnSentinels::start_with(&Setup {
        replication_user: true,
        ..Setup::default()
    });
    let rt = multi_thread_runtime();
    let capacity = 100_000u64;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    rt.block_on(async {
        let mut options = RedisOptions::default()
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300));
        if wait {
            options = options.wait_for_replicas(1, Duration::from_millis(50));
        }
        let backend = RedisBackend::connect_sentinel(servers.urls(), SERVICE, options)
            .await
            .expect("a valid sentinel configuration");
        let prefix = unique_prefix("sentinel-lag");
        let manager = || {
            ProxyManager::configure(backend.clone())
                .key_prefix(prefix.as_str())
                .circuit_breaker(CircuitBreaker::off())
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        };
        let probe = manager().builder().build("hot", config).unwrap();
        reached(&probe, "the master").await;
        let buckets: Vec<_> = (0..4)
            .map(|_| manager().builder().build("hot", config).unwrap())
            .collect();
        let (master, replica) = (servers.master, servers.replica);
        let figures = over_grant(
            &buckets,
            &probe,
            capacity,
            || cut_replication(&cli, master, replica, REPL_USER),
            || {
                servers.kill_master();
                let by = Instant::now() + Duration::from_secs(20);
                wait_until("the replica is promoted", by, || {
                    servers.named_master() == Some(replica)
                });
            },
        )
        .await;
        println!(
            "fault: sentinel failover to a replica cut off before 40 calls ({}): {figures}",
            OverGrant::label(wait)
        );
        figures
    })
}

/// Without waiting for replicas, every token the old master granted after the replica was
/// cut off is granted again by the promoted replica: the over-grant is exactly those.
#[test]
fn fault_sentinel_failover_to_a_lagging_replica_over_grants_what_the_old_master_granted_after_the_cut()
 {
    sentinel_over_grant(false).check(false);
}

/// Waiting for one replica, no call after the cut is granted (each is in doubt: the master
/// applied it, no replica has it), and the failover over-grants nothing.
#[test]
fn fault_sentinel_failover_waiting_for_a_replica_over_grants_nothing() {
    sentinel_over_grant(true).check(true);
}

/// A backend's first answer through `manager`'s bucket `b`: retried while retryable (the
/// backend has just been created and connects in the background), for up to 10 s.
async fn first_answer<T>(
    mut call: impl AsyncFnMut() -> Result<T, bucket4rs_distributed::DistributedError>,
) -> Result<T, bucket4rs_distributed::DistributedError> {
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Err(e) if e.is_retryable() && Instant::now() < by => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            r => return r,
        }
    }
}

/// Sentinels and servers that all require a password (the sentinels `requirepass`, the master
/// and replica `requirepass`, the sentinels' `auth-pass`): a wrong or missing password, for
/// the sentinels or for the master, is a typed error that is not retryable (it fails the same
/// way until the configuration changes); with the right ones the limits are kept, and kept
/// across a failover (`kill -9` of the master once its replica has caught up).
#[test]
fn fault_sentinel_with_passwords_refuses_wrong_ones_keeps_its_limits_and_fails_over() {
    use bucket4rs_distributed::BackendErrorKind;
    use std::error::Error as _;
    const PASSWORD: &str = "s3cret-pass";
    let mut servers = OwnSentinels::start_with(&Setup {
        password: Some(PASSWORD),
        ..Setup::default()
    });
    let rt = multi_thread_runtime();
    let capacity = 20u64;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    let master_url = format!("redis://:{PASSWORD}@{SERVICE}");
    let options = || {
        RedisOptions::default()
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
    };
    rt.block_on(async {
        let prefix = unique_prefix("sentinel-auth");
        let cases = [
            (
                "no password for the sentinels",
                servers.urls_with(None),
                master_url.clone(),
            ),
            (
                "a wrong password for the sentinels",
                servers.urls_with(Some("wrong")),
                master_url.clone(),
            ),
            (
                "no password for the master",
                servers.urls(),
                SERVICE.to_owned(),
            ),
            (
                "a wrong password for the master",
                servers.urls(),
                format!("redis://:wrong@{SERVICE}"),
            ),
        ];
        for (what, sentinels, master) in cases {
            let backend = RedisBackend::connect_sentinel(sentinels, &master, options())
                .await
                .unwrap_or_else(|e| panic!("{what}: created all the same: {e}"));
            let manager = ProxyManager::configure(backend.clone())
                .key_prefix(prefix.as_str())
                .circuit_breaker(CircuitBreaker::off())
                .build()
                .unwrap();
            let b = manager.builder().build("k", config).unwrap();
            let e = first_answer(async || b.try_consume(1).await)
                .await
                .expect_err(what);
            println!("sentinel with passwords, {what}: {e}");
            let bucket4rs_distributed::DistributedError::Backend(be) = &e else {
                panic!("{what}: a backend error: {e}");
            };
            assert_eq!(be.kind(), BackendErrorKind::Unavailable, "{what}: {e}");
            assert!(!e.is_retryable(), "{what}: it cannot pass: {e}");
            assert!(
                e.to_string().contains("refused the credentials"),
                "{what}: {e}"
            );
            let redis = be
                .source()
                .and_then(|s| s.downcast_ref::<redis::RedisError>());
            assert!(
                redis.is_some(),
                "{what}: the driver's error as the source: {e}"
            );
            assert_eq!(backend.stats().round_trips, 0, "{what}: nothing was sent");
        }

        let backend = RedisBackend::connect_sentinel(servers.urls(), &master_url, options())
            .await
            .unwrap();
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(prefix.as_str())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let b = manager.builder().build("k", config).unwrap();
        assert!(first_answer(async || b.try_consume(5).await).await.unwrap());
        assert!(!b.try_consume(16).await.unwrap(), "beyond the limit");
        assert_eq!(b.available_tokens().await.unwrap(), 15);
        let (master, replica) = (servers.master, servers.replica);
        tokio::task::block_in_place(|| {
            crate::failover::caught_up(&|p, a| servers.cli(p, a), master, replica);
            servers.kill_master();
            let by = Instant::now() + Duration::from_secs(20);
            wait_until("the replica is promoted", by, || {
                servers.named_master() == Some(replica)
            });
        });
        let granted = first_answer(async || b.try_consume(15).await)
            .await
            .unwrap();
        assert!(granted, "the promoted replica had the 15 tokens left");
        assert!(!b.try_consume(1).await.unwrap(), "and no more");
        println!(
            "sentinel with passwords: 5 + 15 of {capacity} granted across the failover to \
             :{replica}, the 21st refused; stats {:?}",
            backend.stats()
        );
    });
}

/// Sentinels, master and replica on TLS only with a private CA (`rediss://` sentinels, a
/// `rediss://` master, `RedisOptions::tls` with the CA): the limits are kept; without the CA
/// the handshake with the sentinels is refused, typed and not retryable.
#[test]
fn sentinel_over_tls_with_a_private_ca_keeps_its_limits() {
    use bucket4rs_distributed::{TlsError, TlsOptions};
    use std::error::Error as _;
    let certs = Certs::new();
    let servers = OwnSentinels::start_with(&Setup {
        tls: Some(&certs),
        ..Setup::default()
    });
    let rt = multi_thread_runtime();
    let config = || simple(10, Duration::from_secs(1_000_000));
    rt.block_on(async {
        let prefix = unique_prefix("sentinel-tls");
        let tls = TlsOptions::default().ca_file(certs.path("ca.pem")).unwrap();
        let master = format!("rediss://{SERVICE}");
        let backend = RedisBackend::connect_sentinel(
            servers.urls(),
            &master,
            RedisOptions::default().tls(tls),
        )
        .await
        .unwrap();
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(prefix.as_str())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let b = manager.builder().build("k", config).unwrap();
        assert!(first_answer(async || b.try_consume(4).await).await.unwrap());
        assert!(!b.try_consume(7).await.unwrap());
        assert!(b.try_consume(6).await.unwrap());
        assert_eq!(b.available_tokens().await.unwrap(), 0);
        println!(
            "sentinel over TLS: 4 + 6 of 10 granted, 7 refused; stats {:?}",
            backend.stats()
        );

        // The same through a builder of the application's own, its certificates set on it.
        let builder = || {
            let ca = std::fs::read(certs.path("ca.pem")).unwrap();
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            };
            let sentinels = servers
                .ports()
                .into_iter()
                .map(|port| redis::ConnectionAddr::TcpTls {
                    host: "localhost".to_owned(),
                    port,
                    insecure: false,
                    tls_params: None,
                });
            redis::sentinel::SentinelClientBuilder::new(
                sentinels,
                SERVICE,
                redis::sentinel::SentinelServerType::Master,
            )
            .unwrap()
            .set_client_to_sentinel_certificates(certificates.clone())
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_redis_certificates(certificates)
        };
        let own = RedisBackend::with_sentinel_builder(builder(), RedisOptions::default()).unwrap();
        let manager = ProxyManager::configure(own)
            .key_prefix(prefix.as_str())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let b = manager.builder().build("own", config).unwrap();
        assert!(
            first_answer(async || b.try_consume(10).await)
                .await
                .unwrap()
        );
        assert!(!b.try_consume(1).await.unwrap());
        // Its certificates are the builder's: RedisOptions::tls is refused rather than ignored.
        let tls = TlsOptions::default().ca_file(certs.path("ca.pem")).unwrap();
        let e = RedisBackend::with_sentinel_builder(builder(), RedisOptions::default().tls(tls))
            .unwrap_err();
        assert_eq!(
            e.kind(),
            bucket4rs_distributed::BackendErrorKind::Other,
            "{e}"
        );

        let untrusting = RedisBackend::connect_sentinel(
            servers.urls(),
            &master,
            RedisOptions::default().connect_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
        let manager = ProxyManager::configure(untrusting.clone())
            .key_prefix(prefix.as_str())
            .circuit_breaker(CircuitBreaker::off())
            .build()
            .unwrap();
        let b = manager.builder().build("k", config).unwrap();
        let e = first_answer(async || b.available_tokens().await)
            .await
            .unwrap_err();
        println!("sentinel over TLS, CA not trusted: {e}");
        let bucket4rs_distributed::DistributedError::Backend(be) = &e else {
            panic!("a backend error: {e}");
        };
        let cause = be.source().and_then(|s| s.downcast_ref::<TlsError>());
        assert_eq!(cause, Some(&TlsError::UnknownIssuer), "{e}");
        assert!(!e.is_retryable(), "{e}");
        assert_eq!(untrusting.stats().round_trips, 0, "nothing was sent");
    });
}
