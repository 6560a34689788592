//! The verdict: one checklist item per check, each `pass | warn | wait | fail` with a
//! message and, unless it passed, a hint saying what would make it pass.

use std::fmt;

use serde::Serialize;

use crate::escape;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    /// Not yet: something outside the change has to happen first (e.g. the running CNI
    /// catching up); the gate re-evaluates.
    Wait,
    Fail,
}

impl Status {
    pub fn symbol(self) -> &'static str {
        match self {
            Status::Pass => "✅",
            Status::Warn => "⚠️",
            Status::Wait => "⏳",
            Status::Fail => "❌",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Wait => "wait",
            Status::Fail => "fail",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckItem {
    /// Stable identifier, e.g. `kubernetes-step`, `cni`, `addon/cert-manager`.
    pub id: String,
    /// What the item checks, as a short sentence.
    pub title: String,
    pub status: Status,
    pub message: String,
    /// What would make it pass; absent when it passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Where the data behind the decision comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl CheckItem {
    pub fn new(
        id: impl Into<String>,
        title: impl Into<String>,
        status: Status,
        message: impl Into<String>,
    ) -> Self {
        CheckItem {
            id: id.into(),
            title: title.into(),
            status,
            message: message.into(),
            hint: None,
            source: None,
        }
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every item passed or warned.
    Pass,
    /// At least one item waits and none fails.
    Waiting,
    /// At least one item fails.
    Blocked,
}

impl Outcome {
    /// The worse of two outcomes: blocked over waiting over pass.
    pub fn worst(self, other: Outcome) -> Outcome {
        let rank = |o: Outcome| match o {
            Outcome::Pass => 0,
            Outcome::Waiting => 1,
            Outcome::Blocked => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }

    /// The process exit code of `ichor check`: 0 pass, 1 blocked, 3 waiting (2 is bad input).
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Pass => 0,
            Outcome::Blocked => 1,
            Outcome::Waiting => 3,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Pass => "pass",
            Outcome::Waiting => "waiting",
            Outcome::Blocked => "blocked",
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub pass: usize,
    pub warn: usize,
    pub wait: usize,
    pub fail: usize,
}

/// The checklist for one bump of one cluster. Live items (nodes, etcd, hand-over, removed
/// APIs) are pushed onto the same list by the gate; the outcome follows from the items.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub cluster: String,
    /// One line, e.g. "kubernetes v1.33.5 → v1.34.2".
    pub summary: String,
    pub outcome: Outcome,
    pub counts: Counts,
    pub items: Vec<CheckItem>,
}

impl Verdict {
    pub fn new(
        cluster: impl Into<String>,
        summary: impl Into<String>,
        items: Vec<CheckItem>,
    ) -> Self {
        let mut v = Verdict {
            cluster: cluster.into(),
            summary: summary.into(),
            outcome: Outcome::Pass,
            counts: Counts::default(),
            items: Vec::new(),
        };
        v.extend(items);
        v
    }

    pub fn push(&mut self, item: CheckItem) {
        self.extend([item]);
    }

    pub fn extend(&mut self, items: impl IntoIterator<Item = CheckItem>) {
        self.items.extend(items);
        let mut c = Counts::default();
        for i in &self.items {
            match i.status {
                Status::Pass => c.pass += 1,
                Status::Warn => c.warn += 1,
                Status::Wait => c.wait += 1,
                Status::Fail => c.fail += 1,
            }
        }
        self.outcome = if c.fail > 0 {
            Outcome::Blocked
        } else if c.wait > 0 {
            Outcome::Waiting
        } else {
            Outcome::Pass
        };
        self.counts = c;
    }

    fn headline(&self) -> String {
        let c = &self.counts;
        format!(
            "{} — {} passed, {} warning{}, {} waiting, {} failed",
            match self.outcome {
                Outcome::Pass => "PASS",
                Outcome::Waiting => "WAITING",
                Outcome::Blocked => "BLOCKED",
            },
            c.pass,
            c.warn,
            if c.warn == 1 { "" } else { "s" },
            c.wait,
            c.fail
        )
    }

    /// A terminal table, the hint under each item that did not pass. Ids, messages and
    /// hints embed names from the pull request: control characters are shown escaped.
    pub fn render_text(&self) -> String {
        let t = escape::terminal;
        let mut out = format!("cluster {}: {}\n\n", t(&self.cluster), t(&self.summary));
        let w_status = 6;
        let ids: Vec<String> = self.items.iter().map(|i| t(&i.id)).collect();
        // Padding follows the widest id, up to a bound, so one long id cannot push every
        // result off the screen.
        let w_id = ids
            .iter()
            .map(|id| id.chars().count())
            .max()
            .unwrap_or(2)
            .clamp(5, 40);
        out.push_str(&format!(
            "  {:<w_status$}  {:<w_id$}  {}\n",
            "STATUS", "CHECK", "RESULT"
        ));
        for (i, id) in self.items.iter().zip(&ids) {
            out.push_str(&format!(
                "  {:<w_status$}  {:<w_id$}  {}\n",
                i.status.to_string().to_uppercase(),
                id,
                t(&i.message)
            ));
            if let Some(h) = &i.hint {
                out.push_str(&format!("  {:<w_status$}  {:<w_id$}  ↳ {}\n", "", "", t(h)));
            }
        }
        out.push_str(&format!("\n{}\n", self.headline()));
        out
    }

    /// A Markdown table for a PR comment; every cell is inert text (`escape::md_text`).
    pub fn render_markdown(&self) -> String {
        let md = escape::md_text;
        let mut out = format!(
            "### ichor gate — {}: {}\n\n**{}**\n\n",
            escape::md_code(&self.cluster),
            md(&self.summary),
            self.headline()
        );
        out.push_str("| | Check | Result |\n|---|---|---|\n");
        for i in &self.items {
            let mut result = md(&i.message);
            if let Some(h) = &i.hint {
                result.push_str(&format!("<br>↳ {}", md(h)));
            }
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                i.status.symbol(),
                md(&i.title),
                result
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_follows_the_worst_item() {
        let pass = CheckItem::new("a", "A", Status::Pass, "ok");
        let warn = CheckItem::new("b", "B", Status::Warn, "hm");
        let wait = CheckItem::new("c", "C", Status::Wait, "later");
        let fail = CheckItem::new("d", "D", Status::Fail, "no");
        assert_eq!(
            Verdict::new("x", "", vec![pass.clone(), warn.clone()]).outcome,
            Outcome::Pass
        );
        let mut v = Verdict::new("x", "", vec![pass, warn, wait]);
        assert_eq!(v.outcome, Outcome::Waiting);
        v.push(fail);
        assert_eq!(v.outcome, Outcome::Blocked);
        assert_eq!(v.counts.fail, 1);
        assert_eq!(v.outcome.exit_code(), 1);
    }

    /// Items as a pull request could shape them: names with newlines, pipes, HTML and
    /// terminal escapes inside ids, titles, messages and hints.
    fn hostile() -> Verdict {
        Verdict::new(
            "lab`\n# x",
            "addon <b>x</b> | v1 → v2",
            vec![
                CheckItem::new(
                    "addon/a\nPASS  forged",
                    "Add-on a|b supports Kubernetes",
                    Status::Fail,
                    "unknown add-on `a|b`\n| ✅ | forged | row |",
                )
                .hint("<script>alert(1)</script> or \u{1b}[2J\u{1b}[32mPASS"),
                CheckItem::new(
                    "x".repeat(5000),
                    "- list\n1. item",
                    Status::Warn,
                    format!("```\nfence{}", "y".repeat(5000)),
                ),
            ],
        )
    }

    #[test]
    fn markdown_cells_stay_cells() {
        let v = hostile();
        let md = v.render_markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert!(
            lines[0].starts_with(
                "### ichor gate — ``lab`\\n# x``: addon &lt;b&gt;x&lt;/b&gt; \\| v1 → v2"
            ),
            "{md}"
        );
        let rows: Vec<&&str> = lines.iter().filter(|l| l.starts_with('|')).collect();
        assert_eq!(rows.len(), 2 + v.items.len(), "no forged rows: {md}");
        for row in &rows[2..] {
            let unescaped = row
                .match_indices('|')
                .filter(|(i, _)| !row[..*i].ends_with('\\'))
                .count();
            assert_eq!(unescaped, 4, "three cells: {row}");
        }
        assert!(!md.contains("<script") && !md.contains('\u{1b}'), "{md}");
        assert!(!md.contains("```"), "{md}");
        assert!(md.len() < 5000, "long strings are cut: {}", md.len());
    }

    #[test]
    fn text_shows_escapes_instead_of_running_them() {
        let text = hostile().render_text();
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(text.contains("\\u{1b}[2J\\u{1b}[32mPASS"), "{text}");
        // Header, blank, column titles, 2 items + 1 hint, blank, headline: no forged lines.
        assert_eq!(text.lines().count(), 8, "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].chars().count() < 80,
            "a long id does not pad every line: {}",
            lines[2]
        );
        assert!(
            lines.iter().all(|l| l.chars().count() < 2100),
            "long strings are cut: {text}"
        );
    }

    #[test]
    fn text_puts_the_hint_under_its_item() {
        let v = Verdict::new(
            "homelab",
            "kubernetes v1.33.5 → v1.34.2",
            vec![CheckItem::new("cni", "CNI", Status::Fail, "blocked").hint("bump cilium")],
        );
        let text = v.render_text();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines.iter().position(|l| l.contains("blocked")).unwrap();
        assert!(lines[at + 1].contains("↳ bump cilium"), "{text}");
        assert!(v
            .render_markdown()
            .contains("| ❌ | CNI | blocked<br>↳ bump cilium |"));
    }
}
