//! The services the tests need: Redis and PostgreSQL, for bucket4rs-distributed.
//!
//! Tests read `BUCKET4RS_REDIS_URL` and `BUCKET4RS_POSTGRES_URL` and default to the local
//! servers. This module makes sure those servers answer before `cargo test` starts. It only
//! ever starts a server when the variable is unset or names the local default address; a
//! service that cannot be reached is an error, never a reason to skip tests.

use core::time::Duration;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

/// How long to wait for a server we just started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

struct Service {
    name: &'static str,
    env: &'static str,
    default_port: u16,
    /// Asks the server itself (beyond a TCP connect) with its client tool, when installed.
    probe: fn(&Shell, &Endpoint) -> bool,
    /// Starts the local default server.
    start: fn(&Shell) -> Result<()>,
    /// Prepares a local default server once it answers (for example, creates a database).
    prepare: fn(&Shell) -> Result<()>,
}

const SERVICES: [Service; 2] = [
    Service {
        name: "Redis",
        env: "BUCKET4RS_REDIS_URL",
        default_port: 6379,
        probe: redis_probe,
        start: redis_start,
        prepare: |_| Ok(()),
    },
    Service {
        name: "PostgreSQL",
        env: "BUCKET4RS_POSTGRES_URL",
        default_port: 5432,
        probe: postgres_probe,
        start: postgres_start,
        prepare: postgres_prepare,
    },
];

/// Where a service is expected, and the URL it came from (`None`: the local default).
#[derive(Debug)]
struct Endpoint {
    host: String,
    port: u16,
    url: Option<String>,
}

impl Endpoint {
    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Makes sure every service answers, starting local default servers that are down.
pub(crate) fn ensure(sh: &Shell) -> Result<()> {
    for service in &SERVICES {
        ensure_one(sh, service)?;
    }
    Ok(())
}

fn ensure_one(sh: &Shell, s: &Service) -> Result<()> {
    let url = std::env::var(s.env).ok().filter(|u| !u.trim().is_empty());
    let endpoint = match &url {
        Some(url) => {
            let (host, port) = host_port(url, s.default_port)
                .with_context(|| format!("cannot read {}={url}", s.env))?;
            Endpoint {
                host,
                port,
                url: Some(url.clone()),
            }
        }
        None => Endpoint {
            host: "127.0.0.1".to_owned(),
            port: s.default_port,
            url: None,
        },
    };
    let managed = endpoint.host == "127.0.0.1" && endpoint.port == s.default_port;
    let addr = endpoint.address();

    if !ready(sh, s, &endpoint) {
        if !managed {
            bail!(
                "{} is not reachable at {addr} ({} is set). xtask only starts the local default \
                 server (127.0.0.1:{}); start this one yourself or unset {}.",
                s.name,
                s.env,
                s.default_port,
                s.env
            );
        }
        println!("{}: not reachable at {addr}; starting it", s.name);
        (s.start)(sh).with_context(|| format!("could not start {}", s.name))?;
        let deadline = Instant::now() + START_TIMEOUT;
        while !ready(sh, s, &endpoint) {
            if Instant::now() > deadline {
                bail!(
                    "{} is still not reachable at {addr} {}s after starting it. The tests need \
                     it and are never skipped; see the server's log.",
                    s.name,
                    START_TIMEOUT.as_secs()
                );
            }
            thread::sleep(Duration::from_millis(250));
        }
    }
    if managed {
        (s.prepare)(sh).with_context(|| format!("could not prepare {}", s.name))?;
    }
    println!("{}: reachable at {addr}", s.name);
    Ok(())
}

fn ready(sh: &Shell, s: &Service, e: &Endpoint) -> bool {
    tcp_connects(&e.host, e.port) && (s.probe)(sh, e)
}

fn tcp_connects(host: &str, port: u16) -> bool {
    let Ok(addrs) = (host, port).to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

/// Whether `program` is on `PATH`.
fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Runs a probe command quietly; true when it exits 0 and its output contains `expect`.
fn probe_ok(cmd: xshell::Cmd<'_>, expect: &str) -> bool {
    match cmd.quiet().ignore_status().ignore_stderr().output() {
        Ok(out) => out.status.success() && String::from_utf8_lossy(&out.stdout).contains(expect),
        Err(_) => false,
    }
}

fn redis_probe(sh: &Shell, e: &Endpoint) -> bool {
    if !installed("redis-cli") {
        return true;
    }
    let cmd = match &e.url {
        Some(url) => cmd!(sh, "redis-cli -u {url} ping"),
        None => {
            let (host, port) = (&e.host, e.port.to_string());
            cmd!(sh, "redis-cli -h {host} -p {port} ping")
        }
    };
    probe_ok(cmd, "PONG")
}

fn redis_start(sh: &Shell) -> Result<()> {
    cmd!(
        sh,
        "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --appendonly no"
    )
    .args(["--save", ""])
    .run()?;
    Ok(())
}

fn postgres_probe(sh: &Shell, e: &Endpoint) -> bool {
    if !installed("pg_isready") {
        return true;
    }
    let target = match &e.url {
        Some(url) => url.clone(),
        None => format!("host={} port={} dbname=test", e.host, e.port),
    };
    probe_ok(cmd!(sh, "pg_isready -q -d {target}"), "")
}

fn postgres_start(sh: &Shell) -> Result<()> {
    let mut versions = sh
        .read_dir("/etc/postgresql")
        .context("no PostgreSQL cluster configured under /etc/postgresql")?;
    versions.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
    });
    let Some(version) = versions.last().and_then(|p| p.file_name()) else {
        bail!("no PostgreSQL version under /etc/postgresql");
    };
    let version = Path::new(version);
    cmd!(
        sh,
        "pg_ctlcluster --skip-systemctl-redirect {version} main start"
    )
    .run()?;
    Ok(())
}

/// The tests use the database `test`; create it on the local server if it is missing.
fn postgres_prepare(sh: &Shell) -> Result<()> {
    if !installed("psql") {
        return Ok(());
    }
    let conn = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";
    let exists = cmd!(sh, "psql {conn} -tAc")
        .arg("SELECT 1 FROM pg_database WHERE datname = 'test'")
        .quiet()
        .read()?;
    if exists.trim() != "1" {
        println!("PostgreSQL: creating database `test`");
        cmd!(sh, "psql {conn} -c")
            .arg("CREATE DATABASE test")
            .run()?;
    }
    Ok(())
}

/// The host and port of a service URL (`redis://user:pw@host:port/0`,
/// `postgres://user@host:port/db`) or of a PostgreSQL keyword string (`host=… port=…`).
fn host_port(url: &str, default_port: u16) -> Result<(String, u16)> {
    let (host, port) = if let Some((_, rest)) = url.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').context("unclosed '[' in host")?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        }
    } else {
        let word = |key: &str| {
            url.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        };
        (word("host").unwrap_or_default(), word("port"))
    };
    let host = match host {
        "" | "localhost" => "127.0.0.1",
        h => h,
    };
    let port = match port {
        Some(p) => p.parse().with_context(|| format!("bad port {p:?}"))?,
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests;
