//! `docs/reference/api.md`: the OutboxRelay API, read from the generated CRD. One section per
//! object of the OpenAPI v3 schema of every served version (`spec`, `spec.database`, array
//! items as `spec.x.y[]`), each a table of its fields, so the page says exactly what the API
//! server enforces and cannot drift from it.

use anyhow::{Context as _, bail};
use serde_json::{Map, Value};

use super::markdown::{anchor, cell, code, prose, table};

/// The CRD the page is generated from, relative to the repository root.
pub const SOURCE: &str = "crds/outboxrelays.yaml";

/// A field whose schema is a Kubernetes type the relay pods receive as is (scheduling,
/// resources, pull secrets). The page names the type in one row instead of expanding the
/// dozens of sections Kubernetes documents already.
pub struct KubernetesType {
    /// The field's path in the CRD, as in the page's headings.
    pub path: &'static str,
    pub name: &'static str,
    pub docs: &'static str,
}

const POD_SCHEDULING: &str =
    "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling";

/// Every field shown as a Kubernetes type. A path that leaves the CRD is an error, so a
/// rename cannot make a field expand again unnoticed.
pub const KUBERNETES_TYPES: &[KubernetesType] = &[
    KubernetesType {
        path: "spec.relay.affinity",
        name: "Affinity",
        docs: POD_SCHEDULING,
    },
    KubernetesType {
        path: "spec.relay.imagePullSecrets",
        name: "LocalObjectReference",
        docs: "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/local-object-reference/",
    },
    KubernetesType {
        path: "spec.relay.resources",
        name: "ResourceRequirements",
        docs: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources",
    },
    KubernetesType {
        path: "spec.relay.tolerations",
        name: "Toleration",
        docs: POD_SCHEDULING,
    },
    KubernetesType {
        path: "spec.relay.topologySpreadConstraints",
        name: "TopologySpreadConstraint",
        docs: POD_SCHEDULING,
    },
];

/// The page for the CRD in `crd_yaml`; `command` is what regenerates it.
pub fn render(crd_yaml: &str, command: &str) -> anyhow::Result<String> {
    let crd: Value = serde_yaml::from_str(crd_yaml).context("parse the CRD")?;
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = text(&names["kind"]).context("the CRD names no kind")?;
    let served: Vec<&Value> = array(&spec["versions"])
        .iter()
        .filter(|v| v["served"].as_bool() == Some(true))
        .collect();
    if served.is_empty() {
        bail!("the CRD serves no version");
    }

    let mut page = Page::default();
    page.out.push_str(&format!("# {kind} API\n\n"));
    page.out.push_str(&format!(
        "Generated from `{SOURCE}` by `{command}`: do not edit this page, regenerate it.\n\n"
    ));
    page.out.push_str(&prose(&format!(
        "Every field of the `{kind}` custom resource, by object: its type, whether it is \
         required, its default, the validation the API server applies, and its description. \
         `apiVersion`, `kind` and `metadata` are those of every Kubernetes object."
    )));
    page.out.push_str("\n\n");
    page.out.push_str(&overview(spec, &served)?);

    for (i, version) in served.iter().enumerate() {
        let name = text(&version["name"]).context("a version without a name")?;
        // The first served version keeps plain headings (`spec.database`), which other pages
        // link to; any later one prefixes its own, so anchors stay unique.
        let prefix = if i == 0 {
            String::new()
        } else {
            format!("{name} ")
        };
        page.heading(2, &format!("Version {name}"))?;
        if let Some(warning) = text(&version["deprecationWarning"]) {
            page.out.push_str(&prose(&format!(
                "Deprecated: requests through it carry the warning \"{warning}\"."
            )));
            page.out.push_str("\n\n");
        }
        let schema = &version["schema"]["openAPIV3Schema"];
        if !schema.is_object() {
            bail!("version {name} has no openAPIV3Schema");
        }
        // A version with the first one's schema (served for old manifests) gets a sentence,
        // not a second copy of every table.
        if i > 0 && version["schema"] == served[0]["schema"] {
            let first = text(&served[0]["name"]).unwrap_or_default();
            page.out.push_str(&prose(&format!(
                "The same schema, subresources and columns as {}: every field above applies.",
                code(first)
            )));
            page.out.push_str("\n\n");
            continue;
        }
        page.out.push_str(&printer_columns(version));
        page.object(schema, &format!("{prefix}{kind}"), "", &prefix)?;
    }
    for t in KUBERNETES_TYPES {
        if !page.collapsed.iter().any(|p| p == t.path) {
            bail!(
                "{} is listed as a Kubernetes type in tests/src/docs_reference/api.rs but is not in the CRD",
                t.path
            );
        }
    }
    Ok(page.out)
}

/// The table of the resource's names, scope, versions and subresources.
fn overview(spec: &Value, served: &[&Value]) -> anyhow::Result<String> {
    let names = &spec["names"];
    let mut rows = vec![
        vec![
            "Group".into(),
            code(text(&spec["group"]).unwrap_or_default()),
        ],
        vec![
            "Kind".into(),
            code(text(&names["kind"]).context("the CRD names no kind")?),
        ],
        vec![
            "Plural, singular".into(),
            format!(
                "{}, {}",
                code(text(&names["plural"]).unwrap_or_default()),
                code(text(&names["singular"]).unwrap_or_default())
            ),
        ],
    ];
    let short_names: Vec<String> = array(&names["shortNames"])
        .iter()
        .filter_map(text)
        .map(code)
        .collect();
    if !short_names.is_empty() {
        rows.push(vec!["Short names".into(), short_names.join(", ")]);
    }
    let categories: Vec<String> = array(&names["categories"])
        .iter()
        .filter_map(text)
        .map(code)
        .collect();
    if !categories.is_empty() {
        rows.push(vec!["Categories".into(), categories.join(", ")]);
    }
    rows.push(vec![
        "Scope".into(),
        cell(text(&spec["scope"]).unwrap_or_default()),
    ]);
    let versions: Vec<String> = served
        .iter()
        .map(|v| {
            let name = code(text(&v["name"]).unwrap_or_default());
            if v["storage"].as_bool() == Some(true) {
                format!("{name} (served, storage)")
            } else if v["deprecated"].as_bool() == Some(true) {
                format!("{name} (served, deprecated)")
            } else {
                format!("{name} (served)")
            }
        })
        .collect();
    rows.push(vec!["Versions".into(), versions.join(", ")]);
    // Subresources per version: each served version says its own, unless they are the same.
    let same = served
        .iter()
        .all(|v| v["subresources"] == served[0]["subresources"]);
    let described = if same { &served[..1] } else { served };
    for version in described {
        let name = text(&version["name"]).unwrap_or_default();
        let sub = &version["subresources"];
        let mut parts = Vec::new();
        if sub.get("status").is_some() {
            parts.push("status".to_string());
        }
        if let Some(scale) = sub.get("scale") {
            let paths: Vec<String> = [
                ("spec replicas", "specReplicasPath"),
                ("status replicas", "statusReplicasPath"),
                ("label selector", "labelSelectorPath"),
            ]
            .iter()
            .filter_map(|(label, key)| text(&scale[key]).map(|p| format!("{label} {}", code(p))))
            .collect();
            parts.push(format!("scale ({})", paths.join(", ")));
        }
        if !parts.is_empty() {
            let label = if described.len() == 1 {
                "Subresources".to_string()
            } else {
                format!("Subresources of {}", code(name))
            };
            rows.push(vec![label, parts.join("; ")]);
        }
    }
    Ok(format!("{}\n", table(&["Property", "Value"], &rows)))
}

/// The columns `kubectl get` prints for one version, if it has any.
fn printer_columns(version: &Value) -> String {
    let columns = array(&version["additionalPrinterColumns"]);
    if columns.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = columns
        .iter()
        .map(|c| {
            vec![
                cell(text(&c["name"]).unwrap_or_default()),
                cell(text(&c["type"]).unwrap_or_default()),
                code(text(&c["jsonPath"]).unwrap_or_default()),
                cell(text(&c["description"]).unwrap_or_default()),
            ]
        })
        .collect();
    format!(
        "Columns of `kubectl get`:\n\n{}\n",
        table(&["Column", "Type", "JSON path", "Description"], &rows)
    )
}

/// The page being written, and what the walk has learnt on the way.
#[derive(Default)]
struct Page {
    out: String,
    /// Every anchor so far: a second heading with the same one would get `_1` from MkDocs and
    /// break the links made to it here.
    anchors: Vec<String>,
    /// The paths shown as a Kubernetes type, to check [`KUBERNETES_TYPES`] against the CRD.
    collapsed: Vec<String>,
}

impl Page {
    fn heading(&mut self, level: usize, title: &str) -> anyhow::Result<String> {
        let id = anchor(title);
        if self.anchors.contains(&id) {
            bail!("two headings would share the anchor #{id} ({title})");
        }
        self.anchors.push(id.clone());
        self.out
            .push_str(&format!("{} {title}\n\n", "#".repeat(level)));
        Ok(id)
    }

    /// The section of the object `schema` at `path` (`spec.relay`; "" for the resource itself,
    /// shown as `title`), then the sections of the objects inside it, depth first, so a
    /// section follows the one that links to it. `prefix` starts the headings of a version
    /// other than the first.
    fn object(
        &mut self,
        schema: &Value,
        title: &str,
        path: &str,
        prefix: &str,
    ) -> anyhow::Result<()> {
        self.heading(3, title)?;
        if let Some(description) = text(&schema["description"]) {
            self.out.push_str(&format!("{}\n\n", prose(description)));
        }
        let rules = array(&schema["x-kubernetes-validations"]);
        if !rules.is_empty() {
            self.out
                .push_str("Rules the API server checks on this object:\n\n");
            for rule in rules {
                self.out.push_str(&format!("- {}\n", rule_text(rule)));
            }
            self.out.push('\n');
        }

        let properties = sorted(&schema["properties"]);
        let required: Vec<&str> = array(&schema["required"]).iter().filter_map(text).collect();
        let mut rows = Vec::new();
        let mut children = Vec::new();
        for (name, field) in &properties {
            let field_path = join(path, name);
            let kubernetes = KUBERNETES_TYPES.iter().find(|t| t.path == field_path);
            if kubernetes.is_some() {
                self.collapsed.push(field_path.clone());
            }
            // The object this field's section shows: itself, or its items (`x[]`), or its
            // items' items; none for a scalar, a map, or a field shown in one row.
            let mut section = None;
            if kubernetes.is_none() {
                let mut target = (*field, field_path.clone());
                while target.0["type"] == "array" && !opaque(target.0) {
                    target = (&target.0["items"], format!("{}[]", target.1));
                }
                if expandable(target.0) {
                    section = Some(target);
                }
            }
            let link = section
                .as_ref()
                .map(|(_, p)| anchor(&format!("{prefix}{p}")));
            rows.push(field_row(
                name,
                field,
                required.contains(&name.as_str()),
                link.as_deref(),
                kubernetes,
            ));
            if let Some(child) = section {
                children.push(child);
            }
        }
        if rows.is_empty() {
            self.out.push_str("No fields.\n\n");
        } else {
            self.out.push_str(&table(
                &[
                    "Field",
                    "Type",
                    "Required",
                    "Default",
                    "Validation",
                    "Description",
                ],
                &rows,
            ));
            self.out.push('\n');
        }
        for (child, child_path) in children {
            self.object(child, &format!("{prefix}{child_path}"), &child_path, prefix)?;
        }
        Ok(())
    }
}

/// One row of a section's table. `link` is the anchor of the field's own section, if it has
/// one; `kubernetes` names the type a field passes through.
fn field_row(
    name: &str,
    field: &Value,
    required: bool,
    link: Option<&str>,
    kubernetes: Option<&KubernetesType>,
) -> Vec<String> {
    let name_cell = match link {
        Some(id) => format!("[{}](#{id})", code(name)),
        None => code(name),
    };
    let mut description = text(&field["description"]).unwrap_or_default().to_string();
    let type_cell = match kubernetes {
        Some(t) => {
            let named = format!("[{}]({})", t.name, t.docs);
            let shape = if field["type"] == "array" {
                format!("array of Kubernetes {named}")
            } else {
                format!("Kubernetes {named}")
            };
            append(
                &mut description,
                &format!(
                    "Passed to the relay pods as is: the fields of a Kubernetes {}.",
                    t.name
                ),
            );
            shape
        }
        None => type_name(field),
    };
    if opaque(field) {
        append(
            &mut description,
            "Not checked here: any fields are kept as given (x-kubernetes-preserve-unknown-fields).",
        );
    }
    let default = field
        .get("default")
        .map(|d| code(&d.to_string()))
        .unwrap_or_default();
    vec![
        name_cell,
        type_cell,
        if required { "yes" } else { "no" }.to_string(),
        default,
        validation(field, link),
        cell(&description),
    ]
}

/// The type as a reader says it: `integer (int32)`, `array of string`, `map of string`.
fn type_name(schema: &Value) -> String {
    if schema["x-kubernetes-int-or-string"] == true {
        return "int-or-string".into();
    }
    let base = match text(&schema["type"]) {
        Some("array") => format!("array of {}", type_name(&schema["items"])),
        Some("object") if opaque(schema) => "object (any fields)".into(),
        Some("object") => match schema.get("additionalProperties") {
            Some(values) if values.is_object() && schema.get("properties").is_none() => {
                format!("map of {}", type_name(values))
            }
            _ => "object".into(),
        },
        Some(other) => other.to_string(),
        None => "any".into(),
    };
    match text(&schema["format"]) {
        Some(format) => format!("{base} ({format})"),
        None => base,
    }
}

/// What the API server checks on a field, short enough for a table cell. An object's own
/// rules are listed in its section; the cell links there.
fn validation(field: &Value, link: Option<&str>) -> String {
    let mut parts = Vec::new();
    let values = array(&field["enum"]);
    if !values.is_empty() {
        let values: Vec<String> = values.iter().map(|v| code(&scalar(v))).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    let bounds = [
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("minProperties", "min properties"),
        ("maxProperties", "max properties"),
    ];
    for (key, label) in bounds {
        if let Some(value) = field.get(key) {
            let exclusive = match key {
                "minimum" => field["exclusiveMinimum"] == true,
                "maximum" => field["exclusiveMaximum"] == true,
                _ => false,
            };
            let suffix = if exclusive { " (exclusive)" } else { "" };
            parts.push(format!("{label} {}{suffix}", number(value)));
        }
    }
    if let Some(pattern) = text(&field["pattern"]) {
        parts.push(format!("pattern {}", code(pattern)));
    }
    if field["uniqueItems"] == true {
        parts.push("unique items".into());
    }
    // The items of a list of scalars have no section of their own: their checks go here.
    let items = &field["items"];
    if items.is_object() && !expandable(items) {
        let inner = validation(items, None);
        if !inner.is_empty() {
            parts.push(format!("each item: {inner}"));
        }
    }
    if let Some(list_type) = text(&field["x-kubernetes-list-type"]) {
        let keys: Vec<String> = array(&field["x-kubernetes-list-map-keys"])
            .iter()
            .filter_map(text)
            .map(code)
            .collect();
        if keys.is_empty() {
            parts.push(format!("list type {list_type}"));
        } else {
            parts.push(format!(
                "list type {list_type}, keyed by {}",
                keys.join(", ")
            ));
        }
    }
    if let Some(map_type) = text(&field["x-kubernetes-map-type"]) {
        parts.push(format!("map type {map_type}"));
    }
    let rules = array(&field["x-kubernetes-validations"]);
    if !rules.is_empty() {
        match link {
            Some(id) => parts.push(format!("[{} rules](#{id})", rules.len())),
            None => parts.extend(rules.iter().map(rule_text)),
        }
    }
    parts.join("; ")
}

/// A CEL rule with the message the API server answers when it fails (and the field it names).
fn rule_text(rule: &Value) -> String {
    let mut out = code(text(&rule["rule"]).unwrap_or_default());
    if let Some(message) = text(&rule["message"]).or_else(|| text(&rule["messageExpression"])) {
        out.push_str(&format!(": {}", cell(message)));
    }
    if let Some(field_path) = text(&rule["fieldPath"]) {
        out.push_str(&format!(" (field {})", code(field_path)));
    }
    if let Some(reason) = text(&rule["reason"]) {
        out.push_str(&format!(" (reason {})", code(reason)));
    }
    out
}

/// Whether a field is passed through unchecked (`x-kubernetes-preserve-unknown-fields`).
fn opaque(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == true
}

/// Whether a schema is an object with fields of its own, worth a section.
fn expandable(schema: &Value) -> bool {
    !opaque(schema)
        && schema["properties"]
            .as_object()
            .is_some_and(|p| !p.is_empty())
}

/// The properties of an object schema, by name: the page's order does not depend on how the
/// YAML or serde_json's map orders them.
fn sorted(properties: &Value) -> Vec<(&String, &Value)> {
    let mut fields: Vec<(&String, &Value)> = properties
        .as_object()
        .map(Map::iter)
        .into_iter()
        .flatten()
        .collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    fields
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn append(description: &mut String, sentence: &str) {
    if !description.is_empty() {
        description.push(' ');
    }
    description.push_str(sentence);
}

fn text(value: &Value) -> Option<&str> {
    value.as_str()
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// An enum value as written in a manifest: strings without quotes.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(_) => number(value),
        other => other.to_string(),
    }
}

/// A bound as a person writes it: YAML gives `maximum: 10000.0` as a float, shown as 10000.
fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(f) if value.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => {
            format!("{}", f as i64)
        }
        _ => value.to_string(),
    }
}
