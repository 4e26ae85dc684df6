//! The book's generated reference pages (`docs/reference/api.md`, `cli.md`, `metrics.md`):
//! the committed pages are what `make docs-reference` writes today, and what it writes covers
//! everything it describes: every field of the CRD, every metric the registries and the
//! sources name, every subcommand the binaries list, without the caller's environment.
//!
//! Needs `outbox-relay` and `outbox-operator` built next to this test (as `make test` does).

use std::collections::BTreeMap;
use std::path::Path;

use outbox_tests::docs_reference::{self, REGENERATE, api, cli, metrics};
use outbox_tests::{process, repo_root};
use serde_json::Value;

#[test]
fn committed_pages_are_current() {
    let root = repo_root();
    let pages = docs_reference::pages(&root, &process::binary).expect("generate the pages");
    let mut stale = Vec::new();
    for page in &pages {
        match std::fs::read_to_string(root.join(page.path)) {
            Err(e) => stale.push(format!(
                "{} cannot be read ({e}): generate it with `{REGENERATE}`",
                page.path
            )),
            Ok(committed) if committed != page.content => stale.push(format!(
                "{} is stale ({}): regenerate it with `{REGENERATE}` and commit it",
                page.path,
                first_difference(&committed, &page.content)
            )),
            Ok(_) => {}
        }
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

#[test]
fn api_page_has_a_row_for_every_crd_field() {
    let root = repo_root();
    let crd_text = std::fs::read_to_string(root.join(api::SOURCE)).expect("read the CRD");
    let page = api::render(&crd_text, REGENERATE).expect("render api.md");
    let sections = sections(&page, "### ");
    let crd: Value = serde_yaml::from_str(&crd_text).expect("parse the CRD");
    let kind = crd["spec"]["names"]["kind"].as_str().expect("kind");
    let version = crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .find(|v| v["served"] == true)
        .expect("a served version");

    let mut fields = Vec::new();
    collect_fields(&version["schema"]["openAPIV3Schema"], kind, "", &mut fields);
    let spec_leaves = fields
        .iter()
        .filter(|f| f.path.starts_with("spec.") && f.leaf)
        .count();
    assert!(
        spec_leaves > 50,
        "only {spec_leaves} leaf fields under spec: the walk over the CRD went wrong"
    );
    let mut missing = Vec::new();
    for field in &fields {
        let Some(body) = sections.get(&field.section) else {
            missing.push(format!(
                "{}: no section `### {}`",
                field.path, field.section
            ));
            continue;
        };
        let Some(row) = body.lines().find(|line| is_row_of(line, &field.name)) else {
            missing.push(format!("{}: no row in `### {}`", field.path, field.section));
            continue;
        };
        if let Some(default) = &field.default {
            let shown = docs_reference::markdown::code(default);
            if !row.contains(&shown) {
                missing.push(format!(
                    "{}: default {shown} not in its row: {row}",
                    field.path
                ));
            }
        }
        let required = row.split(" | ").nth(2).unwrap_or_default();
        let expected = if field.required { "yes" } else { "no" };
        if required != expected {
            missing.push(format!(
                "{}: required should be {expected}: {row}",
                field.path
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "api.md does not show these CRD fields as the CRD has them:\n{}",
        missing.join("\n")
    );
}

#[test]
fn metrics_page_lists_every_metric() {
    let page = metrics::render(REGENERATE);
    let relay = metrics::relay();
    let operator = metrics::operator();

    // What the generator read from the registries is on the page, with its type.
    for m in relay.iter().chain(&operator) {
        let row = format!("| `{}` | {} |", m.name, m.kind);
        assert!(page.contains(&row), "metrics.md has no row starting {row}");
    }

    // What /metrics serves is what the page says (a family with no labels is always there).
    let served = outbox_relay::metrics::Metrics::new().render();
    for line in served.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE <name> <type>");
            let found = relay.iter().find(|m| m.name == name);
            assert_eq!(
                found.map(|m| m.kind),
                Some(kind),
                "/metrics serves {name} as a {kind}; metrics.md says {found:?}"
            );
        }
    }

    // Every metric the sources define, labelled ones included, which `gather` alone would
    // miss: a family `reference_families` forgot to give a series fails here.
    let relay_names: Vec<&str> = relay.iter().map(|m| m.name.as_str()).collect();
    let metrics_dir = repo_root().join("relay/src/metrics");
    let mut sources: Vec<_> = std::fs::read_dir(&metrics_dir)
        .expect("read relay/src/metrics")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    sources.sort();
    let mut defined = Vec::new();
    for source in &sources {
        for literal in string_literals(&non_test_source(source)) {
            if literal.starts_with("outbox_relay_") && is_metric_name(&literal) {
                defined.push(literal);
            }
        }
    }
    assert!(
        defined.len() >= 15,
        "only {} metric names found in relay/src/metrics: the scan went wrong",
        defined.len()
    );
    for name in &defined {
        assert!(
            relay_names.contains(&name.as_str()),
            "relay/src/metrics defines {name}, but Metrics::reference_families does not give \
             it: a labelled family needs its line there"
        );
    }

    // The operator's names carry its registry's prefix; the sources give them without it.
    let operator_names: Vec<&str> = operator.iter().map(|m| m.name.as_str()).collect();
    let source = non_test_source(&repo_root().join("operator/src/metrics.rs"));
    let mut defined = 0;
    for (i, _) in source.match_indices("Opts::new(") {
        let literal = string_literals(&source[i..])
            .into_iter()
            .next()
            .expect("Opts::new names its metric");
        let name = format!("outbox_operator_{literal}");
        assert!(
            operator_names.contains(&name.as_str()),
            "operator/src/metrics.rs defines {name}, but Metrics::reference_families does not \
             give it: the family needs its line there"
        );
        defined += 1;
    }
    assert!(
        defined >= 3,
        "only {defined} operator metrics found: the scan went wrong"
    );
}

/// The book explains metrics in prose and tables of its own (observability, the runbooks): a
/// name there that no registry has is a metric renamed or removed under the reader's feet.
#[test]
fn the_book_names_only_metrics_that_exist() {
    let mut known: Vec<String> = metrics::relay()
        .into_iter()
        .chain(metrics::operator())
        .map(|m| m.name)
        .collect();
    // The relay's tables share the prefix.
    known.push(outbox_relay::table::REPORTS_TABLE.to_string());
    known.push(outbox_relay::table::LIMITS_TABLE.to_string());
    known.push(outbox_operator::reconcile::database::claims::CLAIMS_TABLE.to_string());

    let mut pages = vec![repo_root().join("README.md")];
    let mut folders = vec![repo_root().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read docs/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut named = 0;
    let mut unknown = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read a page");
        for (start, _) in text.match_indices("outbox_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !(name.starts_with("outbox_relay_") || name.starts_with("outbox_operator_")) {
                continue;
            }
            named += 1;
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| known.iter().any(|k| k == base))
                .unwrap_or(&name);
            if !known.iter().any(|k| k == family) {
                unknown.push(format!("{}: {name}", page.display()));
            }
        }
    }
    assert!(
        named >= 40,
        "only {named} metric names found in the book: the scan went wrong"
    );
    assert!(
        unknown.is_empty(),
        "the book names metrics neither registry has:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn cli_page_is_deterministic_and_covers_every_subcommand() {
    let first = cli::render(&process::binary, REGENERATE).expect("render cli.md");
    let second = cli::render(&process::binary, REGENERATE).expect("render cli.md again");
    assert_eq!(first, second, "two runs of --help gave different pages");

    // No value of the caller's environment: clap prints `[env: NAME=value]` for a variable
    // that is set (`[env: NAME=]` when unset), and the generator runs the binaries without any.
    let mut env_options = 0;
    let mut in_help = false;
    for line in first.lines() {
        if line.starts_with("```") {
            in_help = !in_help;
            continue;
        }
        if !in_help {
            continue;
        }
        for (i, _) in line.match_indices("[env: ") {
            let rest = &line[i + "[env: ".len()..];
            let name_end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let after = &rest[name_end..];
            assert!(
                after.starts_with(']') || after.starts_with("=]"),
                "cli.md shows an environment value: {line}"
            );
            env_options += 1;
        }
    }
    assert!(
        env_options > 0,
        "cli.md names no environment variable: the scan went wrong"
    );

    let headings = sections(&first, "### ");
    for binary in cli::BINARIES {
        assert!(
            first.contains(&format!("\n## {binary}\n")),
            "cli.md has no section for {binary}"
        );
        let help = std::process::Command::new(process::binary(binary))
            .arg("--help")
            .env_clear()
            .output()
            .expect("run --help");
        let subcommands = cli::subcommands(&String::from_utf8_lossy(&help.stdout));
        assert!(
            !subcommands.is_empty(),
            "{binary} --help lists no subcommand"
        );
        for sub in subcommands {
            let title = format!("{binary} {sub}");
            assert!(
                headings.contains_key(&title),
                "cli.md has no section `### {title}`"
            );
        }
    }
}

/// Where two texts first differ, as a line number and both lines, for the failure message.
fn first_difference(committed: &str, generated: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut generated_lines = generated.lines();
    for number in 1.. {
        match (committed_lines.next(), generated_lines.next()) {
            (Some(a), Some(b)) if a == b => continue,
            (None, None) => return "they differ in line endings".into(),
            (a, b) => {
                return format!(
                    "first difference at line {number}: committed {:?}, generated {:?}",
                    a.unwrap_or("<end of file>"),
                    b.unwrap_or("<end of file>")
                );
            }
        }
    }
    unreachable!("the loop returns")
}

/// The sections of a page by heading title (the text after `marker`), each with its text up
/// to the next heading of any level.
fn sections(page: &str, marker: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in page.lines() {
        if line.starts_with('#') {
            if let Some((title, body)) = current.take() {
                sections.insert(title, body);
            }
            if let Some(title) = line.strip_prefix(marker) {
                current = Some((title.to_string(), String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((title, body)) = current {
        sections.insert(title, body);
    }
    sections
}

/// Whether a table line is the row of field `name`: its first cell is `` `name` ``, linked or
/// not.
fn is_row_of(line: &str, name: &str) -> bool {
    let plain = format!("| `{name}` |");
    let linked = format!("| [`{name}`](");
    line.starts_with(&plain) || line.starts_with(&linked)
}

/// One field of the CRD as the page must show it: in the section of the object holding it.
struct Field {
    path: String,
    section: String,
    name: String,
    required: bool,
    default: Option<String>,
    leaf: bool,
}

/// Every field under the object `schema` (the section `section`, at `path`), down through
/// objects and array items, except inside the Kubernetes types and pass-through fields the page
/// shows in one row.
fn collect_fields(schema: &Value, section: &str, path: &str, fields: &mut Vec<Field>) {
    let Some(properties) = schema["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, field) in properties {
        let field_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let mut inner = (field, field_path.clone());
        while inner.0["type"] == "array" {
            inner = (&inner.0["items"], format!("{}[]", inner.1));
        }
        let passed_through = api::KUBERNETES_TYPES.iter().any(|t| t.path == field_path)
            || inner.0["x-kubernetes-preserve-unknown-fields"] == true;
        let has_fields = inner.0["properties"]
            .as_object()
            .is_some_and(|p| !p.is_empty());
        fields.push(Field {
            path: field_path.clone(),
            section: section.to_string(),
            name: name.clone(),
            required: required.contains(&name.as_str()),
            default: field.get("default").map(Value::to_string),
            leaf: passed_through || !has_fields,
        });
        if !passed_through && has_fields {
            collect_fields(inner.0, &inner.1, &inner.1, fields);
        }
    }
}

/// A source file up to its unit tests, whose strings are expected output, not definitions.
fn non_test_source(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read a source file");
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The contents of the plain `"..."` string literals in Rust source (escapes kept as written;
/// metric names have none).
fn string_literals(source: &str) -> Vec<String> {
    let mut literals = Vec::new();
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut literal = String::new();
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                    literal.push(c);
                }
                literals.push(literal);
            }
            // A comment's quotes open no literal.
            '/' if chars.as_str().starts_with('/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    literals
}

/// Whether a whole literal is a Prometheus metric name.
fn is_metric_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
}
