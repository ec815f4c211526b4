//! Owner tokens and other secrets that must never be printed.

use std::fmt;

/// 128 random bits that identify one grant to the backend. Only the holder
/// knows it, so only the holder can extend or release. `Debug` never shows it
/// and it has no `Display`: it cannot end up in logs or errors by accident.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh token from the operating system's random source, asked for
    /// each token: bytes kept in the process would be handed out twice by a
    /// process cloned from a snapshot (or a fork that kept its pid), and
    /// two owners sharing a token could release each other's locks.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        // The OS random source failing is not something a lock can recover from.
        getrandom::fill(&mut bytes).expect("the operating system's random source is unavailable");
        OwnerToken(bytes)
    }

    /// Rebuilds a token from its bytes (for example one stored by a tool).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lower-case hex, 32 characters: the form backends store.
    pub fn to_hex(&self) -> String {
        // A table, not `write!` per byte: this runs on every acquire,
        // extend and release, and the formatting machinery costs more than
        // the rest of a client-side call.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(32);
        for b in self.0 {
            hex.push(DIGITS[usize::from(b >> 4)] as char);
            hex.push(DIGITS[usize::from(b & 0x0f)] as char);
        }
        hex
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

/// A password or other credential. `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_stay_distinct_across_threads() {
        let per_thread = 5_000;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| OwnerToken::random())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for thread in threads {
            for token in thread.join().unwrap() {
                assert!(all.insert(token.0), "a token repeated");
            }
        }
        assert_eq!(all.len(), 4 * per_thread);
    }

    #[test]
    fn tokens_are_distinct_and_hex_encoded() {
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        assert_ne!(a, b);
        assert_eq!(a.to_hex().len(), 32);
        assert_eq!(OwnerToken::from_bytes([0xab; 16]).to_hex(), "ab".repeat(16));
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let t = OwnerToken::from_bytes([0xab; 16]);
        assert!(!format!("{t:?}").contains("ab"));
        assert_eq!(
            format!("{:?} {}", Secret::new("hunter2"), Secret::new("hunter2")),
            "<redacted> <redacted>"
        );
    }
}
