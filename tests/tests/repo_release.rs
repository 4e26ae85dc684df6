//! The release record agrees with itself: CHANGELOG.md, `release/releases`, the crates' version
//! (`[workspace.package]` in Cargo.toml), the chart's `version` and `appVersion`, and the image
//! tags the manifests and image files default to. Reads files (and, where the clone has the
//! history, asks git): no server, a second or two.
//!
//! The rules (CHANGELOG.md's preamble says them to people):
//! - a build between releases is `X.Y.Z-dev`: the changelog opens with a non-empty
//!   `## [Unreleased]`, and X.Y.Z is above every recorded release;
//! - a release build is `X.Y.Z`: the changelog has `## [X.Y.Z] - DATE`, and its record line in
//!   `release/releases` may come in the next commit (a commit cannot name itself);
//! - every recorded release has an entry of the same version and date, every dated entry is
//!   recorded (but the one being released), versions go down the file and up the record;
//! - an entry's sections are Keep a Changelog's six, none empty; every heading has its link
//!   reference at the end of the file.
//!
//! The unit tests at the end plant each drift and see it caught.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;

/// Keep a Changelog's section names, in its order.
const SECTIONS: [&str; 6] = [
    "Added",
    "Changed",
    "Deprecated",
    "Removed",
    "Fixed",
    "Security",
];

/// Where the link references point.
const REPOSITORY_URL: &str = "https://github.com/outbox-relay/outbox-relay";

const CHART: &str = "charts/outbox-relay-operator/Chart.yaml";

/// Files whose default image tag (or build argument) is the version: `(path, text before it)`.
const IMAGE_TAGS: [(&str, &str); 5] = [
    (
        "config/manager/manager.yaml",
        "ghcr.io/outbox-relay/outbox-relay:",
    ),
    ("config/manager/kustomization.yaml", "newTag: "),
    ("Containerfile", "ARG VERSION="),
    ("Dockerfile", "ARG VERSION="),
    (
        "Dockerfile",
        "docker build -t ghcr.io/outbox-relay/outbox-relay:",
    ),
];

#[test]
fn changelog_record_and_versions_agree() {
    let root = root();
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
    };
    let changelog = read("CHANGELOG.md");
    let record = read("release/releases");
    let versions = Versions::read(&root);
    let problems = check(&changelog, &record, &versions);
    assert!(
        problems.is_empty(),
        "the release record has drifted:\n- {}",
        problems.join("\n- ")
    );
    println!(
        "release: version {} (crates, chart, image tags); {} recorded release(s), each with its changelog entry",
        versions.crates,
        parse_record(&record).unwrap().len()
    );
}

#[test]
fn recorded_releases_are_in_the_clones_history() {
    let root = root();
    let record = parse_record(&std::fs::read_to_string(root.join("release/releases")).unwrap())
        .expect("release/releases parses");
    let git = Git { root: &root };
    match git.history() {
        History::Full => {}
        other => {
            println!(
                "release: {other:?}: the recorded commits are not checked against the history"
            );
            return;
        }
    }
    let mut problems = Vec::new();
    for release in &record {
        problems.extend(git.check_release(release));
    }
    assert!(
        problems.is_empty(),
        "the recorded releases do not match the history:\n- {}",
        problems.join("\n- ")
    );
    println!(
        "release: {} recorded commit(s) found in the history, each an ancestor of HEAD carrying its version",
        record.len()
    );
}

/// `release/cosign.pub` is what users verify with: a PEM public key of cosign's kind (ECDSA
/// P-256, as `cosign generate-key-pair` makes), and no private key sits beside it.
#[test]
fn the_project_public_key_is_a_cosign_public_key() {
    let release = root().join("release");
    let pem = std::fs::read_to_string(release.join("cosign.pub")).expect("release/cosign.pub");
    let body: String = pem
        .trim()
        .strip_prefix("-----BEGIN PUBLIC KEY-----")
        .and_then(|rest| rest.strip_suffix("-----END PUBLIC KEY-----"))
        .expect("release/cosign.pub is a PEM `PUBLIC KEY`")
        .split_whitespace()
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("its body is base64");
    // SubjectPublicKeyInfo: id-ecPublicKey, prime256v1, an uncompressed point (65 bytes).
    const P256_SPKI_PREFIX: [u8; 27] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04,
    ];
    assert_eq!(
        der.len(),
        91,
        "an ECDSA P-256 public key is 91 bytes of DER"
    );
    assert_eq!(der[..27], P256_SPKI_PREFIX, "not an ECDSA P-256 public key");
    for entry in std::fs::read_dir(&release).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        assert!(
            !text.contains("PRIVATE KEY"),
            "{} holds a private key: it must never be in the repository",
            entry.path().display()
        );
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The versions the build carries, each with where it was read.
#[derive(Debug, Clone)]
struct Versions {
    crates: String,
    /// `(where, version)`: the chart's two fields and every image tag.
    others: Vec<(String, String)>,
}

impl Versions {
    fn read(root: &Path) -> Versions {
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let crates = workspace_version(&cargo).expect("Cargo.toml has [workspace.package] version");
        let chart = std::fs::read_to_string(root.join(CHART)).unwrap();
        let mut others = chart_versions(&chart);
        for (path, prefix) in IMAGE_TAGS {
            let text = std::fs::read_to_string(root.join(path)).unwrap();
            let found = tags_after(&text, prefix);
            assert!(!found.is_empty(), "{path} no longer holds `{prefix}…`");
            for tag in found {
                others.push((format!("{path} ({prefix}…)"), tag));
            }
        }
        Versions { crates, others }
    }
}

/// `version = "…"` of `[workspace.package]`.
fn workspace_version(cargo_toml: &str) -> Option<String> {
    let mut in_section = false;
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section && let Some(value) = line.strip_prefix("version") {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

/// The chart's `version` and `appVersion`.
fn chart_versions(chart_yaml: &str) -> Vec<(String, String)> {
    let chart: serde_yaml::Value = serde_yaml::from_str(chart_yaml).expect("Chart.yaml parses");
    ["version", "appVersion"]
        .into_iter()
        .map(|field| {
            let value = match &chart[field] {
                serde_yaml::Value::String(s) => s.clone(),
                other => format!("{other:?}"),
            };
            (format!("{CHART} {field}"), value)
        })
        .collect()
}

/// What follows each `prefix` up to a space, quote or the end of the line.
fn tags_after(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let rest = &line[line.find(prefix)? + prefix.len()..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(rest.len());
            Some(rest[..end].to_owned())
        })
        .collect()
}

/// A version as this project writes them: `X.Y.Z` or `X.Y.Z-PRE`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    core: (u64, u64, u64),
    pre: Option<String>,
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) if !pre.is_empty() => (core, Some(pre.to_owned())),
            Some(_) => return None,
            None => (text, None),
        };
        let mut parts = core.split('.').map(|p| {
            (!p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0')))
            .then(|| p.parse::<u64>().ok())
            .flatten()
        });
        let core = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(Version { core, pre })
    }
}

/// `X.Y.Z`, without a pre-release part.
fn is_release_version(text: &str) -> bool {
    Version::parse(text).is_some_and(|v| v.pre.is_none())
}

/// One `## [...]` entry of the changelog.
#[derive(Debug)]
struct Entry {
    /// None for Unreleased.
    version: Option<String>,
    date: Option<String>,
    /// `(section, bullets)` in file order.
    sections: Vec<(String, usize)>,
}

/// A link reference at the end of the file: `[name]: url`.
type Link = (String, String);

/// The entries, top to bottom, and the link references; or what is malformed.
fn parse_changelog(text: &str) -> Result<(Vec<Entry>, Vec<Link>), Vec<String>> {
    let mut problems = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();
    let mut links = Vec::new();
    if !text.starts_with("# Changelog\n") {
        problems.push("CHANGELOG.md does not open with `# Changelog`".to_owned());
    }
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        let at = format!("CHANGELOG.md:{number}");
        if let Some(heading) = line.strip_prefix("## ") {
            match parse_heading(heading) {
                Ok(entry) => entries.push(entry),
                Err(problem) => problems.push(format!("{at}: {problem}")),
            }
        } else if let Some(name) = line.strip_prefix("### ") {
            match entries.last_mut() {
                Some(entry) if SECTIONS.contains(&name) => {
                    if entry.sections.iter().any(|(s, _)| s == name) {
                        problems.push(format!("{at}: a second `### {name}` in one entry"));
                    }
                    entry.sections.push((name.to_owned(), 0));
                }
                Some(_) => problems.push(format!(
                    "{at}: `### {name}` is not one of Keep a Changelog's sections ({})",
                    SECTIONS.join(", ")
                )),
                None => problems.push(format!("{at}: a section before any entry")),
            }
        } else if line.starts_with("- ") {
            if let Some((_, bullets)) = entries.last_mut().and_then(|e| e.sections.last_mut()) {
                *bullets += 1;
            } else if !entries.is_empty() {
                problems.push(format!("{at}: a bullet outside any `###` section"));
            }
        } else if let Some(rest) = line.strip_prefix('[')
            && let Some((name, url)) = rest.split_once("]: ")
        {
            links.push((name.to_owned(), url.trim().to_owned()));
        }
    }
    if problems.is_empty() {
        Ok((entries, links))
    } else {
        Err(problems)
    }
}

/// `[Unreleased]` or `[X.Y.Z] - YYYY-MM-DD`.
fn parse_heading(heading: &str) -> Result<Entry, String> {
    let entry = |version, date| Entry {
        version,
        date,
        sections: Vec::new(),
    };
    if heading == "[Unreleased]" {
        return Ok(entry(None, None));
    }
    let Some((bracketed, date)) = heading.split_once(" - ") else {
        return Err(format!(
            "`## {heading}`: a heading is `[Unreleased]` or `[X.Y.Z] - YYYY-MM-DD`"
        ));
    };
    let version = bracketed
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .filter(|v| is_release_version(v))
        .ok_or_else(|| format!("`## {heading}`: `{bracketed}` is not a [X.Y.Z] release version"))?;
    if !is_date(date) {
        return Err(format!("`## {heading}`: `{date}` is not a YYYY-MM-DD date"));
    }
    Ok(entry(Some(version.to_owned()), Some(date.to_owned())))
}

fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
        && chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok()
}

/// One line of `release/releases`.
#[derive(Debug, Clone)]
struct Release {
    version: String,
    commit: String,
    date: String,
}

fn parse_record(text: &str) -> Result<Vec<Release>, Vec<String>> {
    let mut releases = Vec::new();
    let mut problems = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("release/releases:{number}");
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [version, commit, date] = fields[..] else {
            problems.push(format!("{at}: `{line}` is not `VERSION COMMIT DATE`"));
            continue;
        };
        if !is_release_version(version) {
            problems.push(format!("{at}: `{version}` is not an X.Y.Z release version"));
        }
        if commit.len() != 40
            || !commit
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            problems.push(format!(
                "{at}: `{commit}` is not a full commit id (40 lower-case hex digits: git rev-parse)"
            ));
        }
        if !is_date(date) {
            problems.push(format!("{at}: `{date}` is not a YYYY-MM-DD date"));
        }
        releases.push(Release {
            version: version.to_owned(),
            commit: commit.to_owned(),
            date: date.to_owned(),
        });
    }
    if problems.is_empty() {
        Ok(releases)
    } else {
        Err(problems)
    }
}

/// Every way the three disagree, as sentences; empty when they agree.
fn check(changelog: &str, record: &str, versions: &Versions) -> Vec<String> {
    let mut problems = Vec::new();
    let (entries, links) = match parse_changelog(changelog) {
        Ok(parsed) => parsed,
        Err(found) => return found,
    };
    let releases = match parse_record(record) {
        Ok(releases) => releases,
        Err(found) => return found,
    };
    let current = &versions.crates;
    for (place, version) in &versions.others {
        if version != current {
            problems.push(format!(
                "{place} is {version}, the crates' version ([workspace.package] in Cargo.toml) is {current}"
            ));
        }
    }
    let Some(current_version) = Version::parse(current) else {
        problems.push(format!(
            "the crates' version {current} is not X.Y.Z or X.Y.Z-dev"
        ));
        return problems;
    };

    // Entries: sections present and filled, versions going down, Unreleased only first.
    for (index, entry) in entries.iter().enumerate() {
        let name = entry.version.as_deref().unwrap_or("Unreleased");
        if entry.version.is_none() && index != 0 {
            problems.push("[Unreleased] is not the first entry".to_owned());
        }
        if entry.sections.is_empty() {
            problems.push(format!("[{name}] has no `###` section"));
        }
        for (section, bullets) in &entry.sections {
            if *bullets == 0 {
                problems.push(format!("[{name}] has an empty `### {section}`"));
            }
        }
        let order: Vec<usize> = entry
            .sections
            .iter()
            .filter_map(|(s, _)| SECTIONS.iter().position(|k| k == s))
            .collect();
        if order.windows(2).any(|w| w[0] > w[1]) {
            problems.push(format!(
                "[{name}]'s sections are not in Keep a Changelog's order ({})",
                SECTIONS.join(", ")
            ));
        }
        if !links.iter().any(|(l, _)| l == name) {
            problems.push(format!(
                "[{name}] has no link reference (`[{name}]: {REPOSITORY_URL}/…`) at the end"
            ));
        }
    }
    let released: Vec<(&Entry, Version)> = entries
        .iter()
        .filter_map(|e| Some((e, Version::parse(e.version.as_deref()?)?)))
        .collect();
    if released
        .windows(2)
        .any(|w| cmp(&w[0].1, &w[1].1) != Ordering::Greater)
    {
        problems.push("the changelog's versions do not go strictly down the file".to_owned());
    }

    // The record: ascending, each with its entry, each entry recorded.
    let recorded: Vec<Version> = releases
        .iter()
        .filter_map(|r| Version::parse(&r.version))
        .collect();
    if recorded
        .windows(2)
        .any(|w| cmp(&w[0], &w[1]) != Ordering::Less)
    {
        problems.push("release/releases does not go strictly up, oldest first".to_owned());
    }
    for release in &releases {
        match entries
            .iter()
            .find(|e| e.version.as_deref() == Some(release.version.as_str()))
        {
            None => problems.push(format!(
                "release {} is recorded in release/releases but has no `## [{}] - {}` in CHANGELOG.md",
                release.version, release.version, release.date
            )),
            Some(entry) if entry.date.as_deref() != Some(release.date.as_str()) => problems.push(format!(
                "release {}: CHANGELOG.md dates it {}, release/releases {}",
                release.version,
                entry.date.as_deref().unwrap_or("-"),
                release.date
            )),
            Some(_) => {}
        }
        let tag_url = format!("{REPOSITORY_URL}/releases/tag/v{}", release.version);
        if !links
            .iter()
            .any(|(l, u)| l == &release.version && u == &tag_url)
        {
            problems.push(format!(
                "CHANGELOG.md's link [{}] is not `{tag_url}`",
                release.version
            ));
        }
    }
    for (entry, _) in &released {
        let version = entry.version.as_deref().unwrap_or_default();
        if version != current && !releases.iter().any(|r| r.version == version) {
            problems.push(format!(
                "CHANGELOG.md has [{version}] but release/releases does not record it (VERSION COMMIT DATE)"
            ));
        }
    }

    // The build's own version against both.
    let latest = releases.last();
    match &current_version.pre {
        Some(pre) => {
            if pre != "dev" {
                problems.push(format!(
                    "the crates' version {current}: a build between releases is X.Y.Z-dev"
                ));
            }
            match entries.first() {
                Some(first) if first.version.is_none() => {}
                _ => problems.push(format!(
                    "the version is {current} (unreleased) but CHANGELOG.md does not open with `## [Unreleased]`"
                )),
            }
            if let Some(latest) = latest
                && let Some(latest_version) = Version::parse(&latest.version)
                && current_version.core <= latest_version.core
            {
                problems.push(format!(
                    "the version {current} is not above the latest release {}: move it to the next version",
                    latest.version
                ));
            }
            if let Some(latest) = latest {
                let compare = format!("{REPOSITORY_URL}/compare/v{}...HEAD", latest.version);
                if !links
                    .iter()
                    .any(|(l, u)| l == "Unreleased" && u == &compare)
                {
                    problems.push(format!(
                        "CHANGELOG.md's link [Unreleased] is not `{compare}`"
                    ));
                }
            }
        }
        None => {
            if !entries
                .iter()
                .any(|e| e.version.as_deref() == Some(current.as_str()))
            {
                problems.push(format!(
                    "the version is {current} (a release) but CHANGELOG.md has no `## [{current}] - DATE`"
                ));
            }
        }
    }
    problems
}

fn cmp(a: &Version, b: &Version) -> Ordering {
    a.core.cmp(&b.core).then_with(|| match (&a.pre, &b.pre) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    })
}

/// What the clone holds of its history.
#[derive(Debug)]
enum History {
    Full,
    /// No git, or no repository (an unpacked archive).
    NoRepository,
    /// A shallow clone: older commits are missing by design.
    Shallow,
}

struct Git<'a> {
    root: &'a Path,
}

impl Git<'_> {
    fn run(&self, args: &[&str]) -> Option<(bool, String)> {
        let output = Command::new("git")
            .arg("-C")
            .arg(self.root)
            .args(args)
            .output()
            .ok()?;
        Some((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        ))
    }

    fn history(&self) -> History {
        match self.run(&["rev-parse", "--is-shallow-repository"]) {
            Some((true, shallow)) if shallow == "false" => History::Full,
            Some((true, _)) => History::Shallow,
            _ => History::NoRepository,
        }
    }

    fn check_release(&self, release: &Release) -> Vec<String> {
        let commit = &release.commit;
        let name = format!("release {} (commit {commit})", release.version);
        let exists = format!("{commit}^{{commit}}");
        if !matches!(self.run(&["cat-file", "-e", &exists]), Some((true, _))) {
            return vec![format!("{name}: no such commit in this clone")];
        }
        let mut problems = Vec::new();
        if !matches!(
            self.run(&["merge-base", "--is-ancestor", commit, "HEAD"]),
            Some((true, _))
        ) {
            problems.push(format!("{name} is not an ancestor of HEAD"));
        }
        let at_commit = |path: &str| match self.run(&["show", &format!("{commit}:{path}")]) {
            Some((true, text)) => Some(text),
            _ => None,
        };
        let crates = at_commit("Cargo.toml").and_then(|t| workspace_version(&t));
        if crates.as_deref() != Some(release.version.as_str()) {
            problems.push(format!(
                "{name}: its Cargo.toml says version {}",
                crates.as_deref().unwrap_or("(none)")
            ));
        }
        if let Some(chart) = at_commit(CHART) {
            for (field, version) in chart_versions(&chart) {
                if version != release.version {
                    problems.push(format!("{name}: its {field} is {version}"));
                }
            }
        }
        // A tag is optional (a clone may carry none); where present it names the same commit.
        let tag = format!("refs/tags/v{}^{{commit}}", release.version);
        if let Some((true, tagged)) = self.run(&["rev-parse", "-q", "--verify", &tag])
            && &tagged != commit
        {
            problems.push(format!(
                "{name}: tag v{} points at {tagged}",
                release.version
            ));
        }
        problems
    }
}

#[cfg(test)]
mod planted {
    //! Each drift planted in a copy of consistent files, and caught.
    use super::*;

    const RECORD: &str = "# comment\n0.1.0 e716c6680d7dd8615dc48e7be9ba973bc1764fd6 2026-12-05\n";

    fn changelog(unreleased: bool, version: &str, date: &str) -> String {
        let mut text = String::from("# Changelog\n\nPreamble.\n\n");
        if unreleased {
            text.push_str("## [Unreleased]\n\n### Added\n\n- Something.\n\n");
        }
        text.push_str(&format!(
            "## [{version}] - {date}\n\n### Added\n\n- The first.\n\n### Fixed\n\n- A defect.\n\n"
        ));
        if unreleased {
            text.push_str(&format!(
                "[Unreleased]: {REPOSITORY_URL}/compare/v{version}...HEAD\n"
            ));
        }
        text.push_str(&format!(
            "[{version}]: {REPOSITORY_URL}/releases/tag/v{version}\n"
        ));
        text
    }

    fn versions(version: &str) -> Versions {
        Versions {
            crates: version.to_owned(),
            others: vec![
                ("Chart.yaml version".to_owned(), version.to_owned()),
                ("Chart.yaml appVersion".to_owned(), version.to_owned()),
            ],
        }
    }

    fn caught(problems: Vec<String>, needle: &str) {
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "expected a problem containing {needle:?}, got {problems:?}"
        );
    }

    #[test]
    fn consistent_files_pass() {
        let problems = check(
            &changelog(true, "0.1.0", "2026-12-05"),
            RECORD,
            &versions("0.2.0-dev"),
        );
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn a_chart_version_apart_from_the_crates_is_caught() {
        let mut v = versions("0.2.0-dev");
        v.others[1].1 = "0.1.0".to_owned();
        caught(
            check(&changelog(true, "0.1.0", "2026-12-05"), RECORD, &v),
            "Chart.yaml appVersion is 0.1.0",
        );
    }

    #[test]
    fn a_recorded_release_without_an_entry_is_caught() {
        let record = format!("{RECORD}0.2.0 0123456789abcdef0123456789abcdef01234567 2026-12-20\n");
        caught(
            check(
                &changelog(true, "0.1.0", "2026-12-05"),
                &record,
                &versions("0.3.0-dev"),
            ),
            "release 0.2.0 is recorded in release/releases but has no",
        );
    }

    #[test]
    fn an_unrecorded_old_release_is_caught() {
        caught(
            check(
                &changelog(true, "0.1.0", "2026-12-05"),
                "",
                &versions("0.2.0-dev"),
            ),
            "does not record it",
        );
    }

    #[test]
    fn a_date_apart_from_the_record_is_caught() {
        caught(
            check(
                &changelog(true, "0.1.0", "2026-12-06"),
                RECORD,
                &versions("0.2.0-dev"),
            ),
            "CHANGELOG.md dates it 2026-12-06, release/releases 2026-12-05",
        );
    }

    #[test]
    fn a_dev_build_without_unreleased_is_caught() {
        caught(
            check(
                &changelog(false, "0.1.0", "2026-12-05"),
                RECORD,
                &versions("0.2.0-dev"),
            ),
            "does not open with `## [Unreleased]`",
        );
    }

    #[test]
    fn a_dev_version_not_above_the_last_release_is_caught() {
        caught(
            check(
                &changelog(true, "0.1.0", "2026-12-05"),
                RECORD,
                &versions("0.1.0-dev"),
            ),
            "is not above the latest release 0.1.0",
        );
    }

    #[test]
    fn a_release_build_without_its_entry_is_caught() {
        caught(
            check(
                &changelog(true, "0.1.0", "2026-12-05"),
                RECORD,
                &versions("0.2.0"),
            ),
            "has no `## [0.2.0] - DATE`",
        );
    }

    #[test]
    fn the_release_being_cut_need_not_be_recorded_yet() {
        let text = changelog(false, "0.1.0", "2026-12-05").replace(
            "## [0.1.0]",
            &format!(
                "## [0.2.0] - 2026-12-20\n\n### Changed\n\n- A change.\n\n[0.2.0]: {REPOSITORY_URL}/releases/tag/v0.2.0\n\n## [0.1.0]"
            ),
        );
        assert_eq!(
            check(&text, RECORD, &versions("0.2.0")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn malformed_changelogs_are_caught() {
        let good = changelog(true, "0.1.0", "2026-12-05");
        let cases = [
            (
                good.replace("### Fixed", "### Bugfixes"),
                "not one of Keep a Changelog's sections",
            ),
            (good.replace("- A defect.\n", ""), "an empty `### Fixed`"),
            (
                good.replace("[0.1.0] - 2026-12-05", "[0.1.0] - 5 Dec 2026"),
                "is not a YYYY-MM-DD date",
            ),
            (
                good.replace("[0.1.0] - ", "[v0.1] - "),
                "is not a [X.Y.Z] release version",
            ),
            (
                good.replace(
                    &format!("[0.1.0]: {REPOSITORY_URL}/releases/tag/v0.1.0\n"),
                    "",
                ),
                "[0.1.0] has no link reference",
            ),
            (
                good.replace("compare/v0.1.0...HEAD", "compare/v0.0.9...HEAD"),
                "link [Unreleased] is not",
            ),
        ];
        for (text, needle) in cases {
            caught(check(&text, RECORD, &versions("0.2.0-dev")), needle);
        }
    }

    #[test]
    fn malformed_records_are_caught() {
        let good = changelog(true, "0.1.0", "2026-12-05");
        caught(
            check(&good, "0.1.0 e716c66 2026-12-05\n", &versions("0.2.0-dev")),
            "is not a full commit id",
        );
        caught(
            check(
                &good,
                "0.1.0 e716c6680d7dd8615dc48e7be9ba973bc1764fd6\n",
                &versions("0.2.0-dev"),
            ),
            "is not `VERSION COMMIT DATE`",
        );
    }

    #[test]
    fn versions_parse_and_order() {
        assert!(Version::parse("0.2.0-dev").is_some_and(|v| v.core == (0, 2, 0)));
        for bad in ["0.2", "0.2.0.1", "v0.2.0", "01.2.0", "0.2.0-", ""] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        let v = |s| Version::parse(s).unwrap();
        assert_eq!(cmp(&v("0.2.0-dev"), &v("0.2.0")), Ordering::Less);
        assert_eq!(cmp(&v("0.10.0"), &v("0.9.9")), Ordering::Greater);
    }

    #[test]
    fn the_workspace_version_is_read_from_its_section() {
        let toml = "[package]\nversion = \"9.9.9\"\n[workspace.package]\nversion = \"0.2.0-dev\"\nedition = \"2024\"\n";
        assert_eq!(workspace_version(toml).as_deref(), Some("0.2.0-dev"));
        assert_eq!(
            tags_after("  image: ghcr.io/x:0.2.0-dev\n", "ghcr.io/x:"),
            ["0.2.0-dev"]
        );
    }

    #[test]
    fn a_commit_of_another_version_is_caught() {
        // The real history: a record naming release 0.1.0's commit as 9.9.9 fails on that
        // commit's Cargo.toml, and a commit the clone lacks is named.
        let root = root();
        let git = Git { root: &root };
        if !matches!(git.history(), History::Full) {
            return;
        }
        let release = Release {
            version: "9.9.9".to_owned(),
            commit: "e716c6680d7dd8615dc48e7be9ba973bc1764fd6".to_owned(),
            date: "2026-12-05".to_owned(),
        };
        caught(
            git.check_release(&release),
            "its Cargo.toml says version 0.1.0",
        );
        let missing = Release {
            commit: "0".repeat(40),
            ..release
        };
        caught(git.check_release(&missing), "no such commit in this clone");
    }
}
