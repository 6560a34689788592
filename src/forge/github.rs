// STUB (replaced by the GitHub client branch)
use crate::clock::Clock;
use crate::secret::Secret;
pub struct GithubConfig { pub api_url: String, pub repo: String, pub auth: GithubAuth }
pub enum GithubAuth { Token(Secret), App { app_id: u64, installation_id: u64, private_key: Secret } }
#[derive(Clone)] pub struct GithubClient { login: String, repo: String }
#[derive(Debug, Clone, Copy, PartialEq, Eq)] pub enum StatusState { Pending, Success, Failure, Error }
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)] pub enum Permission { None, Read, Triage, Write, Maintain, Admin }
impl Permission { pub fn can_write(self) -> bool { self >= Permission::Write } }
#[derive(Debug, Clone)] pub struct Pull { pub number: u64, pub open: bool, pub merged: bool, pub head_sha: String, pub head_ref: String, pub base_ref: String, pub from_fork: bool, pub author: String, pub title: String, pub merge_commit_sha: Option<String> }
#[derive(Debug, thiserror::Error)] pub enum ForgeError { #[error("stub")] Stub }
impl ForgeError { pub fn is_transient(&self) -> bool { false } }
impl GithubClient {
    pub async fn connect(_config: GithubConfig, _clock: Clock) -> Result<GithubClient, ForgeError> { Err(ForgeError::Stub) }
    pub fn login(&self) -> &str { &self.login }
    pub fn repo(&self) -> &str { &self.repo }
    pub async fn set_status(&self, _sha: &str, _context: &str, _state: StatusState, _description: &str, _target_url: Option<&str>) -> Result<bool, ForgeError> { Err(ForgeError::Stub) }
    pub async fn upsert_comment(&self, _pr: u64, _marker: &str, _body: &str) -> Result<u64, ForgeError> { Err(ForgeError::Stub) }
    pub async fn post_comment(&self, _pr: u64, _body: &str) -> Result<u64, ForgeError> { Err(ForgeError::Stub) }
    pub async fn permission(&self, _user: &str) -> Result<Permission, ForgeError> { Err(ForgeError::Stub) }
    pub async fn open_pulls(&self) -> Result<Vec<Pull>, ForgeError> { Err(ForgeError::Stub) }
    pub async fn pull(&self, _number: u64) -> Result<Pull, ForgeError> { Err(ForgeError::Stub) }
    pub async fn pulls_for_commit(&self, _sha: &str) -> Result<Vec<Pull>, ForgeError> { Err(ForgeError::Stub) }
}
