//! `LockKey`: a lock's name, validated once.

use std::fmt;

/// A lock's name, as chosen by the user, already validated against the
/// backend's [`Limits`](crate::Limits) by [`validate::key`](crate::validate::key).
///
/// Backends receive only `LockKey`s, so they never see an empty, oversized or
/// unstorable key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(String);

impl LockKey {
    /// Wraps an already validated string. Only validation creates keys.
    pub(crate) fn new_validated(key: String) -> Self {
        LockKey(key)
    }

    /// The key as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
