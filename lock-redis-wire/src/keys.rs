//! Where a lock lives in Redis: its key, its fencing counter and its
//! release channel, all under one configurable prefix.
//!
//! For the lock `invoice/42` under the default prefix `lockkit:`:
//!
//! | what | name |
//! |---|---|
//! | the grant (value: owner token, with a TTL) | `lockkit:{invoice/42}` |
//! | the fencing counter (Redis Cluster, Redlock) | `lockkit:{invoice/42}:fence` |
//! | the release channel | `lockkit:{invoice/42}:released` |
//! | the fencing counter every lock shares (a single Redis server) | `lockkit:fence` |
//!
//! The `{...}` hash tag puts a lock's keys in one Redis Cluster slot, so one
//! Lua script may touch them together. The shared counter has no tag, so no
//! lock's scan pattern matches it. Inside the tag, `%` and `}` are written
//! as `%25` and `%7D`: a `}` would end the tag early (and an empty tag
//! would make Redis hash the whole name), and escaping keeps every valid
//! lock key usable and the mapping reversible.

use lock_core::{Error, Result};

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "lockkit:";

const COUNTER_SUFFIX: &str = ":fence";
/// Also written in [`BATCH_LUA`](crate::scripts::BATCH_LUA), which publishes on it.
const CHANNEL_SUFFIX: &str = ":released";

/// Names every lock key under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

/// The Redis names of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The key holding the grant: the owner token, with the TTL.
    pub lock: String,
    /// The key holding the fencing counter.
    pub counter: String,
    /// The channel a release is published on.
    pub channel: String,
}

/// A Redis key under the prefix, recognised by [`KeyLayout::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredKey {
    /// The grant of the named lock.
    Lock(String),
    /// The fencing counter of the named lock.
    Counter(String),
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl KeyLayout {
    /// A layout under `prefix`. The prefix may be empty; it may not contain
    /// `{` or `}`, which would move the hash tag. An empty prefix puts every
    /// name in the database's own namespace, beside the application's keys:
    /// the shared counter is then plainly `fence`, and a key of that name
    /// written by anything else would move every lock's fencing tokens.
    pub fn new(prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if prefix.contains(['{', '}']) {
            return Err(Error::invalid(
                "prefix",
                format!(
                    "key prefix `{prefix}` contains `{{` or `}}`, which Redis Cluster reads as a hash tag"
                ),
            ));
        }
        Ok(KeyLayout { prefix })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis names of the lock `key`.
    pub fn keys(&self, key: &str) -> LockKeys {
        // Built with push_str, not format!: this runs on every operation.
        let escaped = escape(key);
        let mut lock = String::with_capacity(self.prefix.len() + escaped.len() + 2);
        lock.push_str(&self.prefix);
        lock.push('{');
        lock.push_str(&escaped);
        lock.push('}');
        let with_suffix = |suffix: &str| {
            let mut name = String::with_capacity(lock.len() + suffix.len());
            name.push_str(&lock);
            name.push_str(suffix);
            name
        };
        LockKeys {
            counter: with_suffix(COUNTER_SUFFIX),
            channel: with_suffix(CHANNEL_SUFFIX),
            lock,
        }
    }

    /// The fencing counter every lock on a single server shares (see
    /// [`TokenRule::SharedClockFloor`](crate::TokenRule::SharedClockFloor)).
    pub fn shared_counter(&self) -> String {
        format!("{}fence", self.prefix)
    }

    /// A `SCAN MATCH` pattern for the keys (grants and counters) of every
    /// lock whose name starts with `key_prefix` (all locks when empty).
    pub fn scan_pattern(&self, key_prefix: &str) -> String {
        format!(
            "{}{{{}*",
            glob_escape(&self.prefix),
            glob_escape(&escape(key_prefix))
        )
    }

    /// A `PSUBSCRIBE` pattern matching the release channel of every lock.
    pub fn channel_pattern(&self) -> String {
        format!("{}{{*}}{CHANNEL_SUFFIX}", glob_escape(&self.prefix))
    }

    /// Which lock a Redis key or channel belongs to, if it is one of this layout's.
    pub fn parse(&self, name: &str) -> Option<StoredKey> {
        let rest = name.strip_prefix(&self.prefix)?.strip_prefix('{')?;
        let (tag, suffix) = rest.split_once('}')?;
        let key = unescape(tag)?;
        match suffix {
            "" => Some(StoredKey::Lock(key)),
            COUNTER_SUFFIX => Some(StoredKey::Counter(key)),
            _ => None,
        }
    }

    /// The lock whose release channel is `channel`, if it is one of this layout's.
    pub fn lock_of_channel(&self, channel: &str) -> Option<String> {
        let rest = channel.strip_prefix(&self.prefix)?.strip_prefix('{')?;
        let tag = rest.strip_suffix(CHANNEL_SUFFIX)?.strip_suffix('}')?;
        if tag.contains('}') {
            return None;
        }
        unescape(tag)
    }
}

fn escape(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.contains(['%', '}']) {
        return std::borrow::Cow::Borrowed(key);
    }
    std::borrow::Cow::Owned(key.replace('%', "%25").replace('}', "%7D"))
}

fn unescape(tag: &str) -> Option<String> {
    let mut out = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Escapes the characters `SCAN MATCH` and `PSUBSCRIBE` treat as glob syntax.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's hash tag rule: the part between the first `{` and the
    /// next `}`, when non-empty; otherwise the whole name.
    fn hash_tag(name: &str) -> &str {
        let tag = name.find('{').and_then(|open| {
            let inner = &name[open + 1..];
            inner
                .find('}')
                .filter(|len| *len > 0)
                .map(|len| &inner[..len])
        });
        tag.unwrap_or(name)
    }

    #[test]
    fn lock_counter_and_channel_share_a_hash_tag_for_any_key() {
        let layout = KeyLayout::default();
        for key in [
            "invoice/42",
            "}starts-with-brace",
            "a}b{c}",
            "100%",
            "%7D",
            "{}",
            "ü",
        ] {
            let k = layout.keys(key);
            assert_eq!(hash_tag(&k.lock), hash_tag(&k.counter), "{key}");
            assert_eq!(hash_tag(&k.lock), hash_tag(&k.channel), "{key}");
            assert_ne!(
                hash_tag(&k.lock),
                k.lock,
                "{key}: no hash tag in {}",
                k.lock
            );
            assert_eq!(
                layout.parse(&k.lock),
                Some(StoredKey::Lock(key.to_owned())),
                "{key}"
            );
            assert_eq!(
                layout.parse(&k.counter),
                Some(StoredKey::Counter(key.to_owned())),
                "{key}"
            );
            assert_eq!(
                layout.lock_of_channel(&k.channel).as_deref(),
                Some(key),
                "{key}"
            );
        }
        assert_eq!(layout.keys("invoice/42").lock, "lockkit:{invoice/42}");
        assert_ne!(layout.keys("%7D").lock, layout.keys("}").lock);
    }

    #[test]
    fn the_shared_counter_is_no_lock_s_key_and_no_scan_finds_it() {
        let layout = KeyLayout::default();
        let counter = layout.shared_counter();
        assert_eq!(counter, "lockkit:fence");
        assert_eq!(layout.parse(&counter), None);
        assert!(!counter.starts_with(&layout.scan_pattern("")[..layout.prefix().len() + 1]));
    }

    #[test]
    fn foreign_names_are_not_parsed() {
        let layout = KeyLayout::new("app:").unwrap();
        for name in [
            "other:{x}",
            "app:x",
            "app:{x}:other",
            "app:{bad%zz}",
            "app:{x}:released",
        ] {
            assert_eq!(layout.parse(name), None, "{name}");
        }
        assert_eq!(layout.lock_of_channel("app:{x}:fence"), None);
    }

    #[test]
    fn prefixes_with_braces_are_refused_and_globs_escaped() {
        assert!(KeyLayout::new("a{b").unwrap_err().is_invalid_input());
        let layout = KeyLayout::new("t*1:").unwrap();
        assert_eq!(layout.scan_pattern(""), "t\\*1:{*");
        assert_eq!(layout.scan_pattern("a}[b"), "t\\*1:{a%7D\\[b*");
        assert_eq!(layout.channel_pattern(), "t\\*1:{*}:released");
    }
}
