//! `docs/reference/cli.md`: the `--help` of the built binaries, each command and subcommand,
//! as the binaries print it, so the page is what a user of this revision sees.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use super::markdown::prose;

/// The binaries on the page, in its order.
pub const BINARIES: &[&str] = &["outbox-relay", "outbox-operator"];

/// clap's width when the environment names none; given explicitly all the same, so the text
/// cannot follow a terminal (clap reads `COLUMNS` when built with `wrap_help`).
const COLUMNS: &str = "100";

/// Subcommands inside subcommands, at most this deep: a bound on the walk, far above the
/// binaries' one level.
const MAX_DEPTH: usize = 4;

/// The page, with the binaries found by `binary` (their name to their path).
pub fn render(
    binary: &dyn Fn(&str) -> std::path::PathBuf,
    command: &str,
) -> anyhow::Result<String> {
    let mut out = String::from("# Command line\n\n");
    out.push_str(&format!(
        "Generated from the binaries' `--help` by `{command}`: do not edit this page, \
         regenerate it.\n\n"
    ));
    out.push_str(&prose(
        "`outbox-relay` runs the relay without Kubernetes and prepares the table; \
         `outbox-operator` is the Kubernetes operator. Every option that names an environment \
         variable (`[env: …]`) can be given through it instead.",
    ));
    out.push_str("\n\n");
    for name in BINARIES {
        let path = binary(name);
        section(&mut out, &path, &[name], 2)?;
    }
    Ok(out)
}

/// The section of the command `words` (the binary's name, then subcommands), then one per
/// subcommand its help lists.
fn section(out: &mut String, binary: &Path, words: &[&str], level: usize) -> anyhow::Result<()> {
    let title = words.join(" ");
    let help = help(binary, &words[1..])?;
    out.push_str(&format!("{} {title}\n\n", "#".repeat(level)));
    out.push_str(&format!("```text\n{help}\n```\n\n"));
    if words.len() > MAX_DEPTH {
        return Ok(());
    }
    for sub in subcommands(&help) {
        let mut deeper = words.to_vec();
        deeper.push(&sub);
        section(out, binary, &deeper, (level + 1).min(6))?;
    }
    Ok(())
}

/// `binary <args> --help`, in an empty environment: clap prints the value of every variable an
/// option reads (`[env: DATABASE_URL=…]`), which would put the caller's URLs on the page.
/// stdout is a pipe, so no colours. Trailing spaces go: they are not part of the text.
fn help(binary: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(binary)
        .args(args)
        .arg("--help")
        .env_clear()
        .env("COLUMNS", COLUMNS)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {} {} --help", binary.display(), args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{} {} --help failed ({}): {}",
            binary.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8(output.stdout).context("help is UTF-8")?;
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    Ok(lines.join("\n").trim_end().to_string())
}

/// The subcommands clap's help lists under `Commands:`, without `help` (clap's own, which
/// prints the same text as `--help`).
pub fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        // A name is indented by two spaces; a wrapped description by more.
        .filter(|line| !line[2..].starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_listed_subcommands() {
        let help = [
            "About",
            "",
            "Usage: x <COMMAND>",
            "",
            "Commands:",
            "  run   Run it",
            "  crd   Print it",
            "        on two lines",
            "  help  Print this message",
            "",
            "Options:",
            "  -h, --help  Print help",
        ]
        .join("\n");
        assert_eq!(subcommands(&help), ["run", "crd"]);
    }
}
