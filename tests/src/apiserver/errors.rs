//! Failures of API requests, answered with `metav1.Status` bodies as the real API server does,
//! so kube's client turns them into `Error::Api` with the right code and reason.

use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    NotFound {
        kind: String,
        name: String,
    },
    AlreadyExists {
        kind: String,
        name: String,
    },
    /// A write carried a resourceVersion other than the live one.
    Conflict {
        kind: String,
        name: String,
    },
    /// A watch asked for history the server no longer keeps.
    Gone(String),
    BadRequest(String),
    UnsupportedMediaType(String),
    MethodNotAllowed(String),
}

impl ApiError {
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } => 409,
            Self::Gone(_) => 410,
            Self::BadRequest(_) => 400,
            Self::UnsupportedMediaType(_) => 415,
            Self::MethodNotAllowed(_) => 405,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } => "Conflict",
            Self::Gone(_) => "Expired",
            Self::BadRequest(_) => "BadRequest",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::MethodNotAllowed(_) => "MethodNotAllowed",
        }
    }

    fn message(&self) -> String {
        match self {
            Self::NotFound { kind, name } => format!("{kind} \"{name}\" not found"),
            Self::AlreadyExists { kind, name } => format!("{kind} \"{name}\" already exists"),
            Self::Conflict { kind, name } => format!(
                "Operation cannot be fulfilled on {kind} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
            Self::Gone(message)
            | Self::BadRequest(message)
            | Self::UnsupportedMediaType(message)
            | Self::MethodNotAllowed(message) => message.clone(),
        }
    }

    /// The `metav1.Status` body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let Self::NotFound { kind, name }
        | Self::AlreadyExists { kind, name }
        | Self::Conflict { kind, name } = self
        {
            status["details"] = json!({"name": name, "kind": kind});
        }
        status
    }
}

/// The Status body of a successful delete.
pub fn success_status(kind: &str, name: &str, uid: Option<&str>) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": kind, "uid": uid},
    })
}
