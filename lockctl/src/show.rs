//! How `status` and `list` print a lock: a line of tab-separated fields
//! for people, or JSON for programs (`--json`).

use std::fmt::Write;

use lockkit::{HeldLock, LockReport, Mode};
use serde::Serialize;

use crate::printable;

/// One lock as `--json` prints it. Unknown parts are `null`.
#[derive(Serialize)]
pub struct Entry<'a> {
    key: &'a str,
    held: bool,
    /// Milliseconds left before the grant expires unless renewed.
    remaining_ms: Option<u64>,
    fencing_token: Option<u64>,
    /// The semaphore's number of permits, when the holder holds one of
    /// them (a semaphore lists one entry per holder); absent for a lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    /// True for a reader of a read-write lock (one entry per reader);
    /// absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shared: bool,
}

fn permits(mode: Mode) -> Option<u32> {
    match mode {
        Mode::Semaphore { permits } => Some(permits),
        _ => None,
    }
}

impl<'a> Entry<'a> {
    /// A held lock.
    pub fn held(h: &'a HeldLock) -> Self {
        Entry {
            key: &h.key,
            held: true,
            remaining_ms: h
                .remaining
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            fencing_token: h.fencing_token.map(|t| t.get()),
            permits: permits(h.mode),
            shared: h.mode == Mode::Shared,
        }
    }

    /// A key nobody holds.
    pub fn free(key: &'a str) -> Self {
        Entry {
            key,
            held: false,
            remaining_ms: None,
            fencing_token: None,
            permits: None,
            shared: false,
        }
    }
}

/// What `list --json` prints: the held locks and the leaks.
#[derive(Serialize)]
pub struct Listing<'a> {
    held: Vec<Entry<'a>>,
    /// The server's own names of keys that will never expire.
    leaks: &'a [String],
}

impl<'a> Listing<'a> {
    /// The listing of `report`.
    pub fn of(report: &'a LockReport) -> Self {
        Listing {
            held: report.held.iter().map(Entry::held).collect(),
            leaks: &report.leaks,
        }
    }
}

/// `KEY  leak  no TTL: ...`, the key escaped where it could spoof the terminal.
pub fn leak_line(key: &str) -> String {
    format!(
        "{}\tleak\tno TTL: blocks its lock until deleted",
        printable::key(key)
    )
}

/// `key  held  remaining=12.3s  fencing_token=42` (unknown parts shown as
/// `?`; the key escaped where it could spoof the terminal), followed by
/// `permits=3` for a holder of a semaphore's permit, or `shared` for a
/// reader of a read-write lock.
pub fn line(h: &HeldLock) -> String {
    let remaining = h
        .remaining
        .map(|d| format!("{:.1}s", d.as_secs_f64()))
        .unwrap_or_else(|| "?".into());
    let token = h
        .fencing_token
        .map(|t| t.get().to_string())
        .unwrap_or_else(|| "?".into());
    let line = format!(
        "{}\theld\tremaining={remaining}\tfencing_token={token}",
        printable::key(&h.key)
    );
    match (permits(h.mode), h.mode) {
        (Some(n), _) => format!("{line}\tpermits={n}"),
        (None, Mode::Shared) => format!("{line}\tshared"),
        (None, _) => line,
    }
}

/// `value` as one line of JSON in which every character that could spoof a
/// terminal is written as a `\uXXXX` escape: JSON's own escaping covers
/// only the C0 controls, and a key may hold a bidi override.
pub fn json(value: &impl Serialize) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|e| {
        // Serializing these plain structs cannot fail; say so if it does.
        format!("{{\"error\":\"{e}\"}}")
    });
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if printable::is_safe(c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_what_could_spoof_a_terminal_and_reads_back_the_same() {
        let key = "a\u{202e}b\u{1f600}\u{10ffff}\\\"";
        let text = json(&Entry::free(key));
        assert!(text.chars().all(printable::is_safe), "{text:?}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["key"], key);
        assert_eq!(back["held"], false);
        assert!(back["fencing_token"].is_null());
    }

    #[test]
    fn a_reader_is_shown_as_shared() {
        let reader = HeldLock::new("doc").with_mode(Mode::Shared);
        assert!(line(&reader).ends_with("\tshared"), "{}", line(&reader));
        let back: serde_json::Value = serde_json::from_str(&json(&Entry::held(&reader))).unwrap();
        assert_eq!(back["shared"], true);
        let lock = HeldLock::new("doc");
        assert!(!line(&lock).contains("shared"));
        assert!(!json(&Entry::held(&lock)).contains("shared"));
    }

    #[test]
    fn a_permit_holder_shows_its_number_of_permits() {
        let permit = HeldLock::new("jobs").with_mode(Mode::semaphore(3));
        assert!(line(&permit).ends_with("\tpermits=3"), "{}", line(&permit));
        let back: serde_json::Value = serde_json::from_str(&json(&Entry::held(&permit))).unwrap();
        assert_eq!(back["permits"], 3);
        let lock = HeldLock::new("jobs");
        assert!(!line(&lock).contains("permits"));
        assert!(!json(&Entry::held(&lock)).contains("permits"));
    }
}
