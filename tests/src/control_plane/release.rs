//! Which Kubernetes a test control plane runs. make test runs every test on the release the
//! node is built from, and the API-only tests (the CRD, the chart, the operator as a process)
//! once more on the oldest minor the chart supports, with `OUTBOX_KUBERNETES=oldest`.

use std::path::PathBuf;

use anyhow::Context as _;

/// The environment variable that picks the release: unset or `current`, or `oldest`.
pub const RELEASE_ENV: &str = "OUTBOX_KUBERNETES";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// `tests/control-plane`: the control plane, the node's kubelet and kube-proxy, kubectl.
    Current,
    /// `tests/control-plane/oldest`: etcd, kube-apiserver and kubectl only; no controller
    /// manager, so nothing the API server stores is acted on (no ReplicaSets, no default
    /// ServiceAccounts, no namespace deletion).
    Oldest,
}

impl Release {
    /// The release `OUTBOX_KUBERNETES` names; a value it does not know is an error that says
    /// which values there are.
    pub fn from_env() -> anyhow::Result<Release> {
        match std::env::var(RELEASE_ENV).as_deref() {
            Err(_) | Ok("") | Ok("current") => Ok(Release::Current),
            Ok("oldest") => Ok(Release::Oldest),
            Ok(other) => anyhow::bail!(
                "{RELEASE_ENV}={other:?} is not a Kubernetes release of the tests: use `current` (the default) or `oldest`"
            ),
        }
    }

    /// The Go module that builds its binaries.
    pub fn module_dir(self) -> PathBuf {
        let root = crate::repo_root().join("tests/control-plane");
        match self {
            Release::Current => root,
            Release::Oldest => root.join("oldest"),
        }
    }

    /// `v1.37.2`: the `k8s.io/kubernetes` version its module requires, which `build.sh`
    /// stamps into the binaries.
    pub fn version(self) -> anyhow::Result<String> {
        let go_mod = self.module_dir().join("go.mod");
        let text = std::fs::read_to_string(&go_mod)
            .with_context(|| format!("read {}", go_mod.display()))?;
        text.lines()
            .find_map(|line| line.trim().strip_prefix("k8s.io/kubernetes v"))
            .and_then(|rest| rest.split_whitespace().next())
            .map(|version| format!("v{version}"))
            .with_context(|| format!("{} does not require k8s.io/kubernetes", go_mod.display()))
    }

    /// Whether it runs kube-controller-manager (and can run the node).
    pub fn runs_controllers(self) -> bool {
        self == Release::Current
    }
}
