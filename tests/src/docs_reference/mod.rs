//! The book's reference pages (`docs/reference/`), generated from what they describe so they
//! cannot fall behind it: the OutboxRelay API from the CRD ([`api`]), the command line from the
//! built binaries' `--help` ([`cli`]), and the metrics from the registries ([`metrics`]).
//! `make docs-reference` writes them (the `docs-reference` binary); the `repo_docs_reference`
//! test fails when a committed page differs from what this module generates.

pub mod api;
pub mod cli;
pub mod markdown;
pub mod metrics;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The command that regenerates the pages, named on each page and in the test's failures.
pub const REGENERATE: &str = "make docs-reference";

/// One generated page: where it goes, relative to the repository root, and its text.
pub struct Page {
    pub path: &'static str,
    pub content: String,
}

pub const API_PAGE: &str = "docs/reference/api.md";
pub const CLI_PAGE: &str = "docs/reference/cli.md";
pub const METRICS_PAGE: &str = "docs/reference/metrics.md";

/// The three pages, from the CRD under `repo_root` and the binaries `binary` finds (their name
/// to their path; [`crate::process::binary`] for the ones built next to the caller).
pub fn pages(repo_root: &Path, binary: &dyn Fn(&str) -> PathBuf) -> anyhow::Result<Vec<Page>> {
    let crd_path = repo_root.join(api::SOURCE);
    let crd = std::fs::read_to_string(&crd_path)
        .with_context(|| format!("read {}", crd_path.display()))?;
    Ok(vec![
        Page {
            path: API_PAGE,
            content: api::render(&crd, REGENERATE)?,
        },
        Page {
            path: CLI_PAGE,
            content: cli::render(binary, REGENERATE)?,
        },
        Page {
            path: METRICS_PAGE,
            content: metrics::render(REGENERATE),
        },
    ])
}
