//! What an entry's value says: its owner, and the mode its key is held in.
//!
//! An exclusive grant's value is its owner token in hex. A permit's adds
//! the number of permits (`{permits}:{owner}`), a read hold's the word
//! `shared` (`shared:{owner}`), so that every entry says in which mode the
//! key is held, and a caller asking for a mode that does not mix with it is
//! refused naming both.

use etcd_client::KeyValue;
use lock_core::{Error, LockKey, Mode, OwnerToken};

/// The prefix of a read hold's value.
const SHARED: &[u8] = b"shared";

/// The value of an entry granted to `owner` in `mode`.
pub(crate) fn value(owner: &OwnerToken, mode: Mode) -> String {
    match mode {
        Mode::Semaphore { permits } => format!("{permits}:{}", owner.to_hex()),
        Mode::Shared => format!("shared:{}", owner.to_hex()),
        _ => owner.to_hex(),
    }
}

/// The mode an entry's value says its key is held in. An owner token in hex
/// has no `:`, so a value without one is an exclusive grant's.
pub(crate) fn mode_of(value: &[u8]) -> Mode {
    let Some(colon) = value.iter().position(|&b| b == b':') else {
        return Mode::Exclusive;
    };
    if &value[..colon] == SHARED {
        return Mode::Shared;
    }
    let permits = std::str::from_utf8(&value[..colon])
        .ok()
        .and_then(|n| n.parse().ok());
    match permits {
        Some(permits) => Mode::semaphore(permits),
        None => Mode::Exclusive,
    }
}

/// Whether holders in `held` and a caller asking for `asked` are one lock
/// (they contend) rather than two modes that do not mix: readers and the
/// writer (the exclusive lock) are one read-write lock.
fn mixes(held: Mode, asked: Mode) -> bool {
    held == asked
        || matches!(
            (held, asked),
            (Mode::Shared, Mode::Exclusive) | (Mode::Exclusive, Mode::Shared)
        )
}

/// The refusal of a caller asking for `asked` on a queue headed by `head`,
/// when `head` holds the key in a mode that does not mix with it.
pub(crate) fn conflict(key: &LockKey, head: Option<&KeyValue>, asked: Mode) -> Option<Error> {
    let held = mode_of(head?.value());
    (!mixes(held, asked)).then(|| Error::ModeConflict {
        key: key.to_string(),
        held: Some(held),
        asked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_says_its_mode() {
        let owner = OwnerToken::random();
        assert_eq!(
            mode_of(value(&owner, Mode::Exclusive).as_bytes()),
            Mode::Exclusive
        );
        let three = Mode::semaphore(3);
        assert_eq!(mode_of(value(&owner, three).as_bytes()), three);
        assert!(!value(&owner, three).starts_with(&owner.to_hex()));
        assert_eq!(
            mode_of(value(&owner, Mode::Shared).as_bytes()),
            Mode::Shared
        );
    }

    #[test]
    fn readers_and_the_writer_are_one_lock() {
        assert!(mixes(Mode::Shared, Mode::Exclusive));
        assert!(mixes(Mode::Exclusive, Mode::Shared));
        assert!(mixes(Mode::Shared, Mode::Shared));
        assert!(!mixes(Mode::Shared, Mode::semaphore(2)));
        assert!(!mixes(Mode::semaphore(2), Mode::Shared));
        assert!(!mixes(Mode::semaphore(2), Mode::semaphore(3)));
    }
}
