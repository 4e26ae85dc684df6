//! Markdown as MkDocs reads it (Python-Markdown with the `tables` and `toc` extensions): table
//! cells, code spans, and the anchor `toc` gives a heading, so generated links match it.

/// `text` as the content of one table cell. A row is one line, so line breaks become spaces.
/// Outside code spans `|` is escaped (the tables extension splits cells on it) and `<` becomes
/// `&lt;` (Python-Markdown passes `<key,value>` through as an HTML tag, which then vanishes).
/// Inside code spans both stay: Python-Markdown splits no cell inside one, and a backslash there
/// would be shown.
pub fn cell(text: &str) -> String {
    escape_outside_code(&one_line(text), true)
}

/// `text` as a paragraph outside a table: line breaks kept, `<` escaped as in [`cell`].
pub fn prose(text: &str) -> String {
    escape_outside_code(text.trim(), false)
}

/// `text` as one code span on one line, fenced with more backticks than any run inside it.
pub fn code(text: &str) -> String {
    let text = one_line(text);
    let longest_run = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    // A span that starts or ends with a backtick needs a space, which Markdown strips again.
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// The id Python-Markdown's `toc` extension gives a heading (its default `slugify`): characters
/// other than letters, digits, `_`, `-` and spaces dropped, lower case, each run of spaces and
/// hyphens one `-`. So `spec.database` becomes `specdatabase` and `outbox-relay run` becomes
/// `outbox-relay-run`. Headings here are ASCII; other characters are dropped, as its ASCII
/// folding drops what it cannot fold.
pub fn anchor(heading: &str) -> String {
    let kept: String = heading
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-') || c.is_whitespace())
        .collect();
    let mut slug = String::new();
    let mut in_separator = false;
    for c in kept.trim().chars() {
        if c == '-' || c.is_whitespace() {
            in_separator = true;
            continue;
        }
        if in_separator {
            slug.push('-');
            in_separator = false;
        }
        slug.push(c.to_ascii_lowercase());
    }
    slug
}

/// A table: the header row, its delimiter row, then one line per row. Callers escape the cells.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// The lines of `text`, trimmed and joined by single spaces.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Copies `text`, escaping `<` (and `|` when `pipes`) outside code spans. A code span is a run
/// of backticks closed by a run of the same length; an unclosed run is literal text.
fn escape_outside_code(text: &str, pipes: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            let run = rest.len() - rest.trim_start_matches('`').len();
            if let Some(end) = closing_run(&rest[run..], run) {
                let span_len = run + end + run;
                out.push_str(&rest[..span_len]);
                rest = &rest[span_len..];
            } else {
                out.push_str(&rest[..run]);
                rest = &rest[run..];
            }
            continue;
        }
        match c {
            '|' if pipes => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            _ => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Where in `text` a run of exactly `len` backticks starts, if one does.
fn closing_run(text: &str, len: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            if i - start == len {
                return Some(start);
            }
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_match_python_markdown() {
        assert_eq!(anchor("spec.database"), "specdatabase");
        assert_eq!(
            anchor("spec.scaling.scaleUp.policies[]"),
            "specscalingscaleuppolicies"
        );
        assert_eq!(anchor("outbox-relay run"), "outbox-relay-run");
        assert_eq!(anchor("  Relay -- metrics "), "relay-metrics");
    }

    #[test]
    fn cells_escape_pipes_outside_code_only() {
        assert_eq!(cell("a | b\nc"), "a \\| b c");
        assert_eq!(cell("`a || b` | <x>"), "`a || b` \\| &lt;x>");
        assert_eq!(cell("an ` alone | here"), "an ` alone \\| here");
    }

    #[test]
    fn code_spans_outgrow_their_backticks() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`a"), "`` `a ``");
    }
}
