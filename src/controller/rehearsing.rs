//! `gate.rehearse`: after a PR's verdict is posted, rehearse its change on a twin of its
//! cluster under random faults (crate::rehearse) and add one line to its sticky comment.
//! It never delays or changes the verdict: one rehearsal runs at a time, on one thread of
//! its own, within the configured seeds and wall-time budget, and its line is dropped
//! when the PR's head moved meanwhile.

use std::sync::Arc;

use super::Ctx;
use crate::forge::comment;
use crate::rehearse::{self, FaultKind, Options, Summary};

/// Marks the rehearsal's line among a sticky comment's notes, so a new one replaces it.
const LINE_START: &str = "Rehearsed ";

/// Start rehearsing `head` of PR `pr` for `cluster` (judged from `base`), when the
/// controller's config asks for it.
pub fn spawn(ctx: &Arc<Ctx>, pr: u64, cluster: &str, base: &str, head: &str) {
    let Some(cfg) = ctx.cfg.gate.rehearse.clone() else {
        return;
    };
    let (ctx, cluster, base, head) = (
        ctx.clone(),
        cluster.to_string(),
        base.to_string(),
        head.to_string(),
    );
    tokio::spawn(async move {
        // One at a time: a burst of PRs queues here rather than taking every core.
        let Ok(_turn) = ctx.rehearsal.acquire().await else {
            return;
        };
        if superseded(&ctx, pr, &head).await {
            return;
        }
        let opts = Options {
            repo: ctx.mirror_dir.clone(),
            base: base.clone(),
            head: head.clone(),
            cluster: Some(cluster.clone()),
            alphabet: FaultKind::ALL.to_vec(),
            keep_log: false,
            planted: None,
        };
        let asked = cfg.seeds as usize;
        let budget = cfg.timeout.0;
        let ran = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut reports = Vec::new();
            for seed in 1..=asked as u64 {
                // Wall time on purpose: this bounds the CPU a PR may cost.
                if started.elapsed() >= budget {
                    break;
                }
                match rehearse::rehearse_seeds(&opts, &[seed], 1, &|_| {}) {
                    Ok(mut r) => reports.append(&mut r),
                    Err(e) => return Err(e),
                }
            }
            Ok(reports)
        })
        .await;
        let reports = match ran {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(pr, cluster = %cluster, error = %e, "gate.rehearse: could not rehearse");
                return;
            }
            Err(e) => {
                tracing::warn!(pr, cluster = %cluster, error = %e, "gate.rehearse: the rehearsal's task failed");
                return;
            }
        };
        let summary = Summary::of(&reports);
        let outcome = if summary.holds() { "held" } else { "broke" };
        ctx.metrics.inc(
            "ichor_gate_rehearsals_total",
            "PR heads rehearsed under random faults (gate.rehearse), by outcome.",
            &[("outcome", outcome)],
        );
        let replay = format!(
            "ichor rehearse --base {} --head {} --cluster {}",
            crate::escape::clip(&base, 12),
            crate::escape::clip(&head, 12),
            crate::escape::md_text(&cluster)
        );
        let line = summary.gate_line(&reports, asked, &replay);
        if let Err(e) = add_line(&ctx, pr, &cluster, &head, line).await {
            tracing::warn!(pr, cluster = %cluster, error = %e, "gate.rehearse: could not update the comment");
        }
        ctx.bump();
    });
}

async fn superseded(ctx: &Ctx, pr: u64, head: &str) -> bool {
    let st = ctx.state.lock().await;
    st.latest_head.get(&pr).is_some_and(|h| h != head)
}

/// Put `line` under the plan of the PR's sticky comment, if it still speaks of `head`.
async fn add_line(
    ctx: &Ctx,
    pr: u64,
    cluster: &str,
    head: &str,
    line: String,
) -> Result<(), super::Error> {
    if superseded(ctx, pr, head).await {
        return Ok(());
    }
    let sticky = {
        let mut st = ctx.state.lock().await;
        let Some(s) = st.stickies.get_mut(&(pr, cluster.to_string())) else {
            return Ok(());
        };
        if s.head != head {
            return Ok(());
        }
        s.notes.retain(|n| !n.starts_with(LINE_START));
        s.notes.push(line);
        s.clone()
    };
    if let Some(gh) = &ctx.github {
        gh.patient()
            .upsert_comment(pr, &comment::marker(cluster), &comment::render(&sticky))
            .await?;
    }
    Ok(())
}
