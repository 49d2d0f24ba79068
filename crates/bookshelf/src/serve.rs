//! The accept loop: HTTP/1.1 on hyper with a header-read timeout, an idle timeout and a cap
//! on open connections, so that slow or silent clients cannot hold the server.

use core::convert::Infallible;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request};
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::Service;

/// The most connections [`ServeOptions::max_connections`] may allow.
pub const MAX_CONNECTIONS: usize = 1 << 20;

/// How [`serve_with`] treats connections. The defaults are those of the binary's flags.
///
/// ```
/// let o = bookshelf::ServeOptions::default();
/// assert_eq!(o.header_timeout, std::time::Duration::from_secs(10));
/// assert_eq!(o.idle_timeout, std::time::Duration::from_secs(60));
/// assert_eq!(o.max_connections, 1024);
/// assert_eq!(o.max_connections_per_address, 64);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeOptions {
    /// How long a client has to send a request's headers, counted from the moment the
    /// server waits for them: the connection's opening, or the end of the previous
    /// response on a kept-alive connection (so an unused kept-alive connection is closed
    /// after this long too). Bytes trickling in do not extend it. Default 10 s.
    pub header_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed: a request
    /// body that stops arriving, a client that stops reading its response (and a handler
    /// that runs this long without a byte moving, so keep it above the slowest handler).
    /// Default 60 s.
    pub idle_timeout: Duration,
    /// Open connections at most; at the cap the server stops accepting (new connections
    /// wait in the kernel's backlog) until one closes. Default 1,024.
    pub max_connections: usize,
    /// Open connections of one client address at most (IPv4-mapped IPv6 counted as IPv4, and
    /// an IPv6 address counted with its /64, as the rate limit keys it: one host holds a /64):
    /// beyond, its new connections are closed at once, so that one address cannot take
    /// every connection of `max_connections`. Default 64.
    pub max_connections_per_address: usize,
    /// Addresses not held to `max_connections_per_address` (the load balancers in front).
    pub unlimited: Vec<ipnet::IpNet>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_address: 64,
            unlimited: Vec::new(),
        }
    }
}

impl ServeOptions {
    /// These options with `header_timeout`, `idle_timeout` and `max_connections`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = bookshelf::ServeOptions::new(Duration::from_secs(5), Duration::from_secs(30), 64);
    /// assert!(o.check().is_ok());
    /// assert!(bookshelf::ServeOptions::new(Duration::ZERO, Duration::from_secs(30), 64).check().is_err());
    /// ```
    pub fn new(header_timeout: Duration, idle_timeout: Duration, max_connections: usize) -> Self {
        Self {
            header_timeout,
            idle_timeout,
            max_connections,
            ..Self::default()
        }
    }

    /// Refuses the settings that can only break serving: a zero timeout (every connection
    /// closed at once) and a connection cap of zero (nothing ever accepted) or above
    /// [`MAX_CONNECTIONS`].
    ///
    /// # Errors
    /// What is wrong, naming the flag.
    ///
    /// ```
    /// let mut o = bookshelf::ServeOptions::default();
    /// o.max_connections = 0;
    /// assert!(o.check().unwrap_err().contains("--max-connections"));
    /// ```
    pub fn check(&self) -> Result<(), String> {
        if self.header_timeout.is_zero() {
            return Err("--header-timeout must be above zero".into());
        }
        if self.idle_timeout.is_zero() {
            return Err("--idle-timeout must be above zero".into());
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(format!(
                "--max-connections must be between 1 and {MAX_CONNECTIONS}"
            ));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections_per_address) {
            return Err(format!(
                "--max-connections-per-address must be between 1 and {MAX_CONNECTIONS}"
            ));
        }
        Ok(())
    }
}

/// Serves `app` on `listener` with `options` until `shutdown` completes, then finishes the
/// requests in flight (kept-alive connections are closed once idle). Handlers see the peer
/// address as `ConnectInfo<SocketAddr>`.
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] for options [`ServeOptions::check`] refuses. Accept
/// errors (a full file table, say) are logged and retried, never fatal.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let options = bookshelf::ServeOptions::default();
/// bookshelf::serve_with(listener, bookshelf::routes(), std::future::pending(), &options).await
/// # }
/// ```
pub async fn serve_with<S>(
    listener: TcpListener,
    app: S,
    shutdown: impl Future<Output = ()> + Send + 'static,
    options: &ServeOptions,
) -> io::Result<()>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    options
        .check()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    let http = Arc::new(http);
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let (stop, stopping) = watch::channel(());
    let idle = options.idle_timeout;
    let per_address = PerAddress::new(options);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted:
                    // wait a little rather than spin, and keep serving.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let Some(slot) = per_address.take(peer.ip()) else {
            // This address holds its share of the connections: closed at once, its permit
            // back for another client.
            tracing::debug!(%peer, "connection closed: the address is at its connection cap");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (http, app, stopping) = (Arc::clone(&http), app.clone(), stopping.clone());
        tokio::spawn(async move {
            connection(&http, stream, peer, app, idle, stopping).await;
            drop(slot);
            drop(permit);
        });
    }
    drop(stop);
    // Every connection holds a permit until it ends: all of them back means all ended.
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

/// Open connections per client address.
struct PerAddress {
    max: usize,
    unlimited: Vec<ipnet::IpNet>,
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// Whose connection it is: an IPv4-mapped address as IPv4, an IPv6 address as its /64.
fn client_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

/// One open connection of an address: counted until dropped.
struct Slot {
    ip: Option<std::net::IpAddr>,
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl PerAddress {
    fn new(options: &ServeOptions) -> Self {
        Self {
            max: options.max_connections_per_address,
            unlimited: options.unlimited.clone(),
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `ip`, unless the address holds its share already.
    fn take(&self, ip: std::net::IpAddr) -> Option<Slot> {
        let ip = client_of(ip);
        let open = Arc::clone(&self.open);
        if self.unlimited.iter().any(|n| n.contains(&ip)) {
            return Some(Slot { ip: None, open });
        }
        let mut map = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        drop(map);
        Some(Slot { ip: Some(ip), open })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(ip) = self.ip else { return };
        let mut map = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// One connection, until it ends, idles out, or is told to stop.
async fn connection<S>(
    http: &hyper::server::conn::http1::Builder,
    stream: TcpStream,
    peer: SocketAddr,
    app: S,
    idle: Duration,
    mut stopping: watch::Receiver<()>,
) where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let origin = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched {
        inner: stream,
        origin,
        last: Arc::clone(&last),
    });
    let service = TowerToHyperService::new(WithPeer { app, peer });
    let conn = http.serve_connection(io, service);
    tokio::pin!(conn);
    let mut told = false;
    loop {
        let quiet = elapsed_ms(origin).saturating_sub(last.load(Ordering::Relaxed));
        let left = idle.saturating_sub(Duration::from_millis(quiet));
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stopping.changed(), if !told => {
                conn.as_mut().graceful_shutdown();
                told = true;
            }
            () = tokio::time::sleep(left) => {
                let quiet = elapsed_ms(origin).saturating_sub(last.load(Ordering::Relaxed));
                if Duration::from_millis(quiet) >= idle {
                    tracing::debug!(%peer, "connection closed after the idle timeout");
                    return;
                }
            }
        }
    }
}

fn elapsed_ms(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The application with the peer address put where axum's `ConnectInfo` extractor and the
/// layer's client-IP key look for it.
#[derive(Clone)]
struct WithPeer<S> {
    app: S,
    peer: SocketAddr,
}

impl<S> Service<hyper::Request<Incoming>> for WithPeer<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.app.poll_ready(cx)
    }

    fn call(&mut self, req: hyper::Request<Incoming>) -> Self::Future {
        let mut req = req.map(axum::body::Body::new);
        req.extensions_mut().insert(ConnectInfo(self.peer));
        self.app.call(req)
    }
}

/// A stream that records when a byte last moved, for the idle timeout.
struct Watched {
    inner: TcpStream,
    origin: Instant,
    /// Milliseconds since `origin` at the last read or write of at least one byte.
    last: Arc<AtomicU64>,
}

impl Watched {
    fn moved(&self) {
        self.last.store(elapsed_ms(self.origin), Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::client_of;

    #[test]
    fn a_client_is_its_ipv4_address_or_its_ipv6_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(client_of(ip("198.51.100.7")), ip("198.51.100.7"));
        assert_eq!(client_of(ip("::ffff:198.51.100.7")), ip("198.51.100.7"));
        assert_eq!(client_of(ip("2001:db8:1:2:ffff::9")), ip("2001:db8:1:2::"));
        assert_eq!(
            client_of(ip("2001:db8:1:2::1")),
            client_of(ip("2001:db8:1:2::2"))
        );
        assert_ne!(
            client_of(ip("2001:db8:1:2::1")),
            client_of(ip("2001:db8:1:3::1"))
        );
    }
}
