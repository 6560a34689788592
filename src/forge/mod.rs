//! Where verdicts and rollout progress go, and what comes in from the forge: the GitHub
//! client (statuses, the sticky comment, permissions, open pull requests), GitHub App
//! authentication, webhook verification and parsing, PR comment commands, and the
//! rendering of the sticky comment.

pub mod app;
pub mod command;
pub mod comment;
pub mod github;
pub mod webhook;
