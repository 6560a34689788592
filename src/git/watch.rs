// STUB (replaced by the transport branch)
use super::GitError;
pub struct RefWatcher {}
impl RefWatcher { pub fn start(_git_dir: &std::path::Path) -> Result<(RefWatcher, tokio::sync::mpsc::Receiver<()>), GitError> { let (_t, r) = tokio::sync::mpsc::channel(1); Ok((RefWatcher {}, r)) } }
