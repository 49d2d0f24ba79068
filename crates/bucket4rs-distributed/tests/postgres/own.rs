//! A PostgreSQL cluster of the test's own, never the shared one.

use std::path::PathBuf;
use std::process::Command;

use crate::unique_prefix;

/// A PostgreSQL of our own (never the shared one): initdb + pg_ctl as user postgres on a
/// free loopback port in a temporary directory.
pub(crate) struct OwnPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl OwnPostgres {
    fn bin() -> PathBuf {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql are required")
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("pg_ctl").exists())
            .collect();
        found.sort();
        found.pop().expect("no /usr/lib/postgresql/*/bin/pg_ctl")
    }

    fn as_postgres(&self, tool: &str) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(self.bin.join(tool));
        c
    }

    pub(crate) fn init() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(unique_prefix("pg-own"));
        std::fs::create_dir_all(&dir).unwrap();
        let me = Self {
            bin: Self::bin(),
            dir,
            port,
        };
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&me.dir)
            .status()
            .unwrap();
        assert!(ok.success());
        let out = me
            .as_postgres("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(me.dir.join("data"))
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {out:?}");
        me
    }

    pub(crate) fn start(&self) {
        self.start_with("");
    }

    /// Starts the cluster with `extra` server options (`-c name=value …`) added.
    pub(crate) fn start_with(&self, extra: &str) {
        let out = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-o"])
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off {extra}",
                self.port,
                self.dir.display()
            ))
            .arg("start")
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {out:?}");
    }

    pub(crate) fn stop(&self, mode: &str) {
        let _ = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", mode, "-w", "stop"])
            .output();
    }

    pub(crate) fn url(&self) -> String {
        self.url_at("127.0.0.1")
    }

    /// The URL naming the server by `host` (`localhost`: the name the TLS tests' server
    /// certificate is for).
    pub(crate) fn url_at(&self, host: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres", self.port)
    }

    /// Replaces the cluster's `pg_hba.conf` (before `start`).
    pub(crate) fn hba(&self, lines: &str) {
        let path = self.dir.join("data/pg_hba.conf");
        std::fs::write(&path, lines).unwrap();
        let ok = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&path)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// The postmaster and every process it started (backends, checkpointer, …).
    fn pids(&self) -> Vec<u32> {
        let Ok(pidfile) = std::fs::read_to_string(self.dir.join("data/postmaster.pid")) else {
            return Vec::new();
        };
        let Some(master) = pidfile
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
        else {
            return Vec::new();
        };
        let mut pids = vec![master];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid …: the fields after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(master) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Sends `signal` (`STOP`, `CONT`) to every process of this cluster, by pid; how many.
    /// The processes are listed again until no new one appears: a backend the postmaster
    /// forked for a client connecting while the first list was made is signalled too (once
    /// the postmaster itself is stopped, it forks no more).
    pub(crate) fn signal(&self, signal: &str) -> usize {
        let mut sent = std::collections::HashSet::new();
        loop {
            let new: Vec<u32> = self
                .pids()
                .into_iter()
                .filter(|p| !sent.contains(p))
                .collect();
            if new.is_empty() {
                return sent.len();
            }
            for pid in new {
                let _ = Command::new("kill")
                    .arg(format!("-{signal}"))
                    .arg(pid.to_string())
                    .stderr(std::process::Stdio::null())
                    .status();
                sent.insert(pid);
            }
        }
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        // A test that panicked while the cluster was frozen must not leave it stopped.
        self.signal("CONT");
        self.stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
