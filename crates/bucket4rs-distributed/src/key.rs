//! Safe storage key names: a prefix, then the user's key percent-encoded.

use crate::error::KeyError;

/// A storage key, as a [`ProxyManager`](crate::ProxyManager) makes it from a user key
/// (`prefix ":" percent-encoded key`): printable ASCII, never containing `{` or `}`, and two
/// user keys never give the same storage key.
///
/// ```
/// use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
/// let manager = ProxyManager::configure(EmbeddedBackend::new()).key_prefix("rl").build()?;
/// let key = manager.storage_key("tenant {a}")?;
/// assert_eq!(key.as_str(), "rl:tenant%20%7Ba%7D");
/// # Ok::<(), bucket4rs_distributed::DistributedError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey(String);

impl StorageKey {
    /// The key as text.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::configure(EmbeddedBackend::new()).key_prefix("p").build()?;
    /// assert_eq!(manager.storage_key("a")?.as_str(), "p:a");
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as bytes.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::configure(EmbeddedBackend::new()).key_prefix("p").build()?;
    /// assert_eq!(manager.storage_key("a")?.as_bytes(), b"p:a");
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl core::fmt::Display for StorageKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How user keys become storage keys: `prefix ":" percent-encode(user key)`, at most
/// `max_len` bytes.
///
/// The encoding keeps `[A-Za-z0-9._-]` and writes every other byte as `%XX`, so:
/// - distinct user keys never collide (the encoding is injective: every `%` starts an escape);
/// - user text never forms a Redis Cluster hash tag (`{` and `}` are always escaped, and the
///   prefix may not contain them);
/// - the key is printable ASCII, safe in logs and `redis-cli`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyPolicy {
    prefix: String,
    max_len: usize,
}

impl KeyPolicy {
    /// The default limit on a storage key's length, in bytes.
    pub(crate) const DEFAULT_MAX_LEN: usize = 512;

    /// A policy with `prefix` and the default length limit.
    ///
    /// # Errors
    /// [`KeyError::InvalidPrefix`] unless the prefix is 1 to 64 bytes of `[A-Za-z0-9._:/-]`.
    pub(crate) fn new(prefix: impl Into<String>) -> Result<Self, KeyError> {
        let prefix = prefix.into();
        let ok = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !ok {
            return Err(KeyError::InvalidPrefix);
        }
        Ok(Self {
            prefix,
            max_len: Self::DEFAULT_MAX_LEN,
        })
    }

    /// Sets the limit on the encoded key's length.
    #[must_use]
    pub(crate) fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The storage key for `user_key`.
    ///
    /// # Errors
    /// [`KeyError::TooLong`] when the encoded key exceeds the limit.
    pub(crate) fn key(&self, user_key: impl AsRef<[u8]>) -> Result<StorageKey, KeyError> {
        let user = user_key.as_ref();
        let len = self.encoded_len(user)?;
        let mut out = String::with_capacity(len);
        out.push_str(&self.prefix);
        out.push(':');
        let all_plain = len == self.prefix.len() + 1 + user.len();
        if let (true, Ok(text)) = (all_plain, core::str::from_utf8(user)) {
            // Every byte is plain ASCII (the common case): one copy, no per-byte escaping.
            out.push_str(text);
        } else {
            for &b in user {
                if plain(b) {
                    out.push(b as char);
                } else {
                    let [h, l] = escape(b);
                    out.push('%');
                    out.push(h as char);
                    out.push(l as char);
                }
            }
        }
        Ok(StorageKey(out))
    }

    /// The length of `user`'s storage key, checked against the limit.
    fn encoded_len(&self, user: &[u8]) -> Result<usize, KeyError> {
        let escaped = user.iter().filter(|&&b| !plain(b)).count();
        let len = self.prefix.len() + 1 + user.len() + 2 * escaped;
        if len > self.max_len {
            return Err(KeyError::TooLong {
                len,
                max: self.max_len,
            });
        }
        Ok(len)
    }
}

fn escape(b: u8) -> [u8; 2] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]
}

/// Whether a storage key keeps `b` as it is: `[A-Za-z0-9._-]`. One table load per byte:
/// the check runs on every byte of every key, on every remote call.
#[inline]
fn plain(b: u8) -> bool {
    PLAIN[usize::from(b)]
}

/// `PLAIN[b]` is whether [`plain`] keeps byte `b`.
static PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_never_survive_and_keys_are_injective() {
        let p = KeyPolicy::new("rl").unwrap();
        let mut seen = std::collections::HashMap::new();
        for a in 0u8..=255 {
            for b in [b'{', b'}', b'%', b'a', 0] {
                let user = [a, b];
                let k = p.key(user).unwrap();
                assert!(!k.as_str().contains('{') && !k.as_str().contains('}'));
                assert!(k.as_str().is_ascii());
                if let Some(prev) = seen.insert(k.clone(), user) {
                    assert_eq!(prev, user, "collision on {k}");
                }
            }
        }
    }

    #[test]
    fn length_limit_counts_the_encoded_key() {
        let p = KeyPolicy::new("p").unwrap().max_len(8);
        assert!(p.key("abcdef").is_ok()); // "p:abcdef" = 8
        assert_eq!(p.key("abcdefg"), Err(KeyError::TooLong { len: 9, max: 8 }));
        assert_eq!(p.key("{}").unwrap().as_str(), "p:%7B%7D");
        assert_eq!(p.key([0xffu8, b'a']).unwrap().as_str(), "p:%FFa");
        assert_eq!(KeyPolicy::new("{tag}"), Err(KeyError::InvalidPrefix));
    }

    /// The table keeps exactly the documented bytes, `[A-Za-z0-9._-]`, and no byte of
    /// 128 or more.
    #[test]
    fn plain_bytes_are_exactly_letters_digits_dot_underscore_and_dash() {
        for b in 0..=u8::MAX {
            let expected = b.is_ascii_alphanumeric() || b"._-".contains(&b);
            assert_eq!(plain(b), expected, "byte {b:#04x}");
        }
    }
}
