//! The configuration of `ichor run` (`--config`, e.g. deploy/config.yaml): where the
//! repository is, which clusters this instance acts on, the credentials, the webhook
//! secret, the poll interval and the listen addresses. Unknown keys are errors (a typo
//! must not silently disable something); every error names the file and line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::releaseset::HumanDuration;
use crate::releaseset::{locate, DocumentError};

/// Notifications (its own file; declared here to keep the controller's module list as is).
#[path = "notify.rs"]
pub mod notify;

/// The shortest poll interval accepted: GitHub's rate limit and a remote's patience.
pub const MIN_POLL_SECS: u64 = 10;
/// At most this many clusters per instance.
pub const MAX_CLUSTERS: usize = 64;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    pub repository: RepositoryConfig,
    pub clusters: Vec<ClusterConfig>,
    #[serde(default)]
    pub credentials: Credentials,
    #[serde(default)]
    pub github: Option<GithubConfig>,
    #[serde(default)]
    pub webhook: Option<WebhookConfig>,
    #[serde(default = "default_poll")]
    pub poll_interval: HumanDuration,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Also write the records as git notes when GitHub is the reporter (Git-only mode
    /// always does).
    #[serde(default)]
    pub notes: bool,
    #[serde(default)]
    pub leader_election: LeaderElection,
    /// Where rollout events are sent (notify.rs); the URLs are secrets, from files or the
    /// environment.
    #[serde(default)]
    pub notifications: Option<notify::NotificationsConfig>,
    /// What one peer's input may cost ichor.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What the gate does beside its verdict.
    #[serde(default)]
    pub gate: GateConfig,
}

/// `gate:` in the controller's config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateConfig {
    /// Rehearse each gated PR on a twin of its cluster under random faults, after its
    /// verdict is posted (docs/rehearse.md). Off unless given.
    #[serde(default)]
    pub rehearse: Option<GateRehearse>,
}

/// `gate.rehearse:` — how much a PR's rehearsal may cost.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateRehearse {
    /// Seeds per head (1 to [`MAX_REHEARSE_SEEDS`]).
    pub seeds: u32,
    /// Wall time one head's rehearsal may take; the seeds not started by then are left
    /// out, and the line says how many ran.
    #[serde(default = "default_rehearse_timeout")]
    pub timeout: HumanDuration,
}

/// The most seeds `gate.rehearse.seeds` may ask for per head.
pub const MAX_REHEARSE_SEEDS: u32 = 1000;

fn default_rehearse_timeout() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(600))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsConfig {
    /// The most bytes one PR's head may send when fetched (each PR is fetched on its own,
    /// so one oversized PR never stalls the branches or another PR).
    #[serde(default = "default_pr_fetch_bytes")]
    pub pr_fetch_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            pr_fetch_bytes: default_pr_fetch_bytes(),
        }
    }
}

fn default_pr_fetch_bytes() -> u64 {
    256 << 20
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RepositoryConfig {
    /// A remote to poll: `https://…`, `ssh://…` or `git@host:path`.
    pub url: Option<String>,
    /// A repository on disk, watched for refs moving (Git-only mode).
    pub path: Option<PathBuf>,
    /// The protected branch: only what reaches it rolls out.
    #[serde(default = "default_branch")]
    pub branch: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterConfig {
    pub name: String,
    /// No kubeconfig: the in-cluster ServiceAccount (when running in a pod).
    pub kubeconfig: Option<PathBuf>,
    pub talosconfig: Option<PathBuf>,
    /// `false`: gate only, never roll out.
    #[serde(default = "yes")]
    pub act: bool,
    /// The Prometheus the cluster's health checks may query with a bearer token: the token
    /// (a file; the repository never carries it) goes only to this URL.
    #[serde(default)]
    pub prometheus: Option<Endpoint>,
}

/// A URL and the bearer token bound to it (`crate::prometheus::Credential`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub url: String,
    pub token_file: PathBuf,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Credentials {
    pub github: Option<GithubCredentials>,
    pub git: Option<GitCredentials>,
    /// Git-only mode: the HMAC key of ichor's acks (64 hex digits), from a file that
    /// outlives the state dir (a Kubernetes Secret); without it, `<stateDir>/ack.key`.
    pub ack_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GithubCredentials {
    pub token_file: Option<PathBuf>,
    /// An environment variable holding the token (e.g. `GITHUB_TOKEN`).
    pub token_env: Option<String>,
    pub app_id: Option<u64>,
    pub installation_id: Option<u64>,
    pub private_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GitCredentials {
    /// https: a token as the password (user `x-access-token` unless `user` says).
    pub token_file: Option<PathBuf>,
    pub user: Option<String>,
    /// ssh: a private key file and the known_hosts that pins the server's key.
    pub ssh_key_file: Option<PathBuf>,
    pub known_hosts_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GithubConfig {
    /// `owner/name`; by default read from a `github.com` repository URL.
    pub repository: Option<String>,
    #[serde(default = "default_api")]
    pub api_url: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookConfig {
    pub secret_file: Option<PathBuf>,
    pub secret_env: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderElection {
    /// Where the per-cluster controller leases live, in each cluster's own API.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "default_lease")]
    pub lease_duration: HumanDuration,
    /// This replica's name in the leases; `ICHOR_POD_NAME` or the host name by default.
    pub identity: Option<String>,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            namespace: default_namespace(),
            lease_duration: default_lease(),
            identity: None,
        }
    }
}

fn default_poll() -> HumanDuration {
    HumanDuration::from_mins(5)
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8080))
}
fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 9090))
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/ichor")
}
fn default_branch() -> String {
    "main".into()
}
fn default_api() -> String {
    "https://api.github.com".into()
}
fn default_namespace() -> String {
    crate::gate::live::ICHOR_NAMESPACE.into()
}
fn default_lease() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn yes() -> bool {
    true
}

/// Where the repository is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Remote(String),
    Path(PathBuf),
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, DocumentError> {
        let file = path.display().to_string();
        // Sized before it is read: a configuration is a page of YAML.
        let size = std::fs::metadata(path)
            .map_err(|e| DocumentError::new(&file, format!("cannot read: {e}")))?
            .len();
        if size > MAX_CONFIG_BYTES {
            return Err(DocumentError::new(
                &file,
                format!("is {size} bytes; a configuration is at most {MAX_CONFIG_BYTES}"),
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| DocumentError::new(&file, format!("cannot read: {e}")))?;
        Config::parse(&file, &text)
    }

    /// What is allowed but unwise, for `--check` and the start: secret files anyone on the
    /// machine can read, a webhook secret short enough to guess. Never quotes a secret.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut files: Vec<(&str, &Path)> = Vec::new();
        if let Some(g) = &self.credentials.github {
            files.extend(
                g.token_file
                    .as_deref()
                    .map(|f| ("credentials.github.tokenFile", f)),
            );
            files.extend(
                g.private_key_file
                    .as_deref()
                    .map(|f| ("credentials.github.privateKeyFile", f)),
            );
        }
        if let Some(g) = &self.credentials.git {
            files.extend(
                g.token_file
                    .as_deref()
                    .map(|f| ("credentials.git.tokenFile", f)),
            );
            files.extend(
                g.ssh_key_file
                    .as_deref()
                    .map(|f| ("credentials.git.sshKeyFile", f)),
            );
        }
        if let Some(w) = &self.webhook {
            files.extend(w.secret_file.as_deref().map(|f| ("webhook.secretFile", f)));
        }
        if let Some(n) = &self.notifications {
            files.extend(n.secret_files());
        }
        for c in &self.clusters {
            files.extend(
                c.prometheus
                    .as_ref()
                    .map(|p| ("clusters[].prometheus.tokenFile", p.token_file.as_path())),
            );
        }
        #[cfg(unix)]
        for (key, f) in &files {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(f) {
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o004 != 0 {
                    out.push(format!(
                        "{key} {}: readable by everyone on this machine (mode {mode:04o}); chmod 600 it (in Kubernetes, a defaultMode such as 0440 on the Secret volume, as deploy/deployment.yaml sets)",
                        f.display()
                    ));
                }
            }
        }
        if let Some(w) = &self.webhook {
            let secret = match (&w.secret_file, &w.secret_env) {
                (Some(f), _) => crate::secret::Secret::from_file(f).ok(),
                (None, Some(e)) => crate::secret::Secret::from_env(e).ok(),
                (None, None) => None,
            };
            if let Some(s) = secret {
                if s.expose().len() < MIN_WEBHOOK_SECRET_BYTES {
                    out.push(format!(
                        "webhook: the secret is {} bytes; use at least {MIN_WEBHOOK_SECRET_BYTES} random bytes (e.g. `openssl rand -hex 32`): anyone who guesses it can forge deliveries",
                        s.expose().len()
                    ));
                }
            }
        }
        out
    }

    pub fn parse(file: &str, text: &str) -> Result<Config, DocumentError> {
        let c: Config = crate::releaseset::yaml::parse(file, text)?;
        c.validate(file, text)?;
        Ok(c)
    }

    fn validate(&self, file: &str, text: &str) -> Result<(), DocumentError> {
        let at = |needle: &str, message: String| {
            DocumentError::at(file, locate(text, needle, 0), message)
        };
        if let Some(n) = &self.notifications {
            n.validate().map_err(|m| at("notifications:", m))?;
        }
        if let Some(r) = &self.gate.rehearse {
            if !(1..=MAX_REHEARSE_SEEDS).contains(&r.seeds) {
                return Err(at(
                    "seeds:",
                    format!(
                        "gate.rehearse.seeds: expected 1 to {MAX_REHEARSE_SEEDS}, got {}",
                        r.seeds
                    ),
                ));
            }
            if r.timeout.0.is_zero() || r.timeout.0 > std::time::Duration::from_secs(6 * 3600) {
                return Err(at(
                    "timeout:",
                    "gate.rehearse.timeout: expected more than 0s and at most 6h".to_string(),
                ));
            }
        }
        let r = &self.repository;
        match (&r.url, &r.path) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "path:",
                    "repository: give `url` (a remote to poll) or `path` (a repository on disk), not both".into(),
                ))
            }
            (None, None) => {
                return Err(at(
                    "repository:",
                    "repository: expected `url` (a remote to poll) or `path` (a repository on disk)".into(),
                ))
            }
            (Some(url), None) => {
                let ok = ["https://", "http://", "ssh://", "file://"]
                    .iter()
                    .any(|p| url.starts_with(p))
                    || (url.contains('@') && url.contains(':') && !url.contains("://"));
                if !ok {
                    return Err(at(
                        "url:",
                        format!("repository.url `{}`: expected https://…, ssh://… or user@host:path", redact_url(url)),
                    ));
                }
                if url_has_password(url) || (url.starts_with("http") && url_has_userinfo(url)) {
                    return Err(at(
                        "url:",
                        "repository.url carries credentials; put the token in credentials.git.tokenFile instead (a URL is logged, a secret must not be)".into(),
                    ));
                }
                // Whoever sits on the path could hand ichor any "protected branch" to roll out.
                if url.starts_with("http://") && !is_loopback_http(url) {
                    return Err(at(
                        "url:",
                        format!("repository.url `{}`: plain http lets anyone on the path change what ichor rolls out; use https:// or ssh:// (plain http only on loopback)", redact_url(url)),
                    ));
                }
            }
            (None, Some(p)) => {
                if !p.is_absolute() {
                    return Err(at(
                        "path:",
                        format!("repository.path {}: expected an absolute path", p.display()),
                    ));
                }
            }
        }
        if r.branch.is_empty()
            || !git2::Reference::is_valid_name(&format!("refs/heads/{}", r.branch))
        {
            return Err(at(
                "branch:",
                format!(
                    "repository.branch `{}` is not a valid branch name",
                    r.branch
                ),
            ));
        }
        if self.clusters.is_empty() {
            return Err(at(
                "clusters:",
                "clusters: expected at least one cluster (clusters/<name>/ in the repository)"
                    .into(),
            ));
        }
        if self.clusters.len() > MAX_CLUSTERS {
            return Err(at(
                "clusters:",
                format!("clusters: at most {MAX_CLUSTERS} per instance"),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in self.clusters.iter().enumerate() {
            let pos = cluster_line(text, i);
            if !crate::forge::command::valid_cluster_name(&c.name) {
                return Err(DocumentError::at(
                    file,
                    pos,
                    format!("clusters[{i}].name `{}`: expected a DNS label (lowercase letters, digits and `-`), as clusters/<name>/ is", crate::escape::clip(&c.name, 70)),
                ));
            }
            if let Some(p) = &c.prometheus {
                // The same rule the token is sent by, refused here rather than withheld later.
                crate::prometheus::Credential::new(&p.url, crate::secret::Secret::new(""))
                    .map_err(|why| {
                        DocumentError::at(file, pos, format!("clusters[{i}].prometheus.url: {why}"))
                    })?;
            }
            if !seen.insert(&c.name) {
                return Err(DocumentError::at(
                    file,
                    pos,
                    format!("clusters[{i}].name `{}` appears twice", c.name),
                ));
            }
            if c.act && c.talosconfig.is_none() {
                return Err(DocumentError::at(
                    file,
                    pos,
                    format!("clusters[{i}] ({}): a cluster ichor acts on needs `talosconfig` (the rollout talks to the Talos API); set `act: false` to gate only", c.name),
                ));
            }
        }
        if self.poll_interval.as_duration().as_secs() < MIN_POLL_SECS {
            return Err(at(
                "pollInterval:",
                format!("pollInterval: at least {MIN_POLL_SECS}s"),
            ));
        }
        let gh = self.credentials.github.as_ref();
        if let Some(g) = gh {
            let token = g.token_file.is_some() || g.token_env.is_some();
            let app =
                g.app_id.is_some() || g.installation_id.is_some() || g.private_key_file.is_some();
            if token && app {
                return Err(at("github:", "credentials.github: a token or a GitHub App (appId, installationId, privateKeyFile), not both".into()));
            }
            if !token && !app {
                return Err(at("github:", "credentials.github: expected tokenFile (or tokenEnv), or appId, installationId and privateKeyFile".into()));
            }
            if app
                && (g.app_id.is_none()
                    || g.installation_id.is_none()
                    || g.private_key_file.is_none())
            {
                return Err(at("github:", "credentials.github: a GitHub App needs appId, installationId and privateKeyFile".into()));
            }
            if self.github_repository().is_none() {
                return Err(at("repository:", "github.repository: expected owner/name (it cannot be read from repository.url, which is not on github.com)".into()));
            }
        }
        if let Some(w) = &self.webhook {
            if w.secret_file.is_none() && w.secret_env.is_none() {
                return Err(at(
                    "webhook:",
                    "webhook: expected secretFile or secretEnv".into(),
                ));
            }
            if gh.is_none() {
                return Err(at(
                    "webhook:",
                    "webhook: webhooks come from GitHub; configure credentials.github too".into(),
                ));
            }
        }
        if let Some(g) = &self.github {
            if url_has_userinfo(&g.api_url) {
                return Err(at(
                    "apiUrl:",
                    format!(
                        "github.apiUrl `{}`: carries credentials; give the token in credentials.github instead",
                        redact_url(&g.api_url)
                    ),
                ));
            }
            if !(g.api_url.starts_with("https://") || is_loopback_http(&g.api_url)) {
                return Err(at(
                    "apiUrl:",
                    format!(
                        "github.apiUrl `{}`: expected https:// (plain http only on loopback)",
                        redact_url(&g.api_url)
                    ),
                ));
            }
        }
        let lease = self.leader_election.lease_duration.as_duration().as_secs();
        if lease < 6 {
            return Err(at(
                "leaseDuration:",
                "leaderElection.leaseDuration: at least 6s (it is renewed every third of it)"
                    .into(),
            ));
        }
        if !self.state_dir.is_absolute() {
            return Err(at(
                "stateDir:",
                format!(
                    "stateDir {}: expected an absolute path",
                    self.state_dir.display()
                ),
            ));
        }
        Ok(())
    }

    pub fn source(&self) -> Source {
        match (&self.repository.url, &self.repository.path) {
            (Some(u), _) => Source::Remote(u.clone()),
            (None, Some(p)) => Source::Path(p.clone()),
            // validate() refuses a config with neither.
            (None, None) => Source::Path(PathBuf::from(".")),
        }
    }

    /// Whether GitHub is the reporter (else Git-only mode).
    pub fn uses_github(&self) -> bool {
        self.credentials.github.is_some()
    }

    /// `owner/name` for the GitHub API.
    pub fn github_repository(&self) -> Option<String> {
        if let Some(r) = self.github.as_ref().and_then(|g| g.repository.clone()) {
            return Some(r);
        }
        let url = self.repository.url.as_deref()?;
        let rest = url
            .strip_prefix("https://github.com/")
            .or_else(|| url.strip_prefix("ssh://git@github.com/"))
            .or_else(|| url.strip_prefix("git@github.com:"))?;
        let rest = rest.trim_end_matches('/').trim_end_matches(".git");
        let mut parts = rest.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(o), Some(n), None) if !o.is_empty() && !n.is_empty() => Some(format!("{o}/{n}")),
            _ => None,
        }
    }

    pub fn api_url(&self) -> String {
        self.github
            .as_ref()
            .map(|g| g.api_url.clone())
            .unwrap_or_else(default_api)
    }

    pub fn cluster(&self, name: &str) -> Option<&ClusterConfig> {
        self.clusters.iter().find(|c| c.name == name)
    }
}

/// `http://127.0.0.1[:port][/…]` or `http://localhost[:port][/…]`, and nothing that merely
/// starts like it (`http://localhost.evil.example`).
fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return false;
    }
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// The `nth` cluster's `- name:` line (`locate` strips list dashes, so it cannot tell).
fn cluster_line(text: &str, nth: usize) -> Option<(usize, usize)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("- name:"))
        .nth(nth)
        .map(|(i, l)| (i + 1, l.len() - l.trim_start().len() + 1))
}

/// The most bytes a configuration file may have.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// A webhook secret shorter than this is warned about.
pub const MIN_WEBHOOK_SECRET_BYTES: usize = 16;

fn url_has_userinfo(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    rest.split('/').next().unwrap_or("").contains('@')
}

fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// A URL without its userinfo, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = include_str!("../../deploy/config.yaml");

    #[test]
    fn the_shipped_config_is_valid() {
        let c = Config::parse("deploy/config.yaml", GOOD).unwrap();
        assert_eq!(c.repository.branch, "main");
        assert_eq!(c.clusters[0].name, "homelab");
        assert!(c.uses_github());
        assert_eq!(c.github_repository().as_deref(), Some("OWNER/homelab"));
        assert_eq!(c.poll_interval, HumanDuration::from_mins(5));
    }

    fn err(text: &str) -> String {
        Config::parse("c.yaml", text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let typo = GOOD.replace("pollInterval:", "pollIntervall:");
        let e = err(&typo);
        assert!(
            e.starts_with("c.yaml:") && e.contains("pollIntervall"),
            "{e}"
        );
        let e = err("repository:\n  branch: main\nclusters:\n  - name: lab\n    act: false\n");
        assert!(e.starts_with("c.yaml:1:") && e.contains("`url`"), "{e}");
        let e = err("repository:\n  path: /srv/lab.git\nclusters:\n  - name: lab\n");
        assert!(
            e.starts_with("c.yaml:4:") && e.contains("talosconfig"),
            "{e}"
        );
        let e =
            err("repository:\n  path: /srv/lab.git\nclusters:\n  - name: Lab_1\n    act: false\n");
        assert!(e.contains("DNS label"), "{e}");
        let e = err("repository:\n  url: https://x:hunter2@github.com/a/b.git\nclusters:\n  - name: lab\n    act: false\n");
        assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
        let e = err("repository:\n  path: /srv/lab.git\nclusters:\n  - name: lab\n    act: false\npollInterval: 1s\n");
        assert!(e.starts_with("c.yaml:6:"), "{e}");
    }

    #[test]
    fn gate_rehearse_is_off_unless_given_and_bounded() {
        assert!(Config::parse("c.yaml", GOOD)
            .unwrap()
            .gate
            .rehearse
            .is_none());
        let on = format!("{GOOD}gate:\n  rehearse:\n    seeds: 20\n");
        let r = Config::parse("c.yaml", &on).unwrap().gate.rehearse.unwrap();
        assert_eq!((r.seeds, r.timeout.0.as_secs()), (20, 600));
        for bad in ["seeds: 0", "seeds: 1001", "seeds: 5\n    timeout: 0s"] {
            let e = err(&format!("{GOOD}gate:\n  rehearse:\n    {bad}\n"));
            assert!(e.contains("c.yaml:") && e.contains("gate.rehearse."), "{e}");
        }
    }

    #[test]
    fn credentials_in_urls_and_plain_http_remotes_are_refused() {
        let e = err("repository:\n  url: https://ghp_0123456789abcdef@github.com/a/b.git\nclusters:\n  - name: lab\n    act: false\n");
        assert!(
            e.contains("carries credentials") && !e.contains("ghp_"),
            "{e}"
        );
        let e = err("repository:\n  url: http://git.example.com/a/b.git\nclusters:\n  - name: lab\n    act: false\n");
        assert!(
            e.starts_with("c.yaml:2:") && e.contains("plain http"),
            "{e}"
        );
        let ok = "repository:\n  url: http://127.0.0.1:9/a/b.git\nclusters:\n  - name: lab\n    act: false\n";
        assert!(Config::parse("c.yaml", ok).is_ok());
        let e = err(&format!(
            "{GOOD}\ngithub:\n  repository: OWNER/homelab\n  apiUrl: https://u:p@ghe.example.com/api/v3\n"
        ));
        assert!(
            e.contains("apiUrl") && e.contains("carries credentials") && !e.contains("u:p"),
            "{e}"
        );
    }

    #[test]
    fn secrets_anyone_can_read_and_short_webhook_secrets_are_warned() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "short\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = GOOD.replace("/etc/ichor/webhook/secret", &secret.display().to_string());
        let c = Config::parse("c.yaml", &text).unwrap();
        let w = c.warnings();
        assert!(
            w.iter()
                .any(|w| w.starts_with("webhook.secretFile") && w.contains("0644")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|w| w.contains("the secret is 5 bytes")),
            "{w:?}"
        );
        assert!(
            w.iter().all(|w| !w.contains("short")),
            "never the secret: {w:?}"
        );
        std::fs::write(&secret, "0123456789abcdef0123").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Config::parse("c.yaml", &text)
            .unwrap()
            .warnings()
            .is_empty());
    }

    #[test]
    fn a_config_file_is_sized_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        let e = Config::load(&big).unwrap_err().to_string();
        assert!(
            e.contains("big.yaml") && e.contains("at most 1048576"),
            "{e}"
        );
    }

    #[test]
    fn plain_http_only_to_loopback() {
        assert!(is_loopback_http("http://127.0.0.1:8080"));
        assert!(is_loopback_http("http://localhost/api"));
        assert!(!is_loopback_http("http://localhost.evil.example"));
        assert!(!is_loopback_http("http://127.0.0.1.evil.example:80"));
        assert!(!is_loopback_http("http://user@127.0.0.1"));
        assert!(!is_loopback_http("https://127.0.0.1"));
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("https://x-access-token:abc@github.com/a/b.git"),
            "https://github.com/a/b.git"
        );
        assert_eq!(redact_url("ssh://git@host:22/x"), "ssh://host:22/x");
    }
}
