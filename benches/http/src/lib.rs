//! Shared pieces of the HTTP overhead measurements (`src/bin/*`, run by `scripts/*.sh`; see
//! `benches/README.md`): the bench plans and the command line of the measuring servers.

use std::net::SocketAddr;

/// The bench plans: the one key `bench-key`, whose limit is never reached, so every request
/// takes the layer's full allowed path (bucket update and both headers). The scripts pass the
/// same file to `bookshelf --plans`.
///
/// ```
/// let plans = bucket4rs_tower::PlanTable::from_toml(bucket4rs_http_benches::BENCH_PLANS);
/// assert!(plans.is_ok());
/// ```
pub const BENCH_PLANS: &str = include_str!("../bench-plans.toml");

/// The listening address of a measuring server that takes only `--addr HOST:PORT`
/// (`header_floor`, `governor_peer`, `limiter_floor`): `default` without it.
///
/// # Errors
/// Any other argument, a missing value, or an invalid address.
///
/// ```
/// use std::net::SocketAddr;
/// use bucket4rs_http_benches::parse_addr_only;
/// let default: SocketAddr = "127.0.0.1:18083".parse()?;
/// let args = ["--addr", "127.0.0.1:9"].map(String::from);
/// assert_eq!(parse_addr_only(args, default)?.port(), 9);
/// assert_eq!(parse_addr_only(Vec::new(), default)?, default);
/// assert!(parse_addr_only(["--plans".to_owned()], default).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn parse_addr_only(
    args: impl IntoIterator<Item = String>,
    default: SocketAddr,
) -> Result<SocketAddr, String> {
    let mut it = args.into_iter();
    let mut addr = default;
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--addr", Some(v)) => {
                addr = v
                    .parse()
                    .map_err(|_| format!("--addr: {v:?} is not HOST:PORT"))?;
            }
            _ => return Err("usage: [--addr HOST:PORT]".to_owned()),
        }
    }
    Ok(addr)
}
