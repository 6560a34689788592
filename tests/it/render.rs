//! The plan's Mermaid gantt drawn by real Mermaid (mermaid-cli 11, the generation GitHub
//! renders PR comments with, on Debian's chromium): steps start where the plan says, and
//! hostile names come out as text, not as extra tasks, directives or markup.
//!
//! It needs `mmdc` and chromium (`scripts/test` installs both, `scripts/install-mermaid`
//! alone prints `mmdc`'s path for `ICHOR_MMDC`), so plain `cargo test` reports it ignored.

use std::path::{Path, PathBuf};
use std::process::Command;

use ichor::plan::{plan, Plan, PlanOptions};
use ichor::releaseset::{Bump, Cluster, Node, ReleaseSet, Role, Version};
use serde_json::Value;

use crate::{homelab, ichor, stderr, stdout};

/// `mmdc` and a puppeteer config naming the browser; a missing one fails the test.
fn mermaid_cli(dir: &Path) -> (PathBuf, PathBuf) {
    let mmdc = crate::tools::MMDC.path();
    let chromium = crate::tools::CHROMIUM.path();
    let config = dir.join("puppeteer.json");
    let json = serde_json::json!({"executablePath": chromium, "args": ["--no-sandbox"]});
    std::fs::write(&config, json.to_string()).expect("write puppeteer config");
    (mmdc, config)
}

/// One `mmdc` run (one browser start) over a Markdown file: every ```mermaid block in it
/// becomes `out-<n>.svg`, in order.
fn render(mmdc: &Path, config: &Path, dir: &Path, markdown: &str, charts: usize) -> Vec<String> {
    let input = dir.join("in.md");
    std::fs::write(&input, markdown).expect("write markdown");
    let o = Command::new(mmdc)
        .arg("-p")
        .arg(config)
        .arg("-i")
        .arg(&input)
        .arg("-o")
        .arg(dir.join("out.md"))
        .output()
        .expect("run mmdc");
    assert!(
        o.status.success(),
        "mmdc failed: {}\n{}",
        stdout(&o),
        stderr(&o)
    );
    (1..=charts)
        .map(|i| {
            let path = dir.join(format!("out-{i}.svg"));
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), stdout(&o)))
        })
        .collect()
}

/// One drawn task: its bar and its label, in document order.
#[derive(Debug)]
struct Bar {
    id: String,
    x: f64,
    width: f64,
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    let len = tag[at..].find('"')?;
    Some(&tag[at..at + len])
}

/// The opening tags named `element` in `svg`, with the text up to the next `<`.
fn elements<'a>(svg: &'a str, element: &str) -> Vec<(&'a str, &'a str)> {
    let open = format!("<{element} ");
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(at) = rest.find(&open) {
        rest = &rest[at..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        let text_end = rest[end..].find('<').map_or(rest.len(), |i| end + i);
        let text = rest.get(end + 1..text_end).unwrap_or("");
        out.push((tag, text));
        rest = &rest[end..];
    }
    out
}

fn bars(svg: &str) -> Vec<Bar> {
    elements(svg, "rect")
        .into_iter()
        .filter(|(tag, _)| attr(tag, "class").is_some_and(|c| c.split(' ').any(|w| w == "task")))
        .map(|(tag, _)| {
            let num = |n| {
                attr(tag, n)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            Bar {
                id: attr(tag, "id").unwrap_or("").to_string(),
                x: num("x"),
                width: num("width"),
            }
        })
        .collect()
}

fn unescape_xml(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let c = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e => e
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| e.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Task labels, in document order.
fn labels(svg: &str) -> Vec<String> {
    elements(svg, "text")
        .into_iter()
        .filter(|(tag, _)| attr(tag, "class").is_some_and(|c| c.contains("taskText")))
        .map(|(_, text)| unescape_xml(text).trim().to_string())
        .collect()
}

/// Bars follow the plan: one per step in plan order, each starting where the plan says
/// (proportional to its start offset) and where the one before it ends.
fn assert_follows(svg: &str, starts: &[u64], estimate: u64) {
    let bars = bars(svg);
    assert_eq!(bars.len(), starts.len(), "{bars:?}");
    let left = bars[0].x;
    let last = &bars[bars.len() - 1];
    let px_per_sec = (last.x + last.width - left) / estimate as f64;
    assert!(px_per_sec > 0.0, "{bars:?}");
    for (i, (bar, start)) in bars.iter().zip(starts).enumerate() {
        let want = left + *start as f64 * px_per_sec;
        assert!(
            (bar.x - want).abs() <= 2.0,
            "step {i} ({}) drawn at x={} but starts at {start}s (x≈{want:.1}): {bars:?}",
            bar.id,
            bar.x
        );
        if i > 0 {
            let prev = &bars[i - 1];
            assert!(bar.x > prev.x, "bars go right in plan order: {bars:?}");
            assert!(
                (prev.x + prev.width - bar.x).abs() <= 1.5,
                "step {i} starts where step {} ends: {bars:?}",
                i - 1
            );
        }
    }
}

const HOSTILE_CP: &str = "click x call alert()";
const HOSTILE_WORKERS: &[&str] = &[
    "w-1\nsection injected\n    fake :x, 2000-01-01 00:00:00, 99999s",
    "<img src=x onerror=alert(1)>",
    // Mermaid's own placeholders for entity codes, written literally.
    "\u{fb02}\u{b0}lt\u{b6}\u{df}b\u{fb02}\u{b0}\u{b0}60\u{b6}\u{df}",
    "%%{init: {\"theme\": \"forest\"}}%% #3; ``` |",
];
const HOSTILE_CLUSTER: &str = "lab: %% comment\ntitle x";

fn hostile_plan() -> Plan {
    let rs = |talos: &str| {
        ReleaseSet::parse(
            "rs",
            &format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: {talos}\n  kubernetes: v1.33.5\n  cni: {{name: cilium, version: 1.18.3}}\n"),
        )
        .expect("release set")
    };
    let (base, head) = (rs("v1.12.6"), rs("v1.12.9"));
    let cluster = Cluster::parse(
        "c",
        "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  volumes: {provider: longhorn}\n",
    )
    .expect("cluster");
    let v = |s: &str| Version::parse(s).expect("version");
    // Names a pull request could carry if nothing refused them at parse time.
    let node = |name: &str, role| Node {
        name: name.to_string(),
        role,
        talos: v("v1.12.6"),
        kubelet: v("v1.33.5"),
        volumes: vec!["vol|<b>\n".into()],
    };
    let mut nodes = vec![node(HOSTILE_CP, Role::Controlplane)];
    nodes.extend(HOSTILE_WORKERS.iter().map(|n| node(n, Role::Worker)));
    plan(
        HOSTILE_CLUSTER,
        &Bump::between(&base, &head),
        &cluster.spec,
        &nodes,
        &PlanOptions::default(),
    )
    .expect("plan")
}

fn homelab_plan(output: &str) -> String {
    let repo = homelab().to_string_lossy().into_owned();
    let o = ichor(&[
        "plan",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--output",
        output,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
}

#[test]
#[ignore = "needs mmdc and chromium: scripts/test installs them"]
fn real_mermaid_draws_steps_where_the_plan_says_and_names_as_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mmdc, config) = mermaid_cli(dir.path());
    let report: Value = serde_json::from_str(&homelab_plan("json")).expect("plan json");
    // The plan itself, whether the report holds one (flattened) or a list per cluster.
    let json = match report["plans"].as_array() {
        Some(plans) => plans.first().cloned().unwrap_or_default(),
        None => report,
    };
    let starts: Vec<u64> = json["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["steps"].as_array().into_iter().flatten())
        .map(|s| s["startSecs"].as_u64().unwrap_or(u64::MAX))
        .collect();
    let estimate = json["estimateSecs"].as_u64().unwrap_or(0);
    assert!(starts.len() > 10 && estimate > 0, "{json:#}");

    let hostile = hostile_plan();
    // The Markdown rendering carries its own ```mermaid block; the other two are wrapped
    // here as a PR comment would wrap them.
    let markdown = format!(
        "{}\n\n```mermaid\n{}```\n\n```mermaid\n{}```\n",
        homelab_plan("markdown"),
        homelab_plan("mermaid"),
        hostile.render_mermaid()
    );
    let svgs = render(&mmdc, &config, dir.path(), &markdown, 3);

    assert_follows(&svgs[0], &starts, estimate);
    assert_follows(&svgs[1], &starts, estimate);

    let svg = &svgs[2];
    let hostile_starts: Vec<u64> = hostile.steps().map(|s| s.start_secs).collect();
    assert_follows(svg, &hostile_starts, hostile.estimate_secs);
    // Each hostile name is one task's label, shown as written (a newline as `\n`).
    let want: Vec<String> = hostile
        .steps()
        .map(|s| match s.nodes.as_slice() {
            [] => s.id.clone(),
            nodes => nodes.join(", ").replace('\n', "\\n"),
        })
        .collect();
    assert_eq!(want.len(), 1 + HOSTILE_WORKERS.len() + 1, "{want:?}");
    for name in std::iter::once(HOSTILE_CP).chain(HOSTILE_WORKERS.iter().copied()) {
        assert!(want.contains(&name.replace('\n', "\\n")), "{name:?}");
    }
    assert_eq!(labels(svg), want, "{svg}");
    assert!(!svg.contains("<img"), "HTML stays text");
    let sections = elements(svg, "text")
        .into_iter()
        .filter(|(tag, _)| attr(tag, "class").is_some_and(|c| c.starts_with("sectionTitle ")))
        .count();
    assert_eq!(sections, hostile.stages.len(), "no injected section: {svg}");
    let title = elements(svg, "text")
        .into_iter()
        .find(|(tag, _)| attr(tag, "class") == Some("titleText"))
        .map(|(_, t)| unescape_xml(t))
        .unwrap_or_default();
    assert!(
        title.starts_with("ichor plan for lab: %% comment\\ntitle x"),
        "{title}"
    );
    // `%%{init}%%` stayed a label: the forest theme's task colour is not in the styles.
    assert!(!svg.contains("#cde498"), "the init directive took effect");
}
