//! The terminal form: the report's own text, as the command prints it.

use super::{Artifact, Exporter, Report};
use kvtrace_io::error::Result;

pub struct Terminal;

impl Exporter for Terminal {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        Ok(vec![Artifact::single(report.terminal().into_bytes())])
    }
}

/// The widest a report's text runs, in columns: it fits a 100-column terminal.
pub const WIDTH: usize = 100;

/// One line of prose (no newline) folded at spaces into lines of at most [`WIDTH`] columns
/// where it can be, each continuation indented by `indent` spaces; a word longer than a line
/// stays whole. Ends with a newline.
pub fn fold(line: &str, indent: usize) -> String {
    let body = line.trim_start_matches(' ');
    let lead = line.len() - body.len();
    let mut out = " ".repeat(lead);
    let mut width = lead;
    for (i, word) in body.split(' ').enumerate() {
        let len = word.chars().count();
        if i > 0 && width + 1 + len > WIDTH && width > indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            width = indent;
        } else if i > 0 {
            out.push(' ');
            width += 1;
        }
        out.push_str(word);
        width += len;
    }
    out.push('\n');
    out
}

/// `text` safe for one line of a terminal: every control character (escape sequences, a
/// carriage return, a newline that would forge a line of its own) shown as its escape, as
/// Rust writes it (`\u{1b}`, `\n`). Strings a trace carries pass through here before they
/// are printed.
pub fn escape_line(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, |_| true)
}

/// Like [`escape_line`] for a whole block of text: newlines and tabs kept.
pub fn escape_text(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, |c| c != '\n' && c != '\t')
}

fn escape(text: &str, escaped: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && escaped(c);
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(escape_line("plain"), "plain");
        assert_eq!(
            escape_line("a\x1b[2J\nkvtrace: error: forged"),
            "a\\u{1b}[2J\\nkvtrace: error: forged"
        );
        assert_eq!(escape_text("one\n\ttwo\r\x07"), "one\n\ttwo\\r\\u{7}");
    }
}
