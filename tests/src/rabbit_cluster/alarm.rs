//! RabbitMQ's resource alarms, raised and cleared on purpose on a node of the 3.10 cluster (the
//! alarm tests' cluster).

use std::time::Duration;

use super::Cluster;
use super::node::Node;

/// The cluster the alarms are raised on.
const CLUSTER: Cluster = Cluster::V3_10;

/// Node `node` (1 to 3) of [`CLUSTER`].
fn on(node: usize) -> Node {
    Node::new(CLUSTER, node)
}

/// A RabbitMQ resource alarm: publishing stops on the whole cluster while it is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `vm_memory_high_watermark` below what the node uses.
    Memory,
    /// `disk_free_limit` above the free disk space.
    Disk,
}

impl Resource {
    /// As `rabbitmqctl status` names it in its `alarms`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Disk => "disk",
        }
    }

    /// The `rabbitmqctl` command that raises it: a watermark of 0, or a free-disk limit far
    /// above any disk here.
    fn raise_args(self) -> [&'static str; 2] {
        match self {
            Resource::Memory => ["set_vm_memory_high_watermark", "0"],
            Resource::Disk => ["set_disk_free_limit", "1000GB"],
        }
    }
}

/// The memory alarm raised on node `node` (1 to 3); see [`Alarm`].
pub async fn memory_alarm(node: usize) -> Alarm {
    let mut alarm = Alarm::prepare(node, Resource::Memory).await;
    alarm.raise().await;
    alarm
}

/// The disk alarm raised on node `node` (1 to 3); see [`Alarm`].
pub async fn disk_alarm(node: usize) -> Alarm {
    let mut alarm = Alarm::prepare(node, Resource::Disk).await;
    alarm.raise().await;
    alarm
}

/// An alarm a test raises. It blocks every publisher of the cluster, so only a test holding
/// the [`Lease`] raises one, and never on the tests' shared RabbitMQ. [`Alarm::clear`] sets the
/// value read before raising back and waits until the alarm is gone; a guard raised and not
/// cleared (a failing test) sets it back on drop, synchronously, so the next lease finds no
/// alarm.
pub struct Alarm {
    node: usize,
    resource: Resource,
    /// The `rabbitmqctl` arguments that set the setting back.
    restore: Vec<String>,
    raised: bool,
    cleared: bool,
}

impl Alarm {
    /// Reads the setting to restore from `rabbitmqctl status`; raises nothing yet, so that
    /// [`Alarm::raise`] is one command at the moment it matters.
    pub async fn prepare(node: usize, resource: Resource) -> Self {
        let status = rabbitmq_status(node).await;
        Self {
            node,
            resource,
            restore: restore_args(resource, &status),
            raised: false,
            cleared: false,
        }
    }

    /// Raises the alarm; returns once the command that raised it has (the node acts on a new
    /// watermark or limit at once).
    pub async fn raise(&mut self) {
        // Marked first: a raise that failed half-way is undone too.
        self.raised = true;
        on(self.node).ctl(&self.resource.raise_args()).await;
    }

    /// Sets the setting back, then waits until `rabbitmqctl status` lists no alarm of this
    /// resource (30 s at most, then panics with the alarms still listed).
    pub async fn clear(mut self) {
        let restore: Vec<&str> = self.restore.iter().map(String::as_str).collect();
        on(self.node).ctl(&restore).await;
        self.cleared = true;
        let resource = self.resource.name();
        let gone = crate::wait::for_value(
            "the alarm is no longer listed",
            Duration::from_secs(30),
            || async {
                let listed = alarms(self.node).await;
                (!listed.iter().any(|r| r == resource)).then_some(())
            },
        )
        .await;
        if let Err(e) = gone {
            panic!("{e}: {:?}", alarms(self.node).await);
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        if !self.raised || self.cleared {
            return;
        }
        let outcome = on(self.node).ctl_command(&self.restore).output();
        let said = match outcome {
            Ok(output) if output.status.success() => "set back".to_string(),
            Ok(output) => format!(
                "NOT set back: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Err(e) => format!("NOT set back: {e}"),
        };
        eprintln!(
            "{} alarm on node {} (on drop): {said} ({:?})",
            self.resource.name(),
            self.node,
            self.restore
        );
    }
}

/// The resources in alarm on the cluster, as `rabbitmqctl status` on node `node` lists them
/// (`memory`, `disk`).
pub async fn alarms(node: usize) -> Vec<String> {
    let status = rabbitmq_status(node).await;
    status["alarms"]
        .as_array()
        .map(|alarms| {
            alarms
                .iter()
                .filter_map(|a| a["resource"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `rabbitmqctl status --formatter json` of node `node`.
pub async fn rabbitmq_status(node: usize) -> serde_json::Value {
    let text = on(node).ctl(&["status", "--formatter", "json"]).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("rabbitmqctl status: {e}: {text}"))
}

/// What sets `resource`'s setting back to its value in `status`. A value this module's own
/// raise left (a test killed before it could clear: 0, or 1000 GB) is replaced by RabbitMQ's
/// default, so that a run after it does not keep the alarm for good.
fn restore_args(resource: Resource, status: &serde_json::Value) -> Vec<String> {
    let args: Vec<String> = match resource {
        Resource::Memory => {
            let setting = &status["vm_memory_high_watermark_setting"];
            let relative = setting["relative"].as_f64();
            let absolute = &setting["absolute"];
            match (relative, absolute) {
                (Some(relative), _) if relative > 0.0 => vec![relative.to_string()],
                (None, serde_json::Value::Number(bytes)) => {
                    vec!["absolute".into(), bytes.to_string()]
                }
                (None, serde_json::Value::String(amount)) => {
                    vec!["absolute".into(), amount.clone()]
                }
                _ => {
                    eprintln!("memory watermark {setting} left by an earlier run: 0.4 restored");
                    vec!["0.4".into()]
                }
            }
        }
        Resource::Disk => match status["disk_free_limit"].as_u64() {
            Some(bytes) if bytes < 1_000_000_000_000 => vec![bytes.to_string()],
            other => {
                eprintln!("disk free limit {other:?} left by an earlier run: 50 MB restored");
                vec!["50000000".into()]
            }
        },
    };
    let command = match resource {
        Resource::Memory => "set_vm_memory_high_watermark",
        Resource::Disk => "set_disk_free_limit",
    };
    std::iter::once(command.to_string()).chain(args).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alarm_is_cleared_with_the_setting_it_found() {
        let status = serde_json::json!({
            "vm_memory_high_watermark_setting": {"relative": 0.4},
            "disk_free_limit": 50_000_000u64,
        });
        assert_eq!(
            restore_args(Resource::Memory, &status),
            ["set_vm_memory_high_watermark", "0.4"]
        );
        assert_eq!(
            restore_args(Resource::Disk, &status),
            ["set_disk_free_limit", "50000000"]
        );
        let absolute = serde_json::json!({
            "vm_memory_high_watermark_setting": {"absolute": 2_000_000_000u64},
        });
        assert_eq!(
            restore_args(Resource::Memory, &absolute),
            ["set_vm_memory_high_watermark", "absolute", "2000000000"]
        );
        // What a killed run's raise left: RabbitMQ's defaults instead.
        let left = serde_json::json!({
            "vm_memory_high_watermark_setting": {"relative": 0.0},
            "disk_free_limit": 1_000_000_000_000u64,
        });
        assert_eq!(
            restore_args(Resource::Memory, &left),
            ["set_vm_memory_high_watermark", "0.4"]
        );
        assert_eq!(
            restore_args(Resource::Disk, &left),
            ["set_disk_free_limit", "50000000"]
        );
    }
}
