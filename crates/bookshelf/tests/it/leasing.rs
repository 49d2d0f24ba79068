//! The shipped search limit — one bucket for every client's searches, a hot key on a shared
//! store — leased as the shipped plans file says, and the same file without leasing, on Redis
//! and on PostgreSQL: the limit holds exactly either way, and leased, its key costs a round
//! trip per lease instead of one per search.

use std::time::{Duration, Instant};

use bucket4rs_distributed::{Backend, ProxyManager};
use bucket4rs_tower::{PlanTable, RateLimitLayer};
use reqwest::StatusCode;

use super::counted::{Counted, on, total};
use super::{
    Server, get, postgres_backend, redis_backend, redis_manager, redis_url, unique_prefix,
};

/// Clients searching at once, each on the pro plan (200 tokens a minute: 40 searches).
const CLIENTS: usize = 10;
/// Searches per client: within its plan, so that only the search limit refuses.
const EACH: usize = 20;
/// The shipped search limit: 600 tokens a minute for everyone, 5 a search.
const SEARCHES_AT_ONCE: u64 = 600 / 5;

/// What one run measured.
struct Run {
    granted: u64,
    elapsed: Duration,
    /// Transactions on the search limit's key.
    on_search_key: u64,
    /// Transactions in all.
    all: u64,
}

/// The shipped plans, leasing as shipped or not at all, and `CLIENTS` more pro keys.
fn plans(leased: bool) -> PlanTable {
    let text = if leased {
        bookshelf::DEFAULT_PLANS.to_owned()
    } else {
        let off = bookshelf::DEFAULT_PLANS.replace("lease = true", "lease = false");
        assert_ne!(off, bookshelf::DEFAULT_PLANS, "the shipped file leases");
        off
    };
    let mut plans = PlanTable::from_toml(&text).expect("the shipped plans file is valid");
    for c in 0..CLIENTS {
        plans.assign(format!("pro-{c}"), "pro").unwrap();
    }
    plans
}

/// A search of client `c`: 1 if it was granted, 0 if refused.
async fn search(client: &reqwest::Client, url: &str, c: usize) -> u64 {
    match get(client, url, Some(&format!("pro-{c}"))).await.status() {
        StatusCode::OK => 1,
        StatusCode::TOO_MANY_REQUESTS => 0,
        s => panic!("a search answered {s}"),
    }
}

/// `CLIENTS` clients search `EACH` times each through one instance on `backend`: at once
/// (each client on its own task), or one search at a time, the clients in turn.
async fn searches<B: Backend>(backend: B, leased: bool, at_once: bool) -> Run {
    let (backend, counts) = Counted::new(backend);
    let manager = ProxyManager::configure(backend)
        .key_prefix(unique_prefix("leasing"))
        .build()
        .unwrap();
    let server = Server::with_plans(
        RateLimitLayer::builder().backend(manager.clone()),
        plans(leased),
    )
    .await;
    let url = server.url("/books/search?q=rust");
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut granted = 0u64;
    if at_once {
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..CLIENTS {
            let (client, url) = (client.clone(), url.clone());
            tasks.spawn(async move {
                let mut granted = 0;
                for _ in 0..EACH {
                    granted += search(&client, &url, c).await;
                }
                granted
            });
        }
        while let Some(n) = tasks.join_next().await {
            granted += n.unwrap();
        }
    } else {
        for _ in 0..EACH {
            for c in 0..CLIENTS {
                granted += search(&client, &url, c).await;
            }
        }
    }
    let elapsed = start.elapsed();
    server.stop().await;
    Run {
        granted,
        elapsed,
        on_search_key: on(&counts, &manager.storage_key("\0search").unwrap()),
        all: total(&counts),
    }
}

/// The searches on a store, with leasing and without, one at a time and at once: the limit
/// holds exactly in each run, and leased, the hot key takes a round trip per lease, not per
/// search. One at a time, without leasing, it takes one per search; at once, the manager's
/// batching (concurrent calls on a key share a round trip) takes fewer, which the figures
/// printed show.
async fn leasing_serves_the_hot_key<B: Backend>(name: &str, backend: impl Fn() -> B) {
    let requests = u64::try_from(CLIENTS * EACH).unwrap();
    for at_once in [false, true] {
        let plain = searches(backend(), false, at_once).await;
        let leased = searches(backend(), true, at_once).await;
        let how = if at_once { "at once" } else { "one at a time" };
        for (run, leasing) in [(&plain, "without leasing"), (&leased, "leased")] {
            // 120 searches at once, and what refilled while the searches ran (10 tokens a
            // second: 2 searches), never more; one instance sees the whole bucket (its lease
            // included), so it refuses only when fewer than 5 tokens are left: never fewer.
            let refilled = u64::try_from(run.elapsed.as_millis() * 2 / 1_000).unwrap() + 1;
            assert!(
                (SEARCHES_AT_ONCE..=SEARCHES_AT_ONCE + refilled).contains(&run.granted),
                "{name}, {how}, {leasing}: {} searches granted in {:?}",
                run.granted,
                run.elapsed
            );
        }
        if !at_once {
            assert_eq!(plain.on_search_key, requests, "{name}: one per search");
        }
        // A lease holds up to 60 tokens (10 % of 600: 12 searches): about 10 leases, and a
        // round trip when the view of the bucket expires or refills while it refuses.
        assert!(
            leased.on_search_key * 5 <= requests,
            "{name}, {how}: {} transactions on the search key leased, {} without",
            leased.on_search_key,
            plain.on_search_key
        );
        let per = |n: u64| n as f64 / requests as f64;
        println!(
            "leasing on {name}: {requests} searches of {CLIENTS} clients {how}; without \
             leasing {} granted in {:.2} s, {:.2} transactions per search on the search key \
             ({:.2} in all); leased {} granted in {:.2} s, {:.2} per search on the search key \
             ({:.2} in all)",
            plain.granted,
            plain.elapsed.as_secs_f64(),
            per(plain.on_search_key),
            per(plain.all),
            leased.granted,
            leased.elapsed.as_secs_f64(),
            per(leased.on_search_key),
            per(leased.all),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_limit_leases_on_redis_and_holds_exactly() {
    let backend = redis_backend().await;
    leasing_serves_the_hot_key("Redis", || backend.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_limit_leases_on_postgres_and_holds_exactly() {
    let backend = postgres_backend().await;
    leasing_serves_the_hot_key("PostgreSQL", || backend.clone()).await;
}

/// A plans file whose search limit leases with leases that neither expire nor idle out while
/// the test runs (only a stop gives them back), and refills so slowly (600 a day) that the
/// bucket's tokens are whole numbers the test can count.
const HELD_PLANS: &str = r#"
[plans.pro]
limits = ["200 per minute"]
[keys]
pro-demo-key = "pro"
[limits.search]
path = "/books/search"
limits = ["600 per day"]
lease = { lifetime = "30s", idle = "30s" }
"#;

/// The binary on Redis with a leased search limit: while it runs, the tokens of its lease are
/// out of the shared bucket; once SIGTERM stopped it, they are back, every one: the bucket
/// holds its capacity less exactly what the granted searches took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_gives_its_leased_tokens_back_when_it_stops() {
    use std::io::BufRead as _;
    let dir = std::env::temp_dir().join(unique_prefix("held"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plans.toml");
    std::fs::write(&file, HELD_PLANS).unwrap();
    let prefix = unique_prefix("held");
    let mut child = super::Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_bookshelf"))
            .args(["--redis", &redis_url(), "--key-prefix", &prefix])
            .args(["--addr", "127.0.0.1:0", "--plans", file.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let addr = super::listening_on(&first);
    // The search limit's bucket, read as it is stored (this manager does not lease).
    let manager = redis_manager(&prefix).await;
    let bucket = manager
        .builder()
        .build("\0search", || {
            bucket4rs_core::BucketConfiguration::builder()
                .add_bandwidth(
                    bucket4rs_core::Bandwidth::simple(600, Duration::from_secs(86_400)).unwrap(),
                )
                .build()
                .unwrap()
        })
        .unwrap();
    let client = reqwest::Client::new();
    let search = format!("http://{addr}/books/search?q=rust");
    // Bookshelf connects to Redis in the background: until then, 503.
    let by = Instant::now() + Duration::from_secs(20);
    let mut granted = 0i64;
    loop {
        match get(&client, &search, Some("pro-demo-key")).await.status() {
            StatusCode::OK => break,
            StatusCode::SERVICE_UNAVAILABLE => assert!(Instant::now() < by, "Redis never answered"),
            s => panic!("a search answered {s}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    granted += 1;
    // Searches until a lease with tokens left is out of the bucket (the pro plan allows 40).
    let mut stored = bucket.available_tokens().await.unwrap();
    while stored == 600 - 5 * granted {
        assert!(granted < 30, "no lease taken after {granted} searches");
        let status = get(&client, &search, Some("pro-demo-key")).await.status();
        assert_eq!(status, StatusCode::OK, "search {}", granted + 1);
        granted += 1;
        stored = bucket.available_tokens().await.unwrap();
    }
    assert!(
        stored < 600 - 5 * granted,
        "{stored} stored after {granted} searches"
    );
    let held = 600 - 5 * granted - stored;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = child.0.wait().unwrap();
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");
    let after = bucket.available_tokens().await.unwrap();
    assert_eq!(
        after,
        600 - 5 * granted,
        "{granted} searches granted, {held} tokens were held in a lease"
    );
    println!(
        "leasing: {granted} searches granted, {held} tokens held in the instance's lease, all \
         back in the bucket after SIGTERM ({after} = 600 - 5 x {granted})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
