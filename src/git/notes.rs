//! Git notes as ichor's Git-only reporter, and Git-only commands.
//!
//! ichor writes the records the GitHub reporter posts (gate verdicts on PR heads, rollout
//! progress on merge commits, acknowledgements of commands) as one JSON object per line in
//! the note on the commit, under [`NOTES_REF`]. Lines are kept sorted and unique, the same
//! shape `git notes merge -s cat_sort_uniq` produces, so two writers never conflict: a merge
//! is the union of lines. `at` is the first key, so sorted lines read oldest first.
//!
//! Notes come from anyone who can push to the repository, so everything read is bounded: a
//! line, a note, the number of annotated objects, the command history walked.
//!
//! Commands without a forge: each commit on [`COMMANDS_REF`] carries one command in the
//! first line of its message (`/ichor retry homelab`); ichor acknowledges one by appending an
//! `ack` record to that commit's note. Anyone who can push the notes can write an `ack`
//! line, so an ack counts only when it carries a MAC of this controller's [`AckKey`]
//! (bound to the command's commit, the cluster and the command), and the controller keeps
//! which commands it handled in its own state dir, not in the shared notes. See
//! docs/git-only.md.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use git2::{AutotagOption, ErrorCode, FetchOptions, ObjectType, Oid, PushOptions, Repository};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::GitError;
use crate::clock::Timestamp;

/// Where ichor's records live.
pub const NOTES_REF: &str = "refs/notes/ichor";
/// Where a fetch puts the remote's notes before merging: outside `refs/notes/`, so
/// `git log --notes='*'` never shows a stale copy.
pub const REMOTE_NOTES_REF: &str = "refs/ichor/notes-remote";
/// Git-only commands: one per commit, in the first line of its message.
pub const COMMANDS_REF: &str = "refs/ichor/commands";

/// The longest line ichor reads or writes.
pub const MAX_LINE_BYTES: usize = 4096;
/// The most lines a note keeps; past it the oldest (by `at`) go.
pub const MAX_NOTE_LINES: usize = 1000;
/// The most bytes a note keeps; past it the oldest (by `at`) go.
pub const MAX_NOTE_BYTES: usize = 256 * 1024;
/// A note blob larger than this is not loaded at all, by a read or by a merge: ichor's own
/// notes are at most [`MAX_NOTE_BYTES`], and the union of two of them at most twice that, so
/// anything larger was written by someone else and would only slow every later write.
pub const MAX_NOTE_BLOB_BYTES: usize = 4 * MAX_NOTE_BYTES;
/// A record's summary, as a GitHub status description.
pub const MAX_SUMMARY_CHARS: usize = 140;
/// A record's detail.
pub const MAX_DETAIL_BYTES: usize = 2048;
/// Every other text field of a record (cluster, head, stage, node, command, by, …).
pub const MAX_FIELD_CHARS: usize = 200;
/// A command's first line.
pub const MAX_COMMAND_LINE_CHARS: usize = 200;
/// The most objects one notes tree may annotate for ichor to merge it.
pub const MAX_NOTED_OBJECTS: usize = 100_000;
/// The most commits of [`COMMANDS_REF`] ichor walks in one reconcile: the newest ones.
pub const MAX_COMMAND_WALK: usize = 100;
/// The most fetch-merge-push rounds of one [`push`].
pub const MAX_PUSH_ATTEMPTS: u32 = 20;

/// Up to this many notes a tree is flat; above it, one level of fan-out (`ab/cdef…`), as
/// git itself does, so adding a note does not rewrite one huge tree.
const FANOUT_ABOVE: usize = 256;

/// What a record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKind {
    /// A gate verdict on a PR head.
    Gate,
    /// Rollout progress on a merge commit.
    Rollout,
    /// A command ichor received (from a PR comment or the command ref).
    Command,
    /// The acknowledgement of a command: ichor handled (or refused) it.
    Ack,
}

impl RecordKind {
    pub const ALL: [RecordKind; 4] = [
        RecordKind::Gate,
        RecordKind::Rollout,
        RecordKind::Command,
        RecordKind::Ack,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Gate => "gate",
            RecordKind::Rollout => "rollout",
            RecordKind::Command => "command",
            RecordKind::Ack => "ack",
        }
    }

    pub fn from_name(name: &str) -> Option<RecordKind> {
        RecordKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// One line of a note. Keys are written in declaration order, absent options left out, so
/// equal records give equal lines (and `cat_sort_uniq` removes the duplicate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoteRecord {
    /// RFC 3339 UTC, second precision (`2026-11-30T07:12:06Z`); first, so lines sort by time.
    pub at: String,
    pub kind: RecordKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `pending`/`success`/`failure` for a gate, `running`/`paused`/`completed`/`failed`
    /// for a rollout, `success`/`failure` for an ack.
    pub state: String,
    /// What matters, at most [`MAX_SUMMARY_CHARS`]: "blocked: kubernetes 1.34 needs cilium ≥ 1.19".
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Longer text (a pause's root cause), at most [`MAX_DETAIL_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// On an `ack`: `<key id>.<HMAC-SHA256>` from the controller's [`AckKey`], binding the
    /// ack to its command commit, cluster and command (see [`AckKey::seal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// Why a note line is not an ichor record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteLineError {
    #[error("the line is {len} bytes; ichor reads note lines of at most {MAX_LINE_BYTES} bytes")]
    TooLong { len: usize },
    #[error("the line is not JSON: {0}")]
    NotJson(String),
    #[error("the line is JSON but not an object")]
    NotAnObject,
    #[error("the line has no `kind`")]
    MissingKind,
    #[error("unknown kind `{0}`; ichor writes gate, rollout, command and ack")]
    UnknownKind(String),
    #[error("`at` is `{0}`, not an RFC 3339 UTC time like 2026-11-30T07:12:06Z")]
    BadTime(String),
    #[error("the record is not valid: {0}")]
    Invalid(String),
}

impl NoteRecord {
    /// A record with no optional fields; set those on the result.
    pub fn new(kind: RecordKind, at: Timestamp, state: &str, summary: &str) -> NoteRecord {
        NoteRecord {
            at: at.rfc3339_millis(),
            kind,
            cluster: None,
            state: state.to_string(),
            summary: summary.to_string(),
            pr: None,
            head: None,
            stage: None,
            node: None,
            command: None,
            by: None,
            detail: None,
            mac: None,
        }
    }

    /// The record as one JSON line (no newline), at most [`MAX_LINE_BYTES`]: every field is
    /// clipped to its bound and control characters become spaces (the detail keeps newlines
    /// and tabs, escaped by JSON), so nothing a PR wrote can break the line.
    pub fn to_line(&self) -> String {
        let mut r = self.clipped(MAX_FIELD_CHARS, MAX_SUMMARY_CHARS, MAX_DETAIL_BYTES);
        let mut line = to_json(&r);
        if line.len() > MAX_LINE_BYTES {
            // Only JSON escapes of a long detail get here; shorten the detail by the excess.
            if let Some(detail) = &r.detail {
                let excess = line.len() - MAX_LINE_BYTES;
                r.detail = Some(clip_bytes(detail, detail.len().saturating_sub(excess + 3)));
                line = to_json(&r);
            }
        }
        if line.len() > MAX_LINE_BYTES {
            // Every field near its bound in 4-byte characters: 64 characters each fit.
            line = to_json(&self.clipped(64, 64, 64));
        }
        line
    }

    fn clipped(&self, field_chars: usize, summary_chars: usize, detail_bytes: usize) -> NoteRecord {
        let one_line = |s: &str, max: usize| clip_chars(&replace_controls(s, false), max);
        let opt = |s: &Option<String>| s.as_deref().map(|s| one_line(s, field_chars));
        NoteRecord {
            at: one_line(&self.at, 32),
            kind: self.kind,
            cluster: opt(&self.cluster),
            state: one_line(&self.state, 32),
            summary: one_line(&self.summary, summary_chars),
            pr: self.pr,
            head: opt(&self.head),
            stage: opt(&self.stage),
            node: opt(&self.node),
            command: opt(&self.command),
            by: opt(&self.by),
            detail: self
                .detail
                .as_deref()
                .map(|d| clip_bytes(&replace_controls(d, true), detail_bytes)),
            mac: self.mac.as_deref().map(|m| one_line(m, 100)),
        }
    }

    /// The record's time, when `at` is well formed.
    pub fn time(&self) -> Option<Timestamp> {
        Timestamp::parse_rfc3339(&self.at)
    }
}

/// The secret that makes this controller's acks its own: an HMAC-SHA256 key, kept in the
/// controller's state dir (never in the repository, never logged).
#[derive(Clone)]
pub struct AckKey([u8; 32]);

impl std::fmt::Debug for AckKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AckKey({})", self.id())
    }
}

impl AckKey {
    pub fn new(bytes: [u8; 32]) -> AckKey {
        AckKey(bytes)
    }

    pub fn random() -> AckKey {
        AckKey(rand::random())
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Names the controller in its MACs: 8 hex digits of a hash of the key (not the key).
    pub fn id(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"ichor ack key id\n");
        h.update(self.0);
        hex::encode(&h.finalize()[..4])
    }

    fn mac_of(&self, commit: Oid, record: &NoteRecord) -> Hmac<Sha256> {
        // A key of any length is accepted by HMAC; 32 bytes always are.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        for part in [
            "ichor ack v1",
            &commit.to_string(),
            record.cluster.as_deref().unwrap_or(""),
            record.command.as_deref().unwrap_or(""),
            &self.id(),
        ] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        mac
    }

    /// Sets `record.mac`, computed over what the record's line will hold (fields clipped as
    /// [`NoteRecord::to_line`] clips them), so the MAC read back verifies.
    pub fn seal(&self, commit: Oid, record: &mut NoteRecord) {
        record.mac = None;
        let written = parse_line(&record.to_line()).unwrap_or_else(|_| record.clone());
        let tag = self.mac_of(commit, &written).finalize().into_bytes();
        record.mac = Some(format!("{}.{}", self.id(), hex::encode(tag)));
    }

    /// Whether `record` is an `ack` this key sealed for `commit`.
    pub fn verifies(&self, commit: Oid, record: &NoteRecord) -> bool {
        if record.kind != RecordKind::Ack {
            return false;
        }
        let Some((id, tag)) = record.mac.as_deref().and_then(|m| m.split_once('.')) else {
            return false;
        };
        let Ok(tag) = hex::decode(tag) else {
            return false;
        };
        id == self.id() && self.mac_of(commit, record).verify_slice(&tag).is_ok()
    }
}

fn to_json(r: &NoteRecord) -> String {
    // A struct of strings, a number and a unit enum always serializes.
    serde_json::to_string(r).unwrap_or_default()
}

fn replace_controls(s: &str, keep_newlines: bool) -> String {
    s.chars()
        .map(|c| {
            // Bidi controls and zero-width characters too: a note reads as it says.
            if crate::escape::is_invisible(c) && !(keep_newlines && (c == '\n' || c == '\t')) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// At most `max` characters, the last one `…` when cut.
fn clip_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// At most `max` bytes, cut at a character boundary and ending in `…` when cut.
fn clip_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Parse one note line as an ichor record. Lines from a note are untrusted: the length is
/// checked before parsing, and an unknown `kind` is named in the error.
pub fn parse_line(line: &str) -> Result<NoteRecord, NoteLineError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(NoteLineError::TooLong { len: line.len() });
    }
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| NoteLineError::NotJson(e.to_string()))?;
    let object = value.as_object().ok_or(NoteLineError::NotAnObject)?;
    match object.get("kind") {
        None => return Err(NoteLineError::MissingKind),
        Some(serde_json::Value::String(k)) if RecordKind::from_name(k).is_none() => {
            return Err(NoteLineError::UnknownKind(clip_chars(k, 40)))
        }
        Some(_) => {}
    }
    let record: NoteRecord =
        serde_json::from_value(value).map_err(|e| NoteLineError::Invalid(e.to_string()))?;
    if record.time().is_none() {
        return Err(NoteLineError::BadTime(clip_chars(&record.at, 40)));
    }
    Ok(record)
}

/// A note as ichor read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Note {
    /// The records, oldest first (lines sort by `at`, the first key).
    pub records: Vec<NoteRecord>,
    /// Lines skipped: too long, not UTF-8, or not an ichor record.
    pub bad_lines: usize,
    /// Lines past the note's bounds, oldest first, left out.
    pub dropped_lines: usize,
    /// The blob's size when it was over [`MAX_NOTE_BLOB_BYTES`] and not read at all.
    pub oversized: Option<usize>,
}

/// A note's text lines, bounded: sorted, unique, each at most [`MAX_LINE_BYTES`].
#[derive(Debug, Default)]
struct Lines {
    lines: Vec<String>,
    /// Lines too long, not UTF-8 or holding a NUL.
    bad: usize,
    dropped: usize,
    oversized: Option<usize>,
}

/// Bound a set of lines to [`MAX_NOTE_LINES`] and [`MAX_NOTE_BYTES`], keeping the newest by
/// `at`; lines without a readable `at` count as oldest. Keeping a prefix of one total order
/// means bounding before or after a union gives the same note, so writers converge.
fn bound(lines: BTreeSet<String>) -> (Vec<String>, usize) {
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    if lines.len() <= MAX_NOTE_LINES && bytes <= MAX_NOTE_BYTES {
        return (lines.into_iter().collect(), 0);
    }
    let total = lines.len();
    let mut by_age: Vec<(Option<Timestamp>, String)> = lines
        .into_iter()
        .map(|l| (parse_line(&l).ok().and_then(|r| r.time()), l))
        .collect();
    by_age.sort();
    let mut kept = Vec::new();
    let mut size = 0;
    for (_, line) in by_age.into_iter().rev() {
        if kept.len() == MAX_NOTE_LINES || size + line.len() + 1 > MAX_NOTE_BYTES {
            break;
        }
        size += line.len() + 1;
        kept.push(line);
    }
    kept.sort();
    let dropped = total - kept.len();
    (kept, dropped)
}

/// Split a note's bytes into lines, as git's `cat_sort_uniq` does (on `\n`, empty lines
/// dropped), skipping lines ichor cannot hold.
fn split_lines(bytes: &[u8]) -> (BTreeSet<String>, usize) {
    let mut lines = BTreeSet::new();
    let mut bad = 0;
    for raw in bytes.split(|b| *b == b'\n') {
        if raw.is_empty() {
            continue;
        }
        if raw.len() > MAX_LINE_BYTES || raw.contains(&0) {
            bad += 1;
            continue;
        }
        match std::str::from_utf8(raw) {
            Ok(line) => {
                lines.insert(line.to_string());
            }
            Err(_) => bad += 1,
        }
    }
    (lines, bad)
}

fn text_of(lines: &[String]) -> String {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// A note blob's lines, loading it only when its size is within bounds.
fn blob_lines(repo: &Repository, blob: Oid) -> Result<Lines, GitError> {
    let (size, kind) = repo.odb()?.read_header(blob)?;
    if kind != ObjectType::Blob {
        return Ok(Lines {
            bad: 1,
            ..Lines::default()
        });
    }
    if size > MAX_NOTE_BLOB_BYTES {
        return Ok(Lines {
            oversized: Some(size),
            ..Lines::default()
        });
    }
    let blob = repo.find_blob(blob)?;
    let (set, bad) = split_lines(blob.content());
    let (lines, dropped) = bound(set);
    Ok(Lines {
        lines,
        bad,
        dropped,
        oversized: None,
    })
}

/// The commit a notes ref points at, if the ref exists. A ref that points at something
/// else (a blob, a tree) is named in the error: git itself keeps notes only in commits.
fn tip(repo: &Repository, refname: &str) -> Result<Option<Oid>, GitError> {
    match repo.find_reference(refname) {
        Ok(r) => match r.peel_to_commit() {
            Ok(c) => Ok(Some(c.id())),
            Err(_) => Err(GitError::RefNotACommit {
                place: "the repository".into(),
                refname: refname.to_string(),
                kind: r
                    .peel(ObjectType::Any)
                    .ok()
                    .and_then(|o| o.kind())
                    .map_or("object of unknown kind", |k| k.str())
                    .to_string(),
            }),
        },
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The note blob for `object` in a notes commit, whatever its fan-out.
fn find_note_blob(repo: &Repository, notes: Oid, object: Oid) -> Result<Option<Oid>, GitError> {
    let hex = object.to_string();
    let mut rest = hex.as_str();
    let mut tree = repo.find_commit(notes)?.tree()?;
    loop {
        if let Some(entry) = tree.get_name(rest) {
            if entry.kind() == Some(ObjectType::Blob) {
                return Ok(Some(entry.id()));
            }
        }
        if rest.len() <= 2 {
            return Ok(None);
        }
        let (dir, tail) = rest.split_at(2);
        let sub = match tree.get_name(dir) {
            Some(entry) if entry.kind() == Some(ObjectType::Tree) => entry.id(),
            _ => return Ok(None),
        };
        tree = repo.find_tree(sub)?;
        rest = tail;
    }
}

fn note_lines(repo: &Repository, commit: Oid) -> Result<(Option<Oid>, Lines), GitError> {
    let Some(notes) = tip(repo, NOTES_REF)? else {
        return Ok((None, Lines::default()));
    };
    match find_note_blob(repo, notes, commit)? {
        Some(blob) => Ok((Some(blob), blob_lines(repo, blob)?)),
        None => Ok((None, Lines::default())),
    }
}

/// The note on `commit` under [`NOTES_REF`], bounded, with what was skipped counted.
pub fn read_note(repo: &Repository, commit: Oid) -> Result<Note, GitError> {
    let (_, lines) = note_lines(repo, commit)?;
    let mut note = Note {
        bad_lines: lines.bad,
        dropped_lines: lines.dropped,
        oversized: lines.oversized,
        ..Note::default()
    };
    for line in &lines.lines {
        match parse_line(line) {
            Ok(r) => note.records.push(r),
            Err(_) => note.bad_lines += 1,
        }
    }
    Ok(note)
}

/// The records in the note on `commit`, oldest first; lines that are not ichor records are
/// skipped and counted in a warning.
pub fn read(repo: &Repository, commit: Oid) -> Result<Vec<NoteRecord>, GitError> {
    let note = read_note(repo, commit)?;
    warn_skipped(commit, &note);
    Ok(note.records)
}

/// The note's lines on `commit` (sorted, unique, bounded), ichor records or not.
pub fn read_lines(repo: &Repository, commit: Oid) -> Result<Vec<String>, GitError> {
    Ok(note_lines(repo, commit)?.1.lines)
}

fn warn_skipped(commit: Oid, note: &Note) {
    if let Some(size) = note.oversized {
        tracing::warn!(%commit, size, max = MAX_NOTE_BLOB_BYTES, "the ichor note is too large to read; ignored");
    }
    if note.bad_lines > 0 || note.dropped_lines > 0 {
        tracing::warn!(
            %commit,
            bad = note.bad_lines,
            dropped = note.dropped_lines,
            "the ichor note has lines that are not ichor records, or more than its bounds; skipped"
        );
    }
}

/// Add `records` to the note on `commit` under [`NOTES_REF`], as `cat_sort_uniq` would
/// (existing lines and the new ones, sorted, duplicates removed). Returns whether the note
/// changed. A note over its bounds loses its oldest lines, with a warning.
///
/// Lines sort by `at`, so records written within the same instant as the note's newest (or
/// as each other) would read in another order than they were written: a new record less
/// than a second older than the newest before it gets an `at` one millisecond after it.
pub fn append(
    repo: &Repository,
    commit: Oid,
    records: &[NoteRecord],
    author: &git2::Signature,
) -> Result<bool, GitError> {
    let (old_blob, old) = note_lines(repo, commit)?;
    let mut newest = old
        .lines
        .iter()
        .filter_map(|l| parse_line(l).ok()?.time())
        .max();
    let mut new_lines: Vec<String> = Vec::with_capacity(records.len());
    for record in records {
        let mut record = record.clone();
        let as_given = record.to_line();
        if old.lines.contains(&as_given) || new_lines.contains(&as_given) {
            continue; // already there: appending is idempotent
        }
        if let (Some(at), Some(last)) = (record.time(), newest) {
            if at <= last && last.since(at) < std::time::Duration::from_secs(1) {
                record.at = Timestamp::from_millis(last.as_millis() + 1).rfc3339_millis();
            }
        }
        newest = record.time().max(newest);
        let line = record.to_line();
        // Never write a line ichor itself would refuse to read.
        parse_line(&line).map_err(|e| GitError::BadNoteRecord {
            message: e.to_string(),
        })?;
        new_lines.push(line);
    }
    if let Some(size) = old.oversized {
        tracing::warn!(%commit, size, "the ichor note is too large to read; ichor replaces it");
    }
    if old.bad > 0 {
        tracing::warn!(%commit, bad = old.bad, "the ichor note had unreadable lines; ichor drops them");
    }
    let mut set: BTreeSet<String> = old.lines.into_iter().collect();
    set.extend(new_lines);
    let (lines, dropped) = bound(set);
    if dropped > 0 {
        tracing::warn!(
            %commit,
            dropped,
            max_lines = MAX_NOTE_LINES,
            max_bytes = MAX_NOTE_BYTES,
            "the ichor note is over its bounds; its oldest lines are dropped"
        );
    }
    if lines.is_empty() {
        return Ok(false);
    }
    let text = text_of(&lines);
    if old_blob == Some(Oid::hash_object(ObjectType::Blob, text.as_bytes())?) {
        return Ok(false);
    }
    repo.note(author, author, Some(NOTES_REF), commit, &text, true)?;
    Ok(true)
}

/// Every (annotated object → note blob) of a notes tree, at any fan-out.
fn collect_notes(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    prefix: &mut String,
    seen: &mut usize,
    out: &mut BTreeMap<Oid, Oid>,
) -> Result<(), GitError> {
    for entry in tree.iter() {
        *seen += 1;
        if *seen > 2 * MAX_NOTED_OBJECTS || out.len() > MAX_NOTED_OBJECTS {
            return Err(GitError::TooManyNotes {
                count: out.len().max(*seen / 2),
            });
        }
        let name = entry.name_bytes();
        if !name
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            continue; // not a note (git keeps such entries; ichor has none)
        }
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let full = prefix.len() + name.len();
        match entry.kind() {
            Some(ObjectType::Blob) if full == 40 => {
                let object = Oid::from_str(&format!("{prefix}{name}"))?;
                out.entry(object).or_insert(entry.id());
            }
            Some(ObjectType::Tree) if name.len() == 2 && full < 40 => {
                let sub = repo.find_tree(entry.id())?;
                prefix.push_str(name);
                let r = collect_notes(repo, &sub, prefix, seen, out);
                prefix.truncate(prefix.len() - 2);
                r?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn notes_of(repo: &Repository, notes: Oid) -> Result<BTreeMap<Oid, Oid>, GitError> {
    let tree = repo.find_commit(notes)?.tree()?;
    let mut out = BTreeMap::new();
    collect_notes(repo, &tree, &mut String::new(), &mut 0, &mut out)?;
    if out.len() > MAX_NOTED_OBJECTS {
        return Err(GitError::TooManyNotes { count: out.len() });
    }
    Ok(out)
}

fn write_notes_tree(repo: &Repository, notes: &BTreeMap<Oid, Oid>) -> Result<Oid, GitError> {
    let mut top = repo.treebuilder(None)?;
    if notes.len() <= FANOUT_ABOVE {
        for (object, blob) in notes {
            top.insert(object.to_string(), *blob, 0o100644)?;
        }
        return Ok(top.write()?);
    }
    let mut dirs: BTreeMap<String, Vec<(String, Oid)>> = BTreeMap::new();
    for (object, blob) in notes {
        let hex = object.to_string();
        let (dir, rest) = hex.split_at(2);
        dirs.entry(dir.to_string())
            .or_default()
            .push((rest.to_string(), *blob));
    }
    for (dir, entries) in dirs {
        let mut sub = repo.treebuilder(None)?;
        for (name, blob) in entries {
            sub.insert(name, blob, 0o100644)?;
        }
        top.insert(dir, sub.write()?, 0o040000)?;
    }
    Ok(top.write()?)
}

/// Who signs ichor's notes merges: the repository's configured user, else ichor.
fn merger(repo: &Repository) -> Result<git2::Signature<'static>, GitError> {
    match repo.signature() {
        Ok(s) => Ok(s),
        Err(_) => Ok(git2::Signature::now("ichor", "ichor@localhost")?),
    }
}

/// Merge the notes commit `theirs` into [`NOTES_REF`]: for every object annotated on either
/// side, the union of both notes' lines (`cat_sort_uniq`), in a merge commit with both
/// parents; a fast-forward when one side contains the other. Returns the new tip. Unlike
/// git's three-way merge, a note deleted on one side comes back (ichor never deletes one).
pub fn merge(repo: &Repository, theirs: Oid) -> Result<Oid, GitError> {
    let their_commit = repo.find_commit(theirs)?;
    let Some(ours) = tip(repo, NOTES_REF)? else {
        repo.reference(NOTES_REF, theirs, false, "ichor: notes from the remote")?;
        return Ok(theirs);
    };
    if ours == theirs || repo.graph_descendant_of(ours, theirs)? {
        return Ok(ours);
    }
    if repo.graph_descendant_of(theirs, ours)? {
        repo.reference_matching(NOTES_REF, theirs, true, ours, "ichor: notes fast-forward")?;
        return Ok(theirs);
    }
    let mut merged = notes_of(repo, ours)?;
    for (object, their_blob) in notes_of(repo, theirs)? {
        let our_blob = match merged.get(&object) {
            None => {
                merged.insert(object, their_blob);
                continue;
            }
            Some(b) if *b == their_blob => continue,
            Some(b) => *b,
        };
        let (a, b) = (blob_lines(repo, our_blob)?, blob_lines(repo, their_blob)?);
        if a.oversized.is_some() || b.oversized.is_some() || a.bad + b.bad > 0 {
            tracing::warn!(%object, "an ichor note being merged has unreadable lines or is too large; dropped");
        }
        let (lines, dropped) = bound(a.lines.into_iter().chain(b.lines).collect());
        if dropped > 0 {
            tracing::warn!(%object, dropped, "the merged ichor note is over its bounds; its oldest lines are dropped");
        }
        merged.insert(object, repo.blob(text_of(&lines).as_bytes())?);
    }
    if merged.len() > MAX_NOTED_OBJECTS {
        return Err(GitError::TooManyNotes {
            count: merged.len(),
        });
    }
    let tree = repo.find_tree(write_notes_tree(repo, &merged)?)?;
    let sig = merger(repo)?;
    let our_commit = repo.find_commit(ours)?;
    let commit = repo.commit(
        None,
        &sig,
        &sig,
        "Notes merged by ichor (cat_sort_uniq)",
        &tree,
        &[&our_commit, &their_commit],
    )?;
    // Compare-and-swap: a writer that moved the ref meanwhile is not overwritten.
    repo.reference_matching(NOTES_REF, commit, true, ours, "ichor: notes merge")?;
    Ok(commit)
}

/// What a fetch of the remote's notes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchOutcome {
    /// The remote's notes commit, when it has `refs/notes/ichor`.
    pub remote: Option<Oid>,
    /// Whether merging it changed the local notes.
    pub changed: bool,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushOutcome {
    /// Fetch-merge-push rounds used (1 when nobody raced us).
    pub attempts_used: u32,
    /// Whether a round merged notes the remote had and we did not.
    pub merged_remote: bool,
    /// Whether anything was pushed (false when the remote already had every note).
    pub pushed: bool,
}

/// `url` without a password or token in it, for errors and logs.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://[redacted]@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

fn remote_error(url: &str, action: &'static str, e: git2::Error) -> GitError {
    GitError::NotesRemote {
        url: redacted(url),
        action,
        message: e.message().to_string(),
    }
}

/// Fetch the remote's `refs/notes/ichor` into [`REMOTE_NOTES_REF`] and [`merge`] it into
/// the local notes. `callbacks` gives the credentials (one call per connection).
pub fn fetch_merge(
    repo: &Repository,
    url: &str,
    callbacks: &dyn Fn() -> git2::RemoteCallbacks<'static>,
) -> Result<FetchOutcome, GitError> {
    // A copy from an earlier fetch must not pass for the remote's notes now.
    match repo.find_reference(REMOTE_NOTES_REF) {
        Ok(mut r) => r.delete()?,
        Err(e) if e.code() == ErrorCode::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    // libgit2's local transport lists every ref of the remote and then reads each; a ref
    // another writer deletes in between (its push's temporary ref) fails the fetch with
    // NotFound. That is a race, not an answer: try again, a bounded number of times.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut remote = repo
            .remote_anonymous(url)
            .map_err(|e| remote_error(url, "fetch", e))?;
        let mut options = FetchOptions::new();
        options
            .remote_callbacks(callbacks())
            .download_tags(AutotagOption::None)
            .update_fetchhead(false);
        match remote.fetch(
            &[format!("+{NOTES_REF}:{REMOTE_NOTES_REF}")],
            Some(&mut options),
            None,
        ) {
            Ok(()) => break,
            Err(e)
                if attempt < 5
                    && e.code() == ErrorCode::NotFound
                    && e.class() == git2::ErrorClass::Reference => {}
            Err(e) => return Err(remote_error(url, "fetch", e)),
        }
    }
    let theirs = match tip(repo, REMOTE_NOTES_REF) {
        Err(GitError::RefNotACommit { kind, .. }) => {
            // Not notes anyone can read or merge: named, and left alone (never forced over).
            return Err(GitError::RefNotACommit {
                place: redacted(url),
                refname: NOTES_REF.into(),
                kind,
            });
        }
        other => other?,
    };
    let Some(theirs) = theirs else {
        return Ok(FetchOutcome {
            remote: None,
            changed: false,
        });
    };
    let before = tip(repo, NOTES_REF)?;
    let after = merge(repo, theirs)?;
    Ok(FetchOutcome {
        remote: Some(theirs),
        changed: before != Some(after),
    })
}

/// Push [`NOTES_REF`] once, not forcing. `Ok(Some(reason))` when the remote refused it
/// because it moved (a race to retry).
fn push_once(
    repo: &Repository,
    url: &str,
    callbacks: &dyn Fn() -> git2::RemoteCallbacks<'static>,
) -> Result<Option<String>, GitError> {
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| remote_error(url, "push", e))?;
    let rejected: Rc<RefCell<Option<String>>> = Rc::default();
    let sink = Rc::clone(&rejected);
    let mut cb = callbacks();
    cb.push_update_reference(move |refname, status| {
        if let Some(status) = status {
            *sink.borrow_mut() = Some(format!("{refname}: {status}"));
        }
        Ok(())
    });
    let mut options = PushOptions::new();
    options.remote_callbacks(cb);
    let result = remote.push(&[format!("{NOTES_REF}:{NOTES_REF}")], Some(&mut options));
    drop(options);
    let status = rejected.borrow_mut().take();
    match (result, status) {
        (_, Some(status)) => Ok(Some(status)),
        // libgit2 checks before sending that the remote's tip is ours or an ancestor.
        (Err(e), None) if e.code() == ErrorCode::NotFastForward => {
            Ok(Some(e.message().to_string()))
        }
        (Err(e), None) => Err(remote_error(url, "push", e)),
        (Ok(()), None) => Ok(None),
    }
}

/// The repository a remote URL names on this machine (a path or `file://`), if any.
fn local_repository(url: &str) -> Option<std::path::PathBuf> {
    if let Some(p) = url.strip_prefix("file://") {
        return Some(p.into());
    }
    (!url.contains("://") && !url.contains('@') && std::path::Path::new(url).is_absolute())
        .then(|| url.into())
}

/// A push to a repository on this machine. libgit2's local transport writes the remote
/// ref without checking that it still holds what we fetched, so two writers could lose a
/// record; instead the objects go to a private ref, and `refs/notes/ichor` moves only if
/// it is still where our fetch left it (compare and swap), as a git server does.
fn push_local(
    repo: &Repository,
    path: &std::path::Path,
    expected: Option<Oid>,
    callbacks: &dyn Fn() -> git2::RemoteCallbacks<'static>,
) -> Result<Option<String>, GitError> {
    const INCOMING: &str = "refs/ichor/notes-incoming";
    let url = path.display().to_string();
    let local = tip(repo, NOTES_REF)?.ok_or_else(|| GitError::NotesRemote {
        url: url.clone(),
        action: "push",
        message: "no local notes".into(),
    })?;
    let mut remote = repo
        .remote_anonymous(&url)
        .map_err(|e| remote_error(&url, "push", e))?;
    let mut options = PushOptions::new();
    options.remote_callbacks(callbacks());
    remote
        .push(&[format!("+{NOTES_REF}:{INCOMING}")], Some(&mut options))
        .map_err(|e| remote_error(&url, "push", e))?;
    let target = Repository::open(path).map_err(|e| remote_error(&url, "push", e))?;
    let moved = match expected {
        Some(old) => target.reference_matching(NOTES_REF, local, true, old, "ichor: notes"),
        None => target.reference(NOTES_REF, local, false, "ichor: notes"),
    };
    if let Ok(mut r) = target.find_reference(INCOMING) {
        let _ = r.delete();
    }
    match moved {
        Ok(_) => Ok(None),
        Err(e)
            if matches!(
                e.code(),
                ErrorCode::Modified | ErrorCode::Exists | ErrorCode::Locked
            ) =>
        {
            Ok(Some(format!(
                "{NOTES_REF} moved while ichor merged: {}",
                e.message()
            )))
        }
        Err(e) => Err(remote_error(&url, "push", e)),
    }
}

/// Publish the local notes to `url`: fetch the remote's notes, merge them in, push
/// `refs/notes/ichor` without forcing; when the remote refuses because another writer got
/// there first, do it again, up to `attempts` rounds (at least 1, at most
/// [`MAX_PUSH_ATTEMPTS`]). Transport and authentication errors are returned at once.
/// One writer per local repository at a time (the caller serializes).
pub fn push(
    repo: &Repository,
    url: &str,
    callbacks: &dyn Fn() -> git2::RemoteCallbacks<'static>,
    attempts: u32,
) -> Result<PushOutcome, GitError> {
    let attempts = attempts.clamp(1, MAX_PUSH_ATTEMPTS);
    let mut merged_remote = false;
    let mut last = String::new();
    for attempt in 1..=attempts {
        let fetched = fetch_merge(repo, url, callbacks)?;
        merged_remote |= fetched.changed;
        let local = tip(repo, NOTES_REF)?;
        if local.is_none() || local == fetched.remote {
            return Ok(PushOutcome {
                attempts_used: attempt,
                merged_remote,
                pushed: false,
            });
        }
        let outcome = match local_repository(url) {
            Some(path) => push_local(repo, &path, fetched.remote, callbacks)?,
            None => push_once(repo, url, callbacks)?,
        };
        match outcome {
            None => {
                return Ok(PushOutcome {
                    attempts_used: attempt,
                    merged_remote,
                    pushed: true,
                })
            }
            Some(reason) => {
                tracing::info!(attempt, %reason, "the remote's ichor notes moved; fetching and merging again");
                last = reason;
            }
        }
    }
    Err(GitError::NotesPushRejected {
        url: redacted(url),
        attempts,
        message: last,
    })
}

/// A commit on [`COMMANDS_REF`] that ichor has not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCommit {
    pub oid: Oid,
    /// As the commit says (not authenticated: who may push the ref is who may command).
    pub author_name: String,
    pub author_email: String,
    /// The first line of the message, at most [`MAX_COMMAND_LINE_CHARS`].
    pub line: String,
}

fn first_line(bytes: &[u8], max: usize) -> String {
    let end = bytes
        .iter()
        .position(|b| *b == b'\n')
        .unwrap_or(bytes.len());
    // Read no more than the bound could use (4 bytes a character).
    let head = &bytes[..end.min(max * 4 + 4)];
    let text = String::from_utf8_lossy(head);
    clip_chars(&replace_controls(text.trim(), false), max)
}

/// What counts as a command already handled.
#[derive(Debug, Clone, Copy)]
pub struct Handled<'a> {
    /// Acks this key sealed count.
    pub key: &'a AckKey,
    /// The commands this controller handled, from its own state dir.
    pub done: &'a BTreeSet<Oid>,
    /// A fresh state dir: the key that sealed the acks already in the notes is gone, so any
    /// ack present now counts (once; the caller records them in `done`).
    pub trust_every_ack: bool,
}

/// The commands of [`COMMANDS_REF`] not yet handled, and what the walk learnt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingCommands {
    /// Oldest first.
    pub commands: Vec<CommandCommit>,
    /// Commands found acknowledged (by this key, or any ack under `trust_every_ack`) that
    /// are not in `done` yet.
    pub acknowledged: Vec<Oid>,
    /// Commands with an `ack` line this controller did not write: they run all the same.
    pub forged: Vec<Oid>,
}

/// Commands on [`COMMANDS_REF`] (commits whose first line starts with `/ichor`) not yet
/// [`Handled`], oldest first. Walks the first-parent history from the tip, at most `limit`
/// commits (and [`MAX_COMMAND_WALK`]): the newest ones.
pub fn pending_commands(
    repo: &Repository,
    handled: Handled<'_>,
    limit: usize,
) -> Result<PendingCommands, GitError> {
    let mut out = PendingCommands::default();
    let Some(commands) = tip(repo, COMMANDS_REF)? else {
        return Ok(out);
    };
    let notes = tip(repo, NOTES_REF)?;
    let mut walk = repo.revwalk()?;
    walk.push(commands)?;
    walk.simplify_first_parent()?;
    let mut pending = Vec::new();
    for oid in walk.take(limit.min(MAX_COMMAND_WALK)) {
        let oid = oid?;
        if handled.done.contains(&oid) {
            continue;
        }
        if let Some(notes) = notes {
            if let Some(blob) = find_note_blob(repo, notes, oid)? {
                let acks: Vec<NoteRecord> = blob_lines(repo, blob)?
                    .lines
                    .iter()
                    .filter_map(|l| parse_line(l).ok())
                    .filter(|r| r.kind == RecordKind::Ack)
                    .collect();
                let trusted = acks
                    .iter()
                    .any(|r| handled.trust_every_ack || handled.key.verifies(oid, r));
                if trusted {
                    out.acknowledged.push(oid);
                    continue;
                }
                if !acks.is_empty() {
                    out.forged.push(oid);
                }
            }
        }
        let commit = repo.find_commit(oid)?;
        let line = first_line(commit.message_bytes(), MAX_COMMAND_LINE_CHARS);
        if !line.starts_with("/ichor") {
            continue; // not a command (the commands ref may sit on top of any history)
        }
        let author = commit.author();
        pending.push(CommandCommit {
            oid,
            author_name: first_line(author.name_bytes(), MAX_FIELD_CHARS),
            author_email: first_line(author.email_bytes(), MAX_FIELD_CHARS),
            line,
        });
    }
    pending.reverse();
    out.commands = pending;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> NoteRecord {
        let mut r = NoteRecord::new(
            RecordKind::Gate,
            Timestamp::parse_rfc3339("2026-11-30T07:12:06Z").unwrap(),
            "failure",
            "blocked: kubernetes 1.34 needs cilium ≥ 1.19",
        );
        r.cluster = Some("homelab".into());
        r.pr = Some(42);
        r
    }

    #[test]
    fn a_line_round_trips_with_at_first_and_absent_options_left_out() {
        let line = record().to_line();
        assert!(
            line.starts_with(
                r#"{"at":"2026-11-30T07:12:06.000Z","kind":"gate","cluster":"homelab""#
            ),
            "{line}"
        );
        assert!(!line.contains("node"));
        assert_eq!(parse_line(&line).unwrap(), record());
    }

    #[test]
    fn bidi_controls_never_reach_a_note() {
        let mut r = NoteRecord::new(
            RecordKind::Gate,
            Timestamp::from_millis(0),
            "failure",
            "blocked: \u{202e}gnihton\u{2069} \u{200b}x",
        );
        r.detail = Some("line one\nline \u{2067}two".into());
        let line = r.to_line();
        for c in ['\u{202e}', '\u{2069}', '\u{200b}', '\u{2067}'] {
            assert!(!line.contains(c), "{line:?}");
        }
        assert!(line.contains("line one\\nline  two"), "{line}");
    }

    #[test]
    fn hostile_fields_are_clipped_and_cannot_break_the_line() {
        let mut r = record();
        r.summary = "x\ny".repeat(200);
        r.detail = Some("\"\\\u{1}".repeat(5000));
        r.node = Some("é".repeat(10_000));
        let line = r.to_line();
        assert!(line.len() <= MAX_LINE_BYTES, "{}", line.len());
        assert!(!line.contains('\n'));
        let back = parse_line(&line).unwrap();
        assert_eq!(back.summary.chars().count(), MAX_SUMMARY_CHARS);
        assert!(back.summary.ends_with('…'));
        assert!(back.node.unwrap().chars().count() <= MAX_FIELD_CHARS);
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let at = r#""at":"2026-11-30T07:12:06Z""#;
        let cases = [
            ("x".repeat(MAX_LINE_BYTES + 1), "bytes"),
            ("not json".to_string(), "not JSON"),
            ("[1]".to_string(), "not an object"),
            (
                format!("{{{at},\"state\":\"s\",\"summary\":\"s\"}}"),
                "no `kind`",
            ),
            (
                format!("{{{at},\"kind\":\"deploy\",\"state\":\"s\",\"summary\":\"s\"}}"),
                "unknown kind `deploy`",
            ),
            (
                r#"{"at":"yesterday","kind":"gate","state":"s","summary":"s"}"#.to_string(),
                "RFC 3339",
            ),
            (format!("{{{at},\"kind\":\"gate\"}}"), "not valid"),
        ];
        for (line, want) in cases {
            let e = parse_line(&line).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should say {want}");
        }
    }

    #[test]
    fn the_bound_keeps_the_newest_and_commutes_with_union() {
        let line = |i: usize| {
            let mut r = record();
            r.at = Timestamp::from_millis(1_700_000_000_000 + i as u64 * 1000).rfc3339();
            r.summary = format!("n{i}");
            r.to_line()
        };
        let all: BTreeSet<String> = (0..MAX_NOTE_LINES + 10)
            .map(line)
            .chain(["garbage".to_string()])
            .collect();
        let (kept, dropped) = bound(all.clone());
        assert_eq!(kept.len(), MAX_NOTE_LINES);
        assert_eq!(dropped, 11);
        assert!(!kept.contains(&"garbage".to_string()));
        assert!(!kept.contains(&line(9)) && kept.contains(&line(10)));
        // Bounding one side first changes nothing.
        let (half, _) = bound(
            all.iter()
                .take(600)
                .cloned()
                .chain((0..1005).map(line))
                .collect(),
        );
        let (again, _) = bound(half.into_iter().chain(all.iter().cloned()).collect());
        assert_eq!(again, kept);
    }

    #[test]
    fn an_ack_verifies_only_for_its_commit_cluster_command_and_key() {
        let key = AckKey::new([7; 32]);
        let commit = Oid::from_str("3f9c2d1e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d").unwrap();
        let mut ack = NoteRecord::new(RecordKind::Ack, Timestamp::from_millis(0), "success", "ok");
        ack.cluster = Some("homelab".into());
        ack.command = Some("/ichor pause homelab".into());
        key.seal(commit, &mut ack);
        let back = parse_line(&ack.to_line()).unwrap();
        assert!(key.verifies(commit, &back));
        assert!(back.mac.as_deref().unwrap().starts_with(&key.id()));
        let other = Oid::from_str("0000000000000000000000000000000000000001").unwrap();
        assert!(!key.verifies(other, &back));
        let mut moved = back.clone();
        moved.command = Some("/ichor resume homelab".into());
        assert!(!key.verifies(commit, &moved));
        let mut elsewhere = back.clone();
        elsewhere.cluster = Some("prod".into());
        assert!(!key.verifies(commit, &elsewhere));
        assert!(!AckKey::new([8; 32]).verifies(commit, &back));
        let mut gate = back.clone();
        gate.kind = RecordKind::Gate;
        assert!(!key.verifies(commit, &gate));
        // The key itself is never printed.
        assert!(!format!("{key:?}").contains("0707"));
    }

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redacted("https://x-access-token:ghs_abc@github.com/o/r.git"),
            "https://[redacted]@github.com/o/r.git"
        );
        assert_eq!(redacted("/srv/git/r.git"), "/srv/git/r.git");
        assert_eq!(redacted("ssh://git@host/a@b"), "ssh://[redacted]@host/a@b");
    }
}
