//! ichor's git sources over real sockets: fetching from the GitHub emulator's smart HTTP
//! (git http-backend) with a token, from a real sshd with a key and a known_hosts file,
//! and a watcher noticing refs move in a repository on disk.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use git2::{Oid, Repository, Signature, Time};
use tokio::sync::mpsc;

use ichor::clock::Clock;
use ichor::git::remote::{
    diff_refs, refs_snapshot, Credentials, FetchLimits, Mirror, RefMove, Remote,
};
use ichor::git::watch::RefWatcher;
use ichor::git::{GitError, Repo};
use ichor::secret::Secret;
use ichor::sim::fixture::Fixture;
use ichor::sim::github::{private_clone, GithubTwin, RepoSpec};

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const REPO: &str = "home/ops";
const GUARD: Duration = Duration::from_secs(30);

/// A blocking git2 call off the runtime, so the emulator keeps serving meanwhile.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

fn commit_on(repo: &Repository, refname: &str, text: &str, secs: i64) -> Oid {
    let sig = Signature::new("Ops", "ops@example.org", &Time::new(secs, 0)).unwrap();
    let parent = repo
        .find_reference(refname)
        .ok()
        .and_then(|r| r.peel_to_commit().ok());
    let mut builder = git2::build::TreeUpdateBuilder::new();
    builder.upsert(
        "clusters/lab/release-set.yaml",
        repo.blob(text.as_bytes()).unwrap(),
        git2::FileMode::Blob,
    );
    let base = match &parent {
        Some(p) => p.tree().unwrap(),
        None => repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap(),
    };
    let tree = repo
        .find_tree(builder.create_updated(repo, &base).unwrap())
        .unwrap();
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    let oid = repo
        .commit(None, &sig, &sig, "change", &tree, &parents)
        .unwrap();
    repo.reference(refname, oid, true, "test").unwrap();
    oid
}

fn fetch_error(r: Result<Vec<RefMove>, GitError>) -> String {
    match r {
        Err(e @ GitError::Fetch { .. }) => e.to_string(),
        other => panic!("expected a fetch error, got {other:?}"),
    }
}

// ----- smart HTTP (the GitHub emulator) -----

/// Issue 17 item 4: a renamed repository's old clone URL goes on working as GitHub keeps it
/// working, through a redirect on the same host that ichor's fetch follows with its token;
/// pushing the notes through the old URL too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_from_a_renamed_repositorys_old_url_follows_it() -> TestResult {
    let state = tempfile::tempdir()?;
    let served = private_clone(homelab(), state.path(), REPO)?;
    let twin = GithubTwin::start(Clock::manual(), vec![RepoSpec::new(REPO, &served)], None).await?;
    let remote = Remote {
        url: twin.clone_url(REPO),
        credentials: Credentials::Token {
            user: "x-access-token".into(),
            token: Secret::new(twin.token()),
        },
        known_hosts: None,
    };
    let mirror_dir = state.path().join("mirror.git");
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    assert!(!blocking(move || Mirror::open(&dir)?.fetch_all(&r))
        .await?
        .is_empty());

    twin.rename_repo(REPO, "home/ops-renamed")?;
    let sha = twin
        .push_commit(
            "home/ops-renamed",
            "main",
            &[("NOTES.md", "after\n")],
            "after",
            "ops",
        )
        .await?;
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    let moves = blocking(move || Mirror::open(&dir)?.fetch_all(&r)).await?;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].new, Some(Oid::from_str(&sha)?));
    // A name nobody had is still not found.
    let gone = Remote {
        url: twin.clone_url("home/never-was"),
        ..remote.clone()
    };
    let dir = mirror_dir.clone();
    let e = fetch_error(blocking(move || Mirror::open(&dir)?.fetch_all(&gone)).await);
    assert!(e.contains("404") || e.contains("not found"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smart_http_fetch_reports_moved_refs_and_refuses_bad_tokens() -> TestResult {
    let state = tempfile::tempdir()?;
    let served = private_clone(homelab(), state.path(), REPO)?;
    let twin = GithubTwin::start(Clock::manual(), vec![RepoSpec::new(REPO, &served)], None).await?;
    let branch = Fixture::homelab().history.branches[0].name.clone();
    let pr = twin
        .open_pull_request(REPO, &branch, "main", "bump", "", "renovate[bot]")
        .await?;

    let url = twin.clone_url(REPO);
    assert!(url.ends_with("/home/ops.git"), "{url}");
    let remote = Remote {
        url: url.clone(),
        credentials: Credentials::Token {
            user: "x-access-token".into(),
            token: Secret::new(twin.token()),
        },
        known_hosts: None,
    };
    let mirror_dir = state.path().join("mirror.git");

    // First fetch: every branch and the PR head appear.
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    let moves = blocking(move || Mirror::open(&dir)?.fetch_all(&r)).await?;
    let source = Repository::open(&served)?;
    let main = source.refname_to_id("refs/heads/main")?;
    assert!(moves.iter().all(|m| m.old.is_none()), "{moves:?}");
    assert!(moves.contains(&RefMove {
        name: "refs/heads/main".into(),
        old: None,
        new: Some(main),
    }));
    let pr_head = format!("refs/pull/{}/head", pr.number);
    assert!(
        moves.iter().any(|m| m.name == pr_head
            && m.new
                == Some(
                    source
                        .refname_to_id(&format!("refs/heads/{branch}"))
                        .unwrap()
                )),
        "{moves:?}"
    );
    let branches = source.references_glob("refs/heads/*")?.count();
    assert_eq!(moves.len(), branches + 1, "{moves:?}");

    // The mirror reads like any repository.
    let repo = Repo::open(&mirror_dir)?;
    let rev = repo.resolve(&pr_head)?;
    assert!(repo
        .read_file(&rev, "clusters/homelab/release-set.yaml")?
        .is_some());
    assert_eq!(repo.clusters(&repo.resolve("main")?)?, vec!["homelab"]);

    // A push through the API: the next fetch reports exactly that ref.
    let sha = twin
        .push_commit(REPO, "main", &[("NOTES.md", "hello\n")], "notes", "ops")
        .await?;
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    let moves = blocking(move || Mirror::open(&dir)?.fetch_all(&r)).await?;
    assert_eq!(
        moves,
        vec![RefMove {
            name: "refs/heads/main".into(),
            old: Some(main),
            new: Some(Oid::from_str(&sha)?),
        }]
    );
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    assert!(blocking(move || Mirror::open(&dir)?.fetch_all(&r))
        .await?
        .is_empty());

    // A branch deleted upstream is pruned from the mirror.
    source
        .find_reference(&format!("refs/heads/{branch}"))?
        .delete()?;
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    let moves = blocking(move || Mirror::open(&dir)?.fetch_all(&r)).await?;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].name, format!("refs/heads/{branch}"));
    assert_eq!(moves[0].new, None);

    // Pushing (receive-pack): a note written in the mirror lands in the emulator's repo.
    let (dir, r) = (mirror_dir.clone(), remote.clone());
    let head = Oid::from_str(&sha)?;
    blocking(move || -> Result<(), GitError> {
        let mirror = Mirror::open(&dir)?;
        let sig = Signature::new("ichor", "ichor@example.org", &Time::new(1_800_000_000, 0))?;
        mirror.git2().note(
            &sig,
            &sig,
            Some("refs/notes/ichor"),
            head,
            "gate: pass",
            false,
        )?;
        mirror.push(&r, &["refs/notes/ichor:refs/notes/ichor"])
    })
    .await?;
    let note = source.find_note(Some("refs/notes/ichor"), head)?;
    assert_eq!(note.message()?, "gate: pass");

    // A wrong token: a clear refusal that does not echo the token.
    let wrong = Remote {
        credentials: Credentials::Token {
            user: "x-access-token".into(),
            token: Secret::new("ghp_wrongwrongwrong"),
        },
        ..remote.clone()
    };
    let dir = mirror_dir.clone();
    let e = fetch_error(blocking(move || Mirror::open(&dir)?.fetch_all(&wrong)).await);
    assert!(e.contains("the remote refused the token"), "{e}");
    assert!(!e.contains("ghp_wrongwrongwrong"), "{e}");
    assert!(!e.contains(twin.token()), "{e}");

    // A token in the URL itself is not printed either.
    let in_url = Remote {
        url: url.replace("http://", "http://x-access-token:ghp_inurl@"),
        credentials: Credentials::None,
        known_hosts: None,
    };
    let dir = mirror_dir.clone();
    let e = fetch_error(blocking(move || Mirror::open(&dir)?.fetch_all(&in_url)).await);
    assert!(!e.contains("ghp_inurl"), "{e}");

    // No credentials: a clear error.
    let anonymous = Remote {
        credentials: Credentials::None,
        ..remote.clone()
    };
    let dir = mirror_dir.clone();
    let e = fetch_error(blocking(move || Mirror::open(&dir)?.fetch_all(&anonymous)).await);
    assert!(e.contains("none are configured"), "{e}");

    // The bounds: too many refs, too many bytes (a fresh mirror has everything to get).
    let (dir, r) = (state.path().join("small.git"), remote.clone());
    let e = fetch_error(
        blocking(move || {
            Mirror::open(&dir)?
                .with_limits(FetchLimits {
                    max_refs: 1,
                    ..FetchLimits::default()
                })
                .fetch_all(&r)
        })
        .await,
    );
    assert!(e.contains("ichor fetches at most 1"), "{e}");
    let (dir, r) = (state.path().join("tiny.git"), remote.clone());
    // A pack over the bound is its own error, so a caller can tell "too large" from "failed".
    let e = match blocking(move || {
        Mirror::open(&dir)?
            .with_limits(FetchLimits {
                max_bytes: 64,
                ..FetchLimits::default()
            })
            .fetch_all(&r)
    })
    .await
    {
        Err(e @ GitError::FetchTooLarge { max_bytes: 64, .. }) => e.to_string(),
        other => panic!("expected the fetch to be too large, got {other:?}"),
    };
    assert!(e.contains("64 bytes"), "{e}");

    twin.shutdown().await;
    Ok(())
}

#[test]
fn mirror_refuses_a_directory_that_is_not_a_repository() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    assert!(matches!(
        Mirror::open(dir.path()),
        Err(GitError::Open { .. })
    ));
    // An empty directory becomes a bare repository, and opens again as one.
    let empty = dir.path().join("m.git");
    std::fs::create_dir(&empty).unwrap();
    Mirror::open(&empty).unwrap();
    assert!(Mirror::open(&empty).unwrap().git2().is_bare());
}

// ----- ssh (a real sshd) -----

/// sshd on a loopback port for the duration of a test; killed on drop.
struct Sshd {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

fn keygen(path: &Path) {
    let out = Command::new(crate::tools::SSH_KEYGEN.path())
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `keytype base64` of a `.pub` file.
fn public_key(path: &Path) -> String {
    let text = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Start sshd with `host_key` and `authorized` (public key lines) in `dir`, and wait until
/// it says it listens (read from its log, not timed).
fn start_sshd(dir: &Path, host_key: &Path, authorized: &str) -> Sshd {
    // As root, sshd insists on its privilege-separation directory (what its service unit
    // creates at boot).
    if Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        std::fs::create_dir_all("/run/sshd").expect("create /run/sshd");
    }
    let keys = dir.join("authorized_keys");
    std::fs::write(&keys, authorized).unwrap();
    let port = free_port();
    // git-upload-pack lives in /usr/local/bin here, which sshd's default PATH lacks.
    let path = std::env::var("PATH").unwrap_or_default();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
         PidFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
         PermitRootLogin prohibit-password\nSetEnv PATH=/usr/local/bin:/usr/bin:/bin:{path}\n",
        host_key.display(),
        keys.display(),
        dir.join("sshd.pid").display(),
    );
    let config_path = dir.join("sshd_config");
    std::fs::write(&config_path, config).unwrap();
    let mut child = Command::new(crate::tools::SSHD.path())
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sshd");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let sink = log.clone();
    // Drain sshd's log for as long as it runs, so it never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("Server listening on") {
                let _ = ready_tx.send(true);
            }
            sink.lock().unwrap().push(line);
        }
        let _ = ready_tx.send(false);
    });
    let sshd = Sshd { child, port, log };
    match ready.recv_timeout(GUARD) {
        Ok(true) => sshd,
        _ => panic!("sshd did not start: {}", sshd.log()),
    }
}

#[test]
#[ignore = "needs sshd: scripts/test installs it"]
fn ssh_fetch_with_a_key_verifies_the_host_key() {
    let dir = tempfile::tempdir().unwrap();
    let (host_key, client_key, stranger_key) = (
        dir.path().join("host_key"),
        dir.path().join("client_key"),
        dir.path().join("stranger_key"),
    );
    for k in [&host_key, &client_key, &stranger_key] {
        keygen(k);
    }
    let sshd = start_sshd(
        dir.path(),
        &host_key,
        &format!("{}\n", public_key(&client_key)),
    );

    let served = dir.path().join("served.git");
    let repo = Repository::init_bare(&served).unwrap();
    let main = commit_on(&repo, "refs/heads/main", "talos: v1.12.0\n", 1_800_000_000);
    let bump = commit_on(
        &repo,
        "refs/heads/renovate/talos",
        "talos: v1.13.0\n",
        1_800_000_100,
    );

    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!(
            "# the test's sshd\n[127.0.0.1]:{} {}\n",
            sshd.port,
            public_key(&host_key)
        ),
    )
    .unwrap();
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let remote = Remote {
        url: format!("ssh://{user}@127.0.0.1:{}{}", sshd.port, served.display()),
        credentials: Credentials::SshKey {
            user: user.clone(),
            private_key: client_key.clone(),
            passphrase: None,
        },
        known_hosts: Some(known_hosts.clone()),
    };
    let mirror = Mirror::open(&dir.path().join("mirror.git")).unwrap();
    let moves = mirror
        .fetch(&remote, &["+refs/heads/*:refs/heads/*"])
        .unwrap_or_else(|e| panic!("{e}\nsshd: {}", sshd.log()));
    assert_eq!(
        moves,
        vec![
            RefMove {
                name: "refs/heads/main".into(),
                old: None,
                new: Some(main)
            },
            RefMove {
                name: "refs/heads/renovate/talos".into(),
                old: None,
                new: Some(bump)
            },
        ]
    );
    let moved = commit_on(&repo, "refs/heads/main", "talos: v1.12.1\n", 1_800_000_200);
    assert_eq!(
        mirror
            .fetch(&remote, &["+refs/heads/*:refs/heads/*"])
            .unwrap(),
        vec![RefMove {
            name: "refs/heads/main".into(),
            old: Some(main),
            new: Some(moved)
        }]
    );

    // Another key for the same host: refused, naming the host and the key type.
    let forged = dir.path().join("known_hosts.forged");
    std::fs::write(
        &forged,
        format!("[127.0.0.1]:{} {}\n", sshd.port, public_key(&stranger_key)),
    )
    .unwrap();
    let e = fetch_error(mirror.fetch(
        &Remote {
            known_hosts: Some(forged),
            ..remote.clone()
        },
        &["+refs/heads/*:refs/heads/*"],
    ));
    assert!(e.contains("does not match"), "{e}");
    assert!(e.contains("ssh-ed25519"), "{e}");
    assert!(e.contains(&format!("[127.0.0.1]:{}", sshd.port)), "{e}");

    // The host not listed at all (the port is part of the name).
    let other = dir.path().join("known_hosts.other");
    std::fs::write(&other, format!("127.0.0.1 {}\n", public_key(&host_key))).unwrap();
    let e = fetch_error(mirror.fetch(
        &Remote {
            known_hosts: Some(other),
            ..remote.clone()
        },
        &["+refs/heads/*:refs/heads/*"],
    ));
    assert!(e.contains("is not in"), "{e}");

    // No known_hosts configured: refused, never trusted on first use.
    let e = fetch_error(mirror.fetch(
        &Remote {
            known_hosts: None,
            ..remote.clone()
        },
        &["+refs/heads/*:refs/heads/*"],
    ));
    assert!(e.contains("no known_hosts file is configured"), "{e}");

    // A key the server does not accept: a clear refusal after a bounded number of tries.
    let e = fetch_error(mirror.fetch(
        &Remote {
            credentials: Credentials::SshKey {
                user,
                private_key: stranger_key.clone(),
                passphrase: None,
            },
            ..remote.clone()
        },
        &["+refs/heads/*:refs/heads/*"],
    ));
    assert!(e.contains("the remote refused the ssh key"), "{e}");
}

// ----- the watcher -----

/// Wait for wakes until the snapshot differs from `last`; return the moves.
async fn next_moves(
    rx: &mut mpsc::Receiver<()>,
    path: &Path,
    last: &mut BTreeMap<String, Oid>,
) -> Vec<RefMove> {
    loop {
        tokio::time::timeout(GUARD, rx.recv())
            .await
            .expect("a wake within the guard")
            .expect("the watcher is alive");
        let now = refs_snapshot(&Repository::open(path).unwrap()).unwrap();
        let moves = diff_refs(last, &now);
        *last = now;
        if !moves.is_empty() {
            return moves;
        }
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn watcher_wakes_when_refs_move_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("ops.git");
    let repo = Repository::init_bare(&path).unwrap();
    repo.set_head("refs/heads/unborn").unwrap();
    let c1 = commit_on(&repo, "refs/heads/main", "one\n", 1_800_000_000);
    let (watcher, mut rx) = RefWatcher::start(&path).unwrap();
    let mut last = refs_snapshot(&repo).unwrap();

    // git2 moves a branch.
    let c2 = commit_on(&repo, "refs/heads/main", "two\n", 1_800_000_100);
    let moves = next_moves(&mut rx, &path, &mut last).await;
    assert_eq!(
        moves,
        vec![RefMove {
            name: "refs/heads/main".into(),
            old: Some(c1),
            new: Some(c2)
        }]
    );

    // A branch in a folder that does not exist yet.
    let c3 = commit_on(&repo, "refs/heads/renovate/talos", "three\n", 1_800_000_200);
    let moves = next_moves(&mut rx, &path, &mut last).await;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].name, "refs/heads/renovate/talos");
    assert_eq!(moves[0].new, Some(c3));

    // The real git moves one.
    git(&path, &["update-ref", "refs/heads/main", &c1.to_string()]);
    let moves = next_moves(&mut rx, &path, &mut last).await;
    assert_eq!(
        moves,
        vec![RefMove {
            name: "refs/heads/main".into(),
            old: Some(c2),
            new: Some(c1)
        }]
    );

    // Packing moves nothing but wakes; a packed ref deleted rewrites only packed-refs.
    git(&path, &["pack-refs", "--all"]);
    assert!(!path.join("refs/heads/renovate/talos").exists());
    tokio::time::timeout(GUARD, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let now = refs_snapshot(&repo).unwrap();
    assert!(diff_refs(&last, &now).is_empty());
    git(&path, &["update-ref", "-d", "refs/heads/renovate/talos"]);
    let moves = next_moves(&mut rx, &path, &mut last).await;
    assert_eq!(
        moves,
        vec![RefMove {
            name: "refs/heads/renovate/talos".into(),
            old: Some(c3),
            new: None
        }]
    );

    // HEAD of a bare repository pointing at another branch is a move too.
    git(&path, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    let moves = next_moves(&mut rx, &path, &mut last).await;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!((moves[0].name.as_str(), moves[0].new), ("HEAD", Some(c1)));

    // Dropping the watcher ends the stream.
    drop(watcher);
    while let Some(()) = tokio::time::timeout(GUARD, rx.recv()).await.unwrap() {}
}

#[tokio::test]
async fn watcher_takes_a_work_tree_and_watches_its_git_dir() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let c1 = commit_on(&repo, "refs/heads/main", "one\n", 1_800_000_000);
    let (_watcher, mut rx) = RefWatcher::start(dir.path()).unwrap();
    let mut last = refs_snapshot(&repo).unwrap();
    let c2 = commit_on(&repo, "refs/heads/feature", "two\n", 1_800_000_100);
    let moves = next_moves(&mut rx, dir.path(), &mut last).await;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(
        (moves[0].name.as_str(), moves[0].new),
        ("refs/heads/feature", Some(c2))
    );
    assert_ne!(c1, c2);
    assert!(RefWatcher::start(&dir.path().join("missing")).is_err());
}
