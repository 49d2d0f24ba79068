//! `--postgres` with libpq's TLS parameters (`sslmode=verify-full&sslrootcert=…`), which the
//! demo used to refuse at start (it read the URL with tokio-postgres' `Config`: "invalid value
//! for option `sslmode`"): against a PostgreSQL of the test's own that takes TLS connections
//! only, with certificates made at test time (the distributed crate's `own.rs`, `certs.rs`).

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::certs::Certs;
use crate::own::OwnPostgres;
use crate::{Server, get};

/// Only TLS connections are let in (`hostnossl … reject`): a request served went over TLS.
fn tls_server(certs: &Certs) -> OwnPostgres {
    let server = OwnPostgres::init();
    server.hba(
        "local all all trust\n\
         hostnossl all all 127.0.0.1/32 reject\n\
         hostssl all all 127.0.0.1/32 trust\n",
    );
    server.start_with(&format!(
        "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
        certs.path("server.pem").display(),
        certs.path("server.key").display(),
    ));
    server
}

async fn app_for(url: &str) -> Result<bookshelf::Started, String> {
    let args = bookshelf::Args::parse(["--postgres".to_owned(), url.to_owned()]).unwrap();
    bookshelf::app_from(&args, bookshelf::load_plans(None).unwrap()).await
}

const LOOKUP: &str = "/books/9781449373320";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_with_the_ca_in_the_url_serves_its_limits_over_tls() {
    let certs = Certs::new();
    certs.own_by("postgres");
    let server = tls_server(&certs);
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url_at("localhost"),
        certs.path("ca.pem").display()
    );
    let started = app_for(&url).await.expect("the URL is read");
    assert_eq!(started.store, format!("PostgreSQL at {url}"));
    let shelf = Server::serving(started.app).await;
    let client = reqwest::Client::new();
    // The backend connects and makes its table in the background: until then the failure
    // policy answers (503).
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&client, &shelf.url(LOOKUP), Some("free-demo-key")).await;
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < by, "PostgreSQL over TLS never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The free plan: 20 lookups a minute (one back every 3 s); the first is spent.
    let mut granted = 1;
    loop {
        let r = get(&client, &shelf.url(LOOKUP), Some("free-demo-key")).await;
        match r.status() {
            StatusCode::OK => granted += 1,
            StatusCode::TOO_MANY_REQUESTS => break,
            s => panic!("lookup {}: {s}", granted + 1),
        }
        assert!(granted <= 25, "no limit");
    }
    println!("bookshelf: --postgres verify-full over TLS granted {granted} lookups");
    assert!((20..=21).contains(&granted), "{granted} granted");
    shelf.stop().await;

    // A CA that did not sign the server's certificate: the URL is read, and limited requests
    // get the failure policy's answer, never a connection that skips the check.
    let wrong = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url_at("localhost"),
        certs.path("other-ca.pem").display()
    );
    let shelf = Server::serving(app_for(&wrong).await.expect("the URL is read").app).await;
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        let r = get(&client, &shelf.url(LOOKUP), Some("free-demo-key")).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shelf.stop().await;

    // A CA file that does not exist, or a mode libpq does not have: refused at start,
    // naming the flag.
    let missing = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url_at("localhost"),
        certs.path("missing.pem").display()
    );
    let Err(e) = app_for(&missing).await else {
        panic!("a missing CA file is refused");
    };
    assert!(
        e.starts_with("--postgres:") && e.contains("missing.pem"),
        "{e}"
    );
    let bogus = format!("{}?sslmode=verify-everything", server.url_at("localhost"));
    let Err(e) = app_for(&bogus).await else {
        panic!("an unknown sslmode is refused");
    };
    assert!(e.starts_with("--postgres:") && e.contains("sslmode"), "{e}");
}
