//! End-to-end tests: the Bookshelf server on a loopback port, a real HTTP client.

// The distributed crate's test certificates and own PostgreSQL clusters, for the TLS test.
#[path = "../../../bucket4rs-distributed/tests/it/certs.rs"]
mod certs;
// The backend that counts its round trips, as the layer's tests have it.
#[path = "../../../bucket4rs-tower/tests/it/counted.rs"]
mod counted;
mod faults;
mod leasing;
#[path = "../../../bucket4rs-distributed/tests/postgres/own.rs"]
#[allow(dead_code)] // the TLS test needs only part of it
mod own;
mod postgres_tls;
mod proxies;

/// What the borrowed modules find under `crate::common`.
mod common {
    pub(crate) use super::unique_prefix;
}

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bucket4rs_distributed::{
    Backend, PostgresBackend, PostgresOptions, ProxyManager, RedisBackend, RedisOptions,
};
use bucket4rs_tower::{RateLimitLayer, RateLimitLayerBuilder};
use reqwest::StatusCode;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start<B: Backend>(manager: ProxyManager<B>) -> Self {
        Self::with(RateLimitLayer::builder().backend(manager)).await
    }

    async fn with(store: RateLimitLayerBuilder) -> Self {
        let plans = bookshelf::load_plans(None).expect("the shipped plans file is valid");
        Self::with_plans(store, plans).await
    }

    async fn with_plans(store: RateLimitLayerBuilder, plans: bucket4rs_tower::PlanTable) -> Self {
        Self::serving(bookshelf::app(store, plans).expect("a valid layer")).await
    }

    /// Serves `app` on a loopback port.
    async fn serving(app: bookshelf::App) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(bookshelf::serve(listener, app, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    /// The demo's default: buckets in this process.
    async fn embedded() -> Self {
        Self::with(RateLimitLayer::builder()).await
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("graceful shutdown within 10 s")
            .unwrap()
            .unwrap();
    }
}

async fn get(client: &reqwest::Client, url: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = client.get(url);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.unwrap()
}

/// `RateLimit` / `RateLimit-Policy` parsed as structured-field lists: (name, params).
fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list = sfv::Parser::new(value)
        .parse_list()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .expect("policy names are sf-strings")
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let n = v.as_integer().expect("parameters are sf-integers");
                        (k.as_str().to_owned(), i64::from(n))
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("unexpected inner list in {value:?}"),
        })
        .collect()
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// The waits a refusal may announce when `full` seconds were due at the first request and
/// up to `elapsed` has passed since (the real clock refills while the requests run): exactly
/// `full` whenever the requests took under a second, as they do on an idle machine.
fn wait_range(full: u64, elapsed: Duration) -> std::ops::RangeInclusive<u64> {
    let left = Duration::from_secs(full).saturating_sub(elapsed);
    let lower = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    lower.max(1)..=full
}

/// The tokens a bucket may report after `taken` of `capacity` were consumed, at one token
/// per `period`, `elapsed` after the first consumption.
fn remaining_range(
    capacity: u64,
    taken: u64,
    period: Duration,
    elapsed: Duration,
) -> std::ops::RangeInclusive<u64> {
    let refilled = u64::try_from(elapsed.as_nanos() / period.as_nanos()).unwrap_or(u64::MAX);
    let low = capacity - taken;
    low..=low.saturating_add(refilled).min(capacity)
}

fn secs(r: &reqwest::Response, name: &str) -> u64 {
    header(r, name)
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_wait_and_remaining_ranges_are_exact_when_fast() {
    assert_eq!(wait_range(3, Duration::from_millis(999)), 3..=3);
    assert_eq!(wait_range(3, Duration::from_millis(1_500)), 2..=3);
    assert_eq!(wait_range(3, Duration::from_secs(10)), 1..=3);
    let third = Duration::from_secs(3);
    assert_eq!(
        remaining_range(20, 5, third, Duration::from_millis(2_999)),
        15..=15
    );
    assert_eq!(
        remaining_range(20, 5, third, Duration::from_secs(7)),
        15..=17
    );
    assert_eq!(
        remaining_range(20, 1, third, Duration::from_secs(70)),
        19..=20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_key_gets_20_lookups_then_429_with_retry_after_3() {
    let server = Server::embedded().await;
    let client = reqwest::Client::new();
    let url = server.url("/books/9781593278281");
    let start = std::time::Instant::now();
    for i in 1..=20 {
        let r = get(&client, &url, Some("free-demo-key")).await;
        let elapsed = start.elapsed();
        assert_eq!(r.status(), StatusCode::OK, "lookup {i}");
        assert_eq!(
            sf_list(header(&r, "ratelimit-policy")),
            vec![(
                "burst".to_owned(),
                vec![("q".to_owned(), 20), ("w".to_owned(), 60)]
            )]
        );
        let rl = sf_list(header(&r, "ratelimit"));
        assert_eq!(rl[0].0, "burst");
        assert_eq!(rl[0].1[0].0, "r");
        let third = Duration::from_secs(3);
        let left = u64::try_from(rl[0].1[0].1).unwrap();
        assert!(
            remaining_range(20, u64::try_from(i).unwrap(), third, elapsed).contains(&left),
            "r={left} after lookup {i}, {elapsed:?}"
        );
        let book: serde_json::Value = r.json_body().await;
        assert_eq!(book["title"], "The Rust Programming Language");
    }
    let r = get(&client, &url, Some("free-demo-key")).await;
    let elapsed = start.elapsed();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // 3 s for one token at one per 3 s, less what refilled while the lookups ran: exactly
    // 3 when they took under a second.
    let wait = secs(&r, "retry-after");
    assert!(
        wait_range(3, elapsed).contains(&wait),
        "{wait} after {elapsed:?}"
    );
    assert_eq!(header(&r, "content-type"), "application/problem+json");
    let rl = sf_list(header(&r, "ratelimit"));
    assert_eq!(
        rl,
        vec![(
            "burst".to_owned(),
            vec![
                ("r".to_owned(), 0),
                ("t".to_owned(), i64::try_from(wait).unwrap())
            ]
        )]
    );
    let problem: serde_json::Value = r.json_body().await;
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["retry_after"], wait);
    assert_eq!(problem["plan"], "free");
    assert_eq!(problem["cost"], 1);
    assert!(problem["detail"].as_str().unwrap().contains("free"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_key_gets_4_searches_then_429() {
    let server = Server::embedded().await;
    let client = reqwest::Client::new();
    let url = server.url("/books/search?q=design");
    let start = std::time::Instant::now();
    for i in 0..4 {
        let r = get(&client, &url, Some("free-demo-key")).await;
        assert_eq!(r.status(), StatusCode::OK, "search {i}");
        let hits: serde_json::Value = r.json_body().await;
        assert_eq!(hits.as_array().unwrap().len(), 4);
    }
    let r = get(&client, &url, Some("free-demo-key")).await;
    let elapsed = start.elapsed();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Five tokens at one per 3 s: 15 s (a little less has elapsed, rounded up).
    let wait = secs(&r, "retry-after");
    assert!(
        wait_range(15, elapsed).contains(&wait),
        "{wait} after {elapsed:?}"
    );
    let problem: serde_json::Value = r.json_body().await;
    assert_eq!(problem["cost"], 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pro_key_gets_200_lookups() {
    let server = Server::embedded().await;
    let client = reqwest::Client::new();
    let url = server.url("/books/9780132350884");
    let start = std::time::Instant::now();
    for i in 0..200 {
        let r = get(&client, &url, Some("pro-demo-key")).await;
        assert_eq!(r.status(), StatusCode::OK, "lookup {i}");
    }
    // Pro refills 200 per minute (one token per 0.3 s), so a few more may pass while the
    // 200 run; then the bucket is dry.
    let mut extra = 0u32;
    let r = loop {
        let r = get(&client, &url, Some("pro-demo-key")).await;
        if r.status() != StatusCode::OK {
            break r;
        }
        extra += 1;
        assert!(extra < 1_000, "the pro limit never applied");
    };
    let refilled = start.elapsed().as_secs_f64() / 0.3;
    assert!(
        f64::from(extra) <= refilled.ceil(),
        "{extra} extra lookups in {:?}",
        start.elapsed()
    );
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        sf_list(header(&r, "ratelimit-policy")),
        vec![(
            "burst".to_owned(),
            vec![("q".to_owned(), 200), ("w".to_owned(), 60)]
        )]
    );
    // The free key has its own bucket.
    let r = get(&client, &url, Some("free-demo-key")).await;
    assert_eq!(r.status(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_missing_key_is_401_and_unknown_books_404() {
    let server = Server::embedded().await;
    let client = reqwest::Client::new();
    let url = server.url("/books/9781593278281");
    for key in [Some("stolen-key"), None] {
        let r = get(&client, &url, key).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(header(&r, "content-type"), "application/problem+json");
        let problem: serde_json::Value = r.json_body().await;
        assert_eq!(problem["status"], 401);
        assert_eq!(problem["title"], "Unauthorized");
    }
    let r = get(
        &client,
        &server.url("/books/0000000000000"),
        Some("free-demo-key"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // The 404 still cost a token and says so.
    assert_eq!(
        sf_list(header(&r, "ratelimit"))[0].1[0],
        ("r".to_owned(), 19)
    );
    server.stop().await;
}

fn redis_url() -> String {
    std::env::var("BUCKET4RS_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

async fn redis_backend() -> RedisBackend {
    let url = redis_url();
    RedisBackend::connect(&url, RedisOptions::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Redis must be reachable at {url} (set BUCKET4RS_REDIS_URL; .ci/run starts it): {e}"
            )
        })
}

async fn redis_manager(prefix: &str) -> ProxyManager<RedisBackend> {
    ProxyManager::configure(redis_backend().await)
        .key_prefix(prefix)
        .build()
        .unwrap()
}

/// A name no other test (or earlier run) uses.
fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("bookshelf-{test}-{}-{nanos}", std::process::id())
}

fn postgres_url() -> String {
    std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The PostgreSQL backend, its table made.
async fn postgres_backend() -> PostgresBackend {
    let url = postgres_url();
    let backend = PostgresBackend::connect(&url, PostgresOptions::default())
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL must be reachable at {url} (set BUCKET4RS_POSTGRES_URL; .ci/run starts it): {e}")
        });
    backend.migrate().await.unwrap();
    backend
}

async fn postgres_manager(prefix: &str) -> ProxyManager<PostgresBackend> {
    ProxyManager::configure(postgres_backend().await)
        .key_prefix(prefix)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_postgres_share_one_limit() {
    let prefix = unique_prefix("shared");
    let a = Server::start(postgres_manager(&prefix).await).await;
    let b = Server::start(postgres_manager(&prefix).await).await;
    shares_one_limit(a, b).await;
}

/// `--sqlite FILE`: the limits outlive the process. 20 lookups on the free plan (20 a minute,
/// one back every 3 s), a new instance on the same file: it grants only what refilled since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_on_sqlite_keeps_its_limits_across_a_restart() {
    let dir = std::env::temp_dir().join(unique_prefix("sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.db").display().to_string();
    let args = bookshelf::Args::parse(["--sqlite".to_owned(), file.clone()]).unwrap();
    let start = async || {
        bookshelf::app_from(&args, bookshelf::load_plans(None).unwrap())
            .await
            .unwrap()
    };
    let started = start().await;
    assert_eq!(started.store, format!("SQLite file {file}"));
    let client = reqwest::Client::new();
    let path = "/books/9781449373320";
    let began = std::time::Instant::now();
    let first = Server::serving(started.app).await;
    for i in 1..=20 {
        let r = get(&client, &first.url(path), Some("free-demo-key")).await;
        assert_eq!(r.status(), StatusCode::OK, "lookup {i}");
    }
    first.stop().await;
    let second = Server::serving(start().await.app).await;
    let mut granted = 0u64;
    while get(&client, &second.url(path), Some("free-demo-key"))
        .await
        .status()
        == StatusCode::OK
    {
        granted += 1;
        assert!(granted < 20, "a restart handed out a fresh quota");
    }
    let refilled = began.elapsed().as_secs() / 3 + 1;
    assert!(
        granted <= refilled,
        "{granted} granted after the restart, {refilled} refilled at most"
    );
    second.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_share_one_limit() {
    let prefix = unique_prefix("shared");
    let a = Server::start(redis_manager(&prefix).await).await;
    let b = Server::start(redis_manager(&prefix).await).await;
    shares_one_limit(a, b).await;
}

async fn shares_one_limit(a: Server, b: Server) {
    let client = reqwest::Client::new();
    let path = "/books/9781449373320";
    let start = std::time::Instant::now();
    for i in 1..=20 {
        let server = if i % 2 == 1 { &a } else { &b };
        let r = get(&client, &server.url(path), Some("free-demo-key")).await;
        let elapsed = start.elapsed();
        assert_eq!(r.status(), StatusCode::OK, "lookup {i}");
        // One bucket: each instance sees the other's lookups.
        let (name, left) = sf_list(header(&r, "ratelimit"))[0].1[0].clone();
        assert_eq!(name, "r");
        let left = u64::try_from(left).unwrap();
        assert!(
            remaining_range(20, i, Duration::from_secs(3), elapsed).contains(&left),
            "r={left} after lookup {i}, {elapsed:?}"
        );
    }
    for server in [&a, &b] {
        let r = get(&client, &server.url(path), Some("free-demo-key")).await;
        let elapsed = start.elapsed();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = secs(&r, "retry-after");
        assert!(
            wait_range(3, elapsed).contains(&wait),
            "{wait} after {elapsed:?}"
        );
    }
    a.stop().await;
    b.stop().await;
}

/// The address in the binary's first line ("Bookshelf API listening on http://ADDR …").
fn listening_on(first: &str) -> String {
    first
        .trim()
        .trim_start_matches("Bookshelf API listening on http://")
        .split(' ')
        .next()
        .unwrap()
        .to_owned()
}

/// The binary, killed on drop (also when the test panics).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_the_binary_serves_while_redis_is_down_at_start() {
    use std::io::BufRead as _;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (redis, port) = (format!("redis://127.0.0.1:{}/", free()), free());
    let addr = format!("127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_bookshelf"))
            .args(["--redis", &redis, "--addr", &addr, "--header-timeout", "1s"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    // The whole banner is read, and the pipe kept open: the server's prints must not fail.
    let banner = tokio::task::spawn_blocking(move || {
        let mut out = std::io::BufReader::new(stdout);
        let mut banner = String::new();
        while !banner.contains("Ctrl-C") {
            if out.read_line(&mut banner).unwrap() == 0 {
                break;
            }
        }
        (banner, out)
    });
    let (banner, _stdout) = tokio::time::timeout(Duration::from_secs(10), banner)
        .await
        .expect("the banner within 10 s")
        .unwrap();
    assert!(banner.contains("listening"), "{banner}");
    let serving = started.elapsed();
    assert!(child.0.try_wait().unwrap().is_none(), "the server exited");
    let client = reqwest::Client::new();
    let health = client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let r = get(
        &client,
        &format!("http://{addr}/books/9781593278281"),
        Some("free-demo-key"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("the rate-limit store is unavailable"),
        "{body}"
    );
    assert!(
        !body.contains("refused") && !body.contains("127.0.0.1"),
        "{body}"
    );
    // The flag reaches the server: a half-sent request is closed after about 1 s.
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut half, b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let mut buf = [0u8; 512];
    loop {
        let n = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::io::AsyncReadExt::read(&mut half, &mut buf),
        )
        .await
        .expect("closed within 5 s (--header-timeout 1s)");
        if n.map_or(true, |n| n == 0) {
            break;
        }
    }
    let closed = t.elapsed();
    assert!(closed < Duration::from_secs(3), "{closed:?}");
    println!(
        "fault: binary with Redis down at start: serving {} ms after launch, /health 200, a \
         lookup 503 without backend text; a half-sent request closed after {:.2} s \
         (--header-timeout 1s)",
        serving.as_millis(),
        closed.as_secs_f64()
    );
}

#[test]
fn the_binary_explains_its_errors() {
    let bin = env!("CARGO_BIN_EXE_bookshelf");
    let run = |args: &[&str]| std::process::Command::new(bin).args(args).output().unwrap();

    let out = run(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--redis URL"));

    assert!(String::from_utf8_lossy(&out.stdout).contains("appendfsync always"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Leasing: a plan or limit"));

    // Knobs that can only break are refused at start, the flag named.
    for (flag, value) in [
        ("--max-keys", "0"),
        ("--backend-timeout", "0s"),
        ("--header-timeout", "0ms"),
        ("--connections", "0"),
        ("--max-connections", "0"),
    ] {
        let out = run(&[flag, value]);
        assert!(!out.status.success(), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }

    let dir = std::env::temp_dir().join(format!("bookshelf-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plans = dir.join("plans.toml");
    // A plans file that cannot be read stops the start, the field named; so do leasing
    // settings the distributed crate refuses.
    for (text, says) in [
        (
            "[plans.free]\nlimits = [{ capacity = 20, refill = 20, period = \"1 fortnight\" }]\n",
            r#"plans.free.limits[0].period: "1 fortnight" is not a duration"#,
        ),
        (
            "[plans.free]\nlimits = [\"20/minute\"]\nlease = { lifetime = \"1 minute\" }\n",
            "plans.free.lease.lifetime: lifetime must be",
        ),
    ] {
        std::fs::write(&plans, text).unwrap();
        let out = run(&["--plans", plans.to_str().unwrap(), "--addr", "127.0.0.1:0"]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
    let out = run(&["--frobnicate"]);
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

trait JsonBody {
    async fn json_body(self) -> serde_json::Value;
}

impl JsonBody for reqwest::Response {
    async fn json_body(self) -> serde_json::Value {
        let text = self.text().await.unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"))
    }
}

#[test]
fn the_binary_serves_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader, Read};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bookshelf"))
        .args(["--addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(
        first.starts_with("Bookshelf API listening on http://127.0.0.1:"),
        "{first}"
    );
    let mut curl_line = String::new();
    out.read_line(&mut curl_line).unwrap();
    out.read_line(&mut curl_line).unwrap();
    assert!(
        curl_line.contains("curl -i -H 'X-API-Key: free-demo-key'"),
        "{curl_line}"
    );
    let addr = listening_on(&first);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/books/9781593278281");
        get(&client, &url, Some("free-demo-key")).await.status()
    });
    assert_eq!(status, StatusCode::OK);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("Bookshelf API stopped."), "{rest}");
}

/// `--redis-cluster` and `--redis-sentinel` build their backends at once, stores down or
/// not (calls then get the failure policy's answer); a certificate file that cannot be read
/// stops the start with the flag's name.
#[tokio::test]
async fn cluster_and_sentinel_stores_start_while_down_and_a_bad_ca_file_is_named() {
    let plans = || bookshelf::load_plans(None).unwrap();
    let args = |a: &[&str]| bookshelf::Args::parse(a.iter().map(|s| (*s).to_owned())).unwrap();
    let store = bookshelf::app_from(
        &args(&["--redis-cluster", "redis://127.0.0.1:1,redis://127.0.0.1:2"]),
        plans(),
    )
    .await
    .unwrap()
    .store;
    assert_eq!(
        store,
        "Redis Cluster at redis://127.0.0.1:1,redis://127.0.0.1:2"
    );
    let store = bookshelf::app_from(
        &args(&[
            "--redis-sentinel",
            "redis://127.0.0.1:1",
            "--sentinel-master",
            "limits",
        ]),
        plans(),
    )
    .await
    .unwrap()
    .store;
    assert!(store.contains("\"limits\""), "{store}");
    let missing = std::env::temp_dir().join("bookshelf-no-such-ca.pem");
    let e = bookshelf::app_from(
        &args(&[
            "--redis",
            "rediss://127.0.0.1:1",
            "--tls-ca",
            missing.to_str().unwrap(),
        ]),
        plans(),
    )
    .await
    .err()
    .unwrap();
    assert!(e.starts_with("--tls-ca:"), "{e}");
}
