//! Safe storage key names: a prefix, then the user's key percent-encoded.

use crate::error::KeyError;

/// A storage key built by a [`KeyPolicy`]: printable ASCII, never containing `{` or `}`.
///
/// ```
/// use bucket4rs_distributed::KeyPolicy;
/// let key = KeyPolicy::new("rl")?.key("tenant {a}")?;
/// assert_eq!(key.as_str(), "rl:tenant%20%7Ba%7D");
/// # Ok::<(), bucket4rs_distributed::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey(String);

impl StorageKey {
    /// The key as text.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert_eq!(KeyPolicy::new("p")?.key("a")?.as_str(), "p:a");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as bytes.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert_eq!(KeyPolicy::new("p")?.key("a")?.as_bytes(), b"p:a");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
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
///
/// ```
/// use bucket4rs_distributed::KeyPolicy;
/// let p = KeyPolicy::new("api")?;
/// assert_ne!(p.key("a:b")?, p.key("a%3Ab")?);
/// # Ok::<(), bucket4rs_distributed::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPolicy {
    prefix: String,
    max_len: usize,
}

impl KeyPolicy {
    /// The default limit on a storage key's length, in bytes.
    pub const DEFAULT_MAX_LEN: usize = 512;

    /// A policy with `prefix` and the default length limit.
    ///
    /// # Errors
    /// [`KeyError::InvalidPrefix`] unless the prefix is 1 to 64 bytes of `[A-Za-z0-9._:/-]`.
    ///
    /// ```
    /// # use bucket4rs_distributed::{KeyError, KeyPolicy};
    /// assert_eq!(KeyPolicy::new("{tag}"), Err(KeyError::InvalidPrefix));
    /// ```
    pub fn new(prefix: impl Into<String>) -> Result<Self, KeyError> {
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
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert!(KeyPolicy::new("p")?.max_len(4).key("abc").is_err());
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    #[must_use]
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The prefix.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert_eq!(KeyPolicy::new("p")?.prefix(), "p");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The storage key for `user_key`.
    ///
    /// # Errors
    /// [`KeyError::TooLong`] when the encoded key exceeds the limit.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert_eq!(KeyPolicy::new("p")?.key([0xffu8, b'a'])?.as_str(), "p:%FFa");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    pub fn key(&self, user_key: impl AsRef<[u8]>) -> Result<StorageKey, KeyError> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let user = user_key.as_ref();
        let len = self.prefix.len()
            + 1
            + user
                .iter()
                .map(|&b| if plain(b) { 1 } else { 3 })
                .sum::<usize>();
        if len > self.max_len {
            return Err(KeyError::TooLong {
                len,
                max: self.max_len,
            });
        }
        let mut out = String::with_capacity(len);
        out.push_str(&self.prefix);
        out.push(':');
        for &b in user {
            if plain(b) {
                out.push(b as char);
            } else {
                out.push('%');
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 15) as usize] as char);
            }
        }
        Ok(StorageKey(out))
    }
}

fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

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
    }
}
