//! The client's address: the peer's, or — behind proxies the operator trusts — the one those
//! proxies saw, read from `X-Forwarded-For` or `Forwarded` (RFC 7239) from the right.

use core::fmt;
use std::net::IpAddr;

use http::HeaderName;
use http::header::FORWARDED;
use ipnet::{IpNet, Ipv6Net, PrefixLenError};

use crate::key::RequestInfo;

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The most hops read from the right of a forwarding header: a chain of proxies longer than
/// this is not a deployment, and a client cannot make the layer read further.
pub(crate) const MAX_HOPS: usize = 32;

/// The header the trusted proxies write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    XForwardedFor,
    Forwarded,
}

/// Who the client is: the peer address, or behind proxies you trust, the address they saw.
///
/// A request whose peer is not one of the trusted proxies is the client itself, whatever its
/// headers say. A request from a trusted proxy is attributed by reading the header the
/// proxies write (`X-Forwarded-For` by default, or RFC 7239 `Forwarded` with
/// [`forwarded_header`](Self::forwarded_header)) **from the right**: each proxy appends the
/// address it received the request from, so the rightmost entries are the trusted ones and
/// the first entry from the right that is not a trusted proxy is the client. Everything left
/// of it was written by the client and is never read. An entry that is not an address (a
/// garbage value, `unknown`, an obfuscated `_name`), more than 32 hops, or a header that is
/// not visible ASCII stops the walk: the client is then the last trusted hop (the proxy), so
/// a malformed header can only put its sender in its proxy's bucket, never in a bucket of its
/// choosing. Ports and brackets (`192.0.2.1:8080`, `[2001:db8::1]:443`) are read; several
/// header lines count as one list, in order.
///
/// Read only the header your proxies write: a proxy that maintains `X-Forwarded-For` passes
/// a client's own `Forwarded` header through untouched, so reading both would let a client
/// choose its key.
///
/// Keys group IPv6 addresses by their /64 prefix (one host usually holds a whole /64;
/// [`ipv6_prefix`](Self::ipv6_prefix) to change it), and an IPv4-mapped IPv6 address
/// (`::ffff:192.0.2.1`) is its IPv4 address.
///
/// ```
/// use bucket4rs_tower::{ClientIp, KeyExtractor, RequestInfo};
/// use std::net::SocketAddr;
/// let behind_lb = ClientIp::behind(["10.0.0.0/8".parse()?]);
/// let mut req = http::Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.3") // 6.6.6.6: what the client wrote
///     .body(())?;
/// req.extensions_mut().insert(SocketAddr::from(([10, 0, 0, 2], 41000))); // the load balancer
/// let key = KeyExtractor::client(behind_lb).extract(&RequestInfo::new(&req));
/// assert_eq!(key.as_deref(), Some("203.0.113.7"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    source: Source,
    ipv6_prefix: u8,
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("trusted", &self.trusted)
            .field("source", &self.source)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish()
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientIp {
    /// The peer address, no proxy trusted (every forwarding header is ignored).
    ///
    /// ```
    /// # use bucket4rs_tower::{ClientIp, RequestInfo};
    /// let mut req = http::Request::get("/").header("x-forwarded-for", "1.2.3.4").body(())?;
    /// req.extensions_mut().insert(std::net::SocketAddr::from(([198, 51, 100, 9], 5000)));
    /// assert_eq!(ClientIp::new().client_addr(&RequestInfo::new(&req)), Some([198, 51, 100, 9].into()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new() -> Self {
        Self {
            trusted: Vec::new(),
            source: Source::XForwardedFor,
            ipv6_prefix: 64,
        }
    }

    /// Behind the proxies of these networks (your load balancers, ingress, CDN ranges),
    /// which write `X-Forwarded-For` (see [`forwarded_header`](Self::forwarded_header)).
    ///
    /// ```
    /// let behind = bucket4rs_tower::ClientIp::behind(["10.0.0.0/8".parse()?, "fd00::/8".parse()?]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn behind(trusted: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trusted: trusted.into_iter().map(|n| n.trunc()).collect(),
            ..Self::new()
        }
    }

    /// The trusted proxies write RFC 7239 `Forwarded` (`for=` of each element), which is
    /// then read instead of `X-Forwarded-For`.
    ///
    /// ```
    /// # use bucket4rs_tower::{ClientIp, RequestInfo};
    /// let behind = ClientIp::behind(["10.0.0.0/8".parse()?]).forwarded_header();
    /// let mut req = http::Request::get("/")
    ///     .header("forwarded", r#"for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.5"#)
    ///     .body(())?;
    /// req.extensions_mut().insert(std::net::SocketAddr::from(([10, 0, 0, 1], 5000)));
    /// assert_eq!(behind.client_addr(&RequestInfo::new(&req)), Some("2001:db8:cafe::17".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn forwarded_header(mut self) -> Self {
        self.source = Source::Forwarded;
        self
    }

    /// Groups IPv6 clients by this prefix length (default 64; 128 keys each address).
    ///
    /// # Errors
    /// A length above 128.
    ///
    /// ```
    /// # use bucket4rs_tower::{ClientIp, KeyExtractor, RequestInfo};
    /// let by_56 = ClientIp::new().ipv6_prefix(56)?;
    /// let mut req = http::Request::get("/").body(())?;
    /// req.extensions_mut().insert("[2001:db8:1:2:3::9]:443".parse::<std::net::SocketAddr>()?);
    /// assert_eq!(KeyExtractor::client(by_56).extract(&RequestInfo::new(&req)).as_deref(), Some("2001:db8:1::/56"));
    /// assert!(ClientIp::new().ipv6_prefix(129).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ipv6_prefix(mut self, len: u8) -> Result<Self, PrefixLenError> {
        Ipv6Net::new(core::net::Ipv6Addr::UNSPECIFIED, len)?;
        self.ipv6_prefix = len;
        Ok(self)
    }

    /// The client's address (IPv4-mapped IPv6 as IPv4), or `None` without a peer address.
    ///
    /// ```
    /// # use bucket4rs_tower::{ClientIp, RequestInfo};
    /// let mut req = http::Request::get("/").body(())?;
    /// req.extensions_mut().insert("[::ffff:192.0.2.1]:80".parse::<std::net::SocketAddr>()?);
    /// assert_eq!(ClientIp::new().client_addr(&RequestInfo::new(&req)), Some([192, 0, 2, 1].into()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client_addr(&self, req: &RequestInfo<'_>) -> Option<IpAddr> {
        let peer = normal(req.peer_addr()?.ip());
        if !self.trusts(peer) {
            return Some(peer);
        }
        let headers = req.headers();
        let mut client = peer;
        let mut hops = 0;
        let mut visit = |hop: Option<IpAddr>| {
            hops += 1;
            match hop {
                // Trusted: the next hop to the left is who it received the request from.
                Some(ip) if hops <= MAX_HOPS && self.trusts(ip) => {
                    client = ip;
                    true
                }
                Some(ip) if hops <= MAX_HOPS => {
                    client = ip;
                    false
                }
                // Not an address, or too far: the last trusted hop stands.
                _ => false,
            }
        };
        match self.source {
            Source::XForwardedFor => {
                let lines: Vec<_> = headers.get_all(X_FORWARDED_FOR).iter().collect();
                'walk: for line in lines.iter().rev() {
                    let Ok(line) = line.to_str() else {
                        break;
                    };
                    for entry in line.rsplit(',') {
                        if !visit(parse_hop(entry.trim())) {
                            break 'walk;
                        }
                    }
                }
            }
            Source::Forwarded => {
                let mut elements = Vec::new();
                for line in headers.get_all(FORWARDED) {
                    match line.to_str() {
                        Ok(line) => forwarded_for(line, &mut elements),
                        // A line that is not text: nothing left of it can be read.
                        Err(_) => elements.clear(),
                    }
                }
                for hop in elements.into_iter().rev() {
                    if !visit(hop) {
                        break;
                    }
                }
            }
        }
        Some(client)
    }

    /// The key of `req`'s client: its IPv4 address, or its IPv6 prefix.
    pub(crate) fn key(&self, req: &RequestInfo<'_>) -> Option<String> {
        Some(match self.client_addr(req)? {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => Ipv6Net::new(v6, self.ipv6_prefix)
                .map_or_else(|_| v6.to_string(), |n| n.trunc().to_string()),
        })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4-mapped IPv6 address as IPv4; any other address as it is.
pub(crate) fn normal(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One hop of a forwarding header: an address, with an optional port, IPv6 in brackets
/// (with a port) or bare; `None` for anything else.
pub(crate) fn parse_hop(s: &str) -> Option<IpAddr> {
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return addr
            .parse::<core::net::Ipv6Addr>()
            .ok()
            .map(|a| normal(a.into()));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(normal(ip));
    }
    // IPv4 with a port (an IPv6 address with a port must be bracketed).
    let (addr, port) = s.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    addr.parse::<core::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Appends the `for=` of each element of a `Forwarded` line to `out` (`None` for an element
/// without one, or whose value is not an address): RFC 7239's elements separated by `,`,
/// pairs by `;`, values tokens or quoted strings.
pub(crate) fn forwarded_for(line: &str, out: &mut Vec<Option<IpAddr>>) {
    let bytes = line.as_bytes();
    let mut i = 0;
    let mut current: Option<Option<IpAddr>> = None;
    loop {
        // One pair: name '=' value, or a malformed run up to the next separator.
        let start = i;
        while i < bytes.len() && !matches!(bytes[i], b'=' | b';' | b',') {
            i += 1;
        }
        let name = line[start..i].trim();
        let mut value: Option<String> = None;
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
            if i < bytes.len() && bytes[i] == b'"' {
                i += 1;
                let mut v = String::new();
                let mut closed = false;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' if i + 1 < bytes.len() => {
                            v.push(char::from(bytes[i + 1]));
                            i += 2;
                        }
                        b'"' => {
                            i += 1;
                            closed = true;
                            break;
                        }
                        b => {
                            v.push(char::from(b));
                            i += 1;
                        }
                    }
                }
                value = closed.then_some(v);
                while i < bytes.len() && !matches!(bytes[i], b';' | b',') {
                    // Anything after a quoted string but before a separator: malformed.
                    if bytes[i] != b' ' {
                        value = None;
                    }
                    i += 1;
                }
            } else {
                let s = i;
                while i < bytes.len() && !matches!(bytes[i], b';' | b',') {
                    i += 1;
                }
                value = Some(line[s..i].trim().to_owned());
            }
        }
        if name.eq_ignore_ascii_case("for") {
            let hop = value.as_deref().and_then(parse_hop);
            // A second `for` in one element is malformed.
            current = Some(if current.is_some() { None } else { hop });
        }
        if i >= bytes.len() || bytes[i] == b',' {
            out.push(current.take().flatten());
            if i >= bytes.len() {
                return;
            }
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests;
