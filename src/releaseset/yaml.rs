//! The one way ichor reads a YAML document that may come from a pull request: bounded in
//! size and nesting *before* the parser sees it, without aliases, and with a leading UTF-8
//! byte-order mark removed. serde_yaml builds its whole event list first and expands
//! aliases while deserializing, so a small hostile document can cost a minute of CPU (deep
//! nesting) or gigabytes (alias fan-out); the scan below is linear and allocation-free.

use serde::de::DeserializeOwned;

use super::document::DocumentError;

/// The largest document ichor parses. A 500-node inventory with volumes is well under this.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// The deepest flow (`[ {`) nesting accepted.
pub const MAX_FLOW_DEPTH: usize = 32;
/// The widest indentation accepted, in columns; it bounds block nesting.
pub const MAX_INDENT: usize = 128;

/// Parse `text` (the contents of `file`) as `T`, within the bounds above.
pub fn parse<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, DocumentError> {
    let text = prepare(file, text)?;
    serde_yaml::from_str(text).map_err(|e| DocumentError::from_yaml(file, &e))
}

/// Check the bounds and strip a byte-order mark; the text serde_yaml should parse.
pub fn prepare<'t>(file: &str, text: &'t str) -> Result<&'t str, DocumentError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(DocumentError::new(
            file,
            format!(
                "the file is {} bytes; ichor reads documents of at most {} bytes",
                text.len(),
                MAX_DOCUMENT_BYTES
            ),
        ));
    }
    scan(file, text)?;
    Ok(text)
}

/// One pass over the text: indentation, flow depth, compact sequences (`- - -`) and aliases,
/// outside quotes, comments and block scalars.
fn scan(file: &str, text: &str) -> Result<(), DocumentError> {
    let err = |line: usize, column: usize, msg: String| {
        Err(DocumentError::at(file, Some((line, column)), msg))
    };
    let mut flow = 0usize;
    let mut quote: Option<char> = None;
    // Inside a block scalar (`|` or `>`): lines indented deeper than this are text.
    let mut block_scalar: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let indent = line.len() - line.trim_start_matches(' ').len();
        let content = &line[indent..];
        if let Some(parent) = block_scalar {
            if content.trim().is_empty() || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        if quote.is_none() && flow == 0 {
            if indent > MAX_INDENT {
                return err(
                    n,
                    indent + 1,
                    format!("indented {indent} columns; ichor reads documents indented at most {MAX_INDENT} (nesting is bounded)"),
                );
            }
            let dashes = content
                .split_inclusive(' ')
                .take_while(|t| t.trim() == "-" || t.trim() == "?")
                .count();
            if dashes > MAX_FLOW_DEPTH {
                return err(
                    n,
                    indent + 1,
                    format!("{dashes} nested sequences on one line; at most {MAX_FLOW_DEPTH}"),
                );
            }
        }
        // The last significant character outside quotes, to tell an alias (`: *a`) from a
        // `*` inside a plain scalar (`x *y`), and a block-scalar header (`key: |`).
        let mut prev = ' ';
        let mut last_sig = ' ';
        let mut chars = content.char_indices().peekable();
        while let Some((col, c)) = chars.next() {
            match quote {
                Some('\'') => {
                    if c == '\'' {
                        if chars.peek().map(|p| p.1) == Some('\'') {
                            chars.next();
                        } else {
                            quote = None;
                        }
                    }
                    prev = c;
                    continue;
                }
                Some(_) => {
                    if c == '\\' {
                        chars.next();
                    } else if c == '"' {
                        quote = None;
                    }
                    prev = c;
                    continue;
                }
                None => {}
            }
            match c {
                '#' if prev == ' ' || col == 0 => break,
                '\'' | '"' if matches!(last_sig, ' ' | ':' | '-' | '[' | '{' | ',' | '?') => {
                    quote = Some(c)
                }
                '[' | '{' => {
                    flow += 1;
                    if flow > MAX_FLOW_DEPTH {
                        return err(
                            n,
                            indent + col + 1,
                            format!("nested more than {MAX_FLOW_DEPTH} levels deep"),
                        );
                    }
                }
                ']' | '}' => flow = flow.saturating_sub(1),
                '*' if matches!(last_sig, ' ' | ':' | '-' | '[' | '{' | ',' | '?')
                    && (prev == ' ' || matches!(prev, '[' | '{' | ',')) =>
                {
                    return err(
                        n,
                        indent + col + 1,
                        "YAML aliases (`*name`) are not accepted in ichor documents; write the value out (quote it if it starts with `*`)".into(),
                    );
                }
                _ => {}
            }
            prev = c;
            if !c.is_whitespace() {
                last_sig = c;
            }
        }
        if quote.is_none() && flow == 0 {
            let head = content.split(" #").next().unwrap_or(content).trim_end();
            let header =
                head.trim_end_matches(|c: char| c.is_ascii_digit() || c == '+' || c == '-');
            if header.ends_with(": |")
                || header.ends_with(": >")
                || header == "|"
                || header == ">"
                || header.ends_with("- |")
                || header.ends_with("- >")
            {
                block_scalar = Some(indent);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), DocumentError> {
        prepare("f.yaml", text).map(|_| ())
    }

    #[test]
    fn ordinary_documents_pass() {
        check("a: 1\nb: [1, 2, {c: d}]\nlist:\n  - x: \"*not an alias\"\n    y: 'it''s [ fine'\n  - a*b\nnote: |\n  [[[[ *text in a block scalar\n  # still text\nafter: x *y # comment [[\n").unwrap();
    }

    #[test]
    fn a_bom_is_stripped() {
        assert_eq!(prepare("f", "\u{feff}kind: X\n").unwrap(), "kind: X\n");
    }

    #[test]
    fn deep_nesting_is_refused_with_its_line() {
        let deep = format!("a: 1\nb: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = check(&deep).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("nested more than 32"), "{e}");
        let dashes = format!("a:\n{}x\n", "- ".repeat(1000));
        assert!(check(&dashes)
            .unwrap_err()
            .message
            .contains("nested sequences"));
        let mut indented = String::new();
        for i in 0..200 {
            indented.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
        }
        let e = check(&indented).unwrap_err();
        assert!(e.message.contains("indented 129 columns"), "{e}");
    }

    #[test]
    fn aliases_are_refused() {
        let laughs = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n";
        let e = check(laughs).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("aliases"), "{e}");
        assert!(check("a: &x 1\nb: *x\n").is_err());
        assert!(check("- *x\n").is_err());
    }

    #[test]
    fn oversized_documents_are_refused_before_parsing() {
        let big = format!("a: \"{}\"\n", "x".repeat(MAX_DOCUMENT_BYTES));
        let e = check(&big).unwrap_err();
        assert!(e.message.contains("bytes"), "{e}");
        assert!(e.to_string().len() < 200, "no echo of the value");
    }
}
