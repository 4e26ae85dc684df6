//! A pair member's broker instance: made by `artemis create` (once; kept in the cache for the
//! next pair) with its journal in the pair's shared store, then its `broker.xml` and
//! `artemis.profile` edited. The instance is marked with a hash of this file and the member's
//! arguments, so that a change to either makes it again.
//!
//! Each member has a core acceptor `ARTEMIS_CORE_PORT_OFFSET` above its AMQP port, for the
//! cluster connection that pairs them (static connectors to each other: `artemis create
//! --shared-store` implies a cluster, by default found by UDP multicast, which would join every
//! pair on this machine into one). Both are made with failover-on-shutdown: without it a
//! stopping primary leaves the store "paused" and the backup keeps waiting.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::ports::ARTEMIS_CORE_PORT_OFFSET;

/// This file: the recipe, hashed into each instance's mark.
const RECIPE: &str = include_str!("member.rs");

/// The file an instance's mark is written to, last (an instance cut short is made again).
const MARK: &str = ".outbox-relay";

/// A member's instance, as it is made.
pub struct Instance<'a> {
    /// `primary` or `backup`.
    pub role: &'a str,
    /// Its AMQP 1.0 port.
    pub port: u16,
    /// The other member's AMQP 1.0 port.
    pub other: u16,
    /// The pair's shared store (the journal and the lock the backup waits on).
    pub shared: &'a Path,
}

impl Instance<'_> {
    fn core(&self) -> u16 {
        self.port + ARTEMIS_CORE_PORT_OFFSET
    }

    /// `artemis create`'s arguments, up to the instance's folder.
    fn create_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "create",
            "--silent",
            "--user",
            "outbox",
            "--password",
            "outbox",
            "--allow-anonymous",
            "--host",
            "127.0.0.1",
            "--name",
        ]
        .map(String::from)
        .into();
        args.push(format!("outbox-pair-{}", self.role));
        args.extend(
            [
                "--mapped",
                "--no-fsync",
                "--java-memory",
                "128M",
                "--no-web",
                "--no-autotune",
                "--no-hornetq-acceptor",
                "--no-mqtt-acceptor",
                "--no-stomp-acceptor",
                "--shared-store",
            ]
            .map(String::from),
        );
        if self.role == "backup" {
            args.push("--backup".into());
        }
        args.extend([
            "--failover-on-shutdown".into(),
            "--data".into(),
            self.shared.display().to_string(),
            "--default-port".into(),
            self.core().to_string(),
            "--static-cluster".into(),
            format!("tcp://127.0.0.1:{}", self.other + ARTEMIS_CORE_PORT_OFFSET),
            "--cluster-user".into(),
            "outbox-cluster".into(),
            "--cluster-password".into(),
            "outbox-cluster".into(),
        ]);
        args
    }

    /// The mark of an instance made for this member by this recipe from `home`'s Artemis.
    fn mark(&self, home: &Path) -> String {
        crate::cache_key::of(&[
            RECIPE,
            &home.display().to_string(),
            &self.create_args().join(" "),
        ])
    }

    /// Makes the instance in `dir` with `home`'s `artemis`, unless one made for the same member
    /// by the same recipe is there.
    pub fn make(&self, home: &Path, dir: &Path) -> Result<(), String> {
        let mark = self.mark(home);
        if std::fs::read_to_string(dir.join(MARK)).is_ok_and(|made| made.trim() == mark) {
            return Ok(());
        }
        eprintln!(
            "creating the Artemis {} instance {}",
            self.role,
            dir.display()
        );
        let _ = std::fs::remove_dir_all(dir);
        let parent = dir.parent().expect("an instance folder has a parent");
        std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
        let log = sibling(dir, ".create.log");
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let stderr = file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let status = Command::new(home.join("bin/artemis"))
            .args(self.create_args())
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .status()
            .map_err(|e| format!("run artemis create: {e}"))?;
        if !status.success() {
            return Err(format!(
                "artemis create failed (log: {}):\n{}",
                log.display(),
                crate::daemon::log_tail(&log, 20)
            ));
        }
        edit(&dir.join("etc/broker.xml"), |xml| self.broker_xml(xml))?;
        edit(&dir.join("etc/artemis.profile"), |profile| {
            Ok(java_profile(profile))
        })?;
        std::fs::write(dir.join(MARK), format!("{mark}\n"))
            .map_err(|e| format!("mark {}: {e}", dir.display()))
    }

    /// `broker.xml` as `artemis create` wrote it, edited: AMQP 1.0 alone on the member's port,
    /// the core protocol alone on its core port; as on the tests' broker, no halt on a slow
    /// machine and no blocked producers on a nearly full disk. `Err` when one of the settings
    /// is not there after the edit (a new Artemis wrote the file otherwise).
    fn broker_xml(&self, xml: &str) -> Result<String, String> {
        let edited: String = xml
            .lines()
            .map(|line| {
                let line = if line.contains("<acceptor name=\"amqp\">") {
                    line.replace(
                        "tcp://127.0.0.1:5672?",
                        &format!("tcp://127.0.0.1:{}?", self.port),
                    )
                } else if line.contains("<acceptor name=\"artemis\">") {
                    core_only(line)
                } else {
                    line.to_string()
                };
                line.replace(
                    "<critical-analyzer-policy>HALT<",
                    "<critical-analyzer-policy>LOG<",
                )
                .replace("<max-disk-usage>90<", "<max-disk-usage>-1<")
                    + "\n"
            })
            .collect();
        let expected = [
            format!("\"amqp\">tcp://127.0.0.1:{}?", self.port),
            format!("\"artemis\">tcp://127.0.0.1:{}?", self.core()),
            format!("tcp://127.0.0.1:{}<", self.other + ARTEMIS_CORE_PORT_OFFSET),
            format!("<{}>", self.role),
            "<failover-on-shutdown>true<".to_string(),
            format!("<journal-directory>{}/journal<", self.shared.display()),
        ];
        match expected
            .iter()
            .find(|setting| !edited.contains(setting.as_str()))
        {
            Some(missing) => Err(format!("broker.xml lacks {missing} after the edit")),
            None => Ok(edited),
        }
    }
}

/// The `artemis` acceptor's line speaking CORE only (`protocols=CORE,AMQP,…` → `protocols=CORE`).
fn core_only(line: &str) -> String {
    const KEY: &str = "protocols=";
    let Some(start) = line.find(KEY).map(|at| at + KEY.len()) else {
        return line.to_string();
    };
    let end = line[start..]
        .find(|c: char| !(c.is_ascii_uppercase() || c == ','))
        .map_or(line.len(), |length| start + length);
    format!("{}CORE{}", &line[..start], &line[end..])
}

/// `artemis create` writes -Xms512M whatever --java-memory says: a heap may not start above
/// its maximum.
fn java_profile(profile: &str) -> String {
    profile.replace("-Xms512M", "-Xms64M")
}

/// `DIR` + `suffix`, beside `dir`.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut path = dir.as_os_str().to_owned();
    path.push(suffix);
    path.into()
}

/// Rewrites the file at `path` with `change`.
fn edit(path: &Path, change: impl FnOnce(&str) -> Result<String, String>) -> Result<(), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let changed =
        change(&text).map_err(|e| format!("could not configure {}: {e}", path.display()))?;
    std::fs::write(path, changed).map_err(|e| format!("write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of an `artemis create --shared-store --backup` broker.xml that the edit reads.
    const CREATED: &str = r#"      <critical-analyzer-policy>HALT</critical-analyzer-policy>
      <journal-directory>/c/pairs/slot-0/shared/journal</journal-directory>
      <max-disk-usage>90</max-disk-usage>
      <ha-policy><shared-store><backup><failover-on-shutdown>true</failover-on-shutdown></backup></shared-store></ha-policy>
         <acceptor name="artemis">tcp://127.0.0.1:6787?tcpSendBufferSize=1048576;protocols=CORE,AMQP,STOMP,HORNETQ,MQTT,OPENWIRE;useEpoll=true</acceptor>
         <acceptor name="amqp">tcp://127.0.0.1:5672?tcpSendBufferSize=1048576;protocols=AMQP;useEpoll=true</acceptor>
         <connector name="server0">tcp://127.0.0.1:6786</connector>
"#;

    fn backup() -> Instance<'static> {
        Instance {
            role: "backup",
            port: 5787,
            other: 5786,
            shared: Path::new("/c/pairs/slot-0/shared"),
        }
    }

    #[test]
    fn the_member_speaks_amqp_on_its_port_and_core_only_on_its_core_port() {
        let edited = backup().broker_xml(CREATED).unwrap();
        assert!(
            edited.contains(r#"<acceptor name="amqp">tcp://127.0.0.1:5787?tcpSendBufferSize"#),
            "{edited}"
        );
        assert!(
            edited.contains(";protocols=CORE;useEpoll=true</acceptor>"),
            "{edited}"
        );
        assert!(edited.contains("<critical-analyzer-policy>LOG<"));
        assert!(edited.contains("<max-disk-usage>-1<"));
    }

    #[test]
    fn a_file_without_a_setting_the_pair_needs_is_refused() {
        let without = CREATED.replace("<failover-on-shutdown>true", "<failover-on-shutdown>false");
        let error = backup().broker_xml(&without).unwrap_err();
        assert!(error.contains("<failover-on-shutdown>true<"), "{error}");
    }

    #[test]
    fn the_arguments_name_the_role_the_store_and_the_other_members_core_port() {
        let args = backup().create_args().join(" ");
        assert!(args.contains("--name outbox-pair-backup"), "{args}");
        assert!(
            args.contains("--shared-store --backup --failover-on-shutdown"),
            "{args}"
        );
        assert!(args.contains("--data /c/pairs/slot-0/shared"), "{args}");
        assert!(args.contains("--default-port 6787"), "{args}");
        assert!(
            args.contains("--static-cluster tcp://127.0.0.1:6786"),
            "{args}"
        );
    }
}
