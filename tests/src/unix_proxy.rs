//! A Unix socket that forwards every connection to a TCP address, for a program inside a
//! [`crate::partition::Partition`] that must keep one server while the cut takes the others: a
//! network namespace does not separate the file system, so a socket file is reached from inside
//! without the veth pair the cut takes down. The relay is given PostgreSQL this way (libpq's
//! `host=/dir`, the socket named `.s.PGSQL.<port>` as the driver looks for it), and the broker
//! over the veth pair: cutting the pair then cuts the broker alone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpStream, UnixListener};
use tokio::task::JoinHandle;

/// Forwards while it lives; dropped, it stops accepting, ends the connections it carries and
/// removes its folder.
pub struct UnixProxy {
    dir: PathBuf,
    task: JoinHandle<()>,
}

impl UnixProxy {
    /// Listens on `<a new folder>/<file>` and forwards each connection to `target`. Must be
    /// called inside a Tokio runtime.
    pub fn start(file: &str, target: SocketAddr) -> Self {
        let dir = std::env::temp_dir().join(crate::unique("unix_proxy"));
        std::fs::create_dir_all(&dir).expect("create the proxy's folder");
        let listener = UnixListener::bind(dir.join(file))
            .unwrap_or_else(|e| panic!("listen on {}: {e}", dir.join(file).display()));
        let task = tokio::spawn(async move {
            let mut carried = tokio::task::JoinSet::new();
            while let Ok((mut inside, _)) = listener.accept().await {
                carried.spawn(async move {
                    // A refused or broken forward ends this connection only, as a server
                    // that went away would.
                    if let Ok(mut outside) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                    }
                });
            }
        });
        Self { dir, task }
    }

    /// The folder that holds the socket: libpq's `host=` for PostgreSQL.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for UnixProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every forward it carries.
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
