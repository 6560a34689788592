//! The sticky PR comment (one per PR and cluster, found again by its hidden marker and
//! edited in place) and the short status descriptions. Pure: data in, Markdown out. Every
//! string that came from a pull request or a cluster is escaped for where it lands.

use crate::escape;
use crate::policy::{Outcome, Status, Verdict};

/// GitHub refuses a status description over 140 characters.
pub const MAX_DESCRIPTION_CHARS: usize = 140;
/// Rollout progress lines kept in the comment (the record keeps more).
pub const MAX_PROGRESS_LINES: usize = 25;

/// The hidden marker that finds the comment again. Cluster names are DNS labels; anything
/// else is hex-encoded so no text can close the HTML comment.
pub fn marker(cluster: &str) -> String {
    let name = if crate::forge::command::valid_cluster_name(cluster) {
        cluster.to_string()
    } else {
        hex::encode(cluster.as_bytes())
    };
    format!("<!-- ichor:sticky cluster={name} -->")
}

/// The commit status context: `ichor/gate`, or `ichor/gate/<cluster>` when the repository
/// holds several clusters.
pub fn gate_context(cluster: &str, several: bool) -> String {
    if several {
        format!("ichor/gate/{}", escape::clip(cluster, 200))
    } else {
        "ichor/gate".to_string()
    }
}

pub fn rollout_context(cluster: &str, several: bool) -> String {
    if several {
        format!("ichor/rollout/{}", escape::clip(cluster, 200))
    } else {
        "ichor/rollout".to_string()
    }
}

/// At most 140 characters, cut on a character boundary with `…`; one line.
pub fn description(s: &str) -> String {
    // One line, and no bidi override or zero-width character: GitHub shows a status
    // description as it is.
    let one_line: String = s
        .chars()
        .map(|c| if escape::is_invisible(c) { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= MAX_DESCRIPTION_CHARS {
        return one_line;
    }
    let mut out: String = one_line.chars().take(MAX_DESCRIPTION_CHARS - 1).collect();
    out.push('…');
    out
}

/// The one thing that matters about a verdict, for the status.
pub fn gate_description(v: &Verdict) -> String {
    let first = |s: Status| v.items.iter().find(|i| i.status == s);
    description(&match v.outcome {
        Outcome::Pass => format!(
            "passed: {} ({} checks{})",
            v.summary,
            v.items.len(),
            if v.counts.warn > 0 {
                format!(
                    ", {} warning{}",
                    v.counts.warn,
                    if v.counts.warn == 1 { "" } else { "s" }
                )
            } else {
                String::new()
            }
        ),
        Outcome::Blocked => match first(Status::Fail) {
            Some(i) => format!("blocked: {}", i.message),
            None => "blocked".to_string(),
        },
        Outcome::Waiting => match first(Status::Wait) {
            Some(i) => format!("waiting: {}", i.message),
            None => "waiting".to_string(),
        },
    })
}

/// Where a rollout stands, as the comment and the status show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutState {
    /// Merged; waiting for the lock, a window or the pre-flight gate.
    Queued(String),
    Running {
        stage: String,
        /// How far it is and when it should end ("23/60 done, ends ≈ 14:20 UTC"), once known.
        eta: Option<String>,
    },
    Paused {
        stage: String,
        node: Option<String>,
        reason: String,
    },
    /// The pre-flight (live) gate refused after merge: nothing was changed.
    Refused(String),
    /// Paused, then a newer merge took over from where this one stopped.
    Superseded(String),
    Completed {
        summary: String,
    },
}

impl RolloutState {
    pub fn status_description(&self) -> String {
        description(&match self {
            RolloutState::Queued(why) => format!("queued: {why}"),
            RolloutState::Running { stage, eta } => match eta {
                Some(eta) => format!("rolling out: {stage} ({eta})"),
                None => format!("rolling out: {stage}"),
            },
            RolloutState::Paused {
                stage,
                node,
                reason,
            } => format!(
                "paused in {stage}{}: {reason}",
                node.as_deref()
                    .map(|n| format!(" at {n}"))
                    .unwrap_or_default()
            ),
            RolloutState::Refused(why) => format!("refused: {why}"),
            RolloutState::Superseded(by) => format!("superseded: {by}"),
            RolloutState::Completed { summary } => format!("done: {summary}"),
        })
    }
}

/// The rollout part of a comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutSection {
    pub commit: String,
    pub state: RolloutState,
    /// Progress lines, oldest first (the last [`MAX_PROGRESS_LINES`] are shown).
    pub lines: Vec<String>,
    /// The cluster's health checks as last read (`spec.healthChecks`), by name.
    pub checks: Vec<CheckLine>,
}

/// One health check as the comment shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    pub name: String,
    /// The gate it was read at: before, between, after.
    pub gate: String,
    /// holds, settling or failing.
    pub state: String,
    pub value: String,
}

/// Everything one sticky comment shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sticky {
    pub cluster: String,
    /// The head the gate section judged.
    pub head: String,
    /// The checklist as Markdown ([`Verdict::render_markdown`]).
    pub checklist: String,
    /// The plan as Markdown (`plan::render::markdown`), or why there is none.
    pub plan: String,
    /// Lines under the plan: why the checklist is not live, what the PR's edits do.
    pub notes: Vec<String>,
    pub rollout: Option<RolloutSection>,
}

fn short(sha: &str) -> &str {
    escape::clip(sha, 10)
}

pub fn render(s: &Sticky) -> String {
    let md = escape::md_text;
    let mut out = format!("{}\n", marker(&s.cluster));
    if let Some(r) = &s.rollout {
        out.push_str(&render_rollout(&s.cluster, r));
        out.push_str("\n---\n\n");
    }
    out.push_str(&s.checklist);
    out.push_str(&format!(
        "\n<sub>Judged at head `{}` with the base revision's policies and rollout settings.</sub>\n\n",
        md(short(&s.head))
    ));
    for n in &s.notes {
        out.push_str(&format!("- {}\n", md(n)));
    }
    if !s.notes.is_empty() {
        out.push('\n');
    }
    out.push_str("<details open><summary>The staged plan</summary>\n\n");
    out.push_str(&s.plan);
    out.push_str("\n</details>\n\n");
    out.push_str("<sub>Commands: `/ichor plan` judges the head again · `/ichor pause` · `/ichor resume` · `/ichor retry` resumes a paused rollout (write access needed).</sub>\n");
    out
}

pub fn render_rollout(cluster: &str, r: &RolloutSection) -> String {
    let md = escape::md_text;
    let mut out = format!(
        "### ichor rollout — {} at `{}`\n\n",
        escape::md_code(cluster),
        md(short(&r.commit))
    );
    match &r.state {
        RolloutState::Queued(why) => out.push_str(&format!("⏳ **Queued**: {}\n\n", md(why))),
        RolloutState::Running { stage, eta } => {
            out.push_str(&format!("🔄 **Rolling out**: {}\n\n", md(stage)));
            if let Some(eta) = eta {
                out.push_str(&format!("{}\n\n", md(eta)));
            }
        }
        RolloutState::Paused {
            stage,
            node,
            reason,
        } => {
            out.push_str(&format!(
                "> [!CAUTION]\n> **Paused** in {}{}.\n>\n> {}\n>\n> The cluster keeps running meanwhile. Once the cause is fixed, comment `/ichor retry` to resume from here.\n\n",
                md(stage),
                node.as_deref()
                    .map(|n| format!(" at {}", md(n)))
                    .unwrap_or_default(),
                md(reason)
            ));
        }
        RolloutState::Refused(why) => out.push_str(&format!(
            "> [!WARNING]\n> **Not rolled out**: {}\n>\n> Nothing on the cluster was changed.\n\n",
            md(why)
        )),
        RolloutState::Superseded(by) => out.push_str(&format!(
            "⏭️ **Superseded**: {}\n\nThis rollout stopped where it paused; the newer one carries on from there.\n\n",
            md(by)
        )),
        RolloutState::Completed { summary } => {
            out.push_str(&format!("✅ **Done**: {}\n\n", md(summary)))
        }
    }
    if !r.checks.is_empty() {
        out.push_str("| health check | gate | state | last value |\n|---|---|---|---|\n");
        for c in &r.checks {
            let icon = match c.state.as_str() {
                "holds" => "✅",
                "failing" | "failed" => "❌",
                _ => "⏳",
            };
            out.push_str(&format!(
                "| {} | {} | {icon} {} | {} |\n",
                escape::md_code(&c.name),
                md(&c.gate),
                md(&c.state),
                md(&crate::releaseset::excerpt(&c.value, 160))
            ));
        }
        out.push('\n');
    }
    if !r.lines.is_empty() {
        out.push_str("<details><summary>Progress</summary>\n\n");
        let skip = r.lines.len().saturating_sub(MAX_PROGRESS_LINES);
        if skip > 0 {
            out.push_str(&format!("- … {skip} earlier lines in the rollout record\n"));
        }
        for l in &r.lines[skip..] {
            out.push_str(&format!("- {}\n", md(l)));
        }
        out.push_str("\n</details>\n");
    }
    out
}

/// The reply to a command, posted where it was given.
pub fn acknowledgement(user: &str, command: &str, what: &str) -> String {
    // Escaped once each, for where it stands: the command as inline code, ichor's own
    // sentence with its `code` spans kept as code.
    format!(
        "@{} {}: {}",
        escape::md_text(escape::clip(user, 40)).trim_start_matches('\\'),
        escape::md_code(escape::clip(command, 80)),
        escape::md_with_code(what)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::CheckItem;

    #[test]
    fn descriptions_carry_no_bidi_or_invisible_characters() {
        let d = description("blocked: cilium\u{202e}91.1\u{2066} needs\u{200b} x\ny");
        assert_eq!(d, "blocked: cilium 91.1  needs  x y");
    }

    #[test]
    fn a_reply_is_escaped_once_for_where_each_part_stands() {
        let out = acknowledgement(
            "mara",
            "/ichor plan `x` @team",
            "homelab: paused; no rollout starts until `/ichor resume`.",
        );
        assert_eq!(
            out,
            "@mara ``/ichor plan `x` @team``: homelab: paused; no rollout starts until `/ichor resume`."
        );
        assert!(!out.contains("&#8288;") && !out.contains("\\`"), "{out}");
    }

    #[test]
    fn descriptions_fit_and_say_the_one_thing() {
        let v = Verdict::new(
            "lab",
            "kubernetes v1.33.5 → v1.34.2",
            vec![
                CheckItem::new("a", "A", Status::Pass, "ok"),
                CheckItem::new(
                    "cni",
                    "CNI",
                    Status::Fail,
                    "kubernetes 1.34 needs cilium ≥ 1.19",
                ),
            ],
        );
        assert_eq!(
            gate_description(&v),
            "blocked: kubernetes 1.34 needs cilium ≥ 1.19"
        );
        let long = description(&"é".repeat(300));
        assert_eq!(long.chars().count(), 140);
        assert!(long.ends_with('…'));
        assert_eq!(description("a\nb"), "a b");
    }

    #[test]
    fn the_marker_cannot_be_closed_by_a_name() {
        assert_eq!(marker("homelab"), "<!-- ichor:sticky cluster=homelab -->");
        let m = marker("x --><script>");
        assert!(!m["<!--".len()..m.len() - 3].contains("-->"));
        assert_eq!(gate_context("lab", false), "ichor/gate");
        assert_eq!(gate_context("lab", true), "ichor/gate/lab");
    }

    #[test]
    fn pauses_show_their_root_cause_escaped() {
        let s = Sticky {
            cluster: "lab".into(),
            head: "0123456789abcdef".into(),
            checklist: "### ichor gate\n".into(),
            plan: "1. step\n".into(),
            notes: vec![],
            rollout: Some(RolloutSection {
                commit: "fedcba9876543210".into(),
                state: RolloutState::Paused {
                    stage: "talos".into(),
                    node: Some("w-1".into()),
                    reason: "PDB <b>web</b> allows no disruption".into(),
                },
                lines: (0..40).map(|i| format!("line {i}")).collect(),
                checks: vec![
                    CheckLine {
                        name: "postgres-ready".into(),
                        gate: "between".into(),
                        state: "failing".into(),
                        value: "false | <b>2 of 3</b>".into(),
                    },
                    CheckLine {
                        name: "ceph-ok".into(),
                        gate: "between".into(),
                        state: "holds".into(),
                        value: "1 sample".into(),
                    },
                ],
            }),
        };
        let text = render(&s);
        assert!(text.starts_with("<!-- ichor:sticky cluster=lab -->"));
        assert!(text.contains("**Paused** in talos at w-1"));
        assert!(!text.contains("<b>web</b>"));
        assert!(text.contains("15 earlier lines"));
        assert!(text.contains("line 39") && !text.contains("line 14\n"));
        // Each health check with its gate, state and last value, escaped for a table cell.
        assert!(
            text.contains(
                "| `postgres-ready` | between | ❌ failing | false \\| &lt;b&gt;2 of 3&lt;/b&gt; |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| `ceph-ok` | between | ✅ holds | 1 sample |"),
            "{text}"
        );
    }
}
