//! Text from elsewhere as a terminal may show it. A key on a server may
//! have been written by a client that skipped lockkit's validation, and a
//! server's message is its own: printed raw, a control sequence could
//! clear or retitle the screen, a bidi override reverse what follows, a
//! zero-width or invisible character make two keys look the same, a line
//! separator forge a line of output. Such characters are shown escaped, as
//! Rust writes them (`\u{202e}`), and everything else as it is.
//!

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` shows on a terminal as the one visible character it is (or
/// as a plain space), without acting on the terminal or on its neighbours:
/// the characters lockkit accepts in keys (see
/// [`lockkit::raw::validate::unprintable`], one rule for keys and for what is shown).
pub fn is_safe(c: char) -> bool {
    lockkit::raw::validate::unprintable(c).is_none()
}

/// `text` with every character that is not [`is_safe`] escaped: for
/// messages, whose backslashes are left as they are.
pub fn text(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `key` with every character that is not [`is_safe`] escaped, and each
/// backslash doubled, so that no key can pass for another one's escape.
pub fn key(key: &str) -> Cow<'_, str> {
    escape(key, true)
}

fn escape(text: &str, backslash: bool) -> Cow<'_, str> {
    let plain = |c: char| is_safe(c) && !(backslash && c == '\\');
    if text.chars().all(plain) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if plain(c) => out.push(c),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            // Writing to a String cannot fail.
            c => drop(write!(out, "\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_marks_symbols_and_the_space_are_shown_as_they_are() {
        for text in [
            "invoice/42",
            "naïve café",
            "ключ",
            "鍵",
            "📦 box",
            "e\u{301}",
            "a b",
        ] {
            assert_eq!(key(text), text);
        }
    }

    #[test]
    fn what_could_spoof_a_terminal_is_escaped() {
        let cases = [
            ("\u{1b}[2J", "\\u{1b}[2J"),
            ("a\u{7f}\u{9b}", "a\\u{7f}\\u{9b}"),
            ("line\nforged\r", "line\\nforged\\r"),
            ("col\tcol", "col\\tcol"),
            ("txt\u{202e}exe\u{2066}", "txt\\u{202e}exe\\u{2066}"),
            (
                "\u{200b}\u{200d}\u{feff}\u{2060}",
                "\\u{200b}\\u{200d}\\u{feff}\\u{2060}",
            ),
            ("\u{2028}\u{2029}", "\\u{2028}\\u{2029}"),
            (
                "\u{ffff}\u{fdd0}\u{10ffff}",
                "\\u{ffff}\\u{fdd0}\\u{10ffff}",
            ),
            ("\u{e000}", "\\u{e000}"),
            ("nb\u{a0}sp\u{3000}", "nb\\u{a0}sp\\u{3000}"),
            (
                "\u{3164}\u{115f}\u{34f}\u{fe0f}",
                "\\u{3164}\\u{115f}\\u{34f}\\u{fe0f}",
            ),
            ("\u{e0041}", "\\u{e0041}"),
        ];
        for (raw, shown) in cases {
            assert_eq!(key(raw), shown, "{raw:?}");
            assert_eq!(text(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn a_key_doubles_its_backslashes_a_message_keeps_them() {
        assert_eq!(key("a\\u{202e}"), "a\\\\u{202e}");
        assert_eq!(text("'\\u{1b}' at byte 3"), "'\\u{1b}' at byte 3");
    }
}
