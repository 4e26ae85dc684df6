//! A password kept in a file that something else rewrites: a Kubernetes Secret mounted as a
//! volume, a Vault or CSI secrets-store sidecar, a cloud identity agent writing an RDS IAM or
//! Entra ID token. It is read at each new connection, never cached, so a rotation needs no
//! restart. PostgreSQL (`--database-password-file`) and the broker (`--broker-password-file`)
//! read it the same way, here, so the two cannot drift apart.

use std::path::Path;

/// Why the file gave no password. Starts with the option that named the file, so the message
/// says what to fix; never holds the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordFileError {
    #[error("{setting} {path} cannot be read: {reason}")]
    Unreadable {
        setting: &'static str,
        path: String,
        reason: String,
    },
    #[error("{setting} {path} is empty: its first line must hold the password")]
    Empty { setting: &'static str, path: String },
}

/// The password in the file that `setting` (the option's flag, e.g. `--broker-password-file`)
/// names: the file's first line, without its line ending (tools write files ending in a newline
/// that is not part of the password); surrounding spaces are kept, they may belong to it.
pub fn read_password(path: &Path, setting: &'static str) -> Result<String, PasswordFileError> {
    let shown = path.display().to_string();
    let unreadable = |reason: String| PasswordFileError::Unreadable {
        setting,
        path: shown.clone(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.kind().to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| unreadable("it is not UTF-8 text".into()))?;
    let first_line = text.lines().next().unwrap_or("");
    if first_line.is_empty() {
        return Err(PasswordFileError::Empty {
            setting,
            path: shown,
        });
    }
    Ok(first_line.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(content: &[u8]) -> (tempdir::Dir, std::path::PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.path().join("password");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    const SETTING: &str = "--database-password-file";

    #[test]
    fn the_first_line_without_its_ending_is_the_password() {
        for (content, want) in [
            (&b"s3cret\n"[..], "s3cret"),
            (b"s3cret\r\n", "s3cret"),
            (b"s3cret", "s3cret"),
            (b" spaced pw \n", " spaced pw "),
            (b"tok3n.with:@/%?\nignored", "tok3n.with:@/%?"),
        ] {
            let (_dir, path) = file_with(content);
            assert_eq!(read_password(&path, SETTING).unwrap(), want);
        }
    }

    #[test]
    fn an_empty_or_missing_file_is_an_error_that_names_it_and_holds_no_content() {
        let (_dir, path) = file_with(b"\nhunter2\n");
        let err = read_password(&path, SETTING).unwrap_err();
        assert!(matches!(err, PasswordFileError::Empty { .. }), "{err}");
        assert!(err.to_string().starts_with(SETTING), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        assert!(!err.to_string().contains("hunter2"));

        let missing = path.with_file_name("absent");
        let err = read_password(&missing, "--broker-password-file").unwrap_err();
        assert!(
            err.to_string().starts_with("--broker-password-file"),
            "{err}"
        );
        assert!(err.to_string().contains("absent"), "{err}");
        assert!(err.to_string().contains("not found"), "{err}");

        let (_dir, path) = file_with(&[0xff, 0xfe, b'\n']);
        let err = read_password(&path, SETTING).unwrap_err();
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    /// A private directory removed on drop (no tempfile crate needed for three tests).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let path = std::env::temp_dir().join(format!(
                    "outbox-relay-pwfile-{}-{}",
                    std::process::id(),
                    uuid::Uuid::new_v4()
                ));
                std::fs::create_dir_all(&path).unwrap();
                Self(path)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
