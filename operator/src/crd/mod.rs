//! The `OutboxRelay` custom resource: one relay Deployment per outbox table.
//!
//! Field docs become the CRD's descriptions, so `kubectl explain outboxrelay.spec.scaling`
//! reads like a manual. Defaults live in `#[serde(default = ...)]` so that they show up in the
//! schema (the API server fills them in) and in Rust (tests and old objects get the same values).

pub mod tls;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::tls::{
    BrokerTlsSpec, CaKeyRef, CaSource, DatabaseTlsSpec, PasswordSecretRef, PostgresTlsMode,
    TlsSecretRef,
};

/// API group of every resource this operator defines.
pub const GROUP: &str = "outboxrelay.io";

/// `[A-Za-z_][A-Za-z0-9_]{0,62}`: the identifier pattern the relay crate enforces, repeated in
/// the schema so a typo is refused by `kubectl apply` instead of at reconcile time.
pub const IDENT_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$";
/// A table name, optionally schema-qualified.
pub const TABLE_PATTERN: &str = r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$";
/// Durations as Go and Kubernetes users write them: `200ms`, `10s`, `5m`, `168h`, `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// The version the API server stores, and the one this operator reads and writes.
pub const STORAGE_VERSION: &str = "v1beta1";
/// The first version, still served so that manifests and clients written for it keep working,
/// and marked deprecated (see docs/reference/api-policy.md for how long it stays).
pub const DEPRECATED_VERSION: &str = "v1alpha1";
/// What `kubectl` prints (a `Warning:` line) and every client receives in a `Warning` header
/// on each request through the deprecated version.
pub const DEPRECATION_WARNING: &str = "outboxrelay.io/v1alpha1 OutboxRelay is deprecated; use outboxrelay.io/v1beta1 (the same schema: change the apiVersion only)";
/// The CRD's name on the cluster (`plural.group`).
pub const CRD_NAME: &str = "outboxrelays.outboxrelay.io";

/// The CustomResourceDefinition: `v1beta1` served and stored, `v1alpha1` served and deprecated.
///
/// The two versions have the same schema: v1beta1 promised stability for the fields as they
/// stood, so nothing was renamed or removed at the move. Hence one Rust type (at v1beta1),
/// its generated version copied under the old name, and no conversion: strategy None, under
/// which the API server only rewrites `apiVersion` between them. A later version that changes
/// a field needs a type of its own and a conversion webhook that round-trips every field.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = OutboxRelay::crd();
    let current = crd.spec.versions[0].clone();
    let deprecated = CustomResourceDefinitionVersion {
        name: DEPRECATED_VERSION.to_string(),
        served: true,
        storage: false,
        deprecated: Some(true),
        deprecation_warning: Some(DEPRECATION_WARNING.to_string()),
        ..current.clone()
    };
    crd.spec.versions = vec![current, deprecated];
    crd
}

/// [`crd`] as one YAML document: what `outbox-operator crd` prints and what
/// `crds/outboxrelays.yaml` holds. It sat in a child module, which needed `OutboxRelay` from
/// here while this module re-exported its function: an import circle
/// (tests/tests/repo_imports.rs).
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&crd()).expect("a CRD always serializes to YAML")
}

/// Desired state of an outbox relay: where the outbox table is, where messages go, how the
/// relay pods run and how many of them there are.
// Printer columns repeat `type_ = "integer"`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "outboxrelay.io",
    version = "v1beta1",
    kind = "OutboxRelay",
    plural = "outboxrelays",
    shortname = "obr",
    namespaced,
    status = "OutboxRelayStatus",
    derive = "PartialEq",
    doc = "Relays the rows of one transactional-outbox table from PostgreSQL to RabbitMQ or an AMQP 1.0 broker, with a Deployment of relay workers the operator creates, migrates the table for, and scales on backlog.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Suspended",
        type_ = "boolean",
        json_path = ".spec.suspend",
        description = "Delivery suspended by spec.suspend"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Backlog", type_ = "integer", json_path = ".status.backlog"),
    printcolumn(
        name = "Oldest",
        type_ = "number",
        json_path = ".status.oldestAgeSeconds",
        description = "Age in seconds of the oldest pending row"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
// Spans two sections, so it sits here and not on BrokerSpec with the other protocol rules.
#[x_kube(
    validation = Rule::new("!has(self.relay) || !has(self.relay.ordering) || self.relay.ordering != 'perKey' || (has(self.database.columns) && has(self.database.columns.partitionKey))").message("relay.ordering perKey orders the rows of each partition key: set database.columns.partitionKey (e.g. the aggregate id), or use ordering unordered").field_path(".relay.ordering"),
    validation = Rule::new("!has(self.database.columns) || !has(self.database.columns.partitionKey) || (has(self.relay) && has(self.relay.ordering) && self.relay.ordering == 'perKey')").message("database.columns.partitionKey only has a meaning with relay.ordering perKey: set it, or remove the column").field_path(".database.columns.partitionKey"),
    validation = Rule::new("!has(self.database.poolMode) || self.database.poolMode != 'transaction' || has(self.database.sessionUrlSecretRef)").message("database.poolMode transaction needs database.sessionUrlSecretRef: the migration, per-key ordering and LISTEN take session advisory locks or listen, which a transaction pool cannot keep; give a URL of the server itself or of a session pool").field_path(".database.sessionUrlSecretRef"),
    validation = Rule::new("!has(self.database.sessionUrlSecretRef) || (has(self.database.poolMode) && self.database.poolMode == 'transaction')").message("database.sessionUrlSecretRef is only used with database.poolMode transaction: set it, or remove the session URL").field_path(".database.sessionUrlSecretRef"),
    validation = Rule::new("!has(self.broker.protocol) || self.broker.protocol != 'amqp10' || !has(self.database.columns) || !has(self.database.columns.routingKey)").message("columns.routingKey is an AMQP 0-9-1 mapping with no meaning under broker.protocol amqp10 (the row's type goes in the subject property): remove it").field_path(".database.columns.routingKey")
)]
#[serde(rename_all = "camelCase")]
pub struct OutboxRelaySpec {
    /// Relay pods to run when `scaling` is absent (manual mode). `kubectl scale obr/NAME
    /// --replicas=N` writes this field through the scale subresource. Ignored while `scaling`
    /// is set.
    #[serde(default = "defaults::replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// The PostgreSQL database and the outbox table in it.
    pub database: DatabaseSpec,
    /// The broker messages are published to: RabbitMQ over AMQP 0-9-1, or an AMQP 1.0 broker.
    pub broker: BrokerSpec,
    /// How each relay pod runs.
    #[serde(default)]
    pub relay: RelaySpec,
    /// Autoscaling on the backlog of pending rows. Absent: the relay runs `replicas` pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,
    /// Stop delivery without deleting anything: the relay's Deployment goes to zero pods (each
    /// finishes its batch in flight, commits and exits), the autoscaler computes nothing, and
    /// the operator measures the backlog itself, so `status.backlog` still moves. The status
    /// says `Suspended`. Setting it back to false resumes where delivery stopped: `replicas`
    /// pods, or with `scaling` the autoscaler starting from zero pods as it does when it wakes
    /// a relay, or with `scaling.paused` the number of pods that ran before the suspension
    /// (kept on the Deployment meanwhile). Unlike `scaling.paused`, which only freezes the
    /// number of pods, nothing is delivered while suspended.
    #[serde(default)]
    pub suspend: bool,
}

/// A key in a Secret of the relay's namespace. The value is handed to the relay pods as an
/// environment variable reference; the operator never copies it anywhere.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret, in the namespace of the OutboxRelay.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret whose value is the connection URL.
    #[serde(default = "defaults::secret_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// The outbox table and the database that holds it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Secret key holding the PostgreSQL URL (postgres://user:password@host:5432/db). Never
    /// give the URL by value.
    pub url_secret_ref: SecretKeyRef,
    /// A Secret key holding the password, mounted into the relay pods as a file read at every
    /// new connection (a rotated password or cloud token is used without a restart); it wins
    /// over a password in the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<PasswordSecretRef>,
    /// What the URL reaches: session (the server, or a pooler in session mode) or transaction
    /// (PgBouncer pool_mode = transaction). With transaction the relays send unnamed statements
    /// inside transactions, and sessionUrlSecretRef is required for what needs a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_mode: Option<PoolMode>,
    /// Secret key holding a URL with a session of its own (the server directly, or a session
    /// pool), used under poolMode transaction for per-key ordering, LISTEN wake-ups and the
    /// operator's own migration and measurements (they take session advisory locks). The
    /// password and TLS settings above apply to it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_url_secret_ref: Option<SecretKeyRef>,
    /// TLS to the database. Absent: the URL's own sslmode (libpq's default, prefer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<DatabaseTlsSpec>,
    /// The outbox table, optionally schema-qualified (`schema.table`).
    #[serde(default = "defaults::table")]
    #[schemars(regex(pattern = r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub table: String,
    /// Column names of the outbox table; every one defaults to the reference table's name.
    #[serde(default)]
    pub columns: ColumnsSpec,
    /// Build the reference article's covering index `(occurred, processed) INCLUDE (id, type,
    /// payload)` instead of the default `(occurred) INCLUDE (id)`. Unsafe for payloads above
    /// about 2.7 kB: PostgreSQL limits a B-tree entry to 2704 bytes, and every INSERT of a
    /// larger row then fails. Off by default.
    #[serde(default)]
    pub covering_index: bool,
    /// Install a statement-level trigger that NOTIFYs idle relays when rows are inserted, for
    /// lower latency than polling.
    #[serde(default)]
    pub notify_trigger: bool,
    /// Set `Degraded=True` with reason `VacuumBlocked` when the database's cleanup horizon
    /// (its oldest open snapshot, transaction, prepared transaction or replication slot) is
    /// older than this: while it is held, VACUUM cannot remove the table's dead rows and every
    /// claim slows down. The measuring relay pod reports the holder.
    #[serde(default = "defaults::vacuum_blocked_after")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub vacuum_blocked_after: String,
    /// What deleting the OutboxRelay does in the database. `retain` (the default) keeps the
    /// pending-row index, the NOTIFY trigger, the relay's report rows and the autovacuum
    /// settings, so another relay (or `outbox-relay run`) can take the table over as it is;
    /// `delete` removes them. Either way the relay's claim on the table is released, and the
    /// outbox table and its rows are never touched.
    #[serde(default)]
    pub cleanup_policy: CleanupPolicy,
}

/// What the operator removes from the database when an OutboxRelay is deleted.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum CleanupPolicy {
    /// Keep what the migration created; only the table's claim is released.
    #[default]
    Retain,
    /// Also drop the pending-row index and the NOTIFY trigger, delete the relay's report rows
    /// and reset the autovacuum settings the migration set.
    Delete,
}

/// The column mapping of the outbox table.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ColumnsSpec {
    /// uuid primary key; becomes the AMQP message_id so consumers can deduplicate.
    #[serde(default = "defaults::id_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub id: String,
    /// Message type (text or varchar); the AMQP type property and the default routing key.
    #[serde(rename = "type", default = "defaults::type_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub kind: String,
    /// Message body (jsonb, json, text or bytea), sent as is.
    #[serde(default = "defaults::payload_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub payload: String,
    /// When the row was written (timestamptz); rows are claimed in this order.
    #[serde(default = "defaults::occurred_at_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub occurred_at: String,
    /// Set when the row was relayed (timestamptz, nullable); NULL means pending.
    #[serde(default = "defaults::processed_at_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub processed_at: String,
    /// Receives the last failure text (text, nullable).
    #[serde(default = "defaults::error_column")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub error: String,
    /// Optional per-row routing key (text); rows where it is NULL use the type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub routing_key: Option<String>,
    /// Optional jsonb column with AMQP headers (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub headers: Option<String>,
    /// Optional integer column counting broker rejections; without it a rejected message is
    /// dead-lettered at its first rejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub attempts: Option<String>,
    /// Optional partition key (text, varchar, uuid or integer; e.g. the aggregate id) that
    /// relay.ordering perKey keeps in order. Required with perKey, refused without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub partition_key: Option<String>,
    /// Optional text column with the W3C traceparent the producing service wrote in its
    /// transaction: sent on as the traceparent header (application property under amqp10),
    /// so the consumer continues the producer's trace. A malformed one is left off and counted
    /// (outbox_relay_trace_context_invalid_total); the message still goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub traceparent: Option<String>,
    /// Optional text column with the W3C tracestate that goes with traceparent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"))]
    pub tracestate: Option<String>,
}

impl Default for ColumnsSpec {
    fn default() -> Self {
        Self {
            id: defaults::id_column(),
            kind: defaults::type_column(),
            payload: defaults::payload_column(),
            occurred_at: defaults::occurred_at_column(),
            processed_at: defaults::processed_at_column(),
            error: defaults::error_column(),
            routing_key: None,
            headers: None,
            attempts: None,
            partition_key: None,
            traceparent: None,
            tracestate: None,
        }
    }
}

/// Where and how messages are published.
///
/// The rules below refuse, at `kubectl apply`, the AMQP 0-9-1 options that mean nothing to an
/// AMQP 1.0 broker (the relay refuses them too: a pod would only crash-loop on them). Each rule
/// first asks `has(...)`, so it holds on objects written before the field existed.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || has(self.address)").message("address is required with protocol amqp10: the queue or topic to send to").field_path(".address"),
    validation = Rule::new("(has(self.protocol) && self.protocol == 'amqp10') || !has(self.address)").message("address is an AMQP 1.0 field: set protocol: amqp10, or publish to an exchange with amqp091").field_path(".address"),
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || !has(self.exchange)").message("exchange is an AMQP 0-9-1 field with no meaning under amqp10 (address says where messages go): remove it").field_path(".exchange"),
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || !has(self.routingKey)").message("routingKey is an AMQP 0-9-1 field with no meaning under amqp10 (the row's type goes in the subject property): remove it").field_path(".routingKey"),
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || !has(self.mandatory) || !self.mandatory").message("mandatory is an AMQP 0-9-1 field with no meaning under amqp10 (the broker refuses an unknown address when the link attaches): remove it").field_path(".mandatory"),
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || !has(self.deadLetterExchange)").message("deadLetterExchange is an AMQP 0-9-1 field with no meaning under amqp10 (rows given up on keep their error in the error column): remove it").field_path(".deadLetterExchange"),
    validation = Rule::new("!has(self.protocol) || self.protocol != 'amqp10' || !has(self.publisherConfirms) || self.publisherConfirms").message("publisherConfirms: false has no meaning under amqp10, which always waits for the broker's outcome: remove it").field_path(".publisherConfirms")
)]
pub struct BrokerSpec {
    /// Secret key holding the broker URL (amqp://user:password@host:5672/%2f). Never give the
    /// URL by value. With protocol amqp10: amqp://user:password@host:5672 (SASL PLAIN; for
    /// Azure Service Bus the shared-access policy name and its key). For a cluster, or an AMQP
    /// 1.0 live/backup pair, a comma-separated list of full URLs, one per node
    /// (amqp://u:p@rabbit-0:5672/%2f,amqp://u:p@rabbit-1:5672/%2f): the relay connects to one
    /// and moves to the next when it is lost or refuses.
    pub url_secret_ref: SecretKeyRef,
    /// A Secret key holding the broker password, mounted as a file read at every connect; it
    /// wins over a password in the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<PasswordSecretRef>,
    /// TLS settings for an amqps:// URL: the CA to trust and a client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BrokerTlsSpec>,
    /// Wire protocol. amqp091: RabbitMQ's own protocol, publishing to `exchange`. amqp10: AMQP
    /// 1.0 (Azure Service Bus, ActiveMQ Artemis, RabbitMQ's AMQP 1.0 plugin), a sender link to
    /// `address`; exchange, routingKey, mandatory, deadLetterExchange, publisherConfirms: false
    /// and the routingKey column are AMQP 0-9-1 options and are refused with it.
    #[serde(default)]
    pub protocol: BrokerProtocol,
    /// AMQP 1.0 target address: a queue or topic (Service Bus: the entity path; Artemis: the
    /// address name). RabbitMQ 4: /queues/NAME, or /exchanges/NAME/ROUTING_KEY (its v2 format);
    /// RabbitMQ 3.x: /amq/queue/NAME or /exchange/NAME/ROUTING_KEY (v1, deprecated in 4.0 and
    /// refused where amqp_address_v1 is not permitted). Required with protocol amqp10, refused
    /// with amqp091.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = ADDRESS_MAX))]
    pub address: Option<String>,
    /// Exchange to publish to (amqp091); "" is the default exchange. Absent: outbox. Not
    /// with protocol amqp10, which sends to `address` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AMQP_SHORT_STRING_MAX))]
    pub exchange: Option<String>,
    /// One static routing key for every message. Absent: the routing-key column when it is
    /// mapped, else the row's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AMQP_SHORT_STRING_MAX))]
    pub routing_key: Option<String>,
    /// Wait for broker confirms before marking rows. Turning this off is allowed but UNSAFE:
    /// rows are marked even when the broker lost the message.
    #[serde(default = "defaults::yes")]
    pub publisher_confirms: bool,
    /// Publish with the mandatory flag, so unroutable messages come back as failures (and spend
    /// an attempt) instead of being dropped by the broker.
    #[serde(default)]
    pub mandatory: bool,
    /// Exchange that receives messages dead-lettered after maxAttempts rejections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AMQP_SHORT_STRING_MAX))]
    pub dead_letter_exchange: Option<String>,
    /// Send every message as a CloudEvent. Absent: plain messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_events: Option<CloudEventsSpec>,
}

/// CloudEvents binary content mode: the payload stays the row's, byte for byte; the event's
/// attributes (specversion 1.0, id ← the message id, type ← the type column, source ← `source`,
/// time ← the occurredAt column, subject ← the partition key when mapped, datacontenttype ←
/// the content type) go as `ce-` headers under amqp091 (RabbitMQ's CloudEvents binding, read
/// by Knative and the CloudEvents SDKs) and as `cloudEvents:` application properties under
/// amqp10 (the CloudEvents AMQP binding). Remove the block to send plain messages.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CloudEventsSpec {
    /// binary, the only content mode offered (structured mode would rewrite the payload).
    #[serde(default)]
    pub mode: CloudEventsContentMode,
    /// The source attribute of every event: a URI-reference (RFC 3986) naming the producer,
    /// e.g. /orders, urn:example:orders or https://example.com/orders.
    #[schemars(length(min = 1, max = 2048))]
    pub source: String,
}

/// How the event travels. One value, so that a later structured mode is a new value and not a
/// new field; no `off` (YAML 1.1 readers, kubectl's among them, take `off` for false).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum CloudEventsContentMode {
    /// Attributes in headers (application properties), the payload untouched.
    #[default]
    Binary,
}

/// Longest `broker.address` accepted: AMQP 1.0 sets no limit, Service Bus entity paths stop at
/// 260 characters, and a bound keeps the CEL rules' cost estimate small.
pub const ADDRESS_MAX: usize = 1024;

// The relay's own types: one definition of each mode, whatever reads it (flag, YAML, CRD).
pub use outbox_relay::broker::BrokerProtocol;
pub use outbox_relay::config::LogFormat;
pub use outbox_relay::database::PoolMode;
use outbox_relay::defaults::AMQP_SHORT_STRING_MAX;
pub use outbox_relay::table::outbox::DeliveryMode;

/// Delivery order, as the CRD spells it (the relay's flag says `per-key`).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum RelayOrdering {
    /// No promise: parallel workers and pods publish concurrently.
    #[default]
    Unordered,
    /// Per partition key, in claim order; different keys in parallel.
    PerKey,
}

impl RelayOrdering {
    /// The relay's own value.
    pub fn delivery_order(self) -> outbox_relay::table::outbox::DeliveryOrder {
        match self {
            Self::Unordered => outbox_relay::table::outbox::DeliveryOrder::Unordered,
            Self::PerKey => outbox_relay::table::outbox::DeliveryOrder::PerKey,
        }
    }
}

/// When the kubelet pulls the relay image.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ImagePullPolicy {
    Always,
    #[default]
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// How each relay pod runs.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RelaySpec {
    /// Relay image. Absent: the operator's own image, so operator and relay never skew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// When the kubelet pulls the image.
    #[serde(default)]
    pub image_pull_policy: ImagePullPolicy,
    /// Rows claimed, published and marked per transaction.
    #[serde(default = "defaults::batch_size")]
    #[schemars(range(min = 1, max = 10000))]
    pub batch_size: i32,
    /// Concurrent claimers per pod, each with its own database connection and AMQP channel.
    #[serde(default = "defaults::workers_per_pod")]
    #[schemars(range(min = 1, max = 64))]
    pub workers_per_pod: i32,
    /// Batches a pod has at the broker at once; the other workers claim meanwhile and publish
    /// as soon as a slot frees. 1 suits a queue on a nearby broker (it confirms one batch at a
    /// time fastest); raise it for a distant broker. 0: one per worker.
    #[serde(default = "defaults::inflight_batches")]
    #[schemars(range(min = 0, max = 64))]
    pub inflight_batches: i32,
    /// mark (set processed-at) or delete (remove the row) after the broker confirmed it.
    #[serde(default)]
    pub delivery_mode: DeliveryMode,
    /// unordered, or perKey: the rows of one database.columns.partitionKey value reach the
    /// broker in claim order, one at a time, while different keys flow in parallel across
    /// workers and pods. perKey needs the partitionKey column.
    #[serde(default)]
    pub ordering: RelayOrdering,
    /// Most messages per second the relay publishes, across all its pods (fractions allowed).
    /// The operator divides it among the pods it runs (at least 1 msg/s each) through the
    /// limits table the pods read at each report interval, so a scale does not restart them;
    /// the autoscaler adds no pod the limit would leave idle. Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 1.0e9))]
    pub max_rate: Option<f64>,
    /// Broker rejections before a message is dead-lettered, so one bad message never blocks
    /// the rest.
    #[serde(default = "defaults::max_attempts")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_attempts: i32,
    /// Longest wait for the confirms of one batch.
    #[serde(default = "defaults::publish_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub publish_timeout: String,
    /// Pause between claims while the table is empty.
    #[serde(default = "defaults::poll_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub poll_interval: String,
    /// How often each pod writes its lag report (publish rate; backlog from one pod).
    #[serde(default = "defaults::report_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub report_interval: String,
    /// In mark mode, processed rows older than this are deleted by the relay (e.g. 168h).
    /// Absent: processed rows are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub processed_retention: Option<String>,
    /// How long PostgreSQL lets a relay session sit idle inside a transaction before it ends
    /// the session and the rows it claimed return to pending: a pod that stalls with claims
    /// holds them no longer. Longer than publishTimeout (a batch awaits its confirms inside
    /// its transaction). Not sent under poolMode transaction. Absent: 30s, or 20s above a
    /// longer publishTimeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub idle_in_transaction_timeout: Option<String>,
    /// Within this PostgreSQL ends the session of a relay pod whose connection went silent (a
    /// network partition, a node gone), so other pods take its claimed rows: server-side TCP
    /// keepalives and tcp_user_timeout set per session. At least 4s. Not sent under poolMode
    /// transaction. Absent: 15s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub dead_client_timeout: Option<String>,
    /// The AMQP 0-9-1 heartbeat the pods ask the broker for (whole seconds; the lower of this
    /// and the broker's wins): a broker that misses two is taken as gone and the batch in
    /// flight is given back. Absent: 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub broker_heartbeat: Option<String>,
    /// Log format of the relay pods: json (the default, for log pipelines) or text.
    #[serde(default = "defaults::log_format")]
    pub log_format: LogFormat,
    /// Seconds a pod gets after SIGTERM to finish its batch in flight and commit.
    #[serde(default = "defaults::termination_grace_period_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub termination_grace_period_seconds: i64,
    /// CPU and memory requests and limits of the relay container. Absent: 50m CPU and
    /// 32Mi + 16Mi per worker requested, a memory limit of 128Mi + 64Mi per worker (64Mi and
    /// 256Mi at 2 workers), room for batches of 500 rows of up to about 60 kB; raise the
    /// limit by about 2 × batchSize × payload size per worker for larger payloads. {}: none
    /// (a BestEffort pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra annotations on the relay pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Extra labels on the relay pods (the operator's own labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// Node selector of the relay pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the relay pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the relay pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the relay pods spread over nodes and zones. Absent: over nodes (topologyKey
    /// kubernetes.io/hostname, maxSkew 1, whenUnsatisfiable ScheduleAnyway: a preference the
    /// scheduler drops when no node can meet it). A constraint without labelSelector gets the
    /// relay pods' labels. []: no constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// The PodDisruptionBudget of the relay pods: how many a voluntary disruption (a node
    /// drain, a cluster upgrade) may take down at once. It limits evictions only, never a
    /// scale-down or a rollout.
    #[serde(default)]
    pub disruption_budget: DisruptionBudgetSpec,
    /// Service account of the relay pods. The relay never calls the Kubernetes API, so its
    /// token is not mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets for pulling the relay image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Priority class of the relay pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Spans of the relay's own work (one per batch: claim, publish, settle, linked to the
    /// trace context of every message in it), exported over OTLP/HTTP (http/protobuf) to a
    /// collector. Absent: no spans are exported, and the pods are what they were without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSpec>,
}

/// `spec.relay.tracing`: where the relay pods send their spans. The pods get the standard
/// OpenTelemetry variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`
/// http/protobuf, `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_RESOURCE_ATTRIBUTES` with the namespace, pod and Deployment names).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("isURL(self.otlpEndpoint) && url(self.otlpEndpoint).getScheme() in ['http', 'https'] && url(self.otlpEndpoint).getHostname() != ''").message("otlpEndpoint must be an http:// or https:// URL with a host: the collector's OTLP/HTTP base URL, e.g. http://otel-collector.observability:4318").field_path(".otlpEndpoint"),
    validation = Rule::new("!self.otlpEndpoint.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')").message("otlpEndpoint must not carry a user or password: it is written into the pod spec as plain text; put the credentials in the Secret of headersSecretRef (e.g. Authorization=Basic ...)").field_path(".otlpEndpoint")
)]
pub struct TracingSpec {
    /// The OTLP/HTTP base URL of the collector or tracing backend, http:// or https://, e.g.
    /// http://otel-collector.observability:4318 (the relay posts to its /v1/traces). Only
    /// OTLP/HTTP with protobuf is spoken, not gRPC (port 4317). No credentials in it: use
    /// headersSecretRef.
    #[schemars(length(min = 1, max = OTLP_ENDPOINT_MAX))]
    pub otlp_endpoint: String,
    /// The fraction of batches traced, from 0 to 1 (0.1: one batch in ten, chosen by trace
    /// id). Absent: the OpenTelemetry default, every batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sample_ratio: Option<f64>,
    /// A Secret key whose value is the headers sent with every export, as
    /// OTEL_EXPORTER_OTLP_HEADERS writes them: key=value pairs separated by commas, values
    /// percent-encoded (e.g. `x-honeycomb-team=KEY` or `Authorization=Basic%20dXNlcjpwYXNz`).
    /// Handed to the pods as a Secret reference, never copied; a change of the Secret
    /// restarts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_secret_ref: Option<OtlpHeadersSecretRef>,
}

/// Longest `spec.relay.tracing.otlpEndpoint` accepted: room for any real URL, and a bound that
/// keeps the CEL rules' cost estimate small.
pub const OTLP_ENDPOINT_MAX: usize = 2048;

/// A Secret key holding OTEL_EXPORTER_OTLP_HEADERS text (an API key or an Authorization
/// header: a secret).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OtlpHeadersSecretRef {
    /// Name of the Secret, in the namespace of the OutboxRelay.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret whose value is the headers text.
    #[serde(default = "defaults::otlp_headers_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// `spec.relay.disruptionBudget`: the relay pods' PodDisruptionBudget, owned by the
/// OutboxRelay.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudgetSpec {
    /// false: no PodDisruptionBudget (the operator deletes the one it made).
    #[serde(default = "defaults::disruption_budget_enabled")]
    pub enabled: bool,
    /// Relay pods a voluntary disruption may take down at once: a number, or a percentage of
    /// the replicas such as "50%". With 1, a drain never takes every pod of a relay at once
    /// while it runs two or more; a relay with one pod can still be drained.
    #[serde(default = "defaults::max_unavailable")]
    pub max_unavailable: IntOrString,
}

impl Default for DisruptionBudgetSpec {
    fn default() -> Self {
        Self {
            enabled: defaults::disruption_budget_enabled(),
            max_unavailable: defaults::max_unavailable(),
        }
    }
}

impl Default for RelaySpec {
    fn default() -> Self {
        Self {
            image: None,
            image_pull_policy: ImagePullPolicy::default(),
            batch_size: defaults::batch_size(),
            workers_per_pod: defaults::workers_per_pod(),
            inflight_batches: defaults::inflight_batches(),
            delivery_mode: DeliveryMode::default(),
            ordering: RelayOrdering::default(),
            max_rate: None,
            max_attempts: defaults::max_attempts(),
            publish_timeout: defaults::publish_timeout(),
            poll_interval: defaults::poll_interval(),
            report_interval: defaults::report_interval(),
            processed_retention: None,
            idle_in_transaction_timeout: None,
            dead_client_timeout: None,
            broker_heartbeat: None,
            log_format: defaults::log_format(),
            termination_grace_period_seconds: defaults::termination_grace_period_seconds(),
            resources: None,
            pod_annotations: BTreeMap::new(),
            pod_labels: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            topology_spread_constraints: None,
            disruption_budget: DisruptionBudgetSpec::default(),
            service_account_name: None,
            image_pull_secrets: Vec::new(),
            priority_class_name: None,
            tracing: None,
        }
    }
}

/// Autoscaling on the backlog the relay pods report, with the semantics of the HPA and KEDA:
/// desired = ceil(backlog / targetBacklogPerReplica), clamped to [minReplicas, maxReplicas].
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not be greater than maxReplicas"),
    validation = Rule::new("!has(self.fallback) || self.fallback.replicas <= self.maxReplicas").message("fallback.replicas must not be greater than maxReplicas")
)]
pub struct ScalingSpec {
    /// Fewest pods; 0 allows scaling to zero when the table stays empty for cooldownPeriod.
    #[serde(default = "defaults::min_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: i32,
    /// Most pods.
    #[serde(default = "defaults::max_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Pending rows one pod is expected to handle.
    #[serde(default = "defaults::target_backlog_per_replica")]
    #[schemars(range(min = 1))]
    pub target_backlog_per_replica: i64,
    /// Throughput-aware target: size the relay so the backlog drains within this many seconds
    /// at the measured publish rate per pod. Absent: targetBacklogPerReplica alone decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_drain_seconds: Option<i64>,
    /// From zero pods, start one only when the backlog exceeds this many rows.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub activation_backlog: i64,
    /// How often the operator re-evaluates the replicas.
    #[serde(default = "defaults::polling_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub polling_interval: String,
    /// From one pod, go to zero only after this long with no backlog.
    #[serde(default = "defaults::cooldown_period")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub cooldown_period: String,
    /// Relative change below which the replicas stay as they are (0.1 = 10 %).
    #[serde(default = "defaults::tolerance")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub tolerance: f64,
    /// How fast to scale up.
    #[serde(default = "ScalingRules::default_up")]
    pub scale_up: ScalingRules,
    /// How fast to scale down.
    #[serde(default = "ScalingRules::default_down")]
    pub scale_down: ScalingRules,
    /// What to run when the pods' reports are stale or missing: never a silent scale to zero.
    #[serde(default)]
    pub fallback: FallbackSpec,
    /// Freeze the replicas where they are.
    #[serde(default)]
    pub paused: bool,
}

/// Scaling behaviour in one direction, as in the HPA's `behavior`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// The highest (down) or lowest (up) recommendation over this window is used, so a short
    /// dip does not remove pods that are needed again a moment later.
    #[schemars(range(min = 0, max = 3600))]
    pub stabilization_window_seconds: i32,
    /// Which policy wins when several allow different changes.
    #[serde(default)]
    pub select_policy: SelectPolicy,
    /// Limits on the change per period.
    #[serde(default)]
    pub policies: Vec<ScalingPolicy>,
}

impl ScalingRules {
    /// HPA default: double or add four pods per 15 s, whichever is more, with no window.
    pub fn default_up() -> Self {
        Self {
            stabilization_window_seconds: 0,
            select_policy: SelectPolicy::Max,
            policies: vec![
                ScalingPolicy::new(PolicyType::Percent, 100, 15),
                ScalingPolicy::new(PolicyType::Pods, 4, 15),
            ],
        }
    }

    /// HPA default: down to the highest recommendation of the last 300 s.
    pub fn default_down() -> Self {
        Self {
            stabilization_window_seconds: 300,
            select_policy: SelectPolicy::Max,
            policies: vec![ScalingPolicy::new(PolicyType::Percent, 100, 15)],
        }
    }
}

/// Which policy applies when several are given.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    #[default]
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// How a policy's value is counted.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyType {
    /// A number of pods.
    Pods,
    /// A percentage of the current pods.
    Percent,
}

/// At most `value` pods (or percent) of change per `periodSeconds`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingPolicy {
    #[serde(rename = "type")]
    pub kind: PolicyType,
    #[schemars(range(min = 1))]
    pub value: i32,
    #[schemars(range(min = 1, max = 1800))]
    pub period_seconds: i32,
}

impl ScalingPolicy {
    pub fn new(kind: PolicyType, value: i32, period_seconds: i32) -> Self {
        Self {
            kind,
            value,
            period_seconds,
        }
    }
}

/// Replicas to run while the reports cannot be trusted.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// Pods to run while reports are stale or missing; at least 1, so a relay is never
    /// silently stopped.
    #[serde(default = "defaults::fallback_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub replicas: i32,
    /// Reports older than this count as stale.
    #[serde(default = "defaults::stale_after")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub stale_after: String,
}

impl Default for FallbackSpec {
    fn default() -> Self {
        Self {
            replicas: defaults::fallback_replicas(),
            stale_after: defaults::stale_after(),
        }
    }
}

impl Default for ScalingSpec {
    fn default() -> Self {
        Self {
            min_replicas: defaults::min_replicas(),
            max_replicas: defaults::max_replicas(),
            target_backlog_per_replica: defaults::target_backlog_per_replica(),
            target_drain_seconds: None,
            activation_backlog: 0,
            polling_interval: defaults::polling_interval(),
            cooldown_period: defaults::cooldown_period(),
            tolerance: defaults::tolerance(),
            scale_up: ScalingRules::default_up(),
            scale_down: ScalingRules::default_down(),
            fallback: FallbackSpec::default(),
            paused: false,
        }
    }
}

/// Observed state of an outbox relay.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct OutboxRelayStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Relay pods that exist (from the Deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Relay pods that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Pods the operator asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Pending rows, as last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<i64>,
    /// True when the count stopped at its cap: there are at least `backlog` rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_capped: Option<bool>,
    /// Age in seconds of the oldest pending row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<f64>,
    /// Messages per second published by all pods together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_rate: Option<f64>,
    /// When the operator last changed the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Label selector of the relay pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// What keeps VACUUM from cleaning the outbox table, as last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_health: Option<TableHealthStatus>,
    /// The rate limit of `spec.relay.maxRate` as the operator divided it, and whether it holds
    /// the relay back; absent without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitStatus>,
    /// The PostgreSQL server's version (e.g. `16.4`), as last measured with the table's health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    /// Ready, IndexReady, ScalingActive, ScalingLimited, Degraded, Reconciling, Stalled, and
    /// Suspended from the first suspension on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// `status.rateLimit`: `spec.relay.maxRate` as the pods hold it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitStatus {
    /// Messages per second each pod may publish: maxRate divided among the pods, at least 1.
    pub per_pod_rate: f64,
    /// True while the pods publish at 90 % or more of their limits: the limit, not the broker
    /// or the database, holds the relay back (the autoscaler then adds no pods).
    pub held_back: bool,
    /// Seconds the pods' workers waited for permits during their last report interval,
    /// summed over workers.
    pub waited_seconds: f64,
}

/// The health of the outbox table, from the relay pod that measures the backlog.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TableHealthStatus {
    /// True while the cleanup horizon is older than `spec.database.vacuumBlockedAfter`.
    pub vacuum_blocked: bool,
    /// How long the cleanup horizon has been held back, in seconds (0 when nothing holds it).
    pub horizon_age_seconds: f64,
    /// The same age in transaction ids.
    pub horizon_age_xids: i64,
    /// What holds the horizon: a session's pid, application name and state, a prepared
    /// transaction or a replication slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon_holder: Option<String>,
    /// Dead tuples in the outbox table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_tuples: Option<i64>,
    /// Live tuples in the outbox table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_tuples: Option<i64>,
    /// Seconds since the table's last VACUUM or autovacuum; absent when it never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_vacuum_age_seconds: Option<f64>,
    /// Size of the pending-rows index in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_index_bytes: Option<i64>,
    /// Autovacuum runs for this table: on for the server (with track_counts) and not turned
    /// off on the table.
    pub autovacuum: bool,
}

/// Default values, one function each because serde and the schema need functions. Where the
/// field is a relay option they return the relay's own default (`outbox_relay::defaults`), so
/// the CRD and `outbox-relay run` never disagree; the Kubernetes-only ones are written here.
pub mod defaults {
    use outbox_relay::defaults as relay;

    /// A duration as the CRD writes it (`10s`, `200ms`), the pattern the schema enforces.
    fn duration(d: std::time::Duration) -> String {
        humantime::format_duration(d).to_string()
    }

    pub fn replicas() -> i32 {
        1
    }
    pub fn secret_key() -> String {
        "url".into()
    }
    pub fn otlp_headers_key() -> String {
        "headers".into()
    }
    pub fn table() -> String {
        relay::TABLE.into()
    }
    pub fn id_column() -> String {
        relay::columns::ID.into()
    }
    pub fn type_column() -> String {
        relay::columns::TYPE.into()
    }
    pub fn payload_column() -> String {
        relay::columns::PAYLOAD.into()
    }
    pub fn occurred_at_column() -> String {
        relay::columns::OCCURRED_AT.into()
    }
    pub fn processed_at_column() -> String {
        relay::columns::PROCESSED_AT.into()
    }
    pub fn error_column() -> String {
        relay::columns::ERROR.into()
    }
    pub fn yes() -> bool {
        true
    }
    /// Pods write JSON lines for log pipelines; the relay's own default (text) is for people.
    pub fn log_format() -> super::LogFormat {
        super::LogFormat::Json
    }
    pub fn disruption_budget_enabled() -> bool {
        true
    }
    pub fn max_unavailable() -> super::IntOrString {
        super::IntOrString::Int(1)
    }
    pub fn batch_size() -> i32 {
        relay::BATCH_SIZE as i32
    }
    pub fn workers_per_pod() -> i32 {
        relay::WORKERS as i32
    }
    pub fn inflight_batches() -> i32 {
        relay::INFLIGHT_BATCHES as i32
    }
    pub fn max_attempts() -> i32 {
        relay::MAX_ATTEMPTS as i32
    }
    pub fn publish_timeout() -> String {
        duration(relay::PUBLISH_TIMEOUT)
    }
    pub fn poll_interval() -> String {
        duration(relay::POLL_INTERVAL)
    }
    pub fn report_interval() -> String {
        duration(relay::REPORT_INTERVAL)
    }
    pub fn termination_grace_period_seconds() -> i64 {
        30
    }
    pub fn min_replicas() -> i32 {
        1
    }
    pub fn max_replicas() -> i32 {
        10
    }
    pub fn target_backlog_per_replica() -> i64 {
        10_000
    }
    pub fn polling_interval() -> String {
        "15s".into()
    }
    pub fn cooldown_period() -> String {
        "300s".into()
    }
    pub fn tolerance() -> f64 {
        0.1
    }
    pub fn fallback_replicas() -> i32 {
        1
    }
    pub fn stale_after() -> String {
        "60s".into()
    }
    /// Long enough that a report or a migration does not trip it, short enough to hear about
    /// a forgotten session before the table doubles.
    pub fn vacuum_blocked_after() -> String {
        "10m".into()
    }
}
