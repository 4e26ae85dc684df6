//! The previous release (the newest line of `release/releases`), built from its recorded
//! commit by `scripts/previous-release.sh` once and cached by that commit: its static binaries,
//! its image and its packaged chart, for the tests that run it beside this build.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::{process, repo_root};

/// What `release.env` says: the release's version and commit, and where its artifacts are.
#[derive(Debug, Clone)]
pub struct PreviousRelease {
    pub version: String,
    pub commit: String,
    /// Its `outbox-relay`, static and stripped.
    pub relay: PathBuf,
    pub operator: PathBuf,
    /// `DIR:TAG` of its OCI layout (as `scripts/image.sh` prints it).
    pub image_layout: String,
    pub image_digest: String,
    /// Its chart, packaged (`helm package`).
    pub chart_package: PathBuf,
}

impl PreviousRelease {
    /// Built on the first call of the run (minutes, when the cache is cold), then at once.
    pub fn get() -> anyhow::Result<PreviousRelease> {
        static RELEASE: OnceLock<Result<PreviousRelease, String>> = OnceLock::new();
        RELEASE
            .get_or_init(|| {
                let env = process::path_printed_by(
                    &repo_root().join("scripts/previous-release.sh"),
                    &[],
                    "the previous release could not be built from its recorded commit",
                )?;
                let text = std::fs::read_to_string(&env)
                    .map_err(|e| format!("read {}: {e}", env.display()))?;
                PreviousRelease::parse(&text).map_err(|e| format!("{}: {e}", env.display()))
            })
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn parse(text: &str) -> Result<PreviousRelease, String> {
        let values: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .collect();
        let get = |key: &str| {
            values
                .get(key)
                .map(|v| v.to_string())
                .ok_or_else(|| format!("no {key}="))
        };
        Ok(PreviousRelease {
            version: get("VERSION")?,
            commit: get("COMMIT")?,
            relay: get("RELAY")?.into(),
            operator: get("OPERATOR")?.into(),
            image_layout: get("IMAGE_LAYOUT")?,
            image_digest: get("IMAGE_DIGEST")?,
            chart_package: get("CHART_PACKAGE")?.into(),
        })
    }
}
