//! Talking to a remote repository with git2: credentials for its https and ssh transports,
//! ssh host-key verification against a `known_hosts` file, and fetching what changed into
//! a local bare mirror (which [`crate::git::Repo`] then reads at any revision).
//!
//! Bounds on what a remote can do to us (see docs/sources.md):
//! - credentials are offered at most [`MAX_CREDENTIAL_ATTEMPTS`] times per operation
//!   (libgit2 asks again after every refusal, forever);
//! - a fetch whose refspecs match more than [`FetchLimits::max_refs`] advertised refs is
//!   refused before anything is downloaded;
//! - a fetch that receives more than [`FetchLimits::max_bytes`] is aborted mid-transfer;
//! - a `known_hosts` file is read up to [`MAX_KNOWN_HOSTS_BYTES`];
//! - a token is never sent over plain `http://` except to a loopback address.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use git2::{
    AutotagOption, CertificateCheckStatus, Cred, CredentialType, Direction, FetchOptions,
    FetchPrune, Oid, PushOptions, RemoteCallbacks, Repository,
};

use super::GitError;
use crate::secret::Secret;

/// How ichor authenticates to a remote.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A public remote, a local path or `file://`.
    None,
    /// https with a token as the password (GitHub: user `x-access-token`).
    Token { user: String, token: Secret },
    /// ssh with a private key file (user usually `git`).
    SshKey {
        user: String,
        private_key: PathBuf,
        passphrase: Option<Secret>,
    },
}

/// A remote to fetch from (or push to): its URL, how to authenticate, and for ssh the
/// `known_hosts` file its host key must be in.
#[derive(Clone, Debug)]
pub struct Remote {
    pub url: String,
    pub credentials: Credentials,
    /// OpenSSH `known_hosts`; required for ssh URLs (ichor refuses unverified hosts).
    pub known_hosts: Option<PathBuf>,
}

/// How often one operation offers its credentials before giving up.
pub const MAX_CREDENTIAL_ATTEMPTS: u32 = 3;
/// The largest `known_hosts` file ichor reads.
pub const MAX_KNOWN_HOSTS_BYTES: u64 = 1 << 20;
/// What [`Mirror::fetch_all`] fetches: every branch, and GitHub's PR heads.
pub const FETCH_ALL: [&str; 2] = [
    "+refs/heads/*:refs/heads/*",
    "+refs/pull/*/head:refs/pull/*/head",
];
/// The most refs [`refs_snapshot`] reads.
pub const MAX_SNAPSHOT_REFS: usize = 1_000_000;

/// What one fetch may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// Advertised refs matching the fetch's refspecs.
    pub max_refs: usize,
    /// Bytes received (the pack).
    pub max_bytes: u64,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_refs: 100_000,
            max_bytes: 1 << 30,
        }
    }
}

/// One ref that moved: created (`old` is `None`), deleted (`new` is `None`) or updated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefMove {
    pub name: String,
    pub old: Option<Oid>,
    pub new: Option<Oid>,
}

// ----- URLs -----

/// The parts of a remote URL ichor needs: `scheme://[user[:pass]@]host[:port]/path`,
/// scp-like `user@host:path` (ssh), or a local path (`file`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct UrlParts {
    scheme: String,
    host: String,
    port: Option<u16>,
}

fn parse_url(url: &str) -> UrlParts {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority = rest.split('/').next().unwrap_or_default();
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            match v6.split_once(']') {
                Some((h, tail)) => (h, tail.strip_prefix(':')),
                None => (v6, None),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        return UrlParts {
            scheme: scheme.to_ascii_lowercase(),
            host: host.to_string(),
            port: port.and_then(|p| p.parse().ok()),
        };
    }
    // scp-like: `[user@]host:path`, with no slash before the colon.
    if let Some((before, _)) = url.split_once(':') {
        if !before.contains('/') && !before.is_empty() {
            let host = before.rsplit_once('@').map_or(before, |(_, h)| h);
            return UrlParts {
                scheme: "ssh".into(),
                host: host.to_string(),
                port: None,
            };
        }
    }
    UrlParts {
        scheme: "file".into(),
        host: String::new(),
        port: None,
    }
}

/// The URL without its userinfo (`https://x:TOKEN@host/` → `https://host/`): the form
/// ichor prints.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

// ----- known_hosts -----

/// One line of an OpenSSH `known_hosts` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownHost {
    /// Host patterns (`github.com`, `[127.0.0.1]:2222`, `*.example.org`, `!bad.example.org`).
    pub patterns: Vec<String>,
    pub key_type: String,
    pub key: Vec<u8>,
    /// `@revoked`: this key must be refused.
    pub revoked: bool,
}

/// What a `known_hosts` file holds: the usable lines, and how many it could not use
/// (hashed hosts, `@cert-authority`), which the refusal mentions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownHosts {
    pub entries: Vec<KnownHost>,
    pub hashed: usize,
    pub cert_authorities: usize,
}

/// Parse `known_hosts` text. A malformed line is an error naming its number.
pub fn parse_known_hosts(text: &str) -> Result<KnownHosts, String> {
    let mut out = KnownHosts::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let mut first = fields.next().unwrap_or_default();
        let mut revoked = false;
        if first.starts_with('@') {
            match first {
                "@revoked" => revoked = true,
                "@cert-authority" => {
                    out.cert_authorities += 1;
                    continue;
                }
                other => return Err(format!("line {}: unknown marker {other}", i + 1)),
            }
            first = fields.next().unwrap_or_default();
        }
        let (Some(key_type), Some(key)) = (fields.next(), fields.next()) else {
            return Err(format!(
                "line {}: expected `host[,host] keytype base64-key`",
                i + 1
            ));
        };
        if first.starts_with("|1|") {
            out.hashed += 1;
            continue;
        }
        let key = base64::engine::general_purpose::STANDARD
            .decode(key)
            .map_err(|_| format!("line {}: the key is not base64", i + 1))?;
        out.entries.push(KnownHost {
            patterns: first.split(',').map(str::to_string).collect(),
            key_type: key_type.to_string(),
            key,
            revoked,
        });
    }
    Ok(out)
}

/// `*` and `?` as in ssh's host patterns.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

impl KnownHost {
    /// Whether this line names `host` on `port` (port 22 is written bare, others as
    /// `[host]:port`); a matching negated pattern excludes the line.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let name = if port == 22 {
            host.to_ascii_lowercase()
        } else {
            format!("[{}]:{port}", host.to_ascii_lowercase())
        };
        let mut hit = false;
        for p in &self.patterns {
            let p = p.to_ascii_lowercase();
            if let Some(neg) = p.strip_prefix('!') {
                if glob(neg, &name) {
                    return false;
                }
            } else if glob(&p, &name) {
                hit = true;
            }
        }
        hit
    }
}

impl KnownHosts {
    /// Accept the key `host:port` presented, or say why not. `file` names the known_hosts
    /// file in the message.
    pub fn verify(
        &self,
        file: &str,
        host: &str,
        port: u16,
        key_type: &str,
        key: &[u8],
    ) -> Result<(), String> {
        let shown = if port == 22 {
            host.to_string()
        } else {
            format!("[{host}]:{port}")
        };
        let for_host: Vec<&KnownHost> = self
            .entries
            .iter()
            .filter(|e| e.matches(host, port))
            .collect();
        if for_host
            .iter()
            .any(|e| e.revoked && e.key_type == key_type && e.key == key)
        {
            return Err(format!(
                "the ssh host key of {shown} ({key_type}) is marked @revoked in {file}; refusing to connect"
            ));
        }
        let trusted: Vec<&&KnownHost> = for_host.iter().filter(|e| !e.revoked).collect();
        if trusted
            .iter()
            .any(|e| e.key_type == key_type && e.key == key)
        {
            return Ok(());
        }
        let mut unsupported = String::new();
        if self.hashed > 0 {
            unsupported.push_str(&format!(
                " ({} hashed entries in it could not be checked: ichor reads hosts written in plain, as `ssh-keyscan` without -H prints them)",
                self.hashed
            ));
        }
        if self.cert_authorities > 0 {
            unsupported.push_str(&format!(
                " ({} @cert-authority lines in it are not supported)",
                self.cert_authorities
            ));
        }
        if trusted.is_empty() {
            return Err(format!(
                "the ssh host {shown} is not in {file}: refusing its {key_type} host key; add the server's key (`ssh-keyscan -p {port} {host}`, checked out of band){unsupported}"
            ));
        }
        if !trusted.iter().any(|e| e.key_type == key_type) {
            let types: Vec<&str> = trusted.iter().map(|e| e.key_type.as_str()).collect();
            return Err(format!(
                "the ssh host {shown} presented a {key_type} host key but {file} has only {} for it: refusing; add its {key_type} key{unsupported}",
                types.join(", ")
            ));
        }
        Err(format!(
            "the {key_type} host key of {shown} does not match {file}: refusing to connect (a changed host key can mean someone is intercepting the connection){unsupported}"
        ))
    }
}

fn read_known_hosts(path: &Path) -> Result<KnownHosts, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read known_hosts {}: {e}", path.display()))?;
    if meta.len() > MAX_KNOWN_HOSTS_BYTES {
        return Err(format!(
            "known_hosts {} is {} bytes; ichor reads at most {MAX_KNOWN_HOSTS_BYTES}",
            path.display(),
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read known_hosts {}: {e}", path.display()))?;
    parse_known_hosts(&text).map_err(|e| format!("known_hosts {}: {e}", path.display()))
}

// ----- callbacks -----

/// Why the last operation was refused by one of our callbacks. libgit2 replaces a
/// callback's error message with its own generic one ("invalid or unknown remote ssh
/// hostkey"), so the callbacks record their reason here for the error ichor reports.
#[derive(Clone, Debug, Default)]
pub struct Refusal(Arc<Mutex<RefusalState>>);

#[derive(Debug, Default)]
struct RefusalState {
    reason: Option<String>,
    /// What to say when the remote turns down the credentials offered last (libssh2 gives
    /// up after one refused key without asking the callback again).
    offered: Option<String>,
}

impl Refusal {
    fn state(&self) -> std::sync::MutexGuard<'_, RefusalState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, reason: String) -> git2::Error {
        let e = git2::Error::from_str(&reason);
        self.state().reason = Some(reason);
        e
    }

    fn offer(&self, refused: String) {
        self.state().offered = Some(refused);
    }

    /// The recorded reason, if a callback refused.
    pub fn take(&self) -> Option<String> {
        self.state().reason.take()
    }

    /// The message for a failed operation: our reason when we refused; for a failed
    /// authentication, which credentials the remote refused; else libgit2's message.
    pub fn explain(&self, e: &git2::Error) -> String {
        let mut state = self.state();
        if let Some(reason) = state.reason.take() {
            return reason;
        }
        match state.offered.take() {
            Some(refused) if e.code() == git2::ErrorCode::Auth => {
                format!("{refused} ({})", e.message())
            }
            _ => e.message().to_string(),
        }
    }
}

/// Callbacks for one fetch or push to `remote`: its credentials (offered at most
/// [`MAX_CREDENTIAL_ATTEMPTS`] times), and for ssh the host-key check against
/// `known_hosts`. https keeps libgit2's own certificate verification.
pub fn callbacks(remote: &Remote) -> RemoteCallbacks<'static> {
    callbacks_with_refusal(remote).0
}

/// [`callbacks`], and where they record why they refused (see [`Refusal`]).
pub fn callbacks_with_refusal(remote: &Remote) -> (RemoteCallbacks<'static>, Refusal) {
    let refusal = Refusal::default();
    let mut cbs = RemoteCallbacks::new();
    let parts = parse_url(&remote.url);
    let shown = redact_url(&remote.url);

    let creds = remote.credentials.clone();
    let r = refusal.clone();
    let (url, scheme, host) = (shown.clone(), parts.scheme.clone(), parts.host.clone());
    let configured_port = parts.port;
    let mut attempts = 0u32;
    cbs.credentials(move |asking_url, user_from_url, allowed| {
        // The URL that asks is not always the configured one: libgit2 follows a redirect
        // and asks again for the new location. Credentials go only to the configured
        // origin (scheme, host and port), and never over plain http but to loopback.
        let asking = parse_url(asking_url);
        let same_origin = asking.scheme == scheme
            && asking.host.eq_ignore_ascii_case(&host)
            && asking.port == configured_port;
        let web = matches!(scheme.as_str(), "http" | "https");
        if web && !same_origin && !matches!(creds, Credentials::None) {
            return Err(r.set(format!(
                "{url} redirected to {}, another origin; refusing to send the credentials there",
                redact_url(asking_url)
            )));
        }
        if asking.scheme == "http" && !is_loopback(&asking.host) {
            if let Credentials::Token { .. } = &creds {
                return Err(r.set(format!(
                    "refusing to send the token to {} over plain http; use https",
                    redact_url(asking_url)
                )));
            }
        }
        // ssh asks for the user name first when the URL has none.
        if allowed == CredentialType::USERNAME {
            let user = match &creds {
                Credentials::SshKey { user, .. } | Credentials::Token { user, .. } => user,
                Credentials::None => "git",
            };
            return Cred::username(user_from_url.unwrap_or(user));
        }
        attempts += 1;
        match &creds {
            Credentials::None => Err(r.set(format!(
                "{url} asks for credentials and none are configured for it (a token for https, an ssh key for ssh)"
            ))),
            Credentials::Token { user, token } => {
                if attempts > MAX_CREDENTIAL_ATTEMPTS {
                    return Err(r.set(format!(
                        "{url}: the remote refused the token (user {user})"
                    )));
                }
                if !allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
                    return Err(r.set(format!(
                        "{url} asks for {allowed:?} credentials; a token works over https only"
                    )));
                }
                if scheme == "http" && !is_loopback(&host) {
                    return Err(r.set(format!(
                        "refusing to send the token to {url} over plain http; use https"
                    )));
                }
                r.offer(format!("{url}: the remote refused the token (user {user})"));
                Cred::userpass_plaintext(user, token.expose())
            }
            Credentials::SshKey {
                user,
                private_key,
                passphrase,
            } => {
                let user = user_from_url.unwrap_or(user);
                if attempts > MAX_CREDENTIAL_ATTEMPTS {
                    return Err(r.set(format!(
                        "{url}: the remote refused the ssh key {} (user {user})",
                        private_key.display()
                    )));
                }
                if !allowed.contains(CredentialType::SSH_KEY) {
                    return Err(r.set(format!(
                        "{url} asks for {allowed:?} credentials; an ssh key works over ssh only"
                    )));
                }
                r.offer(format!(
                    "{url}: the remote refused the ssh key {} (user {user})",
                    private_key.display()
                ));
                Cred::ssh_key(
                    user,
                    None,
                    private_key,
                    passphrase.as_ref().map(Secret::expose),
                )
            }
        }
    });

    let known_hosts = remote.known_hosts.clone();
    let r = refusal.clone();
    let port = parts.port.unwrap_or(22);
    cbs.certificate_check(move |cert, hostname| {
        let Some(hostkey) = cert.as_hostkey() else {
            // TLS: libgit2's verification against the system's roots decides.
            return Ok(CertificateCheckStatus::CertificatePassthrough);
        };
        let (Some(kind), Some(key)) = (hostkey.hostkey_type(), hostkey.hostkey()) else {
            return Err(r.set(format!(
                "the ssh host {hostname} did not present a raw host key to verify; refusing"
            )));
        };
        let Some(file) = &known_hosts else {
            return Err(r.set(format!(
                "ssh to {hostname}: no known_hosts file is configured, so its {} host key cannot be verified; refusing (ichor never trusts an unknown host)",
                kind.name()
            )));
        };
        let hosts = read_known_hosts(file).map_err(|m| r.set(m))?;
        hosts
            .verify(
                &file.display().to_string(),
                hostname,
                port,
                kind.name(),
                key,
            )
            .map_err(|m| r.set(m))?;
        Ok(CertificateCheckStatus::CertificateOk)
    });
    (cbs, refusal)
}

// ----- refs -----

/// Every ref of `repo` (and `HEAD` when it resolves) with the object it points at
/// (symbolic refs resolved; refs that resolve to nothing are left out).
pub fn refs_snapshot(repo: &Repository) -> Result<BTreeMap<String, Oid>, GitError> {
    let mut out = BTreeMap::new();
    for r in repo.references()? {
        let r = r?;
        let Ok(name) = r.name() else { continue };
        let target = match r.target() {
            Some(t) => Some(t),
            None => r.resolve().ok().and_then(|r| r.target()),
        };
        if let Some(t) = target {
            out.insert(name.to_string(), t);
        }
        if out.len() > MAX_SNAPSHOT_REFS {
            return Err(GitError::TooManyRefs {
                path: repo.path().to_path_buf(),
                max: MAX_SNAPSHOT_REFS,
            });
        }
    }
    if let Ok(head) = repo.head() {
        if let Some(t) = head.target() {
            out.insert("HEAD".to_string(), t);
        }
    }
    Ok(out)
}

/// The refs that differ between two snapshots, in name order.
pub fn diff_refs(old: &BTreeMap<String, Oid>, new: &BTreeMap<String, Oid>) -> Vec<RefMove> {
    let mut moves = Vec::new();
    for (name, o) in old {
        match new.get(name) {
            Some(n) if n == o => {}
            n => moves.push(RefMove {
                name: name.clone(),
                old: Some(*o),
                new: n.copied(),
            }),
        }
    }
    for (name, n) in new {
        if !old.contains_key(name) {
            moves.push(RefMove {
                name: name.clone(),
                old: None,
                new: Some(*n),
            });
        }
    }
    moves.sort_by(|a, b| a.name.cmp(&b.name));
    moves
}

/// The two sides of a refspec (`+src:dst`); each side has at most one `*`.
fn refspec_sides(spec: &str) -> Option<(&str, &str)> {
    let spec = spec.strip_prefix('+').unwrap_or(spec);
    let (src, dst) = spec.split_once(':')?;
    (src.matches('*').count() <= 1 && dst.matches('*').count() == src.matches('*').count())
        .then_some((src, dst))
}

/// Whether `name` matches a refspec side (`*` matches anything, slashes included).
fn side_matches(side: &str, name: &str) -> bool {
    match side.split_once('*') {
        Some((pre, post)) => {
            name.len() >= pre.len() + post.len() && name.starts_with(pre) && name.ends_with(post)
        }
        None => side == name,
    }
}

// ----- the mirror -----

/// A bare repository ichor owns (e.g. `<stateDir>/mirror.git`) that remote refs are
/// fetched into. `crate::git::Repo::open(mirror.path())` reads it at any revision.
pub struct Mirror {
    repo: Repository,
    limits: FetchLimits,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("path", &self.repo.path())
            .field("limits", &self.limits)
            .finish()
    }
}

impl Mirror {
    /// Open the mirror at `dir`, creating a bare repository there on first use (a missing
    /// or empty directory). A non-empty directory that is not a repository, or a link, is
    /// refused rather than written into.
    pub fn open(dir: &Path) -> Result<Mirror, GitError> {
        let err = |message: String| GitError::Open {
            path: dir.to_path_buf(),
            message,
        };
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(err(
                    "is a symbolic link; refusing to write a mirror through it".into(),
                ))
            }
            Ok(m) if !m.is_dir() => return Err(err("exists and is not a directory".into())),
            Ok(_) => {
                let empty = std::fs::read_dir(dir)
                    .map_err(|e| err(e.to_string()))?
                    .next()
                    .is_none();
                if !empty {
                    let repo = Repository::open_bare(dir).map_err(|e| {
                        err(format!(
                            "not empty and not a bare repository ({}); refusing to use it as a mirror",
                            e.message()
                        ))
                    })?;
                    return Ok(Mirror {
                        repo,
                        limits: FetchLimits::default(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e.to_string())),
        }
        let repo = Repository::init_bare(dir).map_err(|e| err(e.message().to_string()))?;
        Ok(Mirror {
            repo,
            limits: FetchLimits::default(),
        })
    }

    pub fn with_limits(mut self, limits: FetchLimits) -> Mirror {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> FetchLimits {
        self.limits
    }

    /// The mirror's directory (the bare repository).
    pub fn path(&self) -> &Path {
        self.repo.path()
    }

    pub fn git2(&self) -> &Repository {
        &self.repo
    }

    /// Fetch `refspecs` (`+src:dst`, each side with at most one `*`) from `remote`,
    /// pruning refs under the destinations that the remote no longer has, and return the
    /// refs under those destinations that moved, in name order. Tags are not followed.
    pub fn fetch(&self, remote: &Remote, refspecs: &[&str]) -> Result<Vec<RefMove>, GitError> {
        self.fetch_within(remote, refspecs, self.limits)
    }

    /// [`Mirror::fetch`] under `limits` instead of the mirror's own; a pack over
    /// `limits.max_bytes` is [`GitError::FetchTooLarge`] and moves no ref.
    pub fn fetch_within(
        &self,
        remote: &Remote,
        refspecs: &[&str],
        limits: FetchLimits,
    ) -> Result<Vec<RefMove>, GitError> {
        let shown = redact_url(&remote.url);
        let fail = |message: String| GitError::Fetch {
            url: shown.clone(),
            message: scrub(&message, remote),
        };
        let mut sides = Vec::new();
        for spec in refspecs {
            sides.push(refspec_sides(spec).ok_or_else(|| {
                fail(format!(
                    "refspec {spec:?} is not of the form [+]src:dst with at most one `*` on each side"
                ))
            })?);
        }
        let ours = |snapshot: BTreeMap<String, Oid>| -> BTreeMap<String, Oid> {
            snapshot
                .into_iter()
                .filter(|(name, _)| sides.iter().any(|(_, dst)| side_matches(dst, name)))
                .collect()
        };
        let before = ours(refs_snapshot(&self.repo)?);

        let mut anonymous = self
            .repo
            .remote_anonymous(&remote.url)
            .map_err(|e| fail(e.message().to_string()))?;
        let (cbs, refusal) = callbacks_with_refusal(remote);
        let mut conn = anonymous
            .connect_auth(Direction::Fetch, Some(cbs), None)
            .map_err(|e| fail(refusal.explain(&e)))?;
        let advertised = conn
            .list()
            .map_err(|e| fail(e.message().to_string()))?
            .iter()
            .filter(|h| sides.iter().any(|(src, _)| side_matches(src, h.name())))
            .count();
        if advertised > limits.max_refs {
            return Err(fail(format!(
                "the remote advertises {advertised} refs matching {refspecs:?}; ichor fetches at most {} (FetchLimits::max_refs)",
                limits.max_refs
            )));
        }

        let (mut cbs, refusal) = callbacks_with_refusal(remote);
        let budget = limits.max_bytes;
        let over = refusal.clone();
        let too_large = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen_too_large = too_large.clone();
        cbs.transfer_progress(move |p| {
            if p.received_bytes() as u64 > budget {
                seen_too_large.store(true, std::sync::atomic::Ordering::Relaxed);
                over.set(format!(
                    "the remote sent more than {budget} bytes; ichor aborted the fetch (FetchLimits::max_bytes)"
                ));
                return false;
            }
            true
        });
        let mut options = FetchOptions::new();
        options
            .remote_callbacks(cbs)
            .prune(FetchPrune::On)
            .download_tags(AutotagOption::None)
            .update_fetchhead(false);
        let fetched = conn
            .remote()
            .fetch(refspecs, Some(&mut options), Some("ichor: fetch"));
        if fetched.is_err() && too_large.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(GitError::FetchTooLarge {
                url: shown.clone(),
                what: refspecs.join(" "),
                max_bytes: budget,
            });
        }
        fetched.map_err(|e| fail(refusal.explain(&e)))?;
        drop(conn);

        let after = ours(refs_snapshot(&self.repo)?);
        Ok(diff_refs(&before, &after))
    }

    /// [`Mirror::fetch`] of [`FETCH_ALL`]: every branch and every `refs/pull/*/head`.
    pub fn fetch_all(&self, remote: &Remote) -> Result<Vec<RefMove>, GitError> {
        self.fetch(remote, &FETCH_ALL)
    }

    /// Push `refspecs` (e.g. `refs/notes/ichor:refs/notes/ichor`) to `remote`; a ref the
    /// remote rejects is an error naming it and the remote's reason.
    pub fn push(&self, remote: &Remote, refspecs: &[&str]) -> Result<(), GitError> {
        let shown = redact_url(&remote.url);
        let fail = |message: String| GitError::Push {
            url: shown.clone(),
            message: scrub(&message, remote),
        };
        let mut anonymous = self
            .repo
            .remote_anonymous(&remote.url)
            .map_err(|e| fail(e.message().to_string()))?;
        let (mut cbs, refusal) = callbacks_with_refusal(remote);
        let rejected = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = rejected.clone();
        cbs.push_update_reference(move |name, status| {
            if let Some(status) = status {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{name}: {status}"));
            }
            Ok(())
        });
        let mut options = PushOptions::new();
        options.remote_callbacks(cbs);
        anonymous
            .push(refspecs, Some(&mut options))
            .map_err(|e| fail(refusal.explain(&e)))?;
        let rejected = rejected.lock().unwrap_or_else(|p| p.into_inner());
        if !rejected.is_empty() {
            return Err(fail(format!("the remote rejected {}", rejected.join("; "))));
        }
        Ok(())
    }
}

/// A message with any trace of the remote's secrets removed: the URL's userinfo and the
/// token itself, should libgit2 ever echo them.
fn scrub(message: &str, remote: &Remote) -> String {
    let mut out = message.replace(&remote.url, &redact_url(&remote.url));
    if let Credentials::Token { token, .. } = &remote.credentials {
        if !token.expose().is_empty() {
            out = out.replace(token.expose(), "[redacted]");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    #[test]
    fn diff_names_created_updated_and_deleted_refs_in_order() {
        let old: BTreeMap<String, Oid> = [
            ("refs/heads/main".to_string(), oid(1)),
            ("refs/heads/gone".to_string(), oid(2)),
            ("refs/pull/1/head".to_string(), oid(3)),
        ]
        .into();
        let new: BTreeMap<String, Oid> = [
            ("refs/heads/main".to_string(), oid(4)),
            ("refs/heads/new".to_string(), oid(5)),
            ("refs/pull/1/head".to_string(), oid(3)),
        ]
        .into();
        let moves = diff_refs(&old, &new);
        assert_eq!(
            moves,
            vec![
                RefMove {
                    name: "refs/heads/gone".into(),
                    old: Some(oid(2)),
                    new: None
                },
                RefMove {
                    name: "refs/heads/main".into(),
                    old: Some(oid(1)),
                    new: Some(oid(4))
                },
                RefMove {
                    name: "refs/heads/new".into(),
                    old: None,
                    new: Some(oid(5))
                },
            ]
        );
        assert!(diff_refs(&new, &new).is_empty());
        assert_eq!(diff_refs(&BTreeMap::new(), &new).len(), 3);
    }

    const KEY_A: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
    const KEY_B: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIBcR4GuXhvuLxd1DdXpdOXJ7Dw5S/9+kx6DBVP0axs2m";

    fn b64(s: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(s).unwrap()
    }

    #[test]
    fn known_hosts_parse_and_match_ports_patterns_and_markers() {
        let text = format!(
            "# comment\n\
             github.com,140.82.121.4 ssh-ed25519 {KEY_A}\n\
             [127.0.0.1]:2222 ssh-ed25519 {KEY_B}\n\
             *.example.org,!bad.example.org ssh-ed25519 {KEY_A}\n\
             |1|c2FsdA==|aGFzaA== ssh-ed25519 {KEY_A}\n\
             @cert-authority *.corp ssh-ed25519 {KEY_A}\n\
             @revoked old.example.org ssh-ed25519 {KEY_A}\n"
        );
        let kh = parse_known_hosts(&text).unwrap();
        assert_eq!(kh.entries.len(), 4);
        assert_eq!((kh.hashed, kh.cert_authorities), (1, 1));
        let (a, b) = (b64(KEY_A), b64(KEY_B));
        let f = "kh";
        assert!(kh.verify(f, "github.com", 22, "ssh-ed25519", &a).is_ok());
        assert!(kh.verify(f, "140.82.121.4", 22, "ssh-ed25519", &a).is_ok());
        // A non-22 port is its own host: `[host]:port`.
        assert!(kh.verify(f, "127.0.0.1", 2222, "ssh-ed25519", &b).is_ok());
        let e = kh
            .verify(f, "127.0.0.1", 22, "ssh-ed25519", &b)
            .unwrap_err();
        assert!(e.contains("127.0.0.1 is not in kh"), "{e}");
        assert!(e.contains("hashed"), "{e}");
        let e = kh
            .verify(f, "github.com", 22, "ssh-ed25519", &b)
            .unwrap_err();
        assert!(e.contains("does not match"), "{e}");
        assert!(e.contains("ssh-ed25519"), "{e}");
        let e = kh
            .verify(f, "github.com", 22, "ecdsa-sha2-nistp256", &a)
            .unwrap_err();
        assert!(e.contains("has only ssh-ed25519"), "{e}");
        assert!(kh
            .verify(f, "git.example.org", 22, "ssh-ed25519", &a)
            .is_ok());
        assert!(kh
            .verify(f, "bad.example.org", 22, "ssh-ed25519", &a)
            .is_err());
        let e = kh
            .verify(f, "old.example.org", 22, "ssh-ed25519", &a)
            .unwrap_err();
        assert!(e.contains("@revoked"), "{e}");

        assert!(parse_known_hosts("host ssh-ed25519").is_err());
        assert!(parse_known_hosts("host ssh-ed25519 !!!notbase64").is_err());
        assert!(parse_known_hosts("@weird host ssh-ed25519 AAAA").is_err());
    }

    #[test]
    fn urls_are_parsed_and_printed_without_userinfo() {
        assert_eq!(
            redact_url("https://x-access-token:ghp_secret@github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(
            redact_url("git@github.com:o/r.git"),
            "git@github.com:o/r.git"
        );
        assert_eq!(redact_url("/srv/repo.git"), "/srv/repo.git");
        let p = parse_url("ssh://git@127.0.0.1:2222/srv/r.git");
        assert_eq!(
            (p.scheme.as_str(), p.host.as_str(), p.port),
            ("ssh", "127.0.0.1", Some(2222))
        );
        let p = parse_url("ssh://[::1]:2200/r");
        assert_eq!((p.host.as_str(), p.port), ("::1", Some(2200)));
        let p = parse_url("git@github.com:o/r.git");
        assert_eq!(
            (p.scheme.as_str(), p.host.as_str(), p.port),
            ("ssh", "github.com", None)
        );
        assert_eq!(parse_url("/srv/r.git").scheme, "file");
        assert!(is_loopback("127.0.0.1") && is_loopback("localhost") && !is_loopback("github.com"));
    }

    #[test]
    fn refspec_sides_match_like_git() {
        let (src, dst) = refspec_sides("+refs/pull/*/head:refs/pull/*/head").unwrap();
        assert!(side_matches(src, "refs/pull/12/head"));
        assert!(!side_matches(src, "refs/pull/12/merge"));
        assert!(side_matches(dst, "refs/pull/12/head"));
        let (src, _) = refspec_sides("+refs/heads/*:refs/heads/*").unwrap();
        assert!(side_matches(src, "refs/heads/renovate/x"));
        assert!(refspec_sides("refs/heads/*").is_none());
        assert!(refspec_sides("refs/*/*:refs/*/*").is_none());
    }
}
