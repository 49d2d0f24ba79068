//! How the PostgreSQL backend connects: libpq's TLS parameters, which tokio-postgres does not
//! read (`sslmode=verify-ca|verify-full`, `sslrootcert`, `sslcert`, `sslkey`), taken out of
//! the URL, and the pool's TLS connector (rustls) or none (`sslmode=disable`).

use std::borrow::Cow;

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::config::SslMode as PgSslMode;

use super::options::SslMode;
use crate::error::{BackendError, BackendErrorKind};
use crate::tls::{TlsError, TlsOptions, Verify};

/// The TLS parameters of a URL.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SslParams {
    pub(super) mode: Option<SslMode>,
    pub(super) root_cert: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

const KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

fn bad_url(why: impl core::fmt::Display) -> BackendError {
    BackendError::new(
        BackendErrorKind::Other,
        format!("bad PostgreSQL URL: {why}"),
    )
}

impl SslParams {
    fn set(&mut self, key: &str, value: String) -> Result<(), BackendError> {
        match key {
            "sslmode" => self.mode = Some(value.parse().map_err(bad_url)?),
            "sslrootcert" => self.root_cert = Some(value),
            "sslcert" => self.cert = Some(value),
            _ => self.key = Some(value),
        }
        Ok(())
    }

    /// `options`' TLS certificates with the URL's files added.
    pub(super) fn certificates(&self, tls: &TlsOptions) -> Result<TlsOptions, BackendError> {
        let mut tls = tls.clone();
        if let Some(ca) = &self.root_cert {
            tls = tls.ca_file(ca).map_err(setting)?;
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                tls = tls.client_identity_files(cert, key).map_err(setting)?;
            }
            (None, None) => {}
            _ => return Err(bad_url("sslcert and sslkey go together")),
        }
        Ok(tls)
    }
}

fn setting(e: TlsError) -> BackendError {
    BackendError::new(BackendErrorKind::Other, e.to_string()).with_source(e)
}

/// `url` without its TLS parameters, and those parameters. A URL (`postgres://…?sslmode=…`)
/// or a key=value string (`host=… sslmode=…`).
pub(super) fn split_ssl(url: &str) -> Result<(String, SslParams), BackendError> {
    let mut params = SslParams::default();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if KEYS.contains(&key) {
                let value = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(bad_url)?;
                params.set(key, value.into_owned())?;
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((rest, params))
    } else {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            match word.split_once('=') {
                Some((key, value)) if KEYS.contains(&key) => {
                    params.set(key, value.trim_matches('\'').to_owned())?;
                }
                _ => kept.push(word),
            }
        }
        Ok((kept.join(" "), params))
    }
}

/// The mode of a configuration tokio-postgres read (its three modes).
pub(super) fn mode_of(config: &tokio_postgres::Config) -> SslMode {
    match config.get_ssl_mode() {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::Require => SslMode::Require,
        _ => SslMode::Prefer,
    }
}

/// The pool's connection manager for `config` in `mode` with `tls`: tokio-postgres negotiates
/// TLS (`disable`, `prefer`: TLS if offered, `require` and stricter: TLS or no connection) and
/// rustls checks the certificate as far as the mode says.
pub(super) fn manager(
    mut config: tokio_postgres::Config,
    mode: SslMode,
    tls: &TlsOptions,
) -> Result<Manager, BackendError> {
    let recycling = || ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let verify = match mode {
        SslMode::Disable => {
            config.ssl_mode(PgSslMode::Disable);
            return Ok(Manager::from_config(config, NoTls, recycling()));
        }
        SslMode::Prefer => Verify::Nothing,
        SslMode::Require if tls.has_private_cas() => Verify::Chain,
        SslMode::Require => Verify::Nothing,
        SslMode::VerifyCa => Verify::Chain,
        SslMode::VerifyFull => Verify::Full,
    };
    config.ssl_mode(if mode == SslMode::Prefer {
        PgSslMode::Prefer
    } else {
        PgSslMode::Require
    });
    let client = tls.client_config(verify).map_err(setting)?;
    let connector = tokio_postgres_rustls::MakeRustlsConnect::new(client);
    Ok(Manager::from_config(config, connector, recycling()))
}

/// The TLS cause of a failed connection: the rustls error in its chain, the server refusing
/// the connection for its client certificate, or tokio-postgres' refusal to go on without TLS
/// (its own error text: the server answered `N` to the TLS request, i.e. it runs without TLS).
pub(super) fn tls_cause(e: &tokio_postgres::Error) -> Option<TlsError> {
    if let Some(tls) = TlsError::cause(e) {
        return Some(tls);
    }
    // After the handshake, pg_hba's `clientcert` refuses a connection without a client
    // certificate (or with one it rejects) as an authorization error naming the certificate.
    if let Some(db) = e.as_db_error()
        && *db.code() == tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        && db.message().contains("certificate")
    {
        return Some(TlsError::ClientCertificateRejected(db.message().to_owned()));
    }
    let text: Cow<'_, str> = match std::error::Error::source(e) {
        Some(s) => s.to_string().into(),
        None => "".into(),
    };
    (text == "server does not support TLS").then_some(TlsError::NotTls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_urls_and_keyword_strings() {
        let (rest, p) = split_ssl(
            "postgres://u@h:5432/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5432/db?application_name=x");
        assert_eq!(p.mode, Some(SslMode::VerifyFull));
        assert_eq!(p.root_cert.as_deref(), Some("/tmp/ca.pem"));
        let (rest, p) = split_ssl("postgresql://h/db?sslmode=verify-ca").unwrap();
        assert_eq!(
            (rest.as_str(), p.mode),
            ("postgresql://h/db", Some(SslMode::VerifyCa))
        );
        let (rest, p) =
            split_ssl("host=h dbname=db sslmode=require sslcert=c.pem sslkey=c.key").unwrap();
        assert_eq!(rest, "host=h dbname=db");
        assert_eq!(p.mode, Some(SslMode::Require));
        assert_eq!(
            (p.cert.as_deref(), p.key.as_deref()),
            (Some("c.pem"), Some("c.key"))
        );
        assert_eq!(
            split_ssl("postgres://h/db").unwrap().1,
            SslParams::default()
        );
        let e = split_ssl("postgres://h/db?sslmode=verify").unwrap_err();
        assert!(e.message().contains("verify-full"), "{e}");
    }
}
