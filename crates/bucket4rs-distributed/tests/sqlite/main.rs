//! The SQLite backend: the backend kit, a restart of the process, four processes on one file,
//! a damaged file (its header before it is opened, a page of its table after it was used), and
//! an executor that is never blocked while the file is locked, and waits dropped mid-wait.

#[path = "../it/common.rs"]
#[allow(dead_code)] // shared with the `it` and `postgres` binaries, which use more of it
mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{BackendErrorKind, ProxyManager, SqliteBackend, SqliteOptions};
use bucket4rs_testkit::{BackendKit, Fault, Faults};

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "bucket4rs-sqlite-{test}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Self(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("limits.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `capacity` tokens that do not come back within a test.
fn no_refill(capacity: u64) -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(capacity, Duration::from_secs(1_000_000_000)).unwrap())
        .build()
        .unwrap()
}

/// Freezes the file by holding its write lock from another connection, as another process's
/// long transaction would.
struct Locker {
    path: PathBuf,
    held: Mutex<Option<rusqlite::Connection>>,
}

#[async_trait::async_trait]
impl Faults for Locker {
    async fn inject(&self, fault: Fault) -> Result<bool, String> {
        let mut held = self.held.lock().map_err(|e| e.to_string())?;
        match fault {
            Fault::Freeze => {
                let conn = rusqlite::Connection::open(&self.path).map_err(|e| e.to_string())?;
                conn.execute_batch("BEGIN EXCLUSIVE")
                    .map_err(|e| e.to_string())?;
                *held = Some(conn);
                Ok(true)
            }
            Fault::Thaw => {
                if let Some(conn) = held.take() {
                    conn.execute_batch("ROLLBACK").map_err(|e| e.to_string())?;
                }
                Ok(true)
            }
            // A file has no server to stop or restart: the process restart is a test of its
            // own (`a_restarted_process_finds_its_buckets_as_they_were`).
            _ => Ok(false),
        }
    }
}

#[test]
fn the_sqlite_backend_replays_the_backend_kit() {
    let dir = TempDir::new("kit");
    let path = dir.file();
    let locker = Locker {
        path: path.clone(),
        held: Mutex::new(None),
    };
    BackendKit::new("sqlite", move || {
        SqliteBackend::open(path.clone(), SqliteOptions::default())
    })
    .faults(locker)
    .run();
}

/// The children's side of the multi-process tests: what to do is in the environment.
const CHILD: &str = "BUCKET4RS_SQLITE_CHILD";

fn child_mode() -> Option<(String, PathBuf)> {
    let v = std::env::var(CHILD).ok()?;
    let (mode, path) = v.split_once(':')?;
    Some((mode.to_owned(), PathBuf::from(path)))
}

/// Runs this test binary's `test` in `n` processes with `mode` on `path`; their outputs.
fn children(test: &str, n: usize, mode: &str, path: &Path) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let spawned: Vec<_> = (0..n)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(CHILD, format!("{mode}:{}", path.display()))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    spawned
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "child failed: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect()
}

/// What a child printed after `tag`.
fn reported(text: &str, tag: &str) -> u64 {
    text.lines()
        .find_map(|l| l.split_once(tag).map(|(_, v)| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("child printed no {tag:?}: {text}"))
        .parse()
        .unwrap()
}

/// One process takes 7 tokens of each of three buckets and exits; the next process (a
/// restart) finds every bucket as it was.
#[test]
fn a_restarted_process_finds_its_buckets_as_they_were() {
    const TEST: &str = "a_restarted_process_finds_its_buckets_as_they_were";
    if let Some((mode, path)) = child_mode() {
        let rt = runtime();
        rt.block_on(async {
            let backend = SqliteBackend::open(&path, SqliteOptions::default())
                .await
                .unwrap();
            let manager = ProxyManager::new(backend);
            for (i, k) in ["a", "b", "c"].iter().enumerate() {
                let b = manager.builder().build(*k, || no_refill(1_000)).unwrap();
                if mode == "take" {
                    assert!(b.try_consume(7 + i as u64).await.unwrap());
                }
                println!("left {k}: {}", b.available_tokens().await.unwrap());
            }
        });
        return;
    }
    let dir = TempDir::new("restart");
    let first = children(TEST, 1, "take", &dir.file()).remove(0);
    let second = children(TEST, 1, "look", &dir.file()).remove(0);
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        let left = 1_000 - (7 + i as u64);
        assert_eq!(reported(&first, &format!("left {k}:")), left);
        assert_eq!(
            reported(&second, &format!("left {k}:")),
            left,
            "bucket {k} after the restart"
        );
    }
}

/// Four processes × four tasks × 250 calls on one key of 1,000 tokens in one file: exactly
/// 1,000 granted.
#[test]
fn four_processes_on_one_file_grant_exactly_the_limit() {
    const TEST: &str = "four_processes_on_one_file_grant_exactly_the_limit";
    if let Some((_, path)) = child_mode() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let granted = rt.block_on(async {
            let backend = SqliteBackend::open(&path, SqliteOptions::default())
                .await
                .unwrap();
            let manager = ProxyManager::configure(backend)
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap();
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let b = manager.builder().build("hot", || no_refill(1_000)).unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    for _ in 0..250 {
                        n += u64::from(b.try_consume(1).await.unwrap());
                    }
                    n
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            total
        });
        println!("granted: {granted}");
        return;
    }
    let dir = TempDir::new("processes");
    // The file exists before the children race to create it.
    runtime().block_on(async {
        drop(
            SqliteBackend::open(dir.file(), SqliteOptions::default())
                .await
                .unwrap(),
        );
    });
    let started = Instant::now();
    let outputs = children(TEST, 4, "hammer", &dir.file());
    let granted: u64 = outputs.iter().map(|o| reported(o, "granted:")).sum();
    println!(
        "sqlite: 4 processes × 4 tasks × 250 calls on 1,000 tokens: {granted} granted in {:?}",
        started.elapsed()
    );
    assert_eq!(granted, 1_000);
}

/// A file that is not a database is refused with a typed error and left byte for byte.
#[test]
fn a_damaged_file_is_refused_and_left_as_it_is() {
    let dir = TempDir::new("damaged");
    let rt = runtime();
    // A real database (closed before it is damaged: its last connection checkpoints the
    // journal into the file), whose header is then damaged.
    let conn = rusqlite::Connection::open(dir.file()).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB); INSERT INTO t VALUES (x'00');",
    )
    .unwrap();
    conn.close().unwrap();
    let mut bytes = std::fs::read(dir.file()).unwrap();
    bytes[..16].copy_from_slice(b"not SQLite: junk");
    std::fs::write(dir.file(), &bytes).unwrap();
    let err = rt
        .block_on(SqliteBackend::open(dir.file(), SqliteOptions::default()))
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Protocol, "{err}");
    assert_eq!(
        std::fs::read(dir.file()).unwrap(),
        bytes,
        "the file changed"
    );
}

/// A database whose buckets table is damaged after it was set up and used (its b-tree's root
/// page overwritten, as a torn write or a bad sector would leave it; SQLite itself reports the
/// file corrupt): every operation fails with a typed, non-retryable error, and the file is
/// left byte for byte.
#[test]
fn a_page_damaged_after_setup_is_refused_typed_and_changes_nothing() {
    let dir = TempDir::new("page");
    let rt = runtime();
    // 200 buckets: the table's b-tree has a root page above its leaves.
    rt.block_on(async {
        let backend = SqliteBackend::open(dir.file(), SqliteOptions::default())
            .await
            .unwrap();
        let manager = ProxyManager::new(backend);
        for k in 0..200 {
            let b = manager
                .builder()
                .build(format!("tenant-{k}"), || no_refill(100))
                .unwrap();
            assert!(b.try_consume(3).await.unwrap());
        }
    });
    // Everything in the main file (the backend's connection may still be closing), then the
    // table's root page found and overwritten.
    let conn = rusqlite::Connection::open(dir.file()).unwrap();
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint was blocked");
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    let root: i64 = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'bucket4rs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    conn.close().unwrap();
    assert!(root > 1, "the table's root is page {root}");
    let (root, page_size) = (
        usize::try_from(root).unwrap(),
        usize::try_from(page_size).unwrap(),
    );
    let mut bytes = std::fs::read(dir.file()).unwrap();
    let page = (root - 1) * page_size..root * page_size;
    assert!(
        page.end <= bytes.len(),
        "page {root} is past the end of the file"
    );
    bytes[page].fill(0xa5);
    std::fs::write(dir.file(), &bytes).unwrap();
    // The damage is what SQLite calls a corrupt database, not some other failure.
    let conn = rusqlite::Connection::open(dir.file()).unwrap();
    let read = conn.query_row("SELECT count(*) FROM bucket4rs", [], |r| r.get::<_, i64>(0));
    assert_eq!(
        read.as_ref()
            .err()
            .and_then(rusqlite::Error::sqlite_error_code),
        Some(rusqlite::ErrorCode::DatabaseCorrupt),
        "{read:?}"
    );
    conn.close().unwrap();
    rt.block_on(async {
        // Opening reads only the schema (page 1), which is intact: the calls find the damage.
        let backend = SqliteBackend::open(dir.file(), SqliteOptions::default())
            .await
            .unwrap();
        let manager = ProxyManager::new(backend);
        for key in ["tenant-7", "tenant-199", "a new key"] {
            let b = manager.builder().build(key, || no_refill(100)).unwrap();
            let failures = [
                b.try_consume(1).await.map(drop),
                b.add_tokens(1).await,
                b.reset().await,
                b.available_tokens().await.map(drop),
            ];
            for r in failures {
                match r {
                    Err(bucket4rs_distributed::DistributedError::Backend(e)) => {
                        assert_eq!(e.kind(), BackendErrorKind::Protocol, "{key}: {e}");
                        assert!(!e.is_retryable(), "{key}: {e}");
                    }
                    other => panic!("{key}: {other:?}, not a typed backend error"),
                }
            }
        }
        let removed = manager.remove("tenant-7").await;
        assert!(
            removed.is_err(),
            "a removal from a damaged table: {removed:?}"
        );
    });
    assert_eq!(
        std::fs::read(dir.file()).unwrap(),
        bytes,
        "the damaged file changed"
    );
}

/// While another connection holds the file's lock, a call waits on the backend's thread: the
/// caller's executor (one thread) goes on running its other tasks, and the call fails typed
/// once the busy timeout is over, writing nothing.
#[test]
fn a_locked_file_never_blocks_the_executor_and_fails_typed() {
    let dir = TempDir::new("locked");
    let rt = runtime();
    let options = SqliteOptions::default().busy_timeout(Duration::from_millis(600));
    let backend = rt
        .block_on(SqliteBackend::open(dir.file(), options))
        .unwrap();
    let manager = ProxyManager::configure(backend)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let bucket = manager.builder().build("k", || no_refill(5)).unwrap();
    let lock = rusqlite::Connection::open(dir.file()).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (result, elapsed) = rt.block_on(async {
        let t = Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let started = Instant::now();
        let r = bucket.try_consume(1).await;
        ticker.abort();
        (r, started.elapsed())
    });
    let ticks = ticks.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "sqlite: a call on a locked file failed after {elapsed:?}; the executor ticked {ticks} times meanwhile"
    );
    let err = result.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // 10 ms ticks over at least the busy timeout: a blocked executor would tick once or twice.
    assert!(
        ticks >= 20,
        "the executor ticked only {ticks} times in {elapsed:?}"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    assert_eq!(
        rt.block_on(bucket.available_tokens()).unwrap(),
        5,
        "the failed call charged"
    );
}

/// Waiting calls dropped mid-wait give their reservation back on SQLite too (the one check
/// every backend runs, `common::dropped_waits_give_back_what_they_reserved`).
#[test]
fn sqlite_dropped_waits_give_back_what_they_reserved() {
    let dir = TempDir::new("dropped-waits");
    runtime().block_on(async {
        let backend = SqliteBackend::open(dir.file(), SqliteOptions::default())
            .await
            .unwrap();
        let took = common::dropped_waits_give_back_what_they_reserved(backend, "waits").await;
        println!("sqlite: dropped waits' refunds landed within {took:?}");
    });
}
