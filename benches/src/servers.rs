//! Throwaway servers for `examples/redis_bench.rs` and `examples/postgres_bench.rs`: a Redis
//! Cluster, redis-servers on plaintext or TLS only, a PostgreSQL cluster with `ssl = on`, and
//! the certificates they present, made at run time. Each server listens on a free loopback
//! port in a directory of its own and is stopped, its directory removed, when dropped (also
//! on a panic). Every step that fails panics naming what failed: a benchmark that cannot
//! start its servers reports nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// How long a server may take to start.
const START: Duration = Duration::from_secs(30);

/// A fresh directory under the system's temporary directory.
fn fresh_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("b4bench-{what}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// A free loopback port (the listener is closed again: another process may take it before
/// the server binds it, which then fails to start and says so).
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Waits until something accepts connections on `port`.
fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + START;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} on port {port} did not start within {START:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A CA and a server certificate for `localhost` signed by it, as PEM files (`ca.pem`,
/// `server.pem`, `server.key`) in a fresh directory, removed on drop.
#[derive(Debug)]
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Makes the CA and the server certificate.
    #[must_use]
    pub fn new() -> Self {
        let dir = fresh_dir("certs");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "bucket4rs bench CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a key"))
            .expect("the CA certificate");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned()]).expect("server parameters");
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("a key");
        let cert = server.signed_by(&key, &ca).expect("the server certificate");
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", cert.pem()),
            ("server.key", key.serialize_pem()),
        ] {
            std::fs::write(dir.join(name), pem).expect("a certificate file");
        }
        Self { dir }
    }

    /// The file `name` (`ca.pem`, `server.pem`, `server.key`).
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Default for Certs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A redis-server of the benchmark's own: no persistence, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The port it listens on (plaintext, or TLS only).
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl RedisServer {
    /// `redis-server --port …` with `extra` arguments, once it accepts connections.
    fn spawn(what: &str, port_args: &[String], extra: &[&str]) -> Self {
        let dir = fresh_dir(what);
        let port = port_args
            .last()
            .and_then(|p| p.parse().ok())
            .expect("the port is the last port argument");
        let child = Command::new("redis-server")
            .args(port_args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server must be installed: {e}"));
        let me = Self { port, child, dir };
        wait_for_port(port, what);
        me
    }

    /// A plaintext redis-server.
    #[must_use]
    pub fn plain() -> Self {
        Self::spawn("redis", &["--port".into(), free_port().to_string()], &[])
    }

    /// A redis-server listening on TLS only (`--port 0 --tls-port …`) with the server
    /// certificate of `certs`, asking no client certificate.
    #[must_use]
    pub fn tls(certs: &Certs) -> Self {
        let path = |name: &str| certs.path(name).display().to_string();
        let (cert, key, ca) = (path("server.pem"), path("server.key"), path("ca.pem"));
        Self::spawn(
            "redis-tls",
            &[
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                free_port().to_string(),
            ],
            &[
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
            ],
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-cli -p port args…`, its standard output; panics naming the command if it fails.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("redis-cli must be installed: {e}"));
    assert!(
        out.status.success(),
        "redis-cli -p {port} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A Redis Cluster of the benchmark's own: `masters` redis-servers with `cluster-enabled yes`
/// and no replicas, joined by `redis-cli --cluster create`; killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..1_000 {
        let port = free_port();
        if port <= 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair (port, port + 10000) for a cluster node");
}

impl RedisCluster {
    /// Starts and joins the nodes; returns once every node reports `cluster_state:ok` and
    /// knows every master.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                let port = free_cluster_port();
                RedisServer::spawn(
                    "redis-cluster",
                    &["--port".into(), port.to_string()],
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli must be installed: {e}"));
        // It waits for the nodes to meet with no limit of its own: bounded here.
        let deadline = Instant::now() + START;
        while create.try_wait().expect("redis-cli runs").is_none() {
            if Instant::now() > deadline {
                let _ = create.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = create.wait_with_output().expect("redis-cli's output");
        assert!(
            out.status.success(),
            "redis-cli --cluster create (limit {START:?}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for node in &nodes {
            loop {
                let info = redis_cli(node.port, &["CLUSTER", "INFO"]);
                if info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{masters}"))
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster node {} not ready within {START:?}: {info}",
                    node.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    /// The nodes' ports.
    #[must_use]
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The seed URLs (every node).
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

/// A PostgreSQL cluster of the benchmark's own (initdb and pg_ctl run as user `postgres`,
/// which PostgreSQL requires when run by root) with `ssl = on` and the certificate of a
/// [`Certs`]; plaintext and TLS connections are both let in (trust authentication). Stopped
/// (`pg_ctl stop -m immediate`) and removed on drop. It runs with `fsync = off`: a commit does
/// not wait for the disk, whose latency on this machine varies by several times from run to
/// run and would hide what TLS costs.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Postgres {
    fn bin() -> PathBuf {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql are required")
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("pg_ctl").exists())
            .collect();
        found.sort();
        found.pop().expect("no /usr/lib/postgresql/*/bin/pg_ctl")
    }

    fn tool(bin: &Path, tool: &str) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    }

    fn run(mut c: Command, what: &str) {
        let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn chown(path: &Path) {
        let mut c = Command::new("chown");
        c.args(["-R", "postgres:postgres"]).arg(path);
        Self::run(c, "chown postgres");
    }

    /// initdb, the certificates copied in (the server key readable by `postgres` only),
    /// then pg_ctl start; returns once the server accepts connections.
    #[must_use]
    pub fn start_with_tls(certs: &Certs) -> Self {
        let me = Self {
            bin: Self::bin(),
            dir: fresh_dir("pg"),
            port: free_port(),
        };
        Self::chown(&me.dir);
        let data = me.dir.join("data");
        let mut initdb = Self::tool(&me.bin, "initdb");
        initdb
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data);
        Self::run(initdb, "initdb");
        for name in ["ca.pem", "server.pem", "server.key"] {
            std::fs::copy(certs.path(name), data.join(name)).expect("a certificate copied");
        }
        Self::chown(&data);
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                data.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .expect("the key's mode");
        }
        let mut start = Self::tool(&me.bin, "pg_ctl");
        start
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(me.dir.join("log"))
            .args(["-w", "-o"])
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=100 -c fsync=off \
                 -c ssl=on -c ssl_cert_file=server.pem -c ssl_key_file=server.key -c ssl_ca_file=ca.pem",
                me.port,
                me.dir.display()
            ))
            .arg("start");
        Self::run(start, "pg_ctl start");
        wait_for_port(me.port, "PostgreSQL");
        me
    }

    /// `postgres://postgres@host:port/postgres` (host `localhost` is the name the server
    /// certificate is for).
    #[must_use]
    pub fn url(&self, host: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let mut stop = Self::tool(&self.bin, "pg_ctl");
        stop.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = stop.output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
