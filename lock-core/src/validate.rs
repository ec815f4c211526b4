//! Key and TTL validation: the one place where user input is checked.
//!
//! Every backend accepts every key that passes here, so swapping backends
//! never turns a working key into an error.

use std::time::Duration;

use crate::{Error, Limits, LockKey, MAX_PERMITS, Mode, Result};

/// The longest key any backend accepts, in bytes of UTF-8. A backend may
/// document a lower limit in its [`Limits`].
pub const MAX_KEY_BYTES: usize = 512;

/// The longest TTL any backend accepts. A lock held longer belongs in a
/// guard that renews it, so that a crashed holder does not block others for days.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks a key against the contract and the backend's limits.
///
/// Refused: the empty key, keys longer than `limits.max_key_bytes`, and keys
/// holding a character that does not print as itself (see [`unprintable`]):
/// PostgreSQL cannot store NUL in text, and such characters make operator
/// tools lie. A refused key is never silently changed.
pub fn key(key: &str, limits: &Limits) -> Result<LockKey> {
    if key.is_empty() {
        return Err(Error::invalid(
            "key",
            "lock key is empty; give the lock a name",
        ));
    }
    let max = limits.max_key_bytes.min(MAX_KEY_BYTES);
    if key.len() > max {
        return Err(Error::invalid(
            "key",
            format!(
                "lock key is {} bytes; the {} backend accepts at most {max}",
                key.len(),
                limits.backend
            ),
        ));
    }
    if let Some((at, c, class)) = key
        .char_indices()
        .find_map(|(at, c)| unprintable(c).map(|class| (at, c, class)))
    {
        // The character is named by its code point, never printed: printed,
        // it could reorder or hide the rest of the message.
        return Err(Error::invalid(
            "key",
            format!(
                "lock key contains U+{:04X}, a {class}, at byte {at}; keys must be printable text",
                c as u32
            ),
        ));
    }
    if !unicode_normalization::is_nfc(key) {
        return Err(Error::invalid(
            "key",
            "lock key is not in Unicode normalization form C (NFC): it holds a character \
             written as a base and a combining mark that has a precomposed form, so it would \
             print like another key yet name another lock; normalise it to NFC",
        ));
    }
    Ok(LockKey::new_validated(key.to_owned()))
}

/// Why `c` may not appear in a key or on an operator's terminal, or `None`
/// when it prints as itself. Refused: control characters (Unicode category
/// Cc), format characters (Cf: bidirectional overrides, zero-width
/// characters, the byte-order mark), line and paragraph separators (Zl, Zp),
/// spaces other than U+0020 (Zs), private-use characters (Co), unassigned
/// code points and noncharacters (Cn, as of the Unicode version
/// `unicode-properties` knows), U+FFFD, which a lossy decoding leaves, and
/// the other characters Unicode calls default-ignorable (variation
/// selectors, the combining grapheme joiner, Hangul fillers), which print
/// as nothing. [`key`] also refuses keys not in normalization form C.
pub fn unprintable(c: char) -> Option<&'static str> {
    use unicode_properties::{GeneralCategory as G, UnicodeGeneralCategory};
    if c == ' ' {
        return None;
    }
    Some(match c.general_category() {
        G::Control => "control character",
        G::Format => "format character (invisible; it can reorder or hide text)",
        G::LineSeparator | G::ParagraphSeparator => "line or paragraph separator",
        G::SpaceSeparator => "space separator other than U+0020 (it looks like a plain space)",
        G::PrivateUse => "private-use character (no agreed glyph)",
        G::Unassigned | G::Surrogate => "unassigned code point or noncharacter",
        _ if c == char::REPLACEMENT_CHARACTER => {
            "replacement character (what a lossy decoding leaves)"
        }
        _ if is_default_ignorable(c) => {
            "invisible character (default-ignorable: it prints as nothing)"
        }
        _ => return None,
    })
}

/// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt,
/// Unicode 16), the characters that render as nothing. Written here because
/// no crate in the tree exposes the property; many are also format
/// characters, caught above, and what remains is a short, stable list.
fn is_default_ignorable(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x034F
            | 0x061C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// Checks a TTL against the backend's limits and the drift margin.
///
/// A TTL the backend cannot honour exactly (below its minimum, above its
/// maximum, or not a multiple of its granularity, such as etcd's whole
/// seconds) is refused, never rounded down. `drift` is the margin subtracted
/// from the TTL to compute the deadline: a TTL not longer than it would
/// grant a lock that is already past its deadline.
pub fn ttl(ttl: Duration, limits: &Limits, drift: Duration) -> Result<Duration> {
    let backend = limits.backend;
    if ttl.is_zero() {
        return Err(Error::invalid(
            "ttl",
            "ttl is zero; a lock needs a positive time to live",
        ));
    }
    let max = limits.max_ttl.min(MAX_TTL);
    if ttl > max {
        return Err(Error::invalid(
            "ttl",
            format!(
                "ttl is {ttl:?}; the {backend} backend accepts at most {max:?} (hold longer with a guard, which renews)"
            ),
        ));
    }
    if ttl < limits.min_ttl {
        return Err(Error::invalid(
            "ttl",
            format!(
                "ttl is {ttl:?}; the {backend} backend accepts at least {:?}",
                limits.min_ttl
            ),
        ));
    }
    let grain = limits.ttl_granularity.as_nanos();
    if grain > 1 && !ttl.as_nanos().is_multiple_of(grain) {
        return Err(Error::invalid(
            "ttl",
            format!(
                "ttl is {ttl:?}; the {backend} backend keeps TTLs in whole multiples of {:?}, so it cannot honour this one exactly",
                limits.ttl_granularity
            ),
        ));
    }
    if ttl <= drift {
        return Err(Error::invalid(
            "ttl",
            format!(
                "ttl is {ttl:?}, not longer than the drift margin of {drift:?}, so the lock would be past its deadline when granted"
            ),
        ));
    }
    Ok(ttl)
}

/// Refuses a timeout under 1 ms, naming the option: with it every call
/// would fail before its answer could come. (Connection settings of every
/// backend come through here.)
pub fn timeout(option: &'static str, value: Duration) -> Result<Duration> {
    if value < Duration::from_millis(1) {
        return Err(Error::invalid(
            option,
            format!("`{option}` is {value:?}; a timeout must be at least 1 ms"),
        ));
    }
    Ok(value)
}

/// Checks a mode's parameters (a semaphore's number of permits) and that
/// the backend offers it: [`Error::InvalidInput`] naming `permits` and the
/// limit, or [`Error::Unsupported`] with the backend's reason.
pub fn mode(mode: Mode, capabilities: &crate::Capabilities) -> Result<Mode> {
    if let Mode::Semaphore { permits } = mode {
        if permits == 0 {
            return Err(Error::invalid(
                "permits",
                "a semaphore of 0 permits could never be held; it needs at least 1",
            ));
        }
        if permits > MAX_PERMITS {
            return Err(Error::invalid(
                "permits",
                format!("a semaphore of {permits} permits; at most {MAX_PERMITS} are accepted"),
            ));
        }
    }
    if !capabilities.offer(&mode).is_offered() {
        return Err(Error::unsupported_mode(capabilities, &mode));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            backend: "test",
            ..Limits::default()
        }
    }

    #[test]
    fn empty_key_is_refused() {
        let err = key("", &limits()).unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
    }

    #[test]
    fn oversized_key_names_its_length_and_the_limit() {
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let err = key(&long, &limits()).unwrap_err().to_string();
        assert!(
            err.contains("513 bytes") && err.contains("at most 512"),
            "{err}"
        );
    }

    #[test]
    fn backend_limit_below_the_contract_limit_wins() {
        let l = Limits {
            max_key_bytes: 10,
            ..limits()
        };
        assert!(key("0123456789", &l).is_ok());
        let err = key("0123456789a", &l).unwrap_err().to_string();
        assert!(err.contains("at most 10"), "{err}");
    }

    #[test]
    fn control_characters_are_refused_not_stripped() {
        let err = key("a\0b", &limits()).unwrap_err().to_string();
        assert!(err.contains("control character"), "{err}");
        assert!(key("a\nb", &limits()).is_err());
        assert_eq!(
            key("orders/42 ü", &limits()).unwrap().as_str(),
            "orders/42 ü"
        );
    }

    #[test]
    fn ttl_limits_are_named() {
        let l = Limits {
            min_ttl: Duration::from_secs(1),
            ttl_granularity: Duration::from_secs(1),
            ..limits()
        };
        let d = Duration::from_millis(12);
        assert!(
            ttl(Duration::ZERO, &l, d)
                .unwrap_err()
                .to_string()
                .contains("zero")
        );
        assert!(
            ttl(Duration::from_millis(500), &l, d)
                .unwrap_err()
                .to_string()
                .contains("at least 1s")
        );
        assert!(
            ttl(Duration::from_millis(1500), &l, d)
                .unwrap_err()
                .to_string()
                .contains("whole multiples of 1s")
        );
        assert!(
            ttl(Duration::from_secs(7 * 86400), &l, d)
                .unwrap_err()
                .to_string()
                .contains("at most 86400s")
        );
        assert_eq!(
            ttl(Duration::from_secs(2), &l, d).unwrap(),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn ttl_within_the_drift_margin_is_refused() {
        let err = ttl(
            Duration::from_millis(10),
            &limits(),
            Duration::from_millis(10),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("drift margin"), "{err}");
    }
}
