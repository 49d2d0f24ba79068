//! End to end, with clients at distinct loopback addresses (127.0.0.x): the client address
//! behind a trusted proxy and spoofing attempts, IPv6 grouping, several limits under
//! concurrency, shadow mode, exemptions, the gRPC refusal, the per-address connection cap,
//! and metrics read back from a recorder.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use bookshelf::{KeyBy, ServeOptions};
use bucket4rs_tower::{PlanTable, RateLimitLayer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The proxy every test trusts.
const PROXY: [u8; 4] = [127, 0, 0, 2];

/// A server keyed by client address behind `PROXY`, on `plans`, with `options`.
async fn server(
    plans: &str,
    options: ServeOptions,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let plans = PlanTable::from_toml(plans).unwrap();
    let trusted = ["127.0.0.2/32".parse().unwrap()];
    let app = bookshelf::app_keyed(RateLimitLayer::builder(), plans, KeyBy::Ip, &trusted).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
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
    (addr, tx)
}

/// A client whose connections come from `from`.
fn client(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from(from))
        .build()
        .unwrap()
}

async fn lookup(c: &reqwest::Client, addr: SocketAddr, xff: Option<&str>) -> reqwest::Response {
    let mut r = c.get(format!("http://{addr}/books/9781593278281"));
    if let Some(x) = xff {
        r = r.header("x-forwarded-for", x);
    }
    r.send().await.unwrap()
}

fn three_per_hour(name: &str) -> String {
    format!("default_plan = \"{name}\"\n[plans.{name}]\nlimits = [\"3 per hour\"]\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarding_headers_never_choose_the_key() {
    let (addr, _stop) = server(&three_per_hour("ip"), ServeOptions::default()).await;
    // An untrusted client: keyed by its own address whatever it claims.
    let direct = client([127, 0, 0, 3]);
    for i in 0..3 {
        let fake = format!("203.0.113.{i}");
        assert_eq!(
            lookup(&direct, addr, Some(&fake)).await.status(),
            StatusCode::OK
        );
    }
    for fake in ["198.51.100.1", "127.0.0.2", "garbage", "1.1.1.1, 127.0.0.2"] {
        let r = lookup(&direct, addr, Some(fake)).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{fake}");
    }
    // Through the trusted proxy: the address it appended, whatever the client put before.
    let proxy = client(PROXY);
    for left in ["", "6.6.6.6, ", "garbage, 127.0.0.3, ", "for=1.2.3.4, "] {
        let r = lookup(&proxy, addr, Some(&format!("{left}198.51.100.20"))).await;
        assert!(r.status() == StatusCode::OK || r.status() == StatusCode::TOO_MANY_REQUESTS);
    }
    let r = lookup(&proxy, addr, Some("6.6.6.7, 198.51.100.20")).await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one client, four headers"
    );
    // Another client behind the proxy has its own bucket; a malformed entry from the
    // proxy's side keys the request by the proxy itself.
    assert_eq!(
        lookup(&proxy, addr, Some("198.51.100.21")).await.status(),
        StatusCode::OK
    );
    for _ in 0..3 {
        lookup(&proxy, addr, Some("junk")).await;
    }
    let r = lookup(&proxy, addr, None).await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the proxy's own bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_are_grouped_by_their_64() {
    let (addr, _stop) = server(&three_per_hour("ip"), ServeOptions::default()).await;
    let proxy = client(PROXY);
    for host in [
        "2001:db8:1:2::a",
        "2001:db8:1:2:ffff::1",
        "[2001:db8:1:2::c]:443",
    ] {
        assert_eq!(
            lookup(&proxy, addr, Some(host)).await.status(),
            StatusCode::OK
        );
    }
    let r = lookup(&proxy, addr, Some("2001:db8:1:2:1234::9")).await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one /64, one bucket"
    );
    let r = lookup(&proxy, addr, Some("2001:db8:1:3::a")).await;
    assert_eq!(r.status(), StatusCode::OK, "another /64");
    // An IPv4-mapped address is its IPv4 address.
    for _ in 0..3 {
        lookup(&proxy, addr, Some("198.51.100.30")).await;
    }
    let r = lookup(&proxy, addr, Some("::ffff:198.51.100.30")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Six clients search at once (a search costs 5): a plan of 4 searches an hour each, a
/// search limit of 30 searches (150 tokens) an hour for everyone, a global limit of 1,000
/// tokens. Afterwards the search and global buckets hold exactly their capacity less what
/// the allowed requests took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_exact_under_concurrency_over_http() {
    let plans = r#"
        default_plan = "ip"
        [plans.ip]
        limits = ["20 per hour"]
        [limits.search]
        path = "/books/search"
        limits = [{ id = "s", capacity = 150, refill = 150, period = "1h" }]
        [limits.all]
        limits = ["1000 per hour"]
    "#;
    let (addr, _stop) = server(plans, ServeOptions::default()).await;
    let mut tasks = Vec::new();
    for i in 0..6u8 {
        tasks.push(tokio::spawn(async move {
            let c = client([127, 0, 1, 10 + i]);
            let (mut ok, mut refused) = (0u64, 0u64);
            for _ in 0..8 {
                let r = c
                    .get(format!("http://{addr}/books/search?q=rust"))
                    .send()
                    .await
                    .unwrap();
                match r.status() {
                    StatusCode::OK => ok += 1,
                    StatusCode::TOO_MANY_REQUESTS => refused += 1,
                    s => panic!("{s}"),
                }
            }
            (ok, refused)
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let (ok, refused) = t.await.unwrap();
        assert_eq!(ok + refused, 8);
        assert!(ok <= 4, "{ok} searches for a plan of 4");
        allowed += ok;
    }
    // A new client's lookup reads the global bucket: 1,000 less 5 per allowed search,
    // less its own token.
    let r = lookup(&client([127, 0, 1, 99]), addr, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        rl.contains(&format!(r#""all";r={};"#, 1_000 - 5 * allowed - 1)),
        "{rl}"
    );
    // A new client's search reads the search bucket.
    let r = client([127, 0, 1, 98])
        .get(format!("http://{addr}/books/search?q=x"))
        .send()
        .await
        .unwrap();
    let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        rl.contains(&format!(r#""search";r={};"#, 150 - 5 * allowed - 5)),
        "{rl}"
    );
    println!("several limits over HTTP: {allowed} of 48 searches allowed");
}

fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        s
    })
}

/// The counter of `plan`'s decisions with `outcome`, so far. A snapshot of the debugging
/// recorder takes the counts (and zeroes them) for every test of the binary: they are kept
/// here, by plan and outcome.
fn decisions(s: &Snapshotter, plan: &str, outcome: &str) -> u64 {
    static SEEN: OnceLock<std::sync::Mutex<std::collections::HashMap<(String, String), u64>>> =
        OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap();
    for (k, _, _, v) in s.snapshot().into_vec() {
        let k = k.key();
        let label = |n: &str| {
            k.labels()
                .find(|l| l.key() == n)
                .map(|l| l.value().to_owned())
        };
        if let (DebugValue::Counter(n), Some(p), Some(o)) = (v, label("plan"), label("outcome")) {
            *seen.entry((p, o)).or_default() += n;
        }
    }
    seen.get(&(plan.to_owned(), outcome.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_plans_serve_and_count_what_they_would_refuse() {
    let snapshots = recorder();
    let plans = "default_plan = \"e2e-shadow\"\n[plans.e2e-shadow]\nlimits = [\"2 per hour\"]\nshadow = true\n";
    let (addr, _stop) = server(plans, ServeOptions::default()).await;
    let c = client([127, 0, 2, 1]);
    for i in 0..5 {
        let r = lookup(&c, addr, None).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        let rl = r.headers()["ratelimit"].to_str().unwrap();
        assert!(rl.starts_with(r#""0";r="#), "{rl}");
    }
    assert_eq!(decisions(snapshots, "e2e-shadow", "allowed"), 2);
    assert_eq!(decisions(snapshots, "e2e-shadow", "shadow_refused"), 3);
    assert_eq!(decisions(snapshots, "e2e-shadow", "refused"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_networks_and_the_grpc_refusal() {
    let snapshots = recorder();
    let plans = "default_plan = \"e2e-grpc\"\n[plans.e2e-grpc]\nlimits = [\"1 per minute\"]\n[exempt]\nnetworks = [\"127.0.3.0/24\"]\n";
    let (addr, _stop) = server(plans, ServeOptions::default()).await;
    let exempt = client([127, 0, 3, 7]);
    for _ in 0..5 {
        let r = lookup(&exempt, addr, None).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("ratelimit").is_none());
    }
    let c = client([127, 0, 4, 1]);
    let call = || {
        c.post(format!("http://{addr}/pkg.Books/Get"))
            .header("content-type", "application/grpc")
            .send()
    };
    call().await.unwrap();
    let r = call().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "gRPC refusals are trailers-only responses"
    );
    assert_eq!(r.headers()["grpc-status"], "8");
    assert_eq!(r.headers()["retry-after"], "60");
    assert_eq!(r.headers()["content-type"], "application/grpc");
    assert_eq!(decisions(snapshots, "e2e-grpc", "refused"), 1);
}

/// One address holds at most its share of the connections; the rest is closed at once,
/// while other addresses are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let mut options = ServeOptions::default();
    options.max_connections = 8;
    options.max_connections_per_address = 3;
    let (addr, _stop) = server(&three_per_hour("ip"), options).await;
    let connect = |from: [u8; 4]| async move {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(addr).await.unwrap()
    };
    // Three half-sent requests from one address hold its share.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect([127, 0, 5, 1]).await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        held.push(s);
    }
    let mut fourth = connect([127, 0, 5, 1]).await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf))
        .await
        .expect("closed at once, not held")
        .unwrap_or(0);
    assert_eq!(n, 0, "the fourth connection of one address is closed");
    // Another address is served meanwhile.
    let r = lookup(&client([127, 0, 5, 2]), addr, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    drop(held);
}
