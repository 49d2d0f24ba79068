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

impl core::borrow::Borrow<str> for StorageKey {
    /// Lets maps keyed by `StorageKey` be searched with a [`StorageKeyRef`]'s text (the
    /// [`EmbeddedBackend`](crate::EmbeddedBackend) does, so a lookup needs no owned key).
    /// Hashing and equality agree with the key's text.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// use std::collections::HashSet;
    /// let set: HashSet<_> = [KeyPolicy::new("p")?.key("a")?].into_iter().collect();
    /// assert!(set.contains("p:a"));
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl StorageKey {
    /// A borrowed form of the key.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// let key = KeyPolicy::new("p")?.key("a")?;
    /// assert_eq!(key.as_key_ref().as_str(), "p:a");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    pub fn as_key_ref(&self) -> StorageKeyRef<'_> {
        StorageKeyRef(&self.0)
    }
}

/// A borrowed [`StorageKey`]: the same text (made by a [`KeyPolicy`], so printable ASCII
/// without `{` or `}`), held without an allocation, e.g. encoded on the stack for one call
/// ([`ProxyManager::in_process_bucket`](crate::ProxyManager::in_process_bucket)).
///
/// ```
/// # use bucket4rs_distributed::KeyPolicy;
/// let key = KeyPolicy::new("p")?.key("a b")?;
/// let r = key.as_key_ref();
/// assert_eq!(r.as_str(), "p:a%20b");
/// assert_eq!(r.to_owned(), key);
/// # Ok::<(), bucket4rs_distributed::KeyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKeyRef<'a>(&'a str);

impl StorageKeyRef<'_> {
    /// The key as text.
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// assert_eq!(KeyPolicy::new("p")?.key("a")?.as_key_ref().as_str(), "p:a");
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        self.0
    }

    /// An owned copy (allocates).
    ///
    /// ```
    /// # use bucket4rs_distributed::KeyPolicy;
    /// let key = KeyPolicy::new("p")?.key("a")?;
    /// assert_eq!(key.as_key_ref().to_owned(), key);
    /// # Ok::<(), bucket4rs_distributed::KeyError>(())
    /// ```
    #[allow(clippy::should_implement_trait)]
    pub fn to_owned(&self) -> StorageKey {
        StorageKey(self.0.to_owned())
    }
}

impl core::fmt::Display for StorageKeyRef<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.0)
    }
}

/// Encoded keys up to this many bytes are built on the stack by [`KeyPolicy::encode`].
const INLINE_KEY: usize = 128;

/// A storage key encoded for one call: on the stack when it fits in [`INLINE_KEY`] bytes.
pub(crate) enum EncodedKey {
    Inline { buf: [u8; INLINE_KEY], len: usize },
    Heap(StorageKey),
}

impl EncodedKey {
    /// The key's bytes, without the UTF-8 check of [`as_key_ref`](Self::as_key_ref).
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { buf, len } => &buf[..*len],
            Self::Heap(k) => k.as_bytes(),
        }
    }

    pub(crate) fn as_key_ref(&self) -> StorageKeyRef<'_> {
        match self {
            // ASCII by construction, so `from_utf8` cannot fail; the fallback keeps this
            // total without `unsafe`.
            Self::Inline { buf, len } => {
                StorageKeyRef(core::str::from_utf8(&buf[..*len]).unwrap_or(""))
            }
            Self::Heap(k) => k.as_key_ref(),
        }
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

    /// The storage key of `user_key` for one call: the same text as [`key`](Self::key),
    /// on the stack when it is short (no allocation).
    pub(crate) fn encode(&self, user_key: &[u8]) -> Result<EncodedKey, KeyError> {
        let p = self.prefix.len();
        let len = p + 1 + user_key.len();
        // The common case, a short key of plain bytes: checked, then copied. Compact on
        // purpose: it runs once per request of an HTTP layer, whose code is fetched anew for
        // each request (docs/http-overhead.md), so the rest is out of line.
        if len <= INLINE_KEY.min(self.max_len) && user_key.iter().all(|&b| plain(b)) {
            let mut buf = [0u8; INLINE_KEY];
            buf[..p].copy_from_slice(self.prefix.as_bytes());
            buf[p] = b':';
            buf[p + 1..len].copy_from_slice(user_key);
            return Ok(EncodedKey::Inline { buf, len });
        }
        self.encode_escaped(user_key)
    }

    /// [`encode`](Self::encode) of a key with bytes to escape, or a long one.
    #[inline(never)]
    fn encode_escaped(&self, user_key: &[u8]) -> Result<EncodedKey, KeyError> {
        let len = self.encoded_len(user_key)?;
        if len > INLINE_KEY {
            return self.key(user_key).map(EncodedKey::Heap);
        }
        let mut buf = [0u8; INLINE_KEY];
        let p = self.prefix.len();
        buf[..p].copy_from_slice(self.prefix.as_bytes());
        buf[p] = b':';
        let rest = &mut buf[p + 1..len];
        let mut at = 0;
        for &b in user_key {
            if plain(b) {
                rest[at] = b;
                at += 1;
            } else {
                let [h, l] = escape(b);
                rest[at..at + 3].copy_from_slice(&[b'%', h, l]);
                at += 3;
            }
        }
        Ok(EncodedKey::Inline { buf, len })
    }
}

fn escape(b: u8) -> [u8; 2] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]
}

/// Whether a storage key keeps `b` as it is: `[A-Za-z0-9._-]`. One table load per byte:
/// the check runs on every byte of every key of a per-request path (an HTTP layer), where
/// a bit-mask test of a 128-bit constant costs about three times the instructions.
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
        assert!(p.encode(b"abcdef").is_ok());
        assert_eq!(
            p.encode(b"abcdefg").err(),
            Some(KeyError::TooLong { len: 9, max: 8 })
        );
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

    /// `encode` (stack or heap) gives exactly `key`'s text, for plain and escaped keys on
    /// both sides of the inline limit.
    #[test]
    fn encode_matches_key() {
        let p = KeyPolicy::new("rl:x").unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for n in 0..2000usize {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = n % 200;
            let user: Vec<u8> = (0..len)
                .map(|i| {
                    let r = rng.rotate_left(i as u32 % 64) as u8;
                    if n % 3 == 0 { r } else { b'a' + r % 26 }
                })
                .collect();
            let owned = p.key(&user);
            let enc = p.encode(&user);
            match (owned, enc) {
                (Ok(k), Ok(e)) => {
                    assert_eq!(e.as_key_ref().as_str(), k.as_str());
                    assert_eq!(e.as_key_ref().to_owned(), k);
                    let inline = matches!(e, EncodedKey::Inline { .. });
                    assert_eq!(inline, k.as_str().len() <= INLINE_KEY);
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!(
                    "key {a:?} but encode {:?}",
                    b.map(|e| e.as_key_ref().to_owned())
                ),
            }
        }
    }
}
