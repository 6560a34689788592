//! Git notes as the Git-only reporter, and Git-only commands, on real repositories: git2
//! for ichor's side, the real git CLI for what a human (or `git notes merge`) does.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use git2::{Oid, Repository, Signature, Time};
use ichor::clock::Timestamp;
use ichor::git::notes::{self, NoteRecord, RecordKind, NOTES_REF};

fn sig() -> Signature<'static> {
    Signature::new("ichor", "ichor@example.org", &Time::new(1_764_000_000, 0)).unwrap()
}

/// An empty-tree commit on `refs/heads/main`.
fn commit(repo: &Repository, message: &str) -> Oid {
    let tree = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    let parent = repo
        .find_reference("refs/heads/main")
        .ok()
        .and_then(|r| r.peel_to_commit().ok());
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(
        Some("refs/heads/main"),
        &sig(),
        &sig(),
        message,
        &tree,
        &parents,
    )
    .unwrap()
}

fn record(kind: RecordKind, secs: u64, summary: &str) -> NoteRecord {
    let mut r = NoteRecord::new(
        kind,
        Timestamp::from_millis(1_764_000_000_000 + secs * 1000),
        "success",
        summary,
    );
    r.cluster = Some("homelab".to_string());
    r
}

/// The real git CLI in `dir`, with no user or system configuration.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "user.name=Op", "-c", "user.email=op@example.org"])
        .args(args)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn note_text(repo: &Repository, object: Oid) -> String {
    let note = repo.find_note(Some(NOTES_REF), object).unwrap();
    String::from_utf8(note.message_bytes().to_vec()).unwrap()
}

fn lines(records: &[NoteRecord]) -> BTreeSet<String> {
    records.iter().map(NoteRecord::to_line).collect()
}

#[test]
fn append_and_read_round_trip_sorted_unique_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let c1 = commit(&repo, "one");
    let later = record(RecordKind::Rollout, 20, "talos 1/3 nodes");
    let earlier = record(
        RecordKind::Gate,
        10,
        "blocked: kubernetes 1.34 needs cilium ≥ 1.19",
    );

    assert!(notes::append(&repo, c1, &[later.clone(), earlier.clone()], &sig()).unwrap());
    assert_eq!(
        notes::read(&repo, c1).unwrap(),
        vec![earlier.clone(), later.clone()]
    );
    // The same records again, in any order: nothing changes, no new notes commit.
    let tip = repo.refname_to_id(NOTES_REF).unwrap();
    assert!(!notes::append(&repo, c1, std::slice::from_ref(&earlier), &sig()).unwrap());
    assert!(!notes::append(&repo, c1, &[later.clone(), earlier.clone()], &sig()).unwrap());
    assert_eq!(repo.refname_to_id(NOTES_REF).unwrap(), tip);

    let third = record(RecordKind::Ack, 5, "retrying");
    assert!(notes::append(&repo, c1, &[third.clone(), third.clone()], &sig()).unwrap());
    let read = notes::read_lines(&repo, c1).unwrap();
    let mut sorted = read.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(read, sorted);
    assert_eq!(read.len(), 3);
    assert_eq!(note_text(&repo, c1), format!("{}\n", read.join("\n")));
    // Oldest first: `at` leads every line.
    assert_eq!(notes::read(&repo, c1).unwrap(), vec![third, earlier, later]);
    // A commit without a note reads as empty.
    let c2 = commit(&repo, "two");
    assert!(notes::read(&repo, c2).unwrap().is_empty());
}

#[test]
fn git_log_shows_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let c1 = commit(&repo, "bump talos");
    let r = record(RecordKind::Gate, 1, "all checks pass");
    notes::append(&repo, c1, std::slice::from_ref(&r), &sig()).unwrap();
    let log = git(dir.path(), &["log", "--notes=ichor", "-1", &c1.to_string()]);
    assert!(log.contains("Notes (ichor):"), "{log}");
    assert!(log.contains(&r.to_line()), "{log}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Append to the history that ends at `from` and return the new notes commit, leaving
/// `NOTES_REF` where it was: a second writer's history in the same repository.
fn append_elsewhere(repo: &Repository, from: Oid, writes: &[(Oid, Vec<NoteRecord>)]) -> Oid {
    let keep = repo.refname_to_id(NOTES_REF).unwrap();
    repo.reference(NOTES_REF, from, true, "test").unwrap();
    for (object, records) in writes {
        notes::append(repo, *object, records, &sig()).unwrap();
    }
    let tip = repo.refname_to_id(NOTES_REF).unwrap();
    repo.reference(NOTES_REF, keep, true, "test").unwrap();
    tip
}

#[test]
fn merge_gives_what_git_notes_merge_cat_sort_uniq_gives() {
    let dir = tempfile::tempdir().unwrap();
    let ours_dir = dir.path().join("ours");
    let repo = Repository::init(&ours_dir).unwrap();
    let (c1, c2, c3) = (commit(&repo, "1"), commit(&repo, "2"), commit(&repo, "3"));
    let shared = record(RecordKind::Gate, 1, "pending");
    notes::append(&repo, c1, std::slice::from_ref(&shared), &sig()).unwrap();
    let base = repo.refname_to_id(NOTES_REF).unwrap();

    let both = record(RecordKind::Rollout, 9, "both wrote this");
    let ours_c1 = vec![record(RecordKind::Gate, 5, "ours"), both.clone()];
    for (object, records) in [
        (c1, ours_c1.clone()),
        (c2, vec![record(RecordKind::Ack, 3, "ours")]),
    ] {
        notes::append(&repo, object, &records, &sig()).unwrap();
    }
    // Theirs: the same commits and more than a flat tree's worth of other objects, so the
    // merged tree fans out.
    let their_c1 = vec![record(RecordKind::Gate, 4, "theirs"), both.clone()];
    let mut writes = vec![
        (c1, their_c1.clone()),
        (c3, vec![record(RecordKind::Command, 2, "theirs")]),
    ];
    for i in 0..300u64 {
        let object =
            Oid::hash_object(git2::ObjectType::Blob, format!("object {i}").as_bytes()).unwrap();
        writes.push((object, vec![record(RecordKind::Gate, i, &format!("n{i}"))]));
    }
    let theirs = append_elsewhere(&repo, base, &writes);
    repo.reference("refs/notes/theirs", theirs, true, "test")
        .unwrap();
    let ours = repo.refname_to_id(NOTES_REF).unwrap();

    let git_dir = dir.path().join("git");
    copy_dir(&ours_dir, &git_dir);
    git(
        &git_dir,
        &[
            "notes",
            "--ref=ichor",
            "merge",
            "-s",
            "cat_sort_uniq",
            "refs/notes/theirs",
        ],
    );

    let merged = notes::merge(&repo, theirs).unwrap();
    assert_eq!(repo.refname_to_id(NOTES_REF).unwrap(), merged);
    let parents: Vec<Oid> = repo.find_commit(merged).unwrap().parent_ids().collect();
    assert_eq!(parents, vec![ours, theirs]);

    // `git notes list` pairs each note blob with its object: equal lists, equal texts.
    let list = |d: &Path| {
        let mut l: Vec<String> = git(d, &["notes", "--ref=ichor", "list"])
            .lines()
            .map(str::to_string)
            .collect();
        l.sort();
        l
    };
    let ichor_list = list(&ours_dir);
    assert_eq!(ichor_list.len(), 303);
    assert_eq!(ichor_list, list(&git_dir));
    let want: BTreeSet<String> = lines(&ours_c1)
        .into_iter()
        .chain(lines(&their_c1))
        .chain([shared.to_line()])
        .collect();
    assert_eq!(
        git(
            &ours_dir,
            &["notes", "--ref=ichor", "show", &c1.to_string()]
        ),
        want.iter().map(|l| format!("{l}\n")).collect::<String>()
    );

    // Merging what we already contain changes nothing; a descendant fast-forwards.
    assert_eq!(notes::merge(&repo, theirs).unwrap(), merged);
    let ahead = append_elsewhere(
        &repo,
        merged,
        &[(c2, vec![record(RecordKind::Ack, 7, "later")])],
    );
    assert_eq!(notes::merge(&repo, ahead).unwrap(), ahead);
    assert_eq!(repo.refname_to_id(NOTES_REF).unwrap(), ahead);
}

/// A bare origin with three commits on main, and `n` clones of it.
fn origin_and_clones(dir: &Path, n: usize) -> (PathBuf, [Oid; 3], Vec<PathBuf>) {
    let origin = dir.join("origin.git");
    let repo = Repository::init_bare(&origin).unwrap();
    let commits = [commit(&repo, "1"), commit(&repo, "2"), commit(&repo, "3")];
    repo.set_head("refs/heads/main").unwrap();
    let clones = (0..n)
        .map(|i| {
            let path = dir.join(format!("writer-{i}"));
            Repository::clone(&origin.to_string_lossy(), &path).unwrap();
            path
        })
        .collect();
    (origin, commits, clones)
}

fn no_credentials() -> git2::RemoteCallbacks<'static> {
    git2::RemoteCallbacks::new()
}

#[test]
fn a_writer_that_loses_the_race_fetches_merges_and_pushes_again() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, [c1, c2, c3], clones) = origin_and_clones(dir.path(), 2);
    let url = origin.to_string_lossy().to_string();
    let a = Repository::open(&clones[0]).unwrap();
    let b = Repository::open(&clones[1]).unwrap();
    let a_records = [
        record(RecordKind::Gate, 1, "a on c1"),
        record(RecordKind::Gate, 2, "a on c2"),
    ];
    let b_records = [
        record(RecordKind::Rollout, 3, "b on c1"),
        record(RecordKind::Rollout, 4, "b on c3"),
    ];
    notes::append(&a, c1, &a_records[..1], &sig()).unwrap();
    notes::append(&a, c2, &a_records[1..], &sig()).unwrap();

    // A's callbacks are asked for once per connection: fetch, then push. Before A's push
    // connects, B appends and pushes: B gets in between A's fetch and A's push.
    let calls = Cell::new(0);
    let b_outcome = Cell::new(None);
    let interleave = || {
        calls.set(calls.get() + 1);
        if calls.get() == 2 {
            notes::append(&b, c1, &b_records[..1], &sig()).unwrap();
            notes::append(&b, c3, &b_records[1..], &sig()).unwrap();
            b_outcome.set(Some(notes::push(&b, &url, &no_credentials, 3).unwrap()));
        }
        git2::RemoteCallbacks::new()
    };
    let a_outcome = notes::push(&a, &url, &interleave, 3).unwrap();

    let b_outcome = b_outcome.get().expect("B pushed in between");
    assert_eq!((b_outcome.attempts_used, b_outcome.pushed), (1, true));
    assert_eq!(a_outcome.attempts_used, 2, "{a_outcome:?}");
    assert!(a_outcome.merged_remote && a_outcome.pushed);
    assert_eq!(calls.get(), 4, "fetch, refused push, fetch, push");

    let origin = Repository::open_bare(&origin).unwrap();
    let on = |object| lines(&notes::read(&origin, object).unwrap());
    assert_eq!(on(c1), lines(&[a_records[0].clone(), b_records[0].clone()]));
    assert_eq!(on(c2), lines(&a_records[1..]));
    assert_eq!(on(c3), lines(&b_records[1..]));

    // B pulls A's notes; pushing again has nothing to send.
    let fetched = notes::fetch_merge(&b, &url, &no_credentials).unwrap();
    assert!(fetched.changed);
    assert_eq!(lines(&notes::read(&b, c2).unwrap()), lines(&a_records[1..]));
    let again = notes::push(&b, &url, &no_credentials, 3).unwrap();
    assert_eq!((again.attempts_used, again.pushed), (1, false));
}

/// `git daemon --inetd` behind a loopback listener: the real git server, whose
/// receive-pack updates a ref only if it still holds the value the client saw (libgit2's
/// local transport overwrites instead, so two racing local pushes could lose a write).
struct GitDaemon {
    port: u16,
    stop: Arc<AtomicBool>,
    children: Arc<Mutex<Vec<Child>>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl GitDaemon {
    fn serve(base: &Path) -> GitDaemon {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let children = Arc::new(Mutex::new(Vec::new()));
        let (base, stop2, children2) = (base.to_path_buf(), stop.clone(), children.clone());
        let acceptor = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let output = stream.try_clone().unwrap();
                let child = Command::new("git")
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .env("GIT_CONFIG_GLOBAL", "/dev/null")
                    .arg("daemon")
                    .arg("--inetd")
                    .arg("--export-all")
                    .arg("--enable=receive-pack")
                    .arg(format!("--base-path={}", base.display()))
                    .stdin(Stdio::from(OwnedFd::from(stream)))
                    .stdout(Stdio::from(OwnedFd::from(output)))
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                children2.lock().unwrap().push(child);
            }
        });
        GitDaemon {
            port,
            stop,
            children,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for mut child in self.children.lock().unwrap().drain(..) {
            let _ = child.wait();
        }
    }
}

#[test]
fn two_writers_pushing_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, [c1, c2, c3], clones) = origin_and_clones(dir.path(), 2);
    let daemon = GitDaemon::serve(dir.path());
    let url = daemon.url("origin.git");
    let rounds = 6u64;
    let start = Arc::new(Barrier::new(2));
    let writers: Vec<_> = clones
        .iter()
        .enumerate()
        .map(|(w, path)| {
            let (path, url, start) = (path.clone(), url.clone(), start.clone());
            let own = if w == 0 { c2 } else { c3 };
            std::thread::spawn(move || {
                let repo = Repository::open(&path).unwrap();
                let mut outcomes = Vec::new();
                for round in 0..rounds {
                    let mine = |object: &str| {
                        record(
                            RecordKind::Rollout,
                            round * 10 + w as u64,
                            &format!("writer {w} round {round} {object}"),
                        )
                    };
                    notes::append(&repo, c1, &[mine("c1")], &sig()).unwrap();
                    notes::append(&repo, own, &[mine("own")], &sig()).unwrap();
                    start.wait();
                    outcomes.push(notes::push(&repo, &url, &no_credentials, 20).unwrap());
                }
                outcomes
            })
        })
        .collect();
    let outcomes: Vec<Vec<_>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    // Both appended before either pushed, so in every round whoever came second merged
    // the other's lines (after a refused push, when the two raced).
    for (round, (a, b)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        assert!(
            a.merged_remote || b.merged_remote,
            "round {round}: {a:?} {b:?}"
        );
        assert!(a.pushed && b.pushed, "round {round}: {a:?} {b:?}");
    }
    assert_eq!(outcomes[0].len() as u64, rounds);
    drop(daemon);

    let origin = Repository::open_bare(&origin).unwrap();
    let count = |object| notes::read(&origin, object).unwrap().len() as u64;
    assert_eq!(count(c1), 2 * rounds);
    assert_eq!(count(c2), rounds);
    assert_eq!(count(c3), rounds);
    for (w, own) in [(0, c2), (1, c3)] {
        let summaries: BTreeSet<String> = notes::read(&origin, own)
            .unwrap()
            .into_iter()
            .map(|r| r.summary)
            .collect();
        for round in 0..rounds {
            assert!(summaries.contains(&format!("writer {w} round {round} own")));
        }
    }
}

#[test]
fn a_hostile_note_is_bounded_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let (c1, c2, c3) = (commit(&repo, "1"), commit(&repo, "2"), commit(&repo, "3"));
    let good = record(RecordKind::Gate, 1, "fine");
    let write = |object, text: &str| {
        repo.note(&sig(), &sig(), Some(NOTES_REF), object, text, true)
            .unwrap();
    };

    // A 10 KiB line, garbage, an unknown kind, and one good line.
    let unknown = good.to_line().replace("\"gate\"", "\"deploy\"");
    write(
        c1,
        &format!(
            "{}\n{}\nnot json\n\u{7f}\u{1}\n{unknown}\n",
            "x".repeat(10 << 10),
            good.to_line()
        ),
    );
    let note = notes::read_note(&repo, c1).unwrap();
    assert_eq!(note.records, vec![good.clone()]);
    assert_eq!(note.bad_lines, 4);
    assert!(notes::parse_line(&unknown)
        .unwrap_err()
        .to_string()
        .contains("unknown kind `deploy`"));

    // 5,000 valid lines: the newest MAX_NOTE_LINES are kept.
    let many: String = (0..5_000u64)
        .map(|i| {
            format!(
                "{}\n",
                record(RecordKind::Rollout, i, &format!("{i}")).to_line()
            )
        })
        .collect();
    write(c2, &many);
    let note = notes::read_note(&repo, c2).unwrap();
    assert_eq!(note.records.len(), notes::MAX_NOTE_LINES);
    assert_eq!(note.dropped_lines, 5_000 - notes::MAX_NOTE_LINES);
    assert_eq!(
        note.records[0].summary,
        format!("{}", 5_000 - notes::MAX_NOTE_LINES)
    );

    // Appending to it writes a note within the bounds, keeping the newest lines.
    let newest = record(RecordKind::Rollout, 200_000, "newest");
    assert!(notes::append(&repo, c2, std::slice::from_ref(&newest), &sig()).unwrap());
    let text = note_text(&repo, c2);
    assert!(text.len() <= notes::MAX_NOTE_BYTES);
    assert_eq!(text.lines().count(), notes::MAX_NOTE_LINES);
    assert!(text.contains(&newest.to_line()));

    // Too large to load at all: reported, empty, and replaced on the next append.
    write(c3, &"y".repeat(notes::MAX_NOTE_BLOB_BYTES + 1));
    let note = notes::read_note(&repo, c3).unwrap();
    assert_eq!(note.oversized, Some(notes::MAX_NOTE_BLOB_BYTES + 1));
    assert!(note.records.is_empty());
    assert!(notes::append(&repo, c3, std::slice::from_ref(&good), &sig()).unwrap());
    assert_eq!(notes::read(&repo, c3).unwrap(), vec![good.clone()]);

    // Binary garbage with a NUL, written as a raw blob (git notes take any bytes).
    let blob = repo.blob(b"\xff\xfe\x00garbage\n\x00\n").unwrap();
    let notes_commit = repo
        .find_reference(NOTES_REF)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let mut tree = repo
        .treebuilder(Some(&notes_commit.tree().unwrap()))
        .unwrap();
    tree.insert(c3.to_string(), blob, 0o100644).unwrap();
    let tree = repo.find_tree(tree.write().unwrap()).unwrap();
    repo.commit(
        Some(NOTES_REF),
        &sig(),
        &sig(),
        "garbage",
        &tree,
        &[&notes_commit],
    )
    .unwrap();
    let note = notes::read_note(&repo, c3).unwrap();
    assert!(note.records.is_empty());
    assert_eq!(note.bad_lines, 2);
}

#[test]
fn pending_commands_are_the_unacknowledged_ones_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _, clones) = origin_and_clones(dir.path(), 1);
    let work = &clones[0];
    let long = format!("/ichor plan {}", "z".repeat(300));
    for message in [
        "/ichor plan",
        "/ichor retry homelab\n\nthe drain timed out",
        "/ichor pause homelab",
        &long,
    ] {
        git(work, &["commit", "--allow-empty", "-m", message]);
    }
    git(work, &["push", "origin", "HEAD:refs/ichor/commands"]);

    let origin = Repository::open_bare(&origin).unwrap();
    let key = notes::AckKey::random();
    let none = BTreeSet::new();
    let strict = |done| notes::Handled {
        key: &key,
        done,
        trust_every_ack: false,
    };
    let pending =
        |h: notes::Handled<'_>, limit| notes::pending_commands(&origin, h, limit).unwrap();
    let all = pending(strict(&none), 100).commands;
    // The commands only: the commits of main below them are not commands.
    let lines: Vec<&str> = all.iter().map(|c| c.line.as_str()).collect();
    assert_eq!(
        &lines[..3],
        [
            "/ichor plan",
            "/ichor retry homelab",
            "/ichor pause homelab"
        ]
    );
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[3].chars().count(), notes::MAX_COMMAND_LINE_CHARS);
    assert!(lines[3].starts_with("/ichor plan zzz") && lines[3].ends_with('…'));
    assert_eq!(
        (all[1].author_name.as_str(), all[1].author_email.as_str()),
        ("Op", "op@example.org")
    );

    // ichor acknowledges the retry: its sealed ack makes it handled.
    let retry = all[1].oid;
    let mut ack = record(RecordKind::Ack, 50, "retrying homelab");
    ack.command = Some(all[1].line.clone());
    key.seal(retry, &mut ack);
    notes::append(&origin, retry, &[ack.clone()], &sig()).unwrap();
    // Anyone who can push the notes writes acks for the pause: unsealed, sealed by another
    // controller's key, and ichor's own MAC copied from the retry's ack. None counts.
    let pause = all[2].oid;
    let mut plain = record(RecordKind::Ack, 51, "done");
    plain.command = Some(all[2].line.clone());
    let mut other = plain.clone();
    notes::AckKey::random().seal(pause, &mut other);
    let mut copied = plain.clone();
    copied.mac = ack.mac.clone();
    copied.command = ack.command.clone();
    notes::append(
        &origin,
        pause,
        &[
            plain,
            other,
            copied,
            record(RecordKind::Command, 52, "seen"),
        ],
        &sig(),
    )
    .unwrap();
    let found = pending(strict(&none), 100);
    let oids: Vec<Oid> = found.commands.iter().map(|c| c.oid).collect();
    assert_eq!(oids.len(), 3);
    assert!(!oids.contains(&retry));
    assert!(oids.contains(&pause), "a forged ack suppressed the pause");
    assert_eq!(found.acknowledged, vec![retry]);
    assert_eq!(found.forged, vec![pause]);
    // A fresh state dir trusts every ack already there (the old key is gone).
    let fresh = pending(
        notes::Handled {
            key: &key,
            done: &none,
            trust_every_ack: true,
        },
        100,
    );
    assert_eq!(fresh.commands.len(), 2);
    // What the state dir says was handled is handled, whatever the notes say.
    let done: BTreeSet<Oid> = [all[0].oid].into();
    assert_eq!(pending(strict(&done), 100).commands.len(), 2);
    // The limit counts commits walked from the tip.
    let newest: Vec<Oid> = pending(strict(&none), 2)
        .commands
        .iter()
        .map(|c| c.oid)
        .collect();
    assert_eq!(newest, vec![all[2].oid, all[3].oid]);
    // No command ref: nothing pending.
    let empty = Repository::init(dir.path().join("empty")).unwrap();
    assert!(notes::pending_commands(&empty, strict(&none), 100)
        .unwrap()
        .commands
        .is_empty());
}

/// Issue 17 item 11: records written in the same instant read back in the order they were
/// written (the clock of a test, or two writes within a millisecond, gives them equal `at`).
#[test]
fn records_written_in_the_same_instant_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let c1 = commit(&repo, "one");
    // "running" sorts after "paused" by its text; written first, it must read first.
    let mut first = record(RecordKind::Rollout, 7, "running: w-2");
    first.state = "running".into();
    let mut second = record(RecordKind::Rollout, 7, "paused: w-2");
    second.state = "paused".into();
    notes::append(&repo, c1, std::slice::from_ref(&first), &sig()).unwrap();
    notes::append(&repo, c1, std::slice::from_ref(&second), &sig()).unwrap();
    // And two more in one call, also in the same instant.
    let mut third = record(RecordKind::Rollout, 7, "resumed");
    third.state = "running".into();
    let mut fourth = record(RecordKind::Ack, 7, "acknowledged");
    fourth.state = "success".into();
    notes::append(&repo, c1, &[third, fourth], &sig()).unwrap();
    let read: Vec<String> = notes::read(&repo, c1)
        .unwrap()
        .into_iter()
        .map(|r| r.summary)
        .collect();
    assert_eq!(
        read,
        ["running: w-2", "paused: w-2", "resumed", "acknowledged"]
    );
    // Sub-second `at`, and appending the first again changes nothing.
    assert!(notes::read(&repo, c1).unwrap()[1].at.ends_with(".001Z"));
    assert!(!notes::append(&repo, c1, &[first], &sig()).unwrap());
}

/// Issue 17 item 11: a note far larger than ichor writes, pushed by someone else, is never
/// loaded by a merge: the merged note keeps ichor's side, and the big blob is not read.
#[test]
fn a_merge_never_loads_a_note_larger_than_ichor_writes() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let c1 = commit(&repo, "1");
    let ours = record(RecordKind::Gate, 1, "ours");
    notes::append(&repo, c1, std::slice::from_ref(&ours), &sig()).unwrap();
    let base = repo.refname_to_id(NOTES_REF).unwrap();
    // Theirs: 2 MiB of well-formed records on the same commit (16 MiB was read before).
    let big: String = (0..20_000u64)
        .map(|i| {
            format!(
                "{}\n",
                record(RecordKind::Rollout, 100 + i, &"r".repeat(60)).to_line()
            )
        })
        .collect();
    assert!(big.len() > notes::MAX_NOTE_BLOB_BYTES, "{}", big.len());
    repo.reference(NOTES_REF, base, true, "test").unwrap();
    repo.note(&sig(), &sig(), Some(NOTES_REF), c1, &big, true)
        .unwrap();
    let theirs = repo.refname_to_id(NOTES_REF).unwrap();
    // Ours moves on from the base too.
    repo.reference(NOTES_REF, base, true, "test").unwrap();
    let later = record(RecordKind::Gate, 2, "ours, later");
    notes::append(&repo, c1, std::slice::from_ref(&later), &sig()).unwrap();

    notes::merge(&repo, theirs).unwrap();
    let merged = notes::read_note(&repo, c1).unwrap();
    assert_eq!(merged.records, vec![ours, later]);
    assert_eq!(notes::MAX_NOTE_BLOB_BYTES, 4 * notes::MAX_NOTE_BYTES);
}
