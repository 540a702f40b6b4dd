//! The agent's error type, mapped onto ttrpc status codes a caller can act on.

use ttrpc::{get_status, Code};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, AgentError>;

impl AgentError {
    /// The same error, its message prefixed with `context` (e.g. "create container x").
    pub fn context(self, context: &str) -> AgentError {
        match self {
            AgentError::NotFound(m) => AgentError::NotFound(format!("{context}: {m}")),
            AgentError::AlreadyExists(m) => AgentError::AlreadyExists(format!("{context}: {m}")),
            AgentError::InvalidArgument(m) => {
                AgentError::InvalidArgument(format!("{context}: {m}"))
            }
            AgentError::FailedPrecondition(m) => {
                AgentError::FailedPrecondition(format!("{context}: {m}"))
            }
            AgentError::Internal(m) => AgentError::Internal(format!("{context}: {m}")),
        }
    }
}

/// A refused spec is the caller's to fix.
impl From<crate::spec::SpecError> for AgentError {
    fn from(e: crate::spec::SpecError) -> AgentError {
        AgentError::InvalidArgument(e.to_string())
    }
}

/// A field the stage would refuse (`stage::preflight`): the caller's to fix too.
pub fn refused(e: crate::stage::StageError) -> AgentError {
    AgentError::InvalidArgument(e.to_string())
}

impl From<AgentError> for ttrpc::Error {
    fn from(e: AgentError) -> ttrpc::Error {
        let code = match &e {
            AgentError::NotFound(_) => Code::NOT_FOUND,
            AgentError::AlreadyExists(_) => Code::ALREADY_EXISTS,
            AgentError::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            AgentError::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            AgentError::Internal(_) => Code::INTERNAL,
        };
        ttrpc::Error::RpcStatus(get_status(code, e.to_string()))
    }
}
