use std::net::{IpAddr, SocketAddr};

use proptest::prelude::*;

use super::*;

fn req_with(peer: &str, name: &str, lines: &[&str]) -> http::Request<()> {
    let mut b = http::Request::get("/");
    for l in lines {
        b = b.header(name, *l);
    }
    let mut r = b.body(()).unwrap();
    let peer: IpAddr = peer.parse().unwrap();
    r.extensions_mut().insert(SocketAddr::new(peer, 40_000));
    r
}

fn lb() -> ClientIp {
    ClientIp::behind(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
}

fn xff(c: &ClientIp, peer: &str, lines: &[&str]) -> Option<IpAddr> {
    c.client_addr(&RequestInfo::new(&req_with(peer, "x-forwarded-for", lines)))
}

fn fwd(c: &ClientIp, peer: &str, lines: &[&str]) -> Option<IpAddr> {
    c.client_addr(&RequestInfo::new(&req_with(peer, "forwarded", lines)))
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_writes() {
    for c in [ClientIp::new(), lb(), lb().forwarded_header()] {
        for h in ["x-forwarded-for", "forwarded", "x-real-ip"] {
            let r = req_with("198.51.100.7", h, &["1.2.3.4", "for=1.2.3.4"]);
            assert_eq!(c.client_addr(&RequestInfo::new(&r)), ip("198.51.100.7"));
        }
    }
}

#[test]
fn x_forwarded_for_is_read_from_the_right_to_the_first_untrusted_hop() {
    let c = lb();
    assert_eq!(xff(&c, "10.0.0.2", &["203.0.113.7"]), ip("203.0.113.7"));
    // The client's own entries (left of its address) are never read.
    assert_eq!(
        xff(&c, "10.0.0.2", &["6.6.6.6, 203.0.113.7, 10.1.1.1"]),
        ip("203.0.113.7")
    );
    // Several lines are one list, in order.
    assert_eq!(
        xff(&c, "10.0.0.2", &["6.6.6.6", "203.0.113.7", "10.1.1.1"]),
        ip("203.0.113.7")
    );
    // Ports, brackets, spaces, IPv4-mapped addresses.
    assert_eq!(
        xff(&c, "10.0.0.2", &["203.0.113.7:5555"]),
        ip("203.0.113.7")
    );
    assert_eq!(
        xff(&c, "10.0.0.2", &["[2001:db8::1]:443 , 10.9.9.9"]),
        ip("2001:db8::1")
    );
    assert_eq!(xff(&c, "10.0.0.2", &["2001:db8::1"]), ip("2001:db8::1"));
    assert_eq!(
        xff(&c, "10.0.0.2", &["::ffff:203.0.113.9"]),
        ip("203.0.113.9")
    );
    assert_eq!(
        xff(&c, "::ffff:10.0.0.2", &["203.0.113.7"]),
        ip("203.0.113.7")
    );
    // Every hop trusted: the leftmost is the client.
    assert_eq!(xff(&c, "10.0.0.2", &["10.4.4.4, 10.1.1.1"]), ip("10.4.4.4"));
    // No header: the proxy itself.
    assert_eq!(xff(&c, "10.0.0.2", &[]), ip("10.0.0.2"));
}

#[test]
fn a_malformed_hop_stops_the_walk_at_the_last_trusted_one() {
    let c = lb();
    for bad in [
        "garbage",
        "unknown",
        "_hidden",
        "",
        " ",
        "1.2.3",
        "1.2.3.4.5",
        "300.1.1.1",
        "1.2.3.4:",
        "1.2.3.4:99999999",
        "[2001:db8::1",
        "2001:db8::1]:80",
        "[1.2.3.4]",
        "2001:db8::1:80:",
        "1.2.3.4 5.6.7.8",
        "\"1.2.3.4\"",
        "1.2.3.4;for=5.6.7.8",
    ] {
        let line = format!("6.6.6.6, {bad}");
        assert_eq!(xff(&c, "10.0.0.2", &[&line]), ip("10.0.0.2"), "{bad:?}");
        let line = format!("6.6.6.6, {bad}, 10.3.3.3");
        assert_eq!(xff(&c, "10.0.0.2", &[&line]), ip("10.3.3.3"), "{bad:?}");
    }
    // Too many hops: the walk stops after 32 from the right.
    let many = vec!["10.0.0.9"; MAX_HOPS + 5].join(", ");
    let line = format!("203.0.113.7, {many}");
    assert_eq!(xff(&c, "10.0.0.2", &[&line]), ip("10.0.0.9"));
    let within = vec!["10.0.0.9"; MAX_HOPS - 1].join(", ");
    let line = format!("203.0.113.7, {within}");
    assert_eq!(xff(&c, "10.0.0.2", &[&line]), ip("203.0.113.7"));
    // A line that is not visible ASCII: nothing at or left of it is read.
    let mut r = req_with("10.0.0.2", "x-forwarded-for", &["203.0.113.7"]);
    r.headers_mut().append(
        "x-forwarded-for",
        http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
    );
    assert_eq!(lb().client_addr(&RequestInfo::new(&r)), ip("10.0.0.2"));
}

#[test]
fn forwarded_elements_are_read_from_the_right() {
    let c = lb().forwarded_header();
    assert_eq!(fwd(&c, "10.0.0.2", &["for=203.0.113.7"]), ip("203.0.113.7"));
    assert_eq!(
        fwd(
            &c,
            "10.0.0.2",
            &[
                r#"for=6.6.6.6, For="[2001:db8:cafe::17]:4711";proto=https;by=10.0.0.2, for=10.0.0.5"#
            ]
        ),
        ip("2001:db8:cafe::17")
    );
    assert_eq!(
        fwd(&c, "10.0.0.2", &["for=6.6.6.6", "for=198.51.100.1;host=x"]),
        ip("198.51.100.1")
    );
    assert_eq!(
        fwd(&c, "10.0.0.2", &[r#"for="203.0.113.7:80""#]),
        ip("203.0.113.7")
    );
    // Obfuscated, unknown, missing, doubled or broken `for`: stop at the proxy.
    for bad in [
        "for=unknown",
        "for=_gazonk",
        "proto=https",
        "for=",
        r#"for="[2001:db8::1"#,
        "for=1.2.3.4;for=5.6.7.8",
        r#"for="1.2.3.4"x"#,
        ",",
        "",
        r#"for="1.2.3.4, for=5.6.7.8""#,
    ] {
        assert_eq!(
            fwd(&c, "10.0.0.2", &[&format!("for=6.6.6.6, {bad}")]),
            ip("10.0.0.2"),
            "{bad:?}"
        );
    }
    // X-Forwarded-For is not read when the proxies write Forwarded, and the reverse.
    let r = req_with("10.0.0.2", "x-forwarded-for", &["6.6.6.6"]);
    assert_eq!(c.client_addr(&RequestInfo::new(&r)), ip("10.0.0.2"));
    assert_eq!(fwd(&lb(), "10.0.0.2", &["for=6.6.6.6"]), ip("10.0.0.2"));
}

#[test]
fn ipv6_keys_are_prefixes_and_mapped_addresses_are_ipv4() {
    let key = |c: &ClientIp, peer: &str| c.key(&RequestInfo::new(&req_with(peer, "x", &[])));
    let c = ClientIp::new();
    assert_eq!(
        key(&c, "2001:db8:1:2:aaaa::1").as_deref(),
        Some("2001:db8:1:2::/64")
    );
    assert_eq!(
        key(&c, "2001:db8:1:2:bbbb::2").as_deref(),
        Some("2001:db8:1:2::/64")
    );
    assert_eq!(key(&c, "::ffff:192.0.2.1").as_deref(), Some("192.0.2.1"));
    assert_eq!(key(&c, "192.0.2.1").as_deref(), Some("192.0.2.1"));
    let each = ClientIp::new().ipv6_prefix(128).unwrap();
    assert_eq!(
        key(&each, "2001:db8::1").as_deref(),
        Some("2001:db8::1/128")
    );
    let all = ClientIp::new().ipv6_prefix(0).unwrap();
    assert_eq!(key(&all, "2001:db8::1").as_deref(), Some("::/0"));
    assert!(ClientIp::new().ipv6_prefix(129).is_err());
    // No peer address: no key.
    let r = http::Request::get("/").body(()).unwrap();
    assert_eq!(c.key(&RequestInfo::new(&r)), None);
}

/// Arbitrary bytes of a header value: most are not valid values (skipped), the rest are
/// whatever a client may send.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "[ -~]{0,80}".prop_map(String::into_bytes),
        proptest::collection::vec(
            prop_oneof![
                Just("for="),
                Just("\""),
                Just(","),
                Just(";"),
                Just("["),
                Just("]"),
                Just(":"),
                Just("1.2.3.4"),
                Just("2001:db8::1"),
                Just("10.0.0.1"),
                Just("unknown"),
                Just(" "),
                Just("\\"),
                Just("_x"),
                Just("fd00::5"),
                Just("::ffff:10.0.0.3"),
            ],
            0..24
        )
        .prop_map(|v| v.concat().into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Whatever a client sends (any lines, any bytes) before what its trusted proxy appends,
    /// the client found is the address the proxy appended; an untrusted peer is itself;
    /// nothing panics.
    #[test]
    fn a_client_never_chooses_its_key(
        sent in proptest::collection::vec(value(), 0..4),
        real in prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u16; 8]>().prop_map(IpAddr::from),
        ],
        forwarded in any::<bool>(),
    ) {
        let c = if forwarded { lb().forwarded_header() } else { lb() };
        let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
        let build = |peer: &str, appended: Option<String>| {
            let mut r = http::Request::get("/").body(()).unwrap();
            for v in &sent {
                if let Ok(v) = http::HeaderValue::from_bytes(v) {
                    r.headers_mut().append(name, v);
                }
            }
            if let Some(a) = appended {
                r.headers_mut().append(name, http::HeaderValue::from_str(&a).unwrap());
            }
            r.extensions_mut().insert(SocketAddr::new(peer.parse().unwrap(), 1));
            r
        };
        let appended = match (real, forwarded) {
            (IpAddr::V6(v6), true) => format!("for=\"[{v6}]\""),
            (ip, true) => format!("for={ip}"),
            (ip, false) => ip.to_string(),
        };
        let found = c.client_addr(&RequestInfo::new(&build("10.0.0.2", Some(appended))));
        let real = normal(real);
        if c.trusts(real) {
            // A trusted address: the walk goes on into what the client wrote, and may only
            // stop at an address that is itself trusted or the first untrusted one written.
            prop_assert!(found.is_some());
        } else {
            prop_assert_eq!(found, Some(real));
        }
        // An untrusted peer is the client, whatever the headers.
        let direct = c.client_addr(&RequestInfo::new(&build("198.51.100.3", None)));
        prop_assert_eq!(direct, ip("198.51.100.3"));
        // And the key is always made (never a panic, never empty).
        let key = c.key(&RequestInfo::new(&build("10.0.0.2", None)));
        prop_assert!(key.is_some_and(|k| !k.is_empty()));
    }
}
