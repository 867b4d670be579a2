//! Names and notes on one manifest line: `%` and control characters
//! percent-encoded, so that any column name or note stays on its line.

use std::fmt::Write as _;

/// Percent-encode `%` and control characters so that any column name or note
/// stays on one manifest line (a newline in a metadata key once made every
/// later `open` fail).
pub(in crate::catalog) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '%' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(in crate::catalog) fn unescape(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_name_escaped_stays_on_one_line_and_unescapes_to_itself() {
        for name in [
            "plain",
            "",
            "tab\there",
            "new\nline",
            "cr\r\n",
            "back\\slash\\",
            "100%",
            "%41",
            "trailing%",
            "\u{7f}del and \u{85}next line",
            "été ✓ 名前",
        ] {
            let escaped = escape(name);
            assert!(!escaped.chars().any(char::is_control), "{escaped:?}");
            assert_eq!(unescape(&escaped).as_deref(), Some(name));
        }
        // only `%` and control characters change
        assert_eq!(escape("a b\\c=d"), "a b\\c=d");
        assert_eq!(escape("a\tb%"), "a%09b%25");
    }

    #[test]
    fn a_bad_escape_is_refused() {
        for bad in ["%", "%4", "%G1", "50%!", "%FF", "%C3", "%%41"] {
            assert_eq!(unescape(bad), None, "{bad:?}");
        }
        assert_eq!(unescape("%C3%A9t%C3%A9").as_deref(), Some("été"));
    }
}
