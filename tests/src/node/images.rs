//! The images the node runs. Nothing can be pulled on the test machines, so both are built here
//! and imported into containerd before the kubelet starts: the project's own image (what the
//! chart and the operator name, `make image`'s build) and the pod sandbox image, which kubelets
//! usually pull from a registry, built from `outbox-pause` with buildah.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::command::output_of;
use crate::oci::{FileLock, IMAGE_REPOSITORY, Image};
use crate::process;

/// The sandbox image's name in containerd (`repository:tag`).
pub const PAUSE_REPOSITORY: &str = "localhost/outbox-relay-pause";
const PAUSE_TAG: &str = "1";
/// The uid the sandbox runs as: nobody's, as the upstream pause image does.
const PAUSE_USER: &str = "65535:65535";

/// An image to import: the OCI archive and the repository its tag is put under.
pub struct ImageArchive {
    pub archive: PathBuf,
    pub repository: String,
}

pub fn pause_image_name() -> String {
    format!("{PAUSE_REPOSITORY}:{PAUSE_TAG}")
}

/// The sandbox image's OCI archive, built once per build of `outbox-pause` (every test binary
/// and `make cluster` share it, under a lock).
pub fn pause_image() -> anyhow::Result<ImageArchive> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let archive = BUILT
        .get_or_init(|| {
            build_pause(&process::target_dir().join("oci-pause")).map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    Ok(ImageArchive {
        archive,
        repository: PAUSE_REPOSITORY.into(),
    })
}

/// The project's image (scripts/image.sh, built once per build of the binaries).
pub fn project_image() -> ImageArchive {
    ImageArchive {
        archive: Image::shared().archive(),
        repository: IMAGE_REPOSITORY.into(),
    }
}

fn build_pause(out: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out)?;
    let _lock = FileLock::take(&out.join("lock"));
    let binary = process::binary("outbox-pause");
    let meta = std::fs::metadata(&binary)?;
    let stamp = format!("{} {:?}", meta.len(), meta.modified()?);
    let archive = out.join("pause.oci.tar");
    let stamp_path = out.join("stamp");
    if archive.exists() && std::fs::read_to_string(&stamp_path).ok() == Some(stamp.clone()) {
        return Ok(archive);
    }
    let _ = std::fs::remove_file(&archive);
    let container = buildah(&["from", "scratch"])?;
    let container = container.trim();
    let image = format!("{PAUSE_REPOSITORY}:{PAUSE_TAG}");
    let built = (|| {
        buildah(&["copy", container, &binary.to_string_lossy(), "/pause"])?;
        buildah(&[
            "config",
            "--entrypoint",
            r#"["/pause"]"#,
            "--user",
            PAUSE_USER,
            container,
        ])?;
        buildah(&["commit", "--quiet", "--format", "oci", container, &image])?;
        let target = format!("oci-archive:{}:{PAUSE_TAG}", archive.display());
        buildah(&["push", "--quiet", &image, &target])?;
        anyhow::Ok(())
    })();
    let _ = buildah(&["rm", container]);
    let _ = buildah(&["rmi", &image]);
    built?;
    std::fs::write(&stamp_path, stamp)?;
    Ok(archive)
}

/// buildah with the project's store (scripts/image.sh's) and the vfs driver, which needs no
/// kernel overlay support.
fn buildah(args: &[&str]) -> anyhow::Result<String> {
    let store = std::env::var_os("BUILDAH_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/outbox-relay/buildah")
        });
    let mut command = Command::new("buildah");
    command
        .args(["--storage-driver", "vfs", "--root"])
        .arg(store.join("root"))
        .arg("--runroot")
        .arg(store.join("run"))
        .args(args);
    let what = format!("buildah {}", args.join(" "));
    output_of(&mut command, &what, "make image-tools installs it")
}
