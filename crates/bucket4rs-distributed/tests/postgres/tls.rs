//! The PostgreSQL backend over TLS, against clusters of the tests' own with `ssl = on` and
//! certificates made at test time (`certs.rs`): `sslmode` from the URL, a private CA, mutual
//! TLS, and each refusal typed (a wrong CA, a wrong host name, a plaintext server, a missing
//! client certificate).

use std::error::Error as _;
use std::time::{Duration, Instant};

use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, PostgresBackend, PostgresOptions, ProxyManager,
    TlsError,
};

use super::multi_thread;
use crate::certs::Certs;
use crate::common::simple;
use crate::own::OwnPostgres;

/// Only TLS connections are let in (`hostnossl … reject`), and with `clients` only those
/// presenting a certificate signed by the CA.
fn tls_server(certs: &Certs, clients: bool) -> OwnPostgres {
    let server = OwnPostgres::init();
    let check = if clients { " clientcert=verify-ca" } else { "" };
    server.hba(&format!(
        "local all all trust\n\
         hostnossl all all 127.0.0.1/32 reject\n\
         hostnossl all all ::1/128 reject\n\
         hostssl all all 127.0.0.1/32 trust{check}\n\
         hostssl all all ::1/128 trust{check}\n"
    ));
    server.start_with(&format!(
        "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
        certs.path("server.pem").display(),
        certs.path("server.key").display(),
        certs.path("ca.pem").display(),
    ));
    server
}

fn certs() -> Certs {
    let certs = Certs::new();
    certs.own_by("postgres");
    certs
}

/// `url` with `query` appended (`sslmode=…&sslrootcert=…`).
fn with(url: &str, query: &str) -> String {
    format!("{url}?{query}")
}

/// The first answer of a backend (waiting while the server is starting): a migration.
async fn first_answer(backend: &PostgresBackend) -> (Result<(), BackendError>, Duration) {
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        let t = Instant::now();
        match backend.migrate().await {
            Err(e) if e.is_retryable() && Instant::now() < by => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            r => return (r, t.elapsed()),
        }
    }
}

fn tls_cause(e: &BackendError) -> Option<&TlsError> {
    e.source()?.downcast_ref::<TlsError>()
}

async fn created(url: &str) -> PostgresBackend {
    let options = PostgresOptions::default().connect_timeout(Duration::from_millis(500));
    PostgresBackend::connect(url, options)
        .await
        .unwrap_or_else(|e| panic!("{url}: created all the same: {e}"))
}

#[test]
fn postgres_over_tls_verify_full_with_a_private_ca_keeps_its_limits() {
    let certs = certs();
    let server = tls_server(&certs, false);
    multi_thread().block_on(async {
        let ca = certs.path("ca.pem");
        let url = with(
            &server.url_at("localhost"),
            &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
        );
        let backend = created(&url).await;
        let (r, _) = first_answer(&backend).await;
        r.unwrap();
        let manager = ProxyManager::new(backend.clone());
        let b = manager
            .builder()
            .build("k", || simple(3, Duration::from_secs(3_600)))
            .unwrap();
        let mut granted = Vec::new();
        for _ in 0..4 {
            granted.push(b.try_consume(1).await.unwrap());
        }
        assert_eq!(granted, [true, true, true, false]);
        // verify-ca checks the chain, not the name: 127.0.0.1 is accepted.
        let by_address = created(&with(
            &server.url(),
            &format!("sslmode=verify-ca&sslrootcert={}", ca.display()),
        ))
        .await;
        first_answer(&by_address).await.0.unwrap();
        // require (no CA): encrypted, unverified, as libpq does.
        let required = created(&with(&server.url(), "sslmode=require")).await;
        first_answer(&required).await.0.unwrap();
        // The server lets no plaintext connection in: disable is refused by the server.
        let plain = created(&with(&server.url(), "sslmode=disable")).await;
        let (r, _) = first_answer(&plain).await;
        assert!(r.is_err(), "a plaintext connection was let in");
        println!("tls: postgres verify-full with a private CA: 3 of 3 granted; verify-ca by address and require connect; stats {:?}", backend.stats());
    });
}

#[test]
fn postgres_mutual_tls_needs_the_client_certificate() {
    let certs = certs();
    let server = tls_server(&certs, true);
    multi_thread().block_on(async {
        let ca = certs.path("ca.pem").display().to_string();
        let base = with(
            &server.url_at("localhost"),
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        );
        let identity = format!(
            "&sslcert={}&sslkey={}",
            certs.path("client.pem").display(),
            certs.path("client.key").display()
        );
        let with_cert = created(&format!("{base}{identity}")).await;
        first_answer(&with_cert).await.0.unwrap();
        let without = created(&base).await;
        let (r, took) = first_answer(&without).await;
        let e = r.unwrap_err();
        println!("tls: postgres without the client certificate: {e} (in {took:?})");
        assert!(
            matches!(tls_cause(&e), Some(TlsError::ClientCertificateRejected(_))),
            "{e}"
        );
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
        assert!(!e.is_retryable(), "{e}");
    });
}

/// Each refusal is a typed, non-retryable error naming its cause, never a plaintext
/// connection; creating the backend succeeds each time (it connects in the background).
#[test]
fn postgres_tls_refusals_are_typed_errors() {
    let certs = certs();
    let server = tls_server(&certs, false);
    let plain = OwnPostgres::init();
    plain.start_with("-c ssl=off");
    multi_thread().block_on(async {
        let ca = certs.path("ca.pem").display().to_string();
        let other = certs.path("other-ca.pem").display().to_string();
        let cases = [
            (
                "a CA that did not sign the server's certificate",
                with(
                    &server.url_at("localhost"),
                    &format!("sslmode=verify-full&sslrootcert={other}"),
                ),
                TlsError::UnknownIssuer,
            ),
            (
                "the platform's roots only",
                with(&server.url_at("localhost"), "sslmode=verify-ca"),
                TlsError::UnknownIssuer,
            ),
            (
                "a host name the certificate does not name",
                with(
                    &server.url(),
                    &format!("sslmode=verify-full&sslrootcert={ca}"),
                ),
                TlsError::HostnameMismatch,
            ),
            (
                "a plaintext server",
                with(&plain.url_at("localhost"), "sslmode=require"),
                TlsError::NotTls,
            ),
        ];
        for (what, url, expected) in cases {
            let t = Instant::now();
            let backend = created(&url).await;
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{what}: {:?}",
                t.elapsed()
            );
            let key = ProxyManager::new(backend.clone()).storage_key("k").unwrap();
            let t = Instant::now();
            let e = backend.read(&key).await.unwrap_err();
            let took = t.elapsed();
            println!("tls: postgres, {what}: {e} (in {took:?})");
            assert_eq!(tls_cause(&e), Some(&expected), "{what}: {e}");
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e}");
            assert!(took < Duration::from_secs(1), "{what}: {took:?}");
            // Through a remote bucket: not retryable at the caller's level either.
            let b = ProxyManager::new(backend.clone())
                .builder()
                .build("k", || simple(3, Duration::from_secs(3_600)))
                .unwrap();
            let e = b.try_consume(1).await.unwrap_err();
            assert!(
                !e.is_retryable() && e.is_unavailable() && !e.is_in_doubt(),
                "{what}, through a remote bucket: {e}"
            );
        }
        // prefer on a plaintext server: plaintext, as libpq does.
        let preferred = created(&with(&plain.url(), "sslmode=prefer")).await;
        first_answer(&preferred).await.0.unwrap();
        // A CA file that does not exist: refused at once.
        let e = PostgresBackend::connect(
            &with(
                &server.url(),
                "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            ),
            PostgresOptions::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(tls_cause(&e), Some(TlsError::File { .. })), "{e}");
    });
}
