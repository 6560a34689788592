//! Commands from Git: `/ichor plan|retry|pause|resume [cluster]` in a PR comment (or, in
//! Git-only mode, the first line of a commit on `refs/ichor/commands`). Only the first line
//! starting with `/ichor` counts; anything else in the comment is conversation.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Gate the PR's head again and redraw the comment.
    Plan,
    /// Resume a paused rollout from where it stopped.
    Retry,
    /// Stop at the next safe point (between nodes); the record keeps where.
    Pause,
    /// Lift a pause given with `/ichor pause` and continue.
    Resume,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Plan => "plan",
            Verb::Retry => "retry",
            Verb::Pause => "pause",
            Verb::Resume => "resume",
        }
    }

    /// Whether the command acts on a cluster (and so needs write access).
    pub fn acts(self) -> bool {
        !matches!(self, Verb::Plan)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub verb: Verb,
    /// The cluster named after the verb; `None` means every cluster the PR touches.
    pub cluster: Option<String>,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/ichor {}", self.verb.as_str())?;
        if let Some(c) = &self.cluster {
            write!(f, " {c}")?;
        }
        Ok(())
    }
}

/// What a comment's `/ichor` line asks for: `None` when there is none, `Err` with a reply
/// for a line ichor cannot read.
pub fn parse(body: &str) -> Option<Result<Command, String>> {
    let line = command_line(body)?;
    let mut words = line.split_whitespace().skip(1);
    let usage = "ichor understands `/ichor plan`, `/ichor retry`, `/ichor pause` and `/ichor resume`, each optionally followed by a cluster name";
    let verb = match words.next() {
        Some("plan") => Verb::Plan,
        Some("retry") => Verb::Retry,
        Some("pause") => Verb::Pause,
        Some("resume") => Verb::Resume,
        Some(other) => {
            return Some(Err(format!(
                "`{}` is not an ichor command; {usage}.",
                crate::escape::md_text(crate::escape::clip(other, 40))
            )))
        }
        None => return Some(Err(format!("{usage}."))),
    };
    let cluster = match words.next() {
        None => None,
        Some(c) if valid_cluster_name(c) => Some(c.to_string()),
        Some(c) => {
            return Some(Err(format!(
                "`{}` is not a cluster name (letters, digits and `-`, up to 63 characters).",
                crate::escape::md_text(crate::escape::clip(c, 70))
            )))
        }
    };
    if words.next().is_some() {
        return Some(Err(format!("too many words after `/ichor`; {usage}.")));
    }
    Some(Ok(Command { verb, cluster }))
}

/// The line of a comment that is its command: the first `/ichor` or `/ichor …` line.
/// Bounded: a hostile comment of a million lines is scanned to its first 200.
pub fn command_line(body: &str) -> Option<&str> {
    // What GitHub shows as code or hides as a comment is not a command: a quoted
    // `/ichor pause` in a fenced code block (CommonMark 0.31.2 §4.5: three or more backticks
    // or tildes, closed by a run of the same character at least as long) or inside
    // `<!-- … -->` (§4.6, HTML block type 2) does nothing.
    let mut fence: Option<(char, usize)> = None;
    let mut in_comment = false;
    for line in body.lines().take(200) {
        let l = line.trim();
        if in_comment {
            in_comment = !l.contains("-->");
            continue;
        }
        let run = |c: char| l.chars().take_while(|x| *x == c).count();
        if let Some((c, n)) = fence {
            if run(c) >= n && l.trim_start_matches(c).trim().is_empty() {
                fence = None;
            }
            continue;
        }
        if let Some(c) = ['`', '~'].into_iter().find(|c| run(*c) >= 3) {
            fence = Some((c, run(c)));
            continue;
        }
        if let Some(rest) = l.strip_prefix("<!--") {
            in_comment = !rest.contains("-->");
            continue;
        }
        if l == "/ichor" || l.starts_with("/ichor ") {
            return Some(l);
        }
    }
    None
}

/// A DNS label, as cluster directory names are.
pub fn valid_cluster_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_blocks_and_html_comments_hold_no_commands() {
        assert_eq!(command_line("```\n/ichor pause\n```"), None);
        assert_eq!(
            command_line("~~~~\n/ichor pause\n~~~\n/ichor retry\n~~~~"),
            None
        );
        assert_eq!(
            command_line("````\n/ichor pause\n````\n/ichor retry"),
            Some("/ichor retry")
        );
        assert_eq!(command_line("<!--\n/ichor pause\n-->"), None);
        assert_eq!(command_line("<!-- /ichor pause -->"), None);
        assert_eq!(
            command_line("<!-- note -->\n/ichor plan"),
            Some("/ichor plan")
        );
    }

    #[test]
    fn reads_the_first_ichor_line() {
        let c = parse("thanks!\n\n /ichor retry homelab \n/ichor pause")
            .unwrap()
            .unwrap();
        assert_eq!(c.verb, Verb::Retry);
        assert_eq!(c.cluster.as_deref(), Some("homelab"));
        assert_eq!(c.to_string(), "/ichor retry homelab");
        assert_eq!(parse("/ichor plan").unwrap().unwrap().cluster, None);
        assert!(parse("no command here, /ichor retry inline").is_none());
        assert!(parse("/ichorx").is_none());
    }

    #[test]
    fn refuses_politely() {
        assert!(parse("/ichor").unwrap().is_err());
        let e = parse("/ichor deploy <b>").unwrap().unwrap_err();
        assert!(e.contains("not an ichor command") && !e.contains("<b>"));
        assert!(parse("/ichor retry ../../etc").unwrap().is_err());
        assert!(parse("/ichor retry a b").unwrap().is_err());
        let many = "x\n".repeat(1000) + "/ichor retry";
        assert!(parse(&many).is_none(), "only the first 200 lines are read");
    }
}
