//! What a relay connects to: the URL, and where to read a password kept out of it.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::secret_url::SecretUrl;

/// A PostgreSQL endpoint. Shows as the redacted URL; the password file's path is not secret.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseTarget {
    url: SecretUrl,
    password_file: Option<PathBuf>,
}

impl DatabaseTarget {
    pub fn new(url: SecretUrl, password_file: Option<PathBuf>) -> Self {
        Self { url, password_file }
    }

    /// A target whose password, if any, is in the URL.
    pub fn from_url(url: SecretUrl) -> Self {
        Self::new(url, None)
    }

    pub fn url(&self) -> &SecretUrl {
        &self.url
    }

    /// A file holding the password, read at every new connection; it wins over a password in
    /// the URL.
    pub fn password_file(&self) -> Option<&Path> {
        self.password_file.as_deref()
    }
}

impl fmt::Display for DatabaseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.url, f)
    }
}

impl fmt::Debug for DatabaseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseTarget")
            .field("url", &self.url)
            .field("password_file", &self.password_file)
            .finish()
    }
}
