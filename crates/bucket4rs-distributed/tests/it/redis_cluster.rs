//! The Redis backend on a Redis Cluster that each test starts itself: six redis-servers
//! (`--cluster-enabled yes`) on free loopback ports, joined by `redis-cli --cluster create`
//! into three masters with one replica each, killed when the test ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_distributed::{
    BackendErrorKind, CircuitBreaker, ProxyManager, RedisBackend, RedisOptions,
};
use bucket4rs_testkit::BackendKit;

use crate::certs::Certs;
use crate::common::multi_thread_runtime as runtime;
use crate::common::{patient, simple, unique_prefix};
use crate::failover::{Counted, Load, OverGrant, cut_replication, over_grant, reached};
use crate::redis_sentinel::REPL_USER;

/// A node of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) port: u16,
    /// A master not marked as failed.
    pub(crate) master: bool,
}

/// Six redis-servers in cluster mode on free loopback ports (three masters, one replica
/// each), in a directory of their own; killed and removed on drop (also on a panic).
pub(crate) struct OwnCluster {
    pub(crate) ports: Vec<u16>,
    /// The CA file of a cluster on TLS.
    tls: Option<PathBuf>,
    /// The ports of the nodes killed ([`OwnCluster::kill`]).
    killed: Vec<u16>,
    dir: PathBuf,
    children: Vec<Child>,
}

/// A free loopback port whose cluster bus port (+10000) is free too; the listeners are held
/// until the caller drops them, so no two picks collide.
fn free_pair(held: &mut Vec<std::net::TcpListener>) -> u16 {
    for _ in 0..1_000 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = l.local_addr().expect("its address").port();
        if port > 55_000 {
            continue;
        }
        if let Ok(bus) = std::net::TcpListener::bind(("127.0.0.1", port + 10_000)) {
            held.push(l);
            held.push(bus);
            return port;
        }
    }
    panic!("no free loopback port pair (port, port + 10000) for a cluster node");
}

/// `redis-cli -p port args…`, its standard output; panics naming the command if it fails.
pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    cli_with(None, port, args)
}

/// [`cli`], over TLS trusting the CA file `tls` if given.
fn cli_with(tls: Option<&std::path::Path>, port: u16, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    if let Some(ca) = tls {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let out = cmd
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("redis-cli must be installed for the cluster tests: {e}"));
    assert!(
        out.status.success(),
        "redis-cli -p {port} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl OwnCluster {
    /// Starts the six servers and joins them; returns once every node reports
    /// `cluster_state:ok` and knows three masters and three replicas, and every replica is in
    /// sync with its master. Panics with the reason
    /// when any step fails or takes over 30 s.
    pub(crate) fn start() -> Self {
        Self::start_with(None)
    }

    /// [`start`](Self::start); with `tls`, every node listens on TLS only (clients, the
    /// cluster bus and replication), with the server certificate of `tls` (for `localhost`,
    /// which the nodes announce as their host name).
    pub(crate) fn start_with(tls: Option<&Certs>) -> Self {
        Self::launch(tls, false)
    }

    /// [`start`](Self::start), with the replicas replicating as the ACL user
    /// [`REPL_USER`](crate::redis_sentinel::REPL_USER), so that a master can cut its replica
    /// off ([`cut_replication`](crate::failover::cut_replication)), and promoted whatever
    /// their replication link's age (`cluster-replica-validity-factor 0`).
    pub(crate) fn start_with_replication_user() -> Self {
        Self::launch(None, true)
    }

    fn launch(tls: Option<&Certs>, replication_user: bool) -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("redis-cluster"));
        std::fs::create_dir_all(&dir).expect("the cluster's directory");
        let mut held = Vec::new();
        let ports: Vec<u16> = (0..6).map(|_| free_pair(&mut held)).collect();
        drop(held);
        let mut me = Self {
            ports: ports.clone(),
            tls: tls.map(|c| c.path("ca.pem")),
            killed: Vec::new(),
            dir: dir.clone(),
            children: Vec::new(),
        };
        for &port in &ports {
            let mut server = Command::new("redis-server");
            match tls {
                None => server.args(["--port", &port.to_string()]),
                Some(certs) => server
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                    .arg("--tls-cert-file")
                    .arg(certs.path("server.pem"))
                    .arg("--tls-key-file")
                    .arg(certs.path("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(certs.path("ca.pem"))
                    // The cluster bus always authenticates both ends: the nodes present the
                    // client certificate (the server's has no client-auth usage).
                    .arg("--tls-client-cert-file")
                    .arg(certs.path("client.pem"))
                    .arg("--tls-client-key-file")
                    .arg(certs.path("client.key"))
                    .args(["--tls-auth-clients", "no"])
                    .args(["--cluster-port", &(port + 10_000).to_string()])
                    .args(["--cluster-announce-hostname", "localhost"])
                    .args(["--cluster-preferred-endpoint-type", "hostname"]),
            };
            if replication_user {
                let (user, pass) = crate::redis_sentinel::REPL_CREDENTIALS;
                server
                    .args(["--user", user, "on", &format!(">{pass}")])
                    .args(["+psync", "+replconf", "+ping"])
                    .args(["--masteruser", user, "--masterauth", pass])
                    .args(["--cluster-replica-validity-factor", "0"]);
            }
            let child = server
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                // A replica's first sync starts at once (not after 5 s): a replica that never
                // synced may not be promoted.
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("redis-server must be installed for the cluster tests: {e}")
                });
            me.children.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in &ports {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "cluster node on port {port} did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = Command::new("redis-cli");
        if let Some(ca) = &me.tls {
            create.arg("--tls").arg("--cacert").arg(ca);
        }
        let mut create = create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli must be installed for the cluster tests: {e}"));
        // It waits for the nodes to meet without a limit of its own (forever when their
        // cluster bus cannot connect): bounded here.
        while create.try_wait().expect("redis-cli runs").is_none() {
            if Instant::now() > deadline {
                let _ = create.kill();
                let out = create.wait_with_output().expect("redis-cli's output");
                panic!(
                    "redis-cli --cluster create did not finish within 30 s: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = create.wait_with_output().expect("redis-cli's output");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for &port in &ports {
            loop {
                let info = me.cli(port, &["CLUSTER", "INFO"]);
                let nodes = me.nodes_seen_by(port);
                let masters = nodes.iter().filter(|n| n.master).count();
                if info.contains("cluster_state:ok") && masters == 3 && nodes.len() == 6 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster node {port} not ready within 30 s: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for &port in &ports {
            loop {
                let info = me.cli(port, &["INFO", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster replica {port} not in sync within 30 s: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        me
    }

    /// The seed URLs (every node): `rediss://localhost:…` on TLS.
    pub(crate) fn urls(&self) -> Vec<String> {
        let (scheme, host) = match self.tls {
            None => ("redis", "127.0.0.1"),
            Some(_) => ("rediss", "localhost"),
        };
        self.ports
            .iter()
            .map(|p| format!("{scheme}://{host}:{p}"))
            .collect()
    }

    /// `redis-cli` on the node on `port` (over TLS on a TLS cluster).
    pub(crate) fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_with(self.tls.as_deref(), port, args)
    }

    /// The nodes as the node on `port` sees them.
    pub(crate) fn nodes_seen_by(&self, port: u16) -> Vec<Node> {
        self.cli(port, &["CLUSTER", "NODES"])
            .lines()
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let id = f.next()?.to_owned();
                let addr = f.next()?;
                let flags = f.next()?;
                let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
                Some(Node {
                    id,
                    port,
                    master: flags.contains("master") && !flags.contains("fail"),
                })
            })
            .collect()
    }

    /// A node that was not killed.
    fn alive(&self) -> u16 {
        *self
            .ports
            .iter()
            .find(|p| !self.killed.contains(p))
            .expect("a node alive")
    }

    /// The masters, as a live node sees them.
    pub(crate) fn masters(&self) -> Vec<Node> {
        self.nodes_seen_by(self.alive())
            .into_iter()
            .filter(|n| n.master)
            .collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`) and the master whose slot ranges hold it
    /// (`CLUSTER NODES`, as a live node sees them).
    pub(crate) fn master_of(&self, key: &str) -> (u16, Node) {
        let slot: u16 = self
            .cli(self.alive(), &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot");
        let masters = self.masters();
        let line = self.cli(self.alive(), &["CLUSTER", "NODES"]);
        for l in line.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                if range.starts_with('[') {
                    continue;
                }
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap(), hi.parse().unwrap()),
                    None => {
                        let s: u16 = range.parse().unwrap();
                        (s, s)
                    }
                };
                if (lo..=hi).contains(&slot) {
                    let node = masters
                        .iter()
                        .find(|m| m.id == f[0])
                        .expect("the owner is a master")
                        .clone();
                    return (slot, node);
                }
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// Moves `slot` from master `from` to master `to` while clients use it, as
    /// `redis-cli --cluster reshard` does: `IMPORTING` on the target, `MIGRATING` on the
    /// source, `MIGRATE` of its keys, then `SETSLOT … NODE` on both and on every other master.
    /// `pause` is held after the keys moved and before the slot is handed over (the `ASK`
    /// window).
    pub(crate) fn move_slot(&self, slot: u16, from: &Node, to: &Node, pause: Duration) {
        let s = slot.to_string();
        self.cli(to.port, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id]);
        self.cli(from.port, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id]);
        loop {
            let keys = self.cli(from.port, &["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            self.cli(from.port, &args);
        }
        std::thread::sleep(pause);
        self.cli(to.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
        self.cli(from.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
        for m in self.masters() {
            if m.id != from.id && m.id != to.id {
                self.cli(m.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
            }
        }
    }

    /// How many times the node on `port` answered with error `code` (`INFO errorstats`).
    pub(crate) fn errors_answered(&self, port: u16, code: &str) -> u64 {
        let stats = self.cli(port, &["INFO", "errorstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("errorstat_{code}:count=")))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }
}

impl OwnCluster {
    /// `kill -9` of the node on `port`, waited for.
    pub(crate) fn kill(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node of this cluster");
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        self.killed.push(port);
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn connect(cluster: &OwnCluster) -> RedisBackend {
    RedisBackend::connect_cluster(cluster.urls(), RedisOptions::default())
        .await
        .expect("a valid cluster configuration")
}

/// Every promise of the backend trait, the conformance traces included (`conformance: …
/// (engine: redis-cluster)`), through a cluster of the test's own.
#[test]
fn the_redis_cluster_backend_replays_the_backend_kit() {
    let cluster = OwnCluster::start();
    let urls = cluster.urls();
    BackendKit::new("redis-cluster", move || {
        let urls = urls.clone();
        async move { RedisBackend::connect_cluster(urls, RedisOptions::default()).await }
    })
    .run();
}

/// Buckets of many keys land on every master, and each master holds exactly the records of
/// the keys `CLUSTER KEYSLOT` assigns to its slots.
#[test]
fn cluster_buckets_spread_over_every_master() {
    let cluster = OwnCluster::start();
    runtime().block_on(async {
        let prefix = unique_prefix("spread");
        let manager = ProxyManager::configure(connect(&cluster).await)
            .key_prefix(prefix.as_str())
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let mut expected: BTreeMap<u16, u64> = BTreeMap::new();
        for i in 0..60 {
            let b = manager
                .builder()
                .build(format!("k{i}"), || simple(10, Duration::from_secs(60)))
                .unwrap();
            assert!(b.try_consume(3).await.unwrap());
            assert_eq!(b.available_tokens().await.unwrap(), 7);
            let (_, owner) = cluster.master_of(b.key().as_str());
            *expected.entry(owner.port).or_default() += 1;
        }
        let mut held = BTreeMap::new();
        for m in cluster.masters() {
            let keys = cli(m.port, &["KEYS", &format!("{prefix}*")]);
            held.insert(
                m.port,
                keys.lines().filter(|k| !k.is_empty()).count() as u64,
            );
        }
        println!("cluster: records per master (port: count): {held:?}");
        assert_eq!(held.len(), 3, "three masters: {held:?}");
        assert!(
            held.values().all(|&n| n > 0),
            "a master holds no bucket: {held:?}"
        );
        assert_eq!(held, expected, "each record is on the master of its slot");
    });
}

/// `SCRIPT FLUSH` on every node mid-run: each master's `NOSCRIPT` is answered by `EVAL` of
/// the script on that master, and no call sees it.
#[test]
fn cluster_script_flush_on_every_node_reloads_per_node() {
    let cluster = OwnCluster::start();
    runtime().block_on(async {
        let backend = connect(&cluster).await;
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("flush").as_str())
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let buckets: Vec<_> = (0..30)
            .map(|i| {
                manager
                    .builder()
                    .build(format!("k{i}"), || {
                        simple(100, Duration::from_secs(1_000_000))
                    })
                    .unwrap()
            })
            .collect();
        for b in &buckets {
            assert!(b.try_consume(1).await.unwrap());
        }
        let before = backend.stats().script_reloads;
        for &port in &cluster.ports {
            cli(port, &["SCRIPT", "FLUSH"]);
        }
        for b in &buckets {
            assert!(b.try_consume(1).await.unwrap());
            assert_eq!(b.available_tokens().await.unwrap(), 98);
        }
        let reloads = backend.stats().script_reloads - before;
        println!("cluster: script reloads after SCRIPT FLUSH on 6 nodes: {reloads}");
        // One per master (the 30 keys spread over all three), the rest found the script.
        assert_eq!(reloads, 3, "{:?}", backend.stats());
    });
}

/// The slot of a hot key moves to another master (`MIGRATING`/`IMPORTING`, `MIGRATE`,
/// `SETSLOT … NODE`) while 4 tasks, each with a backend of its own, consume from it: the
/// source answers `ASK` and then `MOVED`, the backends follow, no call fails, and the tokens
/// granted plus those left are exactly the capacity (none lost, none granted twice).
#[test]
fn cluster_resharding_under_load_grants_exactly_the_limit() {
    let cluster = Arc::new(OwnCluster::start());
    let capacity = 20_000;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    runtime().block_on(async {
        let prefix = unique_prefix("reshard");
        let mut managers = Vec::new();
        let mut backends = Vec::new();
        for _ in 0..4 {
            let backend = connect(&cluster).await;
            backends.push(backend.clone());
            managers.push(
                ProxyManager::configure(backend)
                    .key_prefix(prefix.as_str())
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap(),
            );
        }
        let probe = managers[0].builder().build("hot", config).unwrap();
        assert_eq!(probe.available_tokens().await.unwrap(), capacity as i64);
        let (slot, from) = cluster.master_of(probe.key().as_str());
        let to = cluster
            .masters()
            .into_iter()
            .find(|m| m.id != from.id)
            .expect("another master");
        let moved = Arc::new(AtomicBool::new(false));
        let granted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for manager in &managers {
            let b = manager.builder().build("hot", config).unwrap();
            let (moved, granted) = (Arc::clone(&moved), Arc::clone(&granted));
            tasks.push(tokio::spawn(async move {
                let mut calls = 0u64;
                let mut after = 0;
                while after < 50 {
                    match b.try_consume(1).await {
                        Ok(true) => {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) => panic!("denied with tokens left"),
                        Err(e) => panic!("a call failed during the move: {e}"),
                    }
                    calls += 1;
                    if moved.load(Ordering::Acquire) {
                        after += 1;
                    }
                }
                calls
            }));
        }
        // Let the tasks run on the source first.
        while granted.load(Ordering::Relaxed) < 200 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let c = Arc::clone(&cluster);
        let (from_port, to_node, from_node) = (from.port, to.clone(), from.clone());
        tokio::task::spawn_blocking(move || {
            c.move_slot(slot, &from_node, &to_node, Duration::from_millis(300))
        })
        .await
        .unwrap();
        moved.store(true, Ordering::Release);
        let mut calls = 0;
        for t in tasks {
            calls += t.await.unwrap();
        }
        let granted = granted.load(Ordering::Relaxed);
        let left = u64::try_from(probe.available_tokens().await.unwrap()).expect("not in debt");
        let (asks, moves) = (
            cluster.errors_answered(from_port, "ASK"),
            cluster.errors_answered(from_port, "MOVED"),
        );
        println!(
            "cluster: slot {slot} moved {from_port} -> {} under 4 tasks: {calls} calls, {granted} \
             granted, {left} left of {capacity}; the source answered ASK {asks}, MOVED {moves} times",
            to.port
        );
        let stats: Vec<_> = backends.iter().map(RedisBackend::stats).collect();
        println!("cluster: the 4 backends' stats: {stats:?}");
        assert_eq!(cluster.master_of(probe.key().as_str()).1.id, to.id);
        assert_eq!(
            cli(to.port, &["EXISTS", probe.key().as_str()]),
            "1",
            "the record moved"
        );
        assert!(asks + moves > 0, "no redirection was answered: the move was not seen");
        assert_eq!(calls, granted, "every call was granted (tokens were left)");
        assert_eq!(granted + left, capacity, "no token lost or granted twice");
    });
}

/// Created while no node listens: creation does not wait, and calls fail at once with a
/// retryable `Unavailable` (nothing was sent).
#[test]
fn an_unreachable_redis_cluster_is_created_and_its_calls_fail_fast_and_retryably() {
    let mut held = Vec::new();
    let ports: Vec<u16> = (0..3).map(|_| free_pair(&mut held)).collect();
    drop(held);
    runtime().block_on(async {
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        let t = Instant::now();
        let backend = RedisBackend::connect_cluster(&urls, RedisOptions::default())
            .await
            .expect("creation does not wait for the cluster");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        let manager = patient(backend.clone());
        let key = manager.storage_key("k").unwrap();
        for _ in 0..5 {
            let t = Instant::now();
            let e = bucket4rs_distributed::Backend::read(&backend, &key)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "nothing was sent: {e}");
            assert!(
                t.elapsed() < Duration::from_millis(200),
                "{:?}",
                t.elapsed()
            );
        }
    });
}

/// The master of a hot key is killed (`kill -9`) while 4 tasks, a backend each, consume from
/// it: calls fail within their deadline until its replica is promoted
/// (`cluster-node-timeout 2000`), then succeed on it, through the same backends. Prints the
/// time from the kill to the first success, and the tokens granted against the limit (writes
/// the master acknowledged and did not replicate are lost: over-grant).
#[test]
fn fault_cluster_master_killed_under_load_fails_over_to_its_replica() {
    let mut cluster = OwnCluster::start();
    let capacity = 100_000u64;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    runtime().block_on(async {
        let prefix = unique_prefix("failover");
        let options = RedisOptions::default()
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300));
        let mut managers = Vec::new();
        for _ in 0..4 {
            let backend = RedisBackend::connect_cluster(cluster.urls(), options.clone())
                .await
                .unwrap();
            managers.push(
                ProxyManager::configure(backend)
                    .key_prefix(prefix.as_str())
                    .timeout(Duration::from_millis(500))
                    .build()
                    .unwrap(),
            );
        }
        let probe = managers[0].builder().build("hot", config).unwrap();
        reached(&probe, "the cluster").await;
        let (_, old) = cluster.master_of(probe.key().as_str());
        let load = Load::start(
            managers
                .iter()
                .map(|m| m.builder().build("hot", config).unwrap())
                .collect(),
        );
        load.until_granted(500).await;
        let granted_before = load.granted();
        tokio::task::block_in_place(|| cluster.kill(old.port));
        let killed = load.killed();
        let deadline = killed + Duration::from_secs(30);
        let alive = cluster.alive();
        while !load.succeeded_after_kill() {
            assert!(
                Instant::now() < deadline,
                "no success within 30 s of the kill; the cluster as :{alive} sees it:\n{}",
                cli(alive, &["CLUSTER", "NODES"])
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let Counted {
            granted,
            failed,
            first_after_kill: first,
            left,
            over,
            under,
        } = load.stop(&probe, capacity).await;
        let (_, new) = cluster.master_of(probe.key().as_str());
        let new_port = new.port;
        println!(
            "fault: cluster failover (master :{} of the hot key killed -9 under 4 tasks, \
             cluster-node-timeout 2000): first success {:.0} ms after the kill, on :{new_port}; \
             {failed} calls failed; granted {granted} ({granted_before} before the kill), {left} \
             left of {capacity}: over-granted {over}, unaccounted {under} (calls in doubt at the \
             kill)",
            old.port,
            (first - killed).as_secs_f64() * 1e3,
        );
        assert_ne!(new.id, old.id, "the replica was promoted");
        assert!(failed > 0, "calls while the slot had no master must fail");
        // The replica had every acknowledged write but those in flight at the kill.
        assert!(over <= 100, "over-granted {over}");
        assert!(under <= 8, "more calls in doubt than tasks: {under}");
    });
}

/// A cluster on TLS only (clients, bus, replication) with a private CA: the backend trusts it
/// through `RedisOptions::tls`, follows the nodes the cluster announces (`localhost`, the
/// certificate's name) and keeps its limits exactly on every master; without the CA no call
/// succeeds (the handshake is refused: nothing is ever sent in plaintext).
#[test]
fn cluster_over_tls_with_a_private_ca_keeps_its_limits() {
    let certs = Certs::new();
    let cluster = OwnCluster::start_with(Some(&certs));
    runtime().block_on(async {
        let tls = bucket4rs_distributed::TlsOptions::default()
            .ca_file(certs.path("ca.pem"))
            .unwrap();
        let backend =
            RedisBackend::connect_cluster(cluster.urls(), RedisOptions::default().tls(tls))
                .await
                .unwrap();
        let prefix = unique_prefix("tls");
        let manager = ProxyManager::configure(backend)
            .key_prefix(prefix.as_str())
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        for i in 0..30 {
            let b = manager
                .builder()
                .build(format!("k{i}"), || {
                    simple(10, Duration::from_secs(1_000_000))
                })
                .unwrap();
            assert!(b.try_consume(4).await.unwrap());
            assert!(!b.try_consume(7).await.unwrap());
            assert_eq!(b.available_tokens().await.unwrap(), 6);
        }
        let mut held = Vec::new();
        for m in cluster.masters() {
            let keys = cluster.cli(m.port, &["KEYS", &format!("{prefix}*")]);
            held.push(keys.lines().filter(|k| !k.is_empty()).count());
        }
        println!("cluster over TLS: records per master: {held:?}");
        assert_eq!(held.len(), 3);
        assert!(held.iter().all(|&n| n > 0), "{held:?}");
        assert_eq!(held.iter().sum::<usize>(), 30);

        // The platform's roots only: the private CA is unknown, no connection is made.
        let untrusting = RedisBackend::connect_cluster(cluster.urls(), RedisOptions::default())
            .await
            .unwrap();
        let manager = patient(untrusting.clone());
        let key = manager.storage_key("k").unwrap();
        let e = bucket4rs_distributed::Backend::read(&untrusting, &key)
            .await
            .unwrap_err();
        println!("cluster over TLS, CA not trusted: {e}");
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
        assert!(!e.is_retryable(), "a refused handshake: {e}");
        assert_eq!(untrusting.stats().round_trips, 0, "nothing was sent");
    });
}

/// The over-grant of a Cluster failover to a replica that lacks the old master's last writes
/// (`failover::over_grant`: the hot key's replica cut off, 40 calls on its master alone,
/// then `kill -9` of that master), with or without the backends waiting for one replica per
/// write (`RedisOptions::wait_for_replicas(1, 50 ms)`).
fn cluster_over_grant(wait: bool) -> OverGrant {
    let mut cluster = OwnCluster::start_with_replication_user();
    let capacity = 100_000u64;
    let config = move || simple(capacity, Duration::from_secs(1_000_000));
    runtime().block_on(async {
        let prefix = unique_prefix("cluster-lag");
        let mut options = RedisOptions::default()
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300));
        if wait {
            options = options.wait_for_replicas(1, Duration::from_millis(50));
        }
        let mut buckets = Vec::new();
        for _ in 0..5 {
            let backend = RedisBackend::connect_cluster(cluster.urls(), options.clone())
                .await
                .unwrap();
            let manager = ProxyManager::configure(backend)
                .key_prefix(prefix.as_str())
                .circuit_breaker(CircuitBreaker::off())
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap();
            buckets.push(manager.builder().build("hot", config).unwrap());
        }
        let probe = buckets.pop().expect("a probe");
        reached(&probe, "the cluster").await;
        let (_, old) = cluster.master_of(probe.key().as_str());
        let replica: u16 = cli(old.port, &["INFO", "replication"])
            .lines()
            .find_map(|l| l.strip_prefix("slave0:"))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("port=")))
            .and_then(|p| p.parse().ok())
            .expect("the master's replica");
        let figures = over_grant(
            &buckets,
            &probe,
            capacity,
            || cut_replication(&cli, old.port, replica, REPL_USER),
            || {
                cluster.kill(old.port);
                let by = Instant::now() + Duration::from_secs(30);
                while !cli(replica, &["ROLE"]).starts_with("master") {
                    assert!(
                        Instant::now() < by,
                        "the replica :{replica} was not promoted"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            },
        )
        .await;
        println!(
            "fault: cluster failover to a replica cut off before 40 calls ({}): {figures}",
            OverGrant::label(wait)
        );
        figures
    })
}

/// Without waiting for replicas, every token the old master granted after its replica was
/// cut off is granted again once the replica is promoted: the over-grant is exactly those.
#[test]
fn fault_cluster_failover_to_a_lagging_replica_over_grants_what_the_old_master_granted_after_the_cut()
 {
    cluster_over_grant(false).check(false);
}

/// Waiting for one replica, no call after the cut is granted (each is in doubt), and the
/// failover over-grants nothing.
#[test]
fn fault_cluster_failover_waiting_for_a_replica_over_grants_nothing() {
    cluster_over_grant(true).check(true);
}

/// Each refused TLS connection to a cluster is the single node's typed, non-retryable error
/// (its `source()` a `TlsError`), never a plaintext connection, though the crate reports it as
/// text: a CA that did not sign the nodes' certificates, a host name they do not name, a
/// plaintext cluster where TLS was asked for. Nothing is sent.
#[test]
fn cluster_tls_refusals_are_typed_errors() {
    use bucket4rs_distributed::{TlsError, TlsOptions};
    use std::error::Error as _;
    let certs = Certs::new();
    let tls_cluster = OwnCluster::start_with(Some(&certs));
    let plain_cluster = OwnCluster::start();
    let trusting = |ca: &str| TlsOptions::default().ca_file(certs.path(ca)).unwrap();
    let ports = |c: &OwnCluster, host: &str| -> Vec<String> {
        c.ports
            .iter()
            .map(|p| format!("rediss://{host}:{p}"))
            .collect()
    };
    runtime().block_on(async {
        let cases = [
            (
                "a CA that did not sign the nodes' certificates",
                ports(&tls_cluster, "localhost"),
                trusting("other-ca.pem"),
                TlsError::UnknownIssuer,
            ),
            (
                "a host name the certificates do not name",
                ports(&tls_cluster, "127.0.0.1"),
                trusting("ca.pem"),
                TlsError::HostnameMismatch,
            ),
            (
                "a plaintext cluster",
                ports(&plain_cluster, "localhost"),
                trusting("ca.pem"),
                TlsError::NotTls,
            ),
        ];
        for (what, seeds, tls, expected) in cases {
            let options = RedisOptions::default()
                .connect_timeout(Duration::from_millis(500))
                .tls(tls);
            let backend = RedisBackend::connect_cluster(&seeds, options)
                .await
                .unwrap_or_else(|e| panic!("{what}: created all the same: {e}"));
            let key = patient(backend.clone()).storage_key("k").unwrap();
            // Until the background connection has met the nodes.
            let by = Instant::now() + Duration::from_secs(10);
            let (e, took) = loop {
                let t = Instant::now();
                let e = bucket4rs_distributed::Backend::read(&backend, &key)
                    .await
                    .expect_err(what);
                if !e.is_retryable() || Instant::now() > by {
                    break (e, t.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            println!("cluster tls, {what}: {e} (in {took:?})");
            let cause = e.source().and_then(|s| s.downcast_ref::<TlsError>());
            assert_eq!(cause, Some(&expected), "{what}: {e}");
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e}");
            assert!(took < Duration::from_secs(2), "{what}: {took:?}");
            assert_eq!(backend.stats().round_trips, 0, "{what}: nothing was sent");
        }
    });
}
