//! Fault tests of the demo server: slow and silent clients, the connection cap, and a
//! rate-limit store that is down when the server starts. Each starts its own servers on
//! free loopback ports and prints what it measured.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bookshelf::{Args, ServeOptions};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A bookshelf served in-process with `options`; stopped on drop (also on panic).
struct Shelf {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Shelf {
    async fn start(args: &[&str], options: ServeOptions) -> Self {
        let args = Args::parse(args.iter().map(|s| (*s).to_owned())).expect("valid flags");
        let app = bookshelf::app_from(&args, bookshelf::load_plans(None).unwrap())
            .await
            .unwrap()
            .app;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            bookshelf::serve_with(
                listener,
                app,
                async {
                    let _ = rx.await;
                },
                &options,
            )
            .await
        });
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Shelf {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.abort();
    }
}

/// Serving options; every connection comes from 127.0.0.1 here, so the per-address cap is
/// the whole cap (it has its own test, `proxies::one_address_cannot_take_every_connection`).
fn options(header: Duration, idle: Duration, max: usize) -> ServeOptions {
    let mut o = ServeOptions::new(header, idle, max);
    o.max_connections_per_address = max;
    o
}

/// Waits until the server closes `conn` (a read of 0 bytes or an error), at most `limit`;
/// when it was closed, if it was.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Instant> {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(Instant::now()),
            // A response (a 408, say): keep reading until the close.
            Ok(Ok(_)) => {}
        }
    }
}

const LOOKUP: &str = "/books/9781593278281";

/// How many half-sent requests: 300, fewer if the descriptor limit is low (each costs two
/// descriptors in this process, the client's and the server's).
fn attackers() -> usize {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    300.min(limit.saturating_sub(200) / 3).max(10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_slow_clients_are_closed_after_the_header_timeout_and_others_are_served() {
    let header = Duration::from_secs(1);
    let shelf = Shelf::start(&[], options(header, Duration::from_secs(30), 1024)).await;
    let n = attackers();
    let started = Instant::now();
    let mut slow = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = TcpStream::connect(shelf.addr).await.unwrap();
        // Half a request: the request line and part of a header, never the blank line.
        c.write_all(format!("GET {LOOKUP} HTTP/1.1\r\nHost: x\r\nX-API-Key: free-").as_bytes())
            .await
            .unwrap();
        if i % 50 == 0 {
            // Some trickle one byte at a time: bytes do not extend the header timeout.
            let _ = c.write_all(b"d").await;
        }
        slow.push(c);
    }
    let sent = started.elapsed();
    // Normal requests during the attack, each on a fresh connection.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let r = client
            .get(shelf.url(LOOKUP))
            .header("x-api-key", "pro-demo-key")
            .send()
            .await
            .expect("a normal request is answered during the attack");
        assert_eq!(r.status(), StatusCode::OK);
        worst = worst.max(t.elapsed());
    }
    let trickle = tokio::spawn({
        let mut c = TcpStream::connect(shelf.addr).await.unwrap();
        async move {
            let t = Instant::now();
            let _ = c.write_all(b"GET / HTTP/1.1\r\n").await;
            // One byte every 100 ms, for far longer than the header timeout.
            for _ in 0..50 {
                if c.write_all(b"X").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            closed_within(&mut c, Duration::from_secs(1))
                .await
                .map(|at| at.duration_since(t))
        }
    });
    let mut latest = Duration::ZERO;
    for c in &mut slow {
        let at = closed_within(c, Duration::from_secs(10))
            .await
            .expect("a half-sent request is closed within 10 s");
        latest = latest.max(at.duration_since(started));
    }
    let trickled = trickle
        .await
        .unwrap()
        .expect("a trickling client is closed too");
    println!(
        "fault: slow clients: {n} half-sent requests closed after {:.2} s at the latest \
         (header timeout {:.1} s, sent in {:.2} s); a client trickling a byte every 100 ms \
         closed after {:.2} s; normal requests answered in {} ms at worst during the attack",
        latest.as_secs_f64(),
        header.as_secs_f64(),
        sent.as_secs_f64(),
        trickled.as_secs_f64(),
        worst.as_millis()
    );
    assert!(latest < sent + header * 3, "closed late: {latest:?}");
    assert!(
        trickled < header * 3,
        "a trickle holds the connection: {trickled:?}"
    );
    assert!(
        worst < Duration::from_secs(1),
        "normal requests waited {worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_a_request_body_that_stops_arriving_is_closed_after_the_idle_timeout() {
    // The demo's routes read no body, so an application that does: the accept loop is the
    // same for every application.
    let idle = Duration::from_millis(800);
    let echo = axum::Router::new().route(
        "/echo",
        axum::routing::post(|body: String| async move { body }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = options(Duration::from_secs(30), idle, 1024);
    let server = tokio::spawn(async move {
        bookshelf::serve_with(listener, echo, std::future::pending(), &opts).await
    });
    struct Abort(JoinHandle<std::io::Result<()>>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _server = Abort(server);
    let mut c = TcpStream::connect(addr).await.unwrap();
    // The headers are complete (no header timeout runs), then the body stops.
    c.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\npart of it")
        .await
        .unwrap();
    let t = Instant::now();
    let closed = closed_within(&mut c, Duration::from_secs(10))
        .await
        .expect("a stalled request is closed within 10 s");
    let after = closed.duration_since(t);
    println!(
        "fault: idle connection: a request body stalled mid-way closed after {:.2} s (idle timeout {:.1} s)",
        after.as_secs_f64(),
        idle.as_secs_f64()
    );
    assert!(after >= idle / 2 && after < idle * 4, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_connections_beyond_the_cap_wait_until_one_closes() {
    let shelf = Shelf::start(
        &[],
        options(Duration::from_secs(30), Duration::from_secs(30), 2),
    )
    .await;
    let first = TcpStream::connect(shelf.addr).await.unwrap();
    let _second = TcpStream::connect(shelf.addr).await.unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let request = || {
        client
            .get(shelf.url("/health"))
            .timeout(Duration::from_secs(5))
            .send()
    };
    let waiting = tokio::spawn(request());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a third connection was served past a cap of two"
    );
    let t = Instant::now();
    drop(first);
    let r = waiting
        .await
        .unwrap()
        .expect("served once a connection closed");
    assert_eq!(r.status(), StatusCode::OK);
    println!(
        "fault: connection cap: with 2 of 2 connections held, a third waited 500+ ms unanswered, \
         then was answered {} ms after one closed",
        t.elapsed().as_millis()
    );
}

/// A loopback port where nothing listens.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server of this test's own on `port` (never the shared one), killed on drop.
struct OwnRedis(std::process::Child);

impl OwnRedis {
    fn start(port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        let me = Self(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "own redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn lookup(client: &reqwest::Client, shelf: &Shelf) -> (StatusCode, Duration) {
    let t = Instant::now();
    let r = client
        .get(shelf.url(LOOKUP))
        .header("x-api-key", "free-demo-key")
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    (r.status(), t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_bookshelf_serves_while_its_store_is_down_and_uses_it_once_it_is_up() {
    let client = reqwest::Client::new();
    let port = free_port();
    let redis = format!("redis://127.0.0.1:{port}/");
    let postgres = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    for (store, url) in [("--redis", &redis), ("--postgres", &postgres)] {
        for (policy, expected) in [
            ("error", StatusCode::SERVICE_UNAVAILABLE),
            ("deny", StatusCode::TOO_MANY_REQUESTS),
            ("fallback:2 per minute", StatusCode::OK),
        ] {
            let args = [store, url, "--on-backend-failure", policy];
            let shelf = Shelf::start(&args, ServeOptions::default()).await;
            let health = client.get(shelf.url("/health")).send().await.unwrap();
            assert_eq!(health.status(), StatusCode::OK, "{args:?}");
            let (status, took) = lookup(&client, &shelf).await;
            assert_eq!(status, expected, "{args:?}");
            if policy.starts_with("fallback") {
                assert_eq!(lookup(&client, &shelf).await.0, StatusCode::OK);
                assert_eq!(
                    lookup(&client, &shelf).await.0,
                    StatusCode::TOO_MANY_REQUESTS,
                    "the fallback limit holds: {args:?}"
                );
            }
            println!(
                "fault: store down at start ({store} on a port where nothing listens, {policy}): \
                 /health 200, a lookup answered {} in {} ms",
                status.as_u16(),
                took.as_millis()
            );
        }
    }
    // Recovery: the server started against a Redis that is down; once one listens, the
    // limited routes are decided by it.
    let shelf = Shelf::start(&["--redis", &redis], ServeOptions::default()).await;
    assert_eq!(
        lookup(&client, &shelf).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let _redis = OwnRedis::start(port);
    let up = Instant::now();
    let deadline = up + Duration::from_secs(15);
    loop {
        let r = client
            .get(shelf.url(LOOKUP))
            .header("x-api-key", "free-demo-key")
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            assert!(r.headers().contains_key("ratelimit"), "decided by Redis");
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            Instant::now() < deadline,
            "never connected to the new Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = up.elapsed();
    let mut granted = 1;
    while lookup(&client, &shelf).await.0 == StatusCode::OK {
        granted += 1;
        assert!(granted <= 20, "more than the free plan's 20");
    }
    println!(
        "fault: store down at start: Redis started later, limited requests decided by it {} ms \
         after it listened; {granted} of 20 granted",
        recovered.as_millis()
    );
    assert_eq!(granted, 20);
}
