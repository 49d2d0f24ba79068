//! The Redis backend through Redis Sentinel, on servers each test starts itself: a master, a
//! replica of it and three sentinels on free loopback ports, killed when the test ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bucket4rs_distributed::{ProxyManager, RedisBackend, RedisOptions};

use crate::common::{simple, unique_prefix};
use crate::failover::{Counted, Load};
use crate::redis_cluster::cli;

const SERVICE: &str = "limits";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a loopback port")
        .local_addr()
        .expect("its address")
        .port()
}

/// A master, its replica and three sentinels monitoring them as [`SERVICE`] (quorum 2, a
/// master is down after 1 s), each on a free loopback port; all killed on drop.
struct OwnSentinels {
    master: u16,
    replica: u16,
    sentinels: Vec<u16>,
    dir: PathBuf,
    /// The master first, then the replica, then the sentinels.
    children: Vec<Option<Child>>,
}

fn spawn(args: &[&str], dir: &PathBuf) -> Child {
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
    /// Starts them and returns once the replica is in sync and every sentinel sees the
    /// replica and the two other sentinels (`SENTINEL CKQUORUM` answers OK); panics with the
    /// reason otherwise.
    fn start() -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("redis-sentinel"));
        std::fs::create_dir_all(&dir).expect("the sentinels' directory");
        let (master, replica) = (free_port(), free_port());
        let sentinels: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut me = Self {
            master,
            replica,
            sentinels: sentinels.clone(),
            dir: dir.clone(),
            children: Vec::new(),
        };
        let base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
        let m = master.to_string();
        let mut args = vec!["--port", &m];
        args.extend(base);
        me.children.push(Some(spawn(&args, &dir)));
        let r = replica.to_string();
        let mut args = vec!["--port", &r, "--replicaof", "127.0.0.1", &m];
        args.extend(base);
        me.children.push(Some(spawn(&args, &dir)));
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in [master, replica] {
            wait_until("the master and replica listen", deadline, || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        }
        wait_until("the replica is in sync", deadline, || {
            cli(replica, &["INFO", "replication"]).contains("master_link_status:up")
        });
        for &port in &sentinels {
            // A sentinel rewrites its configuration file: one of its own.
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 10000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir.display()
                ),
            )
            .expect("the sentinel's configuration");
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
        for &port in &sentinels {
            wait_for(
                "every sentinel sees the replica and the other two",
                deadline,
                || {
                    let quorum = Command::new("redis-cli")
                        .args(["-p", &port.to_string(), "SENTINEL", "CKQUORUM", SERVICE])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    let replicas = cli(port, &["SENTINEL", "REPLICAS", SERVICE]);
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

    fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The master's port as the first sentinel names it.
    fn named_master(&self) -> Option<u16> {
        let out = cli(
            self.sentinels[0],
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// `kill -9` of the master, waited for.
    fn kill_master(&mut self) {
        if let Some(mut c) = self.children[0].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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
        let setup = Instant::now() + Duration::from_secs(10);
        // The backend connects in the background: the first calls may find no master yet.
        while probe.available_tokens().await.is_err() {
            assert!(Instant::now() < setup, "the backend never reached the master");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
