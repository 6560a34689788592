//! Git-only mode: noticing refs move in a repository on disk. A [`RefWatcher`] watches the
//! repository's `refs/` (recursively), `packed-refs` and `HEAD` with notify, and wakes an
//! async consumer, which then reads [`super::remote::refs_snapshot`] and compares it with
//! its last one ([`super::remote::diff_refs`]). The wake carries no data: a burst of file
//! events (git writes `x.lock`, then renames it) collapses into one pending wake, and the
//! snapshot, taken after the wake, always sees at least the state that caused it.
//!
//! A directory created under `refs/` (a new `refs/heads/renovate/`) is watched before the
//! wake for it is sent, so a ref written into it right away is either in the snapshot the
//! wake leads to or raises its own event.

use std::path::{Path, PathBuf};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, Weak};

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::GitError;

/// Watches one repository's refs while it lives; dropping it stops the watch (and the
/// receiver then yields `None`).
pub struct RefWatcher {
    git_dir: PathBuf,
    _watcher: Arc<Mutex<RecommendedWatcher>>,
}

impl std::fmt::Debug for RefWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefWatcher")
            .field("git_dir", &self.git_dir)
            .finish()
    }
}

/// Which files of a git directory hold refs.
struct Layout {
    /// Where `refs/`, `packed-refs` and `reftable/` live (the common dir of a worktree).
    common: PathBuf,
    /// Where this checkout's `HEAD` lives.
    git_dir: PathBuf,
}

impl Layout {
    fn is_ref_path(&self, path: &Path) -> bool {
        if path.extension().is_some_and(|e| e == "lock") {
            return false;
        }
        if path.starts_with(self.common.join("refs"))
            || path.starts_with(self.common.join("reftable"))
        {
            return true;
        }
        let in_dir = |dir: &Path, name: &str| {
            path.parent() == Some(dir) && path.file_name().is_some_and(|n| n == name)
        };
        in_dir(&self.common, "packed-refs") || in_dir(&self.git_dir, "HEAD")
    }
}

impl RefWatcher {
    /// Watch the repository at `path` (a bare repository, a work tree, or its `.git`).
    /// The receiver gets `()` after refs may have moved; at most one wake is pending.
    pub fn start(path: &Path) -> Result<(RefWatcher, mpsc::Receiver<()>), GitError> {
        let err = |message: String| GitError::Watch {
            path: path.to_path_buf(),
            message,
        };
        let repo = git2::Repository::open(path).map_err(|e| err(e.message().to_string()))?;
        let layout = Layout {
            common: canonical(repo.commondir()),
            git_dir: canonical(repo.path()),
        };
        drop(repo);

        let (events_tx, events) = std_mpsc::channel::<notify::Result<Event>>();
        let watcher = notify::recommended_watcher(events_tx).map_err(|e| err(e.to_string()))?;
        let watcher = Arc::new(Mutex::new(watcher));
        {
            let mut w = watcher.lock().unwrap_or_else(|p| p.into_inner());
            let refs = layout.common.join("refs");
            w.watch(&refs, RecursiveMode::Recursive)
                .map_err(|e| err(format!("{}: {e}", refs.display())))?;
            let reftable = layout.common.join("reftable");
            if reftable.is_dir() {
                w.watch(&reftable, RecursiveMode::Recursive)
                    .map_err(|e| err(format!("{}: {e}", reftable.display())))?;
            }
            // packed-refs and HEAD are replaced by rename: watch their folders.
            w.watch(&layout.common, RecursiveMode::NonRecursive)
                .map_err(|e| err(format!("{}: {e}", layout.common.display())))?;
            if layout.git_dir != layout.common {
                w.watch(&layout.git_dir, RecursiveMode::NonRecursive)
                    .map_err(|e| err(format!("{}: {e}", layout.git_dir.display())))?;
            }
        }

        let (wake, rx) = mpsc::channel(1);
        let weak = Arc::downgrade(&watcher);
        std::thread::Builder::new()
            .name("ichor-ref-watch".into())
            .spawn(move || relay(events, layout, weak, wake))
            .map_err(|e| err(e.to_string()))?;
        Ok((
            RefWatcher {
                git_dir: path.to_path_buf(),
                _watcher: watcher,
            },
            rx,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.git_dir
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Turn notify's events into wakes. Ends when the watcher is dropped (its handler, the
/// sender, goes with it) or the consumer is gone.
fn relay(
    events: std_mpsc::Receiver<notify::Result<Event>>,
    layout: Layout,
    watcher: Weak<Mutex<RecommendedWatcher>>,
    wake: mpsc::Sender<()>,
) {
    while let Ok(event) = events.recv() {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                // An overflowed or failed watch may have lost events: wake to re-read.
                tracing::warn!(error = %e, "ref watcher: notify reported an error");
                if !send(&wake) {
                    return;
                }
                continue;
            }
        };
        if matches!(event.kind, EventKind::Access(_)) {
            continue;
        }
        let relevant: Vec<&PathBuf> = event
            .paths
            .iter()
            .filter(|p| layout.is_ref_path(p))
            .collect();
        if relevant.is_empty() {
            continue;
        }
        // A new folder of refs: watch it before waking, so nothing written into it is lost
        // between notify seeing the folder and adding its own watch.
        for dir in relevant.iter().filter(|p| p.is_dir()) {
            if let Some(w) = watcher.upgrade() {
                let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = w.watch(dir, RecursiveMode::Recursive) {
                    tracing::debug!(error = %e, dir = %dir.display(), "ref watcher: new folder");
                }
            }
        }
        if !send(&wake) {
            return;
        }
    }
}

/// Wake the consumer; a wake already pending absorbs this one. False when it is gone.
fn send(wake: &mpsc::Sender<()>) -> bool {
    !matches!(wake.try_send(()), Err(mpsc::error::TrySendError::Closed(_)))
}
