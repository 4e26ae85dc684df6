//! The resource kinds the in-memory API server knows: exactly those the operator, its event
//! recorder, its leader election and the test kubelet touch.

/// One served resource type, as its URL names it and as its objects carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// The URL segment, e.g. `deployments`.
    pub plural: &'static str,
    pub kind: &'static str,
    /// Writes to the main resource leave `status` alone and `/status` writes touch only it.
    pub status_subresource: bool,
}

impl Kind {
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub const KINDS: &[Kind] = &[
    Kind {
        group: "outboxrelay.io",
        version: "v1alpha1",
        plural: "outboxrelays",
        kind: "OutboxRelay",
        status_subresource: true,
    },
    Kind {
        group: "apps",
        version: "v1",
        plural: "deployments",
        kind: "Deployment",
        status_subresource: true,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        status_subresource: false,
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        status_subresource: false,
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        status_subresource: false,
    },
];

/// The kind served at `group/version/plural`, if any.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<Kind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
        .copied()
}
