//! Certificates made at test time (rcgen) for the tests' own TLS servers: a CA, a server
//! certificate for `localhost` (only: connecting to `127.0.0.1` is a host name mismatch), a
//! client certificate signed by the CA (mutual TLS) and an unrelated CA. Written as PEM files
//! in a fresh directory, removed on drop.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::common::unique_prefix;

pub(crate) struct Certs {
    pub(crate) dir: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("client"),
    );
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Certs {
    pub(crate) fn new() -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("certs"));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = ca("bucket4rs test CA");
        let other = ca_pem_only("an unrelated CA");
        let (server, server_key) = leaf(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth, &ca);
        let (client, client_key) = leaf(&["client"], ExtendedKeyUsagePurpose::ClientAuth, &ca);
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("other-ca.pem", other),
            ("server.pem", server),
            ("server.key", server_key),
            ("client.pem", client),
            ("client.key", client_key),
        ] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        Self { dir }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Makes the directory and its files the given user's, the key files readable by it
    /// only (PostgreSQL refuses a server key others can read).
    pub(crate) fn own_by(&self, user: &str) {
        let ok = std::process::Command::new("chown")
            .args(["-R", &format!("{user}:{user}")])
            .arg(&self.dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "chown {user} {}", self.dir.display());
        for key in ["server.key", "client.key"] {
            set_mode(&self.path(key), 0o600);
        }
    }
}

fn ca_pem_only(name: &str) -> String {
    ca(name).pem()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
