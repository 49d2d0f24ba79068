//! The Redis backend over TLS, against redis-servers of the tests' own that listen on TLS only
//! (`--port 0 --tls-port …`), with certificates made at test time (`certs.rs`): a private CA,
//! mutual TLS, and each refusal typed (a wrong CA, a wrong host name, a plaintext server, a
//! missing client certificate).

use std::error::Error as _;
use std::time::{Duration, Instant};

use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, CircuitBreaker, DistributedError, ProxyManager,
    RedisBackend, RedisOptions, TlsError, TlsOptions,
};

use crate::certs::Certs;
use crate::common::{join_in_order, runtime, simple, unique_prefix};
use crate::redis_faults::OwnRedis;

/// A redis-server of our own listening on TLS only, on a free loopback port; killed on drop.
pub(crate) struct TlsRedis {
    pub(crate) port: u16,
    child: std::process::Child,
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TlsRedis {
    /// `clients`: whether it asks for (and requires) a client certificate.
    pub(crate) fn start(certs: &Certs, clients: bool) -> Self {
        let port = free_port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(certs.path("server.pem"))
            .arg("--tls-key-file")
            .arg(certs.path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(certs.path("ca.pem"))
            .args(["--tls-auth-clients", if clients { "yes" } else { "no" }])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (built with TLS) must be installed for the TLS tests");
        let me = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "own TLS redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    pub(crate) fn url(&self, host: &str) -> String {
        format!("rediss://{host}:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn trusting(certs: &Certs, ca: &str) -> TlsOptions {
    TlsOptions::default().ca_file(certs.path(ca)).unwrap()
}

fn with_client_certificate(certs: &Certs) -> TlsOptions {
    trusting(certs, "ca.pem")
        .client_identity_files(certs.path("client.pem"), certs.path("client.key"))
        .unwrap()
}

/// A backend's first call, until the server answers something other than "not yet" (the
/// server has just started): the answer, and how long the last call took.
async fn first_answer(backend: &RedisBackend) -> (Result<Option<Vec<u8>>, BackendError>, Duration) {
    let key = ProxyManager::new(backend.clone())
        .storage_key("probe")
        .unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        let t = Instant::now();
        let r = backend.read(&key).await;
        match r {
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

#[test]
fn redis_over_tls_only_with_a_private_ca_keeps_its_limits() {
    let certs = Certs::new();
    let server = TlsRedis::start(&certs, false);
    runtime().block_on(async {
        let backend = RedisBackend::connect(
            &server.url("localhost"),
            RedisOptions::default().tls(trusting(&certs, "ca.pem")),
        )
        .await
        .unwrap();
        let (r, _) = first_answer(&backend).await;
        assert_eq!(r.unwrap(), None);
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("tls"))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(3, Duration::from_secs(3_600)))
            .unwrap();
        let mut granted = Vec::new();
        for _ in 0..4 {
            granted.push(b.try_consume(1).await.unwrap());
        }
        assert_eq!(granted, [true, true, true, false]);
        assert_eq!(b.available_tokens().await.unwrap(), 0);
        // The server has no plaintext port: nothing answered there.
        let plain = RedisBackend::connect(
            &format!("redis://localhost:{}", server.port),
            RedisOptions::default().connect_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
        let (r, _) = first_answer(&plain).await;
        assert!(r.is_err(), "a plaintext client got an answer: {r:?}");
        println!(
            "tls: redis over TLS only: 3 of 3 granted, the 4th refused; stats {:?}",
            backend.stats()
        );
    });
}

#[test]
fn redis_mutual_tls_needs_the_client_certificate() {
    let certs = Certs::new();
    let server = TlsRedis::start(&certs, true);
    runtime().block_on(async {
        let with = RedisBackend::connect(
            &server.url("localhost"),
            RedisOptions::default().tls(with_client_certificate(&certs)),
        )
        .await
        .unwrap();
        let (r, _) = first_answer(&with).await;
        assert_eq!(r.unwrap(), None, "with the client certificate");
        let without = RedisBackend::connect(
            &server.url("localhost"),
            RedisOptions::default().tls(trusting(&certs, "ca.pem")),
        )
        .await
        .unwrap();
        let (r, took) = first_answer(&without).await;
        let e = r.unwrap_err();
        println!("tls: redis without the client certificate: {e} (in {took:?})");
        assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
        assert!(!e.is_retryable(), "{e}");
        assert!(
            matches!(tls_cause(&e), Some(TlsError::ClientCertificateRejected(_))),
            "{e}"
        );
    });
}

/// Each refusal is a typed, non-retryable error naming its cause, never a plaintext
/// connection; creating the backend succeeds each time (it connects in the background).
#[test]
fn redis_tls_refusals_are_typed_errors() {
    let certs = Certs::new();
    let server = TlsRedis::start(&certs, false);
    let plain = OwnRedis::start(None, None);
    runtime().block_on(async {
        let cases = [
            (
                "a CA that did not sign the server's certificate",
                server.url("localhost"),
                trusting(&certs, "other-ca.pem"),
                TlsError::UnknownIssuer,
            ),
            (
                "the platform's roots only",
                server.url("localhost"),
                TlsOptions::default(),
                TlsError::UnknownIssuer,
            ),
            (
                "a host name the certificate does not name",
                server.url("127.0.0.1"),
                trusting(&certs, "ca.pem"),
                TlsError::HostnameMismatch,
            ),
            (
                "a plaintext server",
                format!("rediss://localhost:{}", plain.port),
                trusting(&certs, "ca.pem"),
                TlsError::NotTls,
            ),
        ];
        for (what, url, tls, expected) in cases {
            let t = Instant::now();
            let options = RedisOptions::default()
                .connect_timeout(Duration::from_millis(300))
                .tls(tls);
            let backend = RedisBackend::connect(&url, options)
                .await
                .unwrap_or_else(|e| panic!("{what}: created all the same: {e}"));
            // No wait for the server; the platform's roots are read once per process.
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{what}: {:?}",
                t.elapsed()
            );
            let (r, took) = first_answer(&backend).await;
            let e = r.unwrap_err();
            println!("tls: redis, {what}: {e} (in {took:?})");
            assert_eq!(tls_cause(&e), Some(&expected), "{what}: {e}");
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e}");
            // A plaintext Redis mostly waits for the rest of what it takes for a command:
            // noticed at the connect timeout (300 ms), then asked in plaintext.
            assert!(took < Duration::from_secs(1), "{what}: {took:?}");
        }
        // TLS settings with a plaintext URL: refused, not silently ignored.
        let e = RedisBackend::connect(
            &format!("redis://localhost:{}", plain.port),
            RedisOptions::default().tls(trusting(&certs, "ca.pem")),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), BackendErrorKind::Other, "{e}");
        // A CA file that does not exist: refused when the options are made.
        let e = TlsOptions::default()
            .ca_file(certs.path("missing.pem"))
            .unwrap_err();
        assert!(matches!(e, TlsError::File { .. }), "{e}");
    });
}

/// Through a remote bucket, a refused handshake (a CA that did not sign the server's
/// certificate) is not retryable at the caller's level either, as the failure table says:
/// not for the call that met it, not for the other callers of its batch (who get copies of
/// the error without its source), and not once the refusals have opened the circuit breaker
/// (whose refusals say why). A port nobody listens on stays retryable.
#[test]
fn a_remote_bucket_behind_a_refused_tls_handshake_is_not_retryable() {
    let certs = Certs::new();
    let server = TlsRedis::start(&certs, false);
    runtime().block_on(async {
        let options = RedisOptions::default()
            .connect_timeout(Duration::from_millis(300))
            .tls(trusting(&certs, "other-ca.pem"));
        let backend = RedisBackend::connect(&server.url("localhost"), options)
            .await
            .unwrap();
        // Until the background connection has met the server's certificate.
        let (r, _) = first_answer(&backend).await;
        let e = r.unwrap_err();
        assert_eq!(tls_cause(&e), Some(&TlsError::UnknownIssuer), "{e}");
        let config = || simple(3, Duration::from_secs(3_600));
        let check = |what: &str, r: Result<bool, DistributedError>| -> DistributedError {
            let e = r.expect_err(what);
            assert!(
                matches!(&e, DistributedError::Backend(b) if b.kind() == BackendErrorKind::Unavailable),
                "{what}: {e}"
            );
            assert!(!e.is_retryable(), "{what}: retryable: {e}");
            assert!(e.is_unavailable() && !e.is_in_doubt(), "{what}: {e}");
            e
        };

        // Four callers at once on one key (breaker off): the first goes alone, the others
        // as one batch, whose error each gets.
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("tls-caller"))
            .circuit_breaker(CircuitBreaker::off())
            .build()
            .unwrap();
        let b = manager.builder().build("k", config).unwrap();
        let calls: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = _>>>> =
            (0..4).map(|_| Box::pin(b.try_consume(1)) as _).collect();
        let mut with_source = 0;
        for (i, r) in join_in_order(calls).await.into_iter().enumerate() {
            let e = check(&format!("concurrent call {i}"), r);
            with_source += usize::from(
                e.source()
                    .and_then(|s| s.source())
                    .is_some_and(|s| s.downcast_ref::<TlsError>().is_some()),
            );
        }
        assert!(with_source >= 1, "no caller saw the TLS cause");

        // The default breaker (open after 5 consecutive failures): refusals before it opens
        // and the breaker's own after are all non-retryable, and the latter name the cause.
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("tls-breaker"))
            .build()
            .unwrap();
        let b = manager.builder().build("k", config).unwrap();
        let mut by_breaker = 0;
        for i in 0..10 {
            let e = check(&format!("call {i}"), b.try_consume(1).await);
            if e.to_string().contains("consecutive calls failed") {
                assert!(e.to_string().contains("refused TLS handshake"), "{e}");
                by_breaker += 1;
            }
        }
        println!("tls: a remote bucket behind a refused handshake: 14 non-retryable errors, {by_breaker} from the open breaker");
        assert!(by_breaker >= 4, "the breaker did not open: {by_breaker}");

        // The control: no server at all is retryable (it may come up).
        let nobody = RedisBackend::connect(
            &format!("redis://127.0.0.1:{}", free_port()),
            RedisOptions::default(),
        )
        .await
        .unwrap();
        let manager = ProxyManager::configure(nobody)
            .circuit_breaker(CircuitBreaker::off())
            .build()
            .unwrap();
        let e = manager
            .builder()
            .build("k", config)
            .unwrap()
            .try_consume(1)
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
    });
}
