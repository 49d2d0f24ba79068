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
    // Each of the four is the same client's (three allowed, the fourth refused): a header
    // that keyed any of them otherwise would shift the refusal.
    let proxy = client(PROXY);
    let mut seen = Vec::new();
    for left in ["", "6.6.6.6, ", "garbage, 127.0.0.3, ", "for=1.2.3.4, "] {
        let r = lookup(&proxy, addr, Some(&format!("{left}198.51.100.20"))).await;
        seen.push(r.status());
    }
    assert_eq!(
        seen,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
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

/// Six clients search at once, 8 searches each (a search costs 5): a plan of 4 searches an
/// hour each, a search limit of 20 searches (100 tokens) an hour for everyone, so both
/// refuse, and a global limit of 1,000 tokens. Afterwards every bucket — each client's, the
/// search limit's and the global one — holds exactly its capacity less what the allowed
/// requests took: a request refused by one limit took nothing from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_exact_under_concurrency_over_http() {
    let plans = r#"
        default_plan = "ip"
        [plans.ip]
        limits = ["20 per hour"]
        [limits.search]
        path = "/books/search"
        limits = [{ id = "s", capacity = 100, refill = 100, period = "1h" }]
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
    let (mut allowed, mut looked_up) = (0, 0);
    for (i, t) in tasks.into_iter().enumerate() {
        let (ok, refused) = t.await.unwrap();
        assert_eq!(ok + refused, 8);
        assert!(ok <= 4, "{ok} searches for a plan of 4");
        allowed += ok;
        // The client's own bucket: 20 less 5 per allowed search (a lookup costs 1: allowed,
        // and then one less, unless nothing is left).
        let left = 20 - 5 * ok;
        let r = lookup(&client([127, 0, 1, 10 + i as u8]), addr, None).await;
        let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
        if left > 0 {
            assert_eq!(r.status(), StatusCode::OK, "client {i}: {rl}");
            looked_up += 1;
        } else {
            assert_eq!(
                r.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "client {i}: {rl}"
            );
        }
        assert!(
            rl.starts_with(&format!(r#""0";r={};"#, left.saturating_sub(1))),
            "client {i} allowed {ok}: {rl}"
        );
    }
    assert!(
        (1..=20).contains(&allowed),
        "{allowed} searches for a limit of 20"
    );
    // A new client's lookup reads the global bucket: 1,000 less 5 per allowed search,
    // less the lookups above that were allowed and its own token.
    let r = lookup(&client([127, 0, 1, 99]), addr, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        rl.contains(&format!(
            r#""all";r={};"#,
            1_000 - 5 * allowed - looked_up - 1
        )),
        "{rl}"
    );
    // A new client's search reads the search bucket (refused when it is empty: then it
    // holds less than one search).
    let r = client([127, 0, 1, 98])
        .get(format!("http://{addr}/books/search?q=x"))
        .send()
        .await
        .unwrap();
    let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    let left = 100 - 5 * allowed;
    let expected = if left >= 5 { left - 5 } else { left };
    assert!(rl.contains(&format!(r#""search";r={expected};"#)), "{rl}");
    println!("several limits over HTTP: {allowed} of 48 searches allowed (at most 20)");
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
