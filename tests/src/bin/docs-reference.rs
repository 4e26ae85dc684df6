//! `docs-reference`: writes the book's generated reference pages (`docs/reference/api.md`,
//! `cli.md`, `metrics.md`) from the CRD, the `outbox-relay` and `outbox-operator` binaries built
//! next to this one, and the metric registries. `make docs-reference` runs it; the
//! `repo_docs_reference` test fails when a committed page differs from what it would write.

use std::process::ExitCode;

use anyhow::Context as _;
use outbox_tests::docs_reference;
use outbox_tests::{process, repo_root};

fn main() -> ExitCode {
    match write_pages() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docs-reference: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn write_pages() -> anyhow::Result<()> {
    let root = repo_root();
    for page in docs_reference::pages(&root, &process::binary)? {
        let path = root.join(page.path);
        // Rewritten only when it changes, so an up-to-date page keeps its timestamp.
        if std::fs::read_to_string(&path).ok().as_deref() == Some(page.content.as_str()) {
            println!("{} is up to date", page.path);
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(&path, &page.content)
            .with_context(|| format!("write {}", path.display()))?;
        println!("wrote {}", page.path);
    }
    Ok(())
}
