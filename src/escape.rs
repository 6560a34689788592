//! Escaping for every format ichor prints pull-request content into: the terminal, Markdown
//! (PR comments) and Mermaid gantt charts. Node, volume, component and cluster names,
//! versions as written, and the messages that embed them all come from files in a pull
//! request, so each rendering passes them through exactly one function here. Parse-time
//! validation refuses most odd names; these functions do not rely on it.

use std::collections::HashSet;
use std::fmt::Write as _;

/// The most characters of one string any rendering prints; longer strings are cut with `…`.
/// Generous for any real message, small enough that a hostile name cannot blow up a PR
/// comment (GitHub caps a comment at 262,144 bytes).
pub const MAX_CHARS: usize = 1000;

/// Mermaid draws task names inside or beside a bar: keep them short.
const MAX_MERMAID_CHARS: usize = 120;

/// Cut `s` to at most `max` characters (not bytes), ending with `…` when cut.
pub fn clip(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

fn clipped(s: &str, max: usize) -> (&str, bool) {
    let c = clip(s, max);
    (c, c.len() < s.len())
}

/// Characters that change how text is shown rather than being shown: C0/C1 controls (ESC
/// starts ANSI sequences, CSI is U+009B), line and paragraph separators, bidirectional
/// overrides and isolates (which reorder what a reader sees), zero-width characters.
/// Control characters, bidi overrides and isolates, zero-width and other invisible
/// format characters: what can make text read differently from what it says.
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}')
}

/// `\n`, `\t`, `\r` or `\u{1b}`: how an invisible character is shown.
fn visible(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        _ => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// For a terminal: control characters, ANSI escapes and bidi overrides are shown escaped
/// (`\u{1b}`), so a name cannot repaint the screen, move the cursor or fake extra lines.
pub fn terminal(s: &str) -> String {
    let (s, cut) = clipped(s, MAX_CHARS);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_invisible(c) {
            visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// For Markdown prose: a paragraph, a list item, a block quote or a table cell. The text
/// renders as the same characters and never as markup: no emphasis, links, images, HTML,
/// code, table cells, math or @-mentions; no headings, lists or quotes at the start; one
/// line.
pub fn md_text(s: &str) -> String {
    let (s, cut) = clipped(s, MAX_CHARS);
    let mut out = String::with_capacity(s.len() + 8);
    let mut chars = s.chars().peekable();
    // A block marker only counts at the start of a line; this string may be placed at one.
    let lead = s.trim_start_matches(' ');
    let leading_spaces = s.len() - lead.len();
    for _ in 0..leading_spaces {
        chars.next();
        out.push_str("&#32;");
    }
    if lead.starts_with(['#', '-', '+', '=']) {
        out.push('\\');
    } else if let Some(rest) = lead.strip_prefix(|c: char| c.is_ascii_digit()) {
        // `1.` or `1)` opens an ordered list.
        let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
        if digits.starts_with(['.', ')']) {
            let n = lead.len() - digits.len();
            for _ in 0..n {
                if let Some(c) = chars.next() {
                    out.push(c);
                }
            }
            out.push('\\');
        }
    }
    while let Some(c) = chars.next() {
        match c {
            '\\' | '`' | '*' | '_' | '~' | '[' | ']' | '|' | '$' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            // A word joiner after `@` keeps GitHub from notifying a user or team.
            '@' => out.push_str("@&#8288;"),
            // `https://…` would become a link in a comment ichor signs.
            ':' if chars.peek() == Some(&'/') => out.push_str("&#58;"),
            c if is_invisible(c) => {
                // Shown as `\u{1b}`; the backslash itself must be escaped to show.
                let mut v = String::new();
                visible(c, &mut v);
                out.push_str(&v.replace('\\', "\\\\"));
            }
            c => out.push(c),
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// Text of ichor's own with `code` spans marked by backticks, for Markdown: each span
/// becomes inline code ([`md_code`]), the rest is escaped ([`md_text`]), so what ichor
/// means as code shows as code and nothing inside either part is read as Markdown. A
/// backtick left without its pair is shown as one.
pub fn md_with_code(s: &str) -> String {
    let parts: Vec<&str> = s.split('`').collect();
    let paired = parts.len() % 2 == 1;
    let mut out = String::with_capacity(s.len() + 8);
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if i % 2 == 1 && (paired || !last) {
            out.push_str(&md_code(part));
        } else {
            if i % 2 == 1 {
                out.push_str("\\`");
            }
            if i == 0 {
                out.push_str(&md_text(part));
            } else {
                // Mid-line: what opens a block at a line's start means nothing here.
                let t = md_text(&format!("x{part}"));
                out.push_str(t.strip_prefix('x').unwrap_or(&t));
            }
        }
    }
    out
}

/// For Markdown inline code, including the backticks: the fence is longer than any run of
/// backticks inside, so nothing closes it early. Not for table cells (use [`md_text`]:
/// GitHub splits cells on `|` even inside code).
pub fn md_code(s: &str) -> String {
    let (s, cut) = clipped(s, MAX_CHARS);
    let mut body = String::with_capacity(s.len());
    for c in s.chars() {
        if is_invisible(c) {
            visible(c, &mut body);
        } else {
            body.push(c);
        }
    }
    if cut {
        body.push('…');
    }
    if body.is_empty() {
        return "` `".into();
    }
    let mut longest = 0;
    let mut run = 0;
    for c in body.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // One space each side keeps a leading or trailing backtick off the fence; CommonMark
    // strips exactly that space again.
    let pad = if body.starts_with(['`', ' ']) || body.ends_with(['`', ' ']) {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{body}{pad}{fence}")
}

/// Words the Mermaid gantt lexer matches at the start of a line (case-insensitive) before it
/// considers a task name: a task named `click …` would otherwise become an interaction.
const MERMAID_KEYWORDS: &[&str] = &[
    "accdescr",
    "acctitle",
    "axisformat",
    "call",
    "click",
    "dateformat",
    "excludes",
    "gantt",
    "href",
    "includes",
    "inclusiveenddates",
    "section",
    "tickinterval",
    "title",
    "todaymarker",
    "topaxis",
    "weekday",
    "weekend",
];

/// Mermaid turns entity codes into these characters before parsing and back into `&…;` in
/// the SVG; written literally they would make entity references of their own.
const MERMAID_PLACEHOLDERS: &[char] = &['\u{fb02}', '°', '¶', 'ß'];

/// For Mermaid gantt text: the title, a section or a task name. Everything but letters,
/// digits, spaces and a few harmless punctuation marks becomes a Mermaid entity code
/// (`#35;` for `#`), which the renderer turns back into the character after parsing, so
/// `:`, `;`, `#`, `%%` comments, `%%{init}%%` directives and HTML never reach the parser; a
/// leading keyword (`click`, `section`…) or date has its first character encoded too.
/// Always one line.
pub fn mermaid_text(s: &str) -> String {
    let s = s.trim_matches(|c: char| c.is_whitespace());
    let (s, cut) = clipped(s, MAX_MERMAID_CHARS);
    let lower = s.to_ascii_lowercase();
    let keyword = MERMAID_KEYWORDS.iter().any(|k| lower.starts_with(k))
        || s.starts_with(|c: char| c.is_ascii_digit());
    let mut out = String::with_capacity(s.len() + 8);
    for (i, c) in s.chars().enumerate() {
        let safe = c.is_ascii_alphanumeric()
            || matches!(
                c,
                ' ' | '-' | '_' | '.' | ',' | '/' | '(' | ')' | '+' | '=' | '\\'
            )
            || (!c.is_ascii() && !is_invisible(c) && !MERMAID_PLACEHOLDERS.contains(&c));
        if is_invisible(c) {
            visible(c, &mut out);
        } else if safe && !(i == 0 && keyword) {
            out.push(c);
        } else {
            let _ = write!(out, "#{};", c as u32);
        }
    }
    if cut {
        out.push('…');
    }
    if out.is_empty() {
        // An empty task name would leave the line to the lexer's other rules.
        out.push_str("#32;");
    }
    out
}

/// Mermaid task ids: only `[A-Za-z0-9_-]`, never a word the gantt grammar reads as a tag,
/// and unique within one chart (ids are what `after` refers to).
#[derive(Debug, Default)]
pub struct MermaidIds {
    used: HashSet<String>,
}

impl MermaidIds {
    pub fn id(&mut self, wanted: &str) -> String {
        let mut base: String = clip(wanted, 60)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        const TAGS: &[&str] = &[
            "active",
            "done",
            "crit",
            "milestone",
            "vert",
            "after",
            "until",
        ];
        if base.is_empty()
            || TAGS.contains(&base.to_ascii_lowercase().as_str())
            || !base.starts_with(|c: char| c.is_ascii_alphabetic())
        {
            base.insert_str(0, "t-");
        }
        let mut id = base.clone();
        let mut n = 1;
        while self.used.contains(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        self.used.insert(id.clone());
        id
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const HOSTILE: &[&str] = &[
        "cp-1\nsection injected",
        "w-1`rm -rf`",
        "```\n# owned\n```",
        "<script>alert(1)</script>",
        "a|b|c",
        "%%{init: {'theme': 'dark'}}%%",
        "click x call alert()",
        "\u{1b}[2J\u{1b}[31mred",
        "x\u{9b}31m",
        "\u{202e}evil",
        "# heading",
        "> quote",
        "- item",
        "1. item",
        "@org/team",
        "https://evil.example",
        "a:b;c#d",
    ];

    #[test]
    fn terminal_shows_controls_escaped() {
        assert_eq!(terminal("a\u{1b}[31mb"), "a\\u{1b}[31mb");
        assert_eq!(terminal("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(terminal("\u{202e}x"), "\\u{202e}x");
        assert_eq!(terminal("cp-1 → v1.13.0"), "cp-1 → v1.13.0");
        for h in HOSTILE {
            let t = terminal(h);
            assert!(!t.chars().any(is_invisible), "{t:?}");
        }
    }

    #[test]
    fn long_strings_are_cut_on_a_character_boundary() {
        let long = "é".repeat(5000);
        let t = terminal(&long);
        assert_eq!(t.chars().count(), MAX_CHARS + 1);
        assert!(t.ends_with('…'));
        assert!(md_text(&long).chars().count() <= MAX_CHARS + 1);
        assert!(md_code(&long).chars().count() <= MAX_CHARS + 3);
        assert!(mermaid_text(&long).chars().count() <= MAX_MERMAID_CHARS + 1);
        assert_eq!(clip("abc", 5), "abc");
    }

    #[test]
    fn markdown_text_is_inert() {
        assert_eq!(md_text("a|b"), "a\\|b");
        assert_eq!(
            md_text("<script>&"),
            "&lt;script&gt;&amp;",
            "HTML becomes entities"
        );
        assert_eq!(md_text("# h"), "\\# h");
        assert_eq!(md_text("- x"), "\\- x");
        assert_eq!(md_text("12. x"), "12\\. x");
        assert_eq!(md_text("3) x"), "3\\) x");
        assert_eq!(md_text("> q"), "&gt; q");
        assert_eq!(md_text("v1.2.3 - x"), "v1.2.3 - x", "only a leading marker");
        assert_eq!(md_text("`x`"), "\\`x\\`");
        assert_eq!(md_text("a\nb"), "a\\\\nb");
        assert_eq!(md_text("@team"), "@&#8288;team");
        assert_eq!(md_text("https://e"), "https&#58;//e");
        assert_eq!(md_text("  - x"), "&#32;&#32;\\- x");
        for h in HOSTILE {
            let t = md_text(h);
            assert!(!t.contains('\n') && !t.contains('<'), "{t:?}");
            assert!(!t.chars().any(is_invisible), "{t:?}");
            // Every pipe, backtick and bracket is escaped.
            let b = t.as_bytes();
            for (i, &c) in b.iter().enumerate() {
                if matches!(c, b'|' | b'`' | b'[' | b']' | b'*' | b'_') {
                    assert!(i > 0 && b[i - 1] == b'\\', "{t:?} at {i}");
                }
            }
        }
    }

    #[test]
    fn own_code_spans_stay_code_and_the_rest_is_text() {
        assert_eq!(
            md_with_code("paused; no rollout starts until `/ichor resume`."),
            "paused; no rollout starts until `/ichor resume`."
        );
        // Cluster-supplied text between the spans is still only text.
        let out = md_with_code("cluster <b>@team</b>: set `paused: false` [x](y)");
        assert!(
            out.contains("&lt;b&gt;@&#8288;team") && out.contains("`paused: false`"),
            "{out}"
        );
        assert!(out.contains("\\[x\\](y)"), "{out}");
        // An unpaired backtick is shown, not opened.
        assert_eq!(md_with_code("a ` b"), "a \\` b");
        assert_eq!(md_with_code("`a` and `b"), "`a` and \\`b");
    }

    #[test]
    fn markdown_code_uses_a_longer_fence() {
        assert_eq!(md_code("cp-1"), "`cp-1`");
        assert_eq!(md_code("a`b"), "``a`b``");
        assert_eq!(md_code("```"), "```` ``` ````");
        assert_eq!(md_code("`x"), "`` `x ``");
        assert_eq!(md_code(""), "` `");
        assert_eq!(md_code("a\nb"), "`a\\nb`");
        assert_eq!(md_code("<b>"), "`<b>`", "code spans show HTML as text");
    }

    #[test]
    fn mermaid_text_never_reaches_the_grammar() {
        assert_eq!(mermaid_text("cp-1"), "cp-1");
        assert_eq!(mermaid_text("a:b;c#d"), "a#58;b#59;c#35;d");
        assert_eq!(mermaid_text("%%{init}%%"), "#37;#37;#123;init#125;#37;#37;");
        assert_eq!(mermaid_text("click x"), "#99;lick x");
        assert_eq!(mermaid_text("Section x"), "#83;ection x");
        assert_eq!(mermaid_text("2024-01-01"), "#50;024-01-01");
        assert_eq!(mermaid_text("a\nb"), "a\\nb");
        assert_eq!(mermaid_text("<b>"), "#60;b#62;");
        assert_eq!(mermaid_text("Talos v1 → v2"), "Talos v1 → v2");
        assert_eq!(mermaid_text(""), "#32;");
        assert_eq!(mermaid_text("ﬂ°°60¶ß"), "#64258;#176;#176;60#182;#223;");
        for h in HOSTILE {
            let t = mermaid_text(h);
            let bare = without_entity_codes(&t);
            assert!(
                !bare.contains(['\n', ':', ';', '#', '%', '<', '`']),
                "{t:?}"
            );
            let lower = t.to_ascii_lowercase();
            assert!(
                !MERMAID_KEYWORDS.iter().any(|k| lower.starts_with(k)),
                "{t:?}"
            );
        }
    }

    /// `t` with every `#123;` removed.
    pub(crate) fn without_entity_codes(t: &str) -> String {
        let mut out = String::new();
        let mut rest = t;
        while let Some(at) = rest.find('#') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 && after[digits..].starts_with(';') {
                rest = &after[digits + 1..];
            } else {
                out.push('#');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn mermaid_ids_are_safe_and_unique() {
        let mut ids = MermaidIds::default();
        assert_eq!(ids.id("talos/cp-1"), "talos-cp-1");
        assert_eq!(ids.id("talos/cp.1"), "talos-cp-1-2");
        assert_eq!(ids.id("talos/cp:1"), "talos-cp-1-3");
        assert_eq!(ids.id("crit"), "t-crit");
        assert_eq!(ids.id(""), "t-");
        assert_eq!(ids.id("1x"), "t-1x");
        let weird = ids.id("a b\n%%{x}%%");
        assert!(weird
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
