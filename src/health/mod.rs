//! Health checks (`spec.healthChecks` in cluster.yaml): the owner's own definition of
//! healthy, judged before the rollout starts, between its disruptive steps and at its end.
//!
//! This module is the core: the checks as written, their validation, and the judging of what
//! was read (a CEL expression over Kubernetes objects, a Prometheus query's answer) into a
//! [`Reading`], plus the `stableFor` rule. It does no I/O: the objects come through
//! `crate::kube`, the answers through `crate::prometheus`, and the waiting is the rollout's
//! (`crate::rollout`'s health stage).

mod alertmanager_answer;
mod cel_eval;
mod prometheus_answer;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::releaseset::{excerpt, DocumentError, HumanDuration};

pub use alertmanager_answer::judge as judge_alerts;
pub use cel_eval::{
    compile, evaluate, evaluate_failure, CelError, MAX_COMPREHENSIONS, MAX_EXPRESSION_BYTES,
};
pub use prometheus_answer::{judge as judge_prometheus, Sample};

/// The most checks one cluster.yaml may define: each is evaluated at every gate.
pub const MAX_CHECKS: usize = 32;
/// The longest PromQL query accepted (Prometheus takes it in a URL).
pub const MAX_QUERY_BYTES: usize = 4096;
/// The most matchers one Alertmanager check may give, and the longest one.
pub const MAX_MATCHERS: usize = 16;
pub const MAX_MATCHER_BYTES: usize = 256;
/// The most objects a `labelSelector` may match; more is a failure (every one is judged).
pub const MAX_MATCHES: usize = 100;

/// Where in the rollout a check is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Pre-flight, and a live item of the PR's checklist.
    Before,
    /// After each node (or batch) is back and before the next starts, and between stages.
    Between,
    /// The final verify.
    After,
}

impl Phase {
    pub fn key(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Between => "between",
            Phase::After => "after",
        }
    }
}

/// As Argo Rollouts' `consecutiveErrorLimit`, a few blips of the network are not a failure.
pub const DEFAULT_ERROR_LIMIT: u32 = 3;

fn default_error_limit() -> u32 {
    DEFAULT_ERROR_LIMIT
}

fn all_phases() -> Vec<Phase> {
    vec![Phase::Before, Phase::Between, Phase::After]
}

/// One entry of `spec.healthChecks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheck {
    /// DNS-1123 label, unique in the document.
    pub name: String,
    #[serde(default = "all_phases")]
    pub when: Vec<Phase>,
    /// How long the check may fail before the rollout pauses; `spec.rollout.nodeTimeout`
    /// when absent.
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// How long the check must hold before it counts.
    #[serde(default)]
    pub stable_for: HumanDuration,
    /// How many readings in a row that could not judge (Prometheus or the API server did not
    /// answer, a stale or NaN answer) are tolerated before the check counts as failing.
    #[serde(default = "default_error_limit")]
    pub error_limit: u32,
    #[serde(default)]
    pub kubernetes: Option<KubernetesCheck>,
    #[serde(default)]
    pub prometheus: Option<PrometheusCheck>,
    #[serde(default)]
    pub alertmanager: Option<AlertmanagerCheck>,
}

/// A CEL expression over one object, or every object a label selector matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesCheck {
    pub api_version: String,
    pub kind: String,
    /// Absent for cluster-scoped kinds.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub label_selector: Option<String>,
    pub expression: String,
    /// True when the object is broken beyond waiting: the rollout pauses at once, without
    /// waiting out the timeout.
    #[serde(default)]
    pub failure_expression: Option<String>,
}

/// A PromQL query Prometheus evaluates; it passes when the answer has a fresh sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusCheck {
    pub url: String,
    pub query: String,
    #[serde(default)]
    pub max_sample_age: Option<HumanDuration>,
    /// A query whose answer has a (fresh) sample when something is broken beyond waiting:
    /// the rollout pauses at once.
    #[serde(default)]
    pub failure_query: Option<String>,
}

/// Alertmanager's own view of what is firing: the check passes when no active alert
/// matches every matcher, leaving out the silenced (unless `include_silenced`) and the
/// inhibited ones — what Prometheus's `ALERTS` cannot say (kured#499).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AlertmanagerCheck {
    pub url: String,
    /// Label matchers as Alertmanager's filter takes them: `severity="critical"`,
    /// `alertname=~"Kube.*"`, `namespace!="dev"`.
    #[serde(default)]
    pub matchers: Vec<String>,
    #[serde(default)]
    pub include_silenced: bool,
}

impl HealthCheck {
    pub fn applies(&self, phase: Phase) -> bool {
        self.when.contains(&phase)
    }

    /// The timeout, or the rollout's node timeout.
    pub fn timeout_or(&self, node_timeout: HumanDuration) -> Duration {
        self.timeout.unwrap_or(node_timeout).as_duration()
    }

    /// What the check looks at, in a few words (`postgresql.cnpg.io/v1 Cluster db/main`,
    /// `prometheus http://…: ceph_health_status == 0`).
    pub fn subject(&self) -> String {
        if let Some(k) = &self.kubernetes {
            let what = match (&k.name, &k.label_selector) {
                (Some(n), _) => n.clone(),
                (None, Some(s)) => format!("-l {s}"),
                (None, None) => "?".into(),
            };
            let at = k
                .namespace
                .as_deref()
                .map(|n| format!("{n}/"))
                .unwrap_or_default();
            format!("{} {} {at}{what}", k.api_version, k.kind)
        } else if let Some(p) = &self.prometheus {
            format!("Prometheus {}: {}", p.url, excerpt(&p.query, 120))
        } else if let Some(a) = &self.alertmanager {
            format!(
                "Alertmanager {}: alerts {{{}}}",
                a.url,
                excerpt(&a.matchers.join(","), 120)
            )
        } else {
            "nothing".into()
        }
    }
}

/// What one evaluation found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reading {
    pub outcome: Outcome,
    /// The value, as the check's owner reads it: `true`, `false`, `2 samples`, or what went
    /// wrong (`no such object`, `query error bad_data: …`).
    pub value: String,
    /// What it read, briefly: the objects' names and status, the samples.
    pub read: String,
}

/// The three states a check can be in (as Argo Rollouts and Flux's `healthCheckExprs` have
/// them), plus a reading that could not judge at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    /// Unhealthy now: the gate waits, up to the check's timeout.
    Fail,
    /// Nothing to judge by (no answer, a stale or NaN one): never a pass, tolerated
    /// `errorLimit` times in a row, then failing.
    Unknown,
    /// Broken beyond waiting (a `failureExpression` or `failureQuery` holds, a query
    /// Prometheus cannot parse): the rollout pauses at once.
    Failed,
}

impl Reading {
    fn with(outcome: Outcome, value: impl Into<String>, read: impl Into<String>) -> Self {
        Reading {
            outcome,
            value: value.into(),
            read: read.into(),
        }
    }
    pub fn pass(value: impl Into<String>, read: impl Into<String>) -> Self {
        Self::with(Outcome::Pass, value, read)
    }
    pub fn fail(value: impl Into<String>, read: impl Into<String>) -> Self {
        Self::with(Outcome::Fail, value, read)
    }
    pub fn unknown(value: impl Into<String>, read: impl Into<String>) -> Self {
        Self::with(Outcome::Unknown, value, read)
    }
    pub fn failed(value: impl Into<String>, read: impl Into<String>) -> Self {
        Self::with(Outcome::Failed, value, read)
    }
    pub fn passes(&self) -> bool {
        self.outcome == Outcome::Pass
    }
}

/// Whether a check counts now, given its reading and its run so far ([`Run`], updated here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    /// Passing, not yet for `stableFor`: how long it still needs.
    Settling(Duration),
    /// The reading could not judge; the `errors`-th in a row, still tolerated.
    Unknown {
        errors: u32,
    },
    Fails,
    /// Broken beyond waiting: pause now.
    Failed,
}

/// A check's history at one gate: since when it has passed without a break, and how many
/// readings in a row could not judge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Run {
    pub passing_since: Option<Timestamp>,
    pub errors: u32,
}

/// The `stableFor` rule: a pass counts once passes have been read without a failure in
/// between for `stable_for`; any failing reading starts it over. A reading that could not
/// judge never passes: up to `error_limit` in a row neither count nor break the run, the
/// next counts as failing.
pub fn judge_stability(
    reading: &Reading,
    run: &mut Run,
    stable_for: Duration,
    error_limit: u32,
    now: Timestamp,
) -> Verdict {
    match reading.outcome {
        Outcome::Failed => {
            *run = Run::default();
            return Verdict::Failed;
        }
        Outcome::Fail => {
            *run = Run::default();
            return Verdict::Fails;
        }
        Outcome::Unknown => {
            // Counted up to one past the limit: the record changes only when the state does.
            run.errors = run
                .errors
                .saturating_add(1)
                .min(error_limit.saturating_add(1));
            if run.errors > error_limit {
                run.passing_since = None;
                return Verdict::Fails;
            }
            return Verdict::Unknown { errors: run.errors };
        }
        Outcome::Pass => run.errors = 0,
    }
    let since = *run.passing_since.get_or_insert(now);
    let held = now.since(since);
    if held >= stable_for {
        Verdict::Holds
    } else {
        Verdict::Settling(stable_for - held)
    }
}

/// A DNS-1123 label, as Kubernetes names a Service or a container.
fn check_label(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("only lower-case letters, digits and `-` are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The line (1-based) and column of the `nth` line at or after line `from` (0-based) whose
/// trimmed text starts with `needle`, stopping at the next check (`- name:` at the check's
/// own indentation is the next entry).
fn locate_in(text: &str, from: usize, needle: &str) -> Option<(usize, usize)> {
    text.lines().enumerate().skip(from).find_map(|(i, line)| {
        let trimmed = line.trim_start().trim_start_matches("- ");
        trimmed
            .starts_with(needle)
            .then(|| (i + 1, line.len() - trimmed.len() + 1))
    })
}

/// Where each check starts: the 0-based line of its `- name:` (or of `healthChecks:`).
fn check_lines(text: &str, count: usize) -> Vec<Option<usize>> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = lines
        .iter()
        .position(|l| l.trim_start().starts_with("healthChecks:"))
    else {
        return vec![None; count];
    };
    // Entries are the `- ` items at the first item's indentation.
    let mut out = Vec::new();
    let mut indent = None;
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let ind = l.len() - t.len();
        if indent.is_none() {
            if !t.starts_with("- ") && t != "-" {
                break;
            }
            indent = Some(ind);
        }
        if Some(ind) < indent {
            break;
        }
        if Some(ind) == indent && (t.starts_with("- ") || t == "-") {
            out.push(Some(i));
        }
    }
    out.resize(count, Some(start));
    out
}

/// Validate `spec.healthChecks` as written in `text` (for lines). Every error names the
/// check and the line; a CEL expression is compiled here, so a bad one never reaches a
/// cluster.
pub fn validate(
    file: &str,
    text: &str,
    checks: &[HealthCheck],
    node_timeout: HumanDuration,
) -> Result<(), DocumentError> {
    let top = || crate::releaseset::locate(text, "healthChecks:", 0);
    if checks.len() > MAX_CHECKS {
        return Err(DocumentError::at(
            file,
            top(),
            format!(
                "spec.healthChecks has {} checks; at most {MAX_CHECKS} are allowed (each runs at every gate)",
                checks.len()
            ),
        ));
    }
    let starts = check_lines(text, checks.len());
    for (i, c) in checks.iter().enumerate() {
        let from = starts[i].unwrap_or(0);
        let at = |needle: &str| locate_in(text, from, needle).or(Some((from + 1, 1)));
        let field = |f: &str| format!("spec.healthChecks[{i}]{f}");
        let name = excerpt(&c.name, 64);
        if let Err(why) = check_label(&c.name) {
            return Err(DocumentError::at(
                file,
                at("name:"),
                format!("{} `{name}` is not a DNS-1123 label: {why}", field(".name")),
            ));
        }
        if let Some(j) = checks[..i].iter().position(|o| o.name == c.name) {
            return Err(DocumentError::at(
                file,
                at("name:"),
                format!("{} `{name}` is already the name of spec.healthChecks[{j}]; names must be unique", field(".name")),
            ));
        }
        if c.when.is_empty() {
            return Err(DocumentError::at(
                file,
                at("when:"),
                format!("{} is empty; expected some of before, between, after (or leave it out for all three)", field(".when")),
            ));
        }
        let mut seen = c.when.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != c.when.len() {
            return Err(DocumentError::at(
                file,
                at("when:"),
                format!("{} names a phase twice", field(".when")),
            ));
        }
        if c.timeout.is_some_and(|t| t.0.is_zero()) {
            return Err(DocumentError::at(
                file,
                at("timeout:"),
                format!(
                    "{} is zero; give how long the check may fail (e.g. 15m), or leave it out for spec.rollout.nodeTimeout",
                    field(".timeout")
                ),
            ));
        }
        // A run of passes must be able to count before the timeout ends the wait.
        let timeout = c.timeout.unwrap_or(node_timeout);
        if !c.stable_for.0.is_zero() && c.stable_for >= timeout {
            let whose = match c.timeout {
                Some(t) => format!("its timeout ({t})"),
                None => {
                    format!("spec.rollout.nodeTimeout ({timeout}), its timeout when it gives none")
                }
            };
            return Err(DocumentError::at(
                file,
                at("stableFor:"),
                format!(
                    "{} ({}) is not shorter than {whose}: the check could never count; give a longer timeout",
                    field(".stableFor"),
                    c.stable_for
                ),
            ));
        }
        match (&c.kubernetes, &c.prometheus, &c.alertmanager) {
            (Some(k), None, None) => validate_kubernetes(file, i, k, &at)?,
            (None, Some(p), None) => validate_prometheus(file, i, p, &at)?,
            (None, None, Some(a)) => validate_alertmanager(file, i, a, &at)?,
            _ => {
                return Err(DocumentError::at(
                    file,
                    at("name:"),
                    format!(
                        "{} `{name}` needs exactly one of kubernetes, prometheus or alertmanager",
                        field("")
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn validate_kubernetes(
    file: &str,
    i: usize,
    k: &KubernetesCheck,
    at: &dyn Fn(&str) -> Option<(usize, usize)>,
) -> Result<(), DocumentError> {
    let field = |f: &str| format!("spec.healthChecks[{i}].kubernetes.{f}");
    let av = &k.api_version;
    let av_ok = !av.is_empty()
        && av.len() <= 253
        && av.split('/').count() <= 2
        && av
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/'));
    if !av_ok {
        return Err(DocumentError::at(
            file,
            at("apiVersion:"),
            format!(
                "{} `{}` is not an API version; expected e.g. v1 or postgresql.cnpg.io/v1",
                field("apiVersion"),
                excerpt(av, 64)
            ),
        ));
    }
    let kind_ok = !k.kind.is_empty()
        && k.kind.len() <= 63
        && k.kind.bytes().all(|b| b.is_ascii_alphanumeric())
        && k.kind.starts_with(|c: char| c.is_ascii_uppercase());
    if !kind_ok {
        return Err(DocumentError::at(
            file,
            at("kind:"),
            format!(
                "{} `{}` is not a kind; expected e.g. ConfigMap or Cluster",
                field("kind"),
                excerpt(&k.kind, 64)
            ),
        ));
    }
    if let Some(ns) = &k.namespace {
        if let Err(why) = check_label(ns) {
            return Err(DocumentError::at(
                file,
                at("namespace:"),
                format!(
                    "{} `{}` is not a namespace name: {why}",
                    field("namespace"),
                    excerpt(ns, 64)
                ),
            ));
        }
    }
    match (&k.name, &k.label_selector) {
        (Some(n), None) => {
            if let Err(why) = crate::releaseset::check_node_name(n) {
                return Err(DocumentError::at(
                    file,
                    at("kubernetes:"),
                    format!(
                        "{} `{}` is not an object name: {why}",
                        field("name"),
                        excerpt(n, 64)
                    ),
                ));
            }
        }
        (None, Some(s)) => {
            let ok = !s.trim().is_empty()
                && s.len() <= 1024
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b" =!,._-/()".contains(&b) || b == b' ');
            if !ok {
                return Err(DocumentError::at(
                    file,
                    at("labelSelector:"),
                    format!(
                        "{} `{}` is not a label selector; expected e.g. app=pg or tier in (db)",
                        field("labelSelector"),
                        excerpt(s, 64)
                    ),
                ));
            }
        }
        _ => {
            return Err(DocumentError::at(
                file,
                at("kubernetes:"),
                format!(
                    "{} needs exactly one of name or labelSelector",
                    format_args!("spec.healthChecks[{i}].kubernetes")
                ),
            ));
        }
    }
    let exprs = [
        ("expression", Some(&k.expression)),
        ("failureExpression", k.failure_expression.as_ref()),
    ];
    for (name, expr) in exprs {
        let Some(expr) = expr else { continue };
        if let Err(e) = compile(expr) {
            let (line, col) = at(&format!("{name}:")).unwrap_or((1, 1));
            // The expression's own line (a block scalar spans several) and column.
            let (el, ec) = e.position.unwrap_or((0, 0));
            let pos = if el > 0 {
                Some((line + el.saturating_sub(1), if el == 1 { col } else { ec }))
            } else {
                Some((line, col))
            };
            return Err(DocumentError::at(
                file,
                pos,
                format!("{}: {}", field(name), e.message),
            ));
        }
    }
    Ok(())
}

fn validate_prometheus(
    file: &str,
    i: usize,
    p: &PrometheusCheck,
    at: &dyn Fn(&str) -> Option<(usize, usize)>,
) -> Result<(), DocumentError> {
    let field = |f: &str| format!("spec.healthChecks[{i}].prometheus.{f}");
    if let Err(why) = check_url(&p.url) {
        return Err(DocumentError::at(
            file,
            at("url:"),
            format!("{} `{}`: {why}", field("url"), excerpt(&p.url, 80)),
        ));
    }
    let queries = [
        ("query", Some(&p.query)),
        ("failureQuery", p.failure_query.as_ref()),
    ];
    for (name, query) in queries {
        let Some(query) = query else { continue };
        if query.trim().is_empty() {
            return Err(DocumentError::at(
                file,
                at(&format!("{name}:")),
                format!("{} is empty; expected a PromQL query", field(name)),
            ));
        }
        if query.len() > MAX_QUERY_BYTES {
            return Err(DocumentError::at(
                file,
                at(&format!("{name}:")),
                format!(
                    "{} is {} bytes; at most {MAX_QUERY_BYTES} are allowed",
                    field(name),
                    query.len()
                ),
            ));
        }
    }
    if p.max_sample_age.is_some_and(|a| a.0.is_zero()) {
        return Err(DocumentError::at(
            file,
            at("maxSampleAge:"),
            format!(
                "{} is zero; no sample could ever be fresh",
                field("maxSampleAge")
            ),
        ));
    }
    Ok(())
}

fn validate_alertmanager(
    file: &str,
    i: usize,
    a: &AlertmanagerCheck,
    at: &dyn Fn(&str) -> Option<(usize, usize)>,
) -> Result<(), DocumentError> {
    let field = |f: &str| format!("spec.healthChecks[{i}].alertmanager.{f}");
    if let Err(why) = check_url(&a.url) {
        return Err(DocumentError::at(
            file,
            at("url:"),
            format!("{} `{}`: {why}", field("url"), excerpt(&a.url, 80)),
        ));
    }
    if a.matchers.len() > MAX_MATCHERS {
        return Err(DocumentError::at(
            file,
            at("matchers:"),
            format!(
                "{} has {} matchers; at most {MAX_MATCHERS} are allowed",
                field("matchers"),
                a.matchers.len()
            ),
        ));
    }
    for (j, m) in a.matchers.iter().enumerate() {
        if let Err(why) = check_matcher(m) {
            return Err(DocumentError::at(
                file,
                at("matchers:"),
                format!("{}[{j}] `{}`: {why}", field("matchers"), excerpt(m, 80)),
            ));
        }
    }
    Ok(())
}

/// A label matcher as Alertmanager's filter and silences take it: a label name, one of
/// `=`, `!=`, `=~`, `!~`, and a double-quoted value (prometheus/alertmanager
/// `pkg/labels/parse.go`). Alertmanager judges the regex itself (a 400 if it cannot).
pub fn check_matcher(m: &str) -> Result<(), String> {
    if m.len() > MAX_MATCHER_BYTES {
        return Err(format!("longer than {MAX_MATCHER_BYTES} bytes"));
    }
    let name_end = m
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(m.len());
    let name = &m[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("expected a label name first, e.g. severity=\"critical\"".into());
    }
    let rest = &m[name_end..];
    let value = ["=~", "!~", "!=", "="]
        .iter()
        .find_map(|op| rest.strip_prefix(op))
        .ok_or("expected =, !=, =~ or !~ after the label name")?;
    if value.len() < 2 || !value.starts_with('"') || !value.ends_with('"') {
        return Err("expected the value in double quotes".into());
    }
    if value.chars().any(|c| c.is_control()) {
        return Err("the value has a control character".into());
    }
    Ok(())
}

/// `http://host[:port][/path]` or https, with no credentials in it (a URL is logged; the
/// token comes from the controller's config).
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("expected an http:// or https:// URL")?;
    if url.len() > 2048 {
        return Err("longer than 2048 characters".into());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("it names no host".into());
    }
    if authority.contains('@') {
        return Err("it carries credentials; a token for Prometheus comes from the controller's config (a token file), never from the repository".into());
    }
    if url.contains('?') || url.contains('#') {
        return Err("expected the server's base URL, without a query or fragment (ichor adds /api/v1/query)".into());
    }
    if !url
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"\"<>\\^`{|}".contains(&b))
    {
        return Err("it contains characters a URL cannot".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(checks: &str) -> String {
        format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: homelab\nspec:\n  healthChecks:\n{checks}"
        )
    }

    fn parse(checks: &str) -> Result<crate::releaseset::Cluster, DocumentError> {
        crate::releaseset::Cluster::parse("cluster.yaml", &doc(checks))
    }

    const GOOD: &str = r#"    - name: postgres-ready
      when: [before, between, after]
      timeout: 15m
      stableFor: 1m
      kubernetes:
        apiVersion: postgresql.cnpg.io/v1
        kind: Cluster
        namespace: db
        name: main
        expression: 'object.status.readyInstances == object.spec.instances'
    - name: ceph-ok
      prometheus:
        url: http://prometheus.monitoring.svc:9090
        query: 'ceph_health_status == 0'
        maxSampleAge: 2m
"#;

    #[test]
    fn the_issue_example_parses_with_defaults() {
        let c = parse(GOOD).unwrap();
        let h = &c.spec.health_checks;
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].when, all_phases());
        assert_eq!(h[1].timeout, None);
        assert_eq!(h[0].stable_for, HumanDuration::from_mins(1));
        assert_eq!(
            h[1].timeout_or(HumanDuration::from_mins(30)),
            Duration::from_secs(1800)
        );
        assert_eq!(h[0].subject(), "postgresql.cnpg.io/v1 Cluster db/main");
    }

    #[test]
    fn a_bad_expression_is_an_error_at_its_line() {
        let bad = GOOD.replace(
            "'object.status.readyInstances == object.spec.instances'",
            "'object.status.readyInstances == == 2'",
        );
        let e = parse(&bad).unwrap_err();
        assert_eq!(e.line, Some(16), "{e}");
        assert!(
            e.message.contains("healthChecks[0].kubernetes.expression"),
            "{e}"
        );
    }

    #[test]
    fn each_rule_names_the_check_and_its_line() {
        let cases: Vec<(String, usize, &str)> = vec![
            (GOOD.replace("name: ceph-ok", "name: Ceph_OK"), 17, "DNS-1123"),
            (GOOD.replace("name: ceph-ok", "name: postgres-ready"), 17, "unique"),
            (GOOD.replace("when: [before, between, after]", "when: []"), 8, "when"),
            (GOOD.replace("when: [before, between, after]", "when: [during]"), 8, "unknown variant"),
            (GOOD.replace("timeout: 15m", "timeout: 15 minutes"), 9, "unit"),
            (GOOD.replace("stableFor: 1m", "stableFor: 1h"), 10, "not shorter than its timeout (15m)"),
            (GOOD.replace("stableFor: 1m", "stableFor: 15m"), 10, "not shorter than its timeout (15m)"),
            // No timeout: spec.rollout.nodeTimeout (30m by default) is the one it must beat.
            (GOOD.replace("    - name: ceph-ok\n", "    - name: ceph-ok\n      stableFor: 30m\n"), 18, "spec.rollout.nodeTimeout (30m)"),
            (GOOD.replace("        expression: 'object", "        failureExpression: 'object.x =='\n        expression: 'object"), 16, "failureExpression"),
            (GOOD.replace("        maxSampleAge: 2m\n", "        failureQuery: ' '\n"), 21, "failureQuery is empty"),
            (GOOD.replace("        name: main\n", ""), 11, "exactly one of name or labelSelector"),
            (GOOD.replace("        name: main\n", "        name: main\n        labelSelector: app=pg\n"), 11, "exactly one of name or labelSelector"),
            (GOOD.replace("      prometheus:\n", "      kubernetes: {apiVersion: v1, kind: ConfigMap, name: x, expression: 'true'}\n      prometheus:\n"), 17, "exactly one of kubernetes, prometheus or alertmanager"),
            (GOOD.replace("    - name: ceph-ok\n", "    - name: am\n      alertmanager: {url: 'http://am:9093', matchers: ['severity=critical']}\n    - name: ceph-ok\n"), 17, "double quotes"),
            (GOOD.replace("    - name: ceph-ok\n", "    - name: am\n      alertmanager: {url: 'http://am:9093', matchers: ['9x=\"a\"']}\n    - name: ceph-ok\n"), 17, "label name"),
            (GOOD.replace("query: 'ceph_health_status == 0'", "query: ''"), 20, "empty"),
            (GOOD.replace("http://prometheus", "http://user:pw@prometheus"), 19, "credentials"),
            (GOOD.replace("maxSampleAge: 2m", "maxSampleAge: 0s"), 21, "zero"),
        ];
        for (text, line, needle) in cases {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn sizes_are_bounded() {
        let mut many = String::new();
        for i in 0..=MAX_CHECKS {
            many.push_str(&format!(
                "    - name: c{i}\n      prometheus: {{url: 'http://p:9090', query: up}}\n"
            ));
        }
        let e = parse(&many).unwrap_err();
        assert!(e.message.contains("at most 32"), "{e}");
        let long = GOOD.replace(
            "'ceph_health_status == 0'",
            &format!("'{}'", "a".repeat(MAX_QUERY_BYTES + 1)),
        );
        assert!(parse(&long).unwrap_err().message.contains("at most 4096"));
        let long = GOOD.replace(
            "'object.status.readyInstances == object.spec.instances'",
            &format!("'{}'", "true && ".repeat(600) + "true"),
        );
        let e = parse(&long).unwrap_err();
        assert!(e.message.contains("bytes"), "{e}");
    }

    #[test]
    fn stable_for_needs_an_unbroken_run_of_passes() {
        let t0 = Timestamp::from_millis(1_000_000);
        let at = |s: u64| t0.plus(Duration::from_secs(s));
        let pass = Reading::pass("true", "");
        let fail = Reading::fail("false", "");
        let need = Duration::from_secs(60);
        let mut run = Run::default();
        let judge = |r: &Reading, run: &mut Run, s| judge_stability(r, run, need, 3, at(s));
        assert_eq!(judge(&pass, &mut run, 0), Verdict::Settling(need));
        assert_eq!(
            judge(&pass, &mut run, 30),
            Verdict::Settling(Duration::from_secs(30))
        );
        // A flap starts it over.
        assert_eq!(judge(&fail, &mut run, 40), Verdict::Fails);
        assert_eq!(judge(&pass, &mut run, 50), Verdict::Settling(need));
        assert_eq!(judge(&pass, &mut run, 110), Verdict::Holds);
        let mut run = Run::default();
        assert_eq!(
            judge_stability(&pass, &mut run, Duration::ZERO, 3, at(0)),
            Verdict::Holds
        );
    }

    #[test]
    fn a_reading_that_cannot_judge_never_passes_and_counts_as_failing_past_the_limit() {
        let t0 = Timestamp::from_millis(1_000_000);
        let at = |s: u64| t0.plus(Duration::from_secs(s));
        let pass = Reading::pass("true", "");
        let unknown = Reading::unknown("error: Prometheus did not answer", "");
        let mut run = Run::default();
        let judge =
            |r: &Reading, run: &mut Run, s| judge_stability(r, run, Duration::ZERO, 3, at(s));
        assert_eq!(judge(&pass, &mut run, 0), Verdict::Holds);
        // Even with no stableFor, an unknown reading is never a pass.
        for n in 1..=3 {
            assert_eq!(
                judge(&unknown, &mut run, n),
                Verdict::Unknown { errors: n as u32 }
            );
        }
        // Tolerated blips neither pass nor break the run; a pass clears the count.
        assert_eq!(run.passing_since, Some(at(0)));
        assert_eq!(judge(&pass, &mut run, 4), Verdict::Holds);
        assert_eq!(run.errors, 0);
        for n in 1..=3 {
            judge(&unknown, &mut run, 4 + n);
        }
        // The fourth in a row counts as failing, and the run of passes is over.
        assert_eq!(judge(&unknown, &mut run, 8), Verdict::Fails);
        assert_eq!(run.passing_since, None);
        // errorLimit 0: the first is failing.
        let mut run = Run::default();
        assert_eq!(
            judge_stability(&unknown, &mut run, Duration::ZERO, 0, at(0)),
            Verdict::Fails
        );
        // A failed reading pauses, whatever the run.
        let mut run = Run::default();
        judge(&pass, &mut run, 0);
        assert_eq!(
            judge(&Reading::failed("failureExpression true", ""), &mut run, 1),
            Verdict::Failed
        );
    }
}
