// STUB (replaced by the notes branch)
use super::GitError;
pub const NOTES_REF: &str = "refs/notes/ichor";
#[derive(Debug, Clone, Default)]
pub struct NoteRecord { pub kind: String, pub cluster: Option<String>, pub at: String, pub state: String, pub summary: String, pub pr: Option<u64>, pub head: Option<String>, pub stage: Option<String>, pub node: Option<String>, pub detail: Option<String>, pub command: Option<String>, pub by: Option<String> }
pub struct CommandCommit { pub oid: git2::Oid, pub author_name: String, pub author_email: String, pub line: String }
pub struct PushOutcome { pub attempts_used: u32, pub merged_remote: bool }
pub fn append(_repo: &git2::Repository, _commit: git2::Oid, _records: &[NoteRecord], _author: &git2::Signature) -> Result<bool, GitError> { Ok(false) }
pub fn push(_repo: &git2::Repository, _url: &str, _callbacks: &dyn Fn() -> git2::RemoteCallbacks<'static>, _attempts: u32) -> Result<PushOutcome, GitError> { Ok(PushOutcome { attempts_used: 0, merged_remote: false }) }
pub fn pending_commands(_repo: &git2::Repository, _limit: usize) -> Result<Vec<CommandCommit>, GitError> { Ok(vec![]) }
