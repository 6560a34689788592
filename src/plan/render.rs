//! Plan renderings: a terminal listing, a Mermaid `gantt` block for PR comments, and
//! Markdown (ordered steps + the gantt).

use super::Plan;
use crate::releaseset::HumanDuration;

fn hm(secs: u64) -> String {
    format!("{:02}:{:02}", secs / 3600, (secs % 3600) / 60)
}

fn dur(secs: u64) -> String {
    HumanDuration::from_secs(secs).to_string()
}

fn headline(p: &Plan) -> String {
    let b = &p.worker_batches;
    let batches = if p.workers == 0 {
        String::new()
    } else {
        format!(
            ", workers in {} batch(es) (lower bound {}, maxUnavailable {}{})",
            b.count,
            b.lower_bound,
            b.max_unavailable,
            if b.volume_aware { ", volume-aware" } else { "" }
        )
    };
    format!(
        "{} control plane(s), {} worker(s){batches}; estimated {}",
        p.control_planes,
        p.workers,
        dur(p.estimate_secs)
    )
}

pub fn text(p: &Plan) -> String {
    let mut out = format!(
        "plan for cluster {}: {}\n{}\n",
        p.cluster,
        p.summary,
        headline(p)
    );
    let mut n = 0;
    for (i, stage) in p.stages.iter().enumerate() {
        out.push_str(&format!("\nStage {} — {}\n", i + 1, stage.title));
        for s in &stage.steps {
            n += 1;
            out.push_str(&format!(
                "  {n:>3}. {:<7} +{:<6} {}\n",
                hm(s.start_secs),
                dur(s.duration_secs),
                s.description
            ));
        }
    }
    if !p.notes.is_empty() {
        out.push('\n');
        for note in &p.notes {
            out.push_str(&format!("note: {note}\n"));
        }
    }
    out
}

/// Mermaid task names may not contain `:` or `#`, which the gantt grammar reserves.
fn task_name(s: &str) -> String {
    s.replace([':', '#', ';'], " ")
}

pub fn mermaid(p: &Plan) -> String {
    let mut out = format!(
        "gantt\n    title ichor plan for {} ({})\n    dateFormat X\n    axisFormat %H:%M\n",
        task_name(&p.cluster),
        task_name(&p.summary)
    );
    for stage in &p.stages {
        out.push_str(&format!("    section {}\n", task_name(&stage.title)));
        for s in &stage.steps {
            let name = if s.nodes.is_empty() {
                s.id.clone()
            } else {
                s.nodes.join(", ")
            };
            out.push_str(&format!(
                "    {} :{}, {}, {}s\n",
                task_name(&name),
                s.id.replace(['/', '.'], "-"),
                s.start_secs,
                s.duration_secs.max(1)
            ));
        }
    }
    out
}

pub fn markdown(p: &Plan) -> String {
    let mut out = format!(
        "### ichor plan — `{}`: {}\n\n{}\n\n",
        p.cluster,
        p.summary,
        headline(p)
    );
    let mut n = 0;
    for stage in &p.stages {
        out.push_str(&format!("**{}**\n\n", stage.title));
        for s in &stage.steps {
            n += 1;
            out.push_str(&format!(
                "{n}. `{}` {} — {}\n",
                hm(s.start_secs),
                s.description,
                dur(s.duration_secs)
            ));
        }
        out.push('\n');
    }
    for note in &p.notes {
        out.push_str(&format!("> {note}\n"));
    }
    out.push_str(&format!("\n```mermaid\n{}```\n", mermaid(p)));
    out
}
