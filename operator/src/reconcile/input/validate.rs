//! Checks an OutboxRelay spec and turns it into typed values, with one message per problem
//! naming the field. The CRD schema refuses most mistakes at `kubectl apply`, but objects
//! written under an older CRD, or with validation off, reach the reconciler too: it must turn
//! them into a condition, never a panic.

use std::fmt;
use std::time::Duration;

use outbox_relay::defaults::AMQP_SHORT_STRING_MAX;
use outbox_relay::table::ident::{Ident, TableName};
use outbox_relay::table::migrate::MigrationOptions;
use outbox_relay::table::{Columns, OutboxTable};

use crate::crd::{
    BrokerProtocol, CloudEventsSpec, OutboxRelaySpec, PoolMode, PostgresTlsMode, RelayOrdering,
    ScalingRules, ScalingSpec, TracingSpec,
};

/// One problem with the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.relay.batchSize`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found, in field order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecErrors(pub Vec<FieldError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join("; "))
    }
}

impl std::error::Error for SpecErrors {}

/// The durations of the scaling block, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingPlan {
    pub polling_interval: Duration,
    pub cooldown_period: Duration,
    pub stale_after: Duration,
}

/// A spec that passed validation, in the relay crate's types.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayPlan {
    pub table: OutboxTable,
    pub migration: MigrationOptions,
    pub publish_timeout: Duration,
    pub poll_interval: Duration,
    pub report_interval: Duration,
    pub processed_retention: Option<Duration>,
    /// `spec.relay.idleInTransactionTimeout`, `deadClientTimeout`, `brokerHeartbeat`: None
    /// leaves the relay's default (and the Deployment as it was before they existed).
    pub idle_in_transaction_timeout: Option<Duration>,
    pub dead_client_timeout: Option<Duration>,
    pub broker_heartbeat: Option<Duration>,
    /// A cleanup horizon older than this makes the relay Degraded (VacuumBlocked).
    pub vacuum_blocked_after: Duration,
    pub scaling: Option<ScalingPlan>,
    /// `spec.suspend`: no pods, the autoscaler skipped, the backlog counted by the operator.
    pub suspended: bool,
    /// `spec.relay.maxRate`: messages per second across the pods; None: no limit.
    pub max_rate: Option<f64>,
}

/// `spec.relay.maxRate`'s bounds, as the schema has them: at least one message per second (each
/// pod's share is at least that), at most a million per pod for a thousand pods.
const MAX_RATE_MIN: f64 = 1.0;
const MAX_RATE_MAX: f64 = 1.0e9;

/// Collects problems as the checks go, so the user sees all of them at once.
#[derive(Default)]
struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    fn fail(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.to_string(),
            message: message.into(),
        });
    }

    fn range(&mut self, path: &str, value: i64, min: i64, max: i64) {
        if !(min..=max).contains(&value) {
            self.fail(
                path,
                format!("must be between {min} and {max}, got {value}"),
            );
        }
    }

    fn at_least(&mut self, path: &str, value: i64, min: i64) {
        if value < min {
            self.fail(path, format!("must be at least {min}, got {value}"));
        }
    }

    fn ident(&mut self, path: &str, name: &str) -> Option<Ident> {
        Ident::new(name)
            .map_err(|e| self.fail(path, format!("column name {e}")))
            .ok()
    }

    fn short_string(&mut self, path: &str, value: &str) {
        if value.len() > AMQP_SHORT_STRING_MAX {
            self.fail(
                path,
                format!(
                    "is {} bytes; AMQP allows at most {AMQP_SHORT_STRING_MAX}",
                    value.len()
                ),
            );
        }
    }

    fn not_empty(&mut self, path: &str, value: &str) {
        if value.trim().is_empty() {
            self.fail(path, "must not be empty");
        }
    }

    fn duration(&mut self, path: &str, text: &str) -> Option<Duration> {
        match humantime::parse_duration(text.trim()) {
            Ok(d) if d.is_zero() => {
                self.fail(path, "must be greater than zero");
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.fail(
                    path,
                    format!("{e} in {text:?}; write a duration like 500ms, 10s or 5m"),
                );
                None
            }
        }
    }
}

/// Validates the spec; on success every value is in range and typed.
pub fn validate(spec: &OutboxRelaySpec) -> Result<RelayPlan, SpecErrors> {
    let mut check = Checker::default();

    check.range("spec.replicas", spec.replicas.into(), 0, 1000);

    let db = &spec.database;
    check.not_empty("spec.database.urlSecretRef.name", &db.url_secret_ref.name);
    check.not_empty("spec.database.urlSecretRef.key", &db.url_secret_ref.key);
    let table_name = TableName::parse(&db.table)
        .map_err(|e| check.fail("spec.database.table", format!("table name {e}")))
        .ok();
    let columns = check_columns(&mut check, spec);
    let vacuum_blocked_after =
        check.duration("spec.database.vacuumBlockedAfter", &db.vacuum_blocked_after);

    let broker = &spec.broker;
    check.not_empty("spec.broker.urlSecretRef.name", &broker.url_secret_ref.name);
    check.not_empty("spec.broker.urlSecretRef.key", &broker.url_secret_ref.key);
    if let Some(exchange) = &broker.exchange {
        check.short_string("spec.broker.exchange", exchange);
    }
    if let Some(key) = &broker.routing_key {
        check.short_string("spec.broker.routingKey", key);
    }
    if let Some(dlx) = &broker.dead_letter_exchange {
        check.short_string("spec.broker.deadLetterExchange", dlx);
    }
    if let Some(cloud_events) = &broker.cloud_events {
        check_cloud_events(&mut check, cloud_events);
    }
    check_protocol(&mut check, spec);
    check_tls(&mut check, spec);
    check_pool_mode(&mut check, spec);
    match (spec.relay.ordering, &db.columns.partition_key) {
        (RelayOrdering::PerKey, None) => check.fail(
            "spec.relay.ordering",
            "perKey orders the rows of each partition key: set \
             spec.database.columns.partitionKey (e.g. the aggregate id), or use unordered",
        ),
        (RelayOrdering::Unordered, Some(_)) => check.fail(
            "spec.database.columns.partitionKey",
            "only has a meaning with spec.relay.ordering perKey: set it, or remove the column",
        ),
        _ => {}
    }

    let relay = &spec.relay;
    if let Some(image) = &relay.image {
        check.not_empty("spec.relay.image", image);
    }
    check.range("spec.relay.batchSize", relay.batch_size.into(), 1, 10_000);
    check.range(
        "spec.relay.workersPerPod",
        relay.workers_per_pod.into(),
        1,
        64,
    );
    check.range(
        "spec.relay.inflightBatches",
        relay.inflight_batches.into(),
        0,
        64,
    );
    check.range("spec.relay.maxAttempts", relay.max_attempts.into(), 1, 1000);
    if let Some(rate) = relay.max_rate
        && !(MAX_RATE_MIN..=MAX_RATE_MAX).contains(&rate)
    {
        // The schema refuses these at `kubectl apply`; an object stored before the field had
        // its bounds, or written around the schema, is refused here with the same words.
        check.fail(
            "spec.relay.maxRate",
            format!(
                "must be between {MAX_RATE_MIN} and {MAX_RATE_MAX} messages per second, got \
                 {rate}; remove it for no limit"
            ),
        );
    }
    if let Some(tracing) = &relay.tracing {
        check_tracing(&mut check, tracing);
    }
    check.range(
        "spec.relay.terminationGracePeriodSeconds",
        relay.termination_grace_period_seconds,
        1,
        3600,
    );
    let publish_timeout = check.duration("spec.relay.publishTimeout", &relay.publish_timeout);
    let poll_interval = check.duration("spec.relay.pollInterval", &relay.poll_interval);
    let report_interval = check.duration("spec.relay.reportInterval", &relay.report_interval);
    let processed_retention = relay
        .processed_retention
        .as_deref()
        .map(|text| check.duration("spec.relay.processedRetention", text));
    let optional = |check: &mut Checker, path: &str, text: &Option<String>| {
        text.as_deref().and_then(|text| check.duration(path, text))
    };
    let idle_in_transaction_timeout = optional(
        &mut check,
        "spec.relay.idleInTransactionTimeout",
        &relay.idle_in_transaction_timeout,
    );
    let dead_client_timeout = optional(
        &mut check,
        "spec.relay.deadClientTimeout",
        &relay.dead_client_timeout,
    );
    let broker_heartbeat = optional(
        &mut check,
        "spec.relay.brokerHeartbeat",
        &relay.broker_heartbeat,
    );
    check_session_bounds(
        &mut check,
        publish_timeout,
        idle_in_transaction_timeout,
        dead_client_timeout,
    );

    let scaling = spec
        .scaling
        .as_ref()
        .map(|scaling| check_scaling(&mut check, scaling));

    if !check.errors.is_empty() {
        return Err(SpecErrors(check.errors));
    }
    // Every Option below is Some: a None was recorded as an error above.
    let (
        Some(name),
        Some(columns),
        Some(publish_timeout),
        Some(poll_interval),
        Some(report_interval),
        Some(vacuum_blocked_after),
    ) = (
        table_name,
        columns,
        publish_timeout,
        poll_interval,
        report_interval,
        vacuum_blocked_after,
    )
    else {
        return Err(SpecErrors(vec![FieldError {
            path: "spec".into(),
            message: "could not be read".into(),
        }]));
    };
    Ok(RelayPlan {
        table: OutboxTable {
            name,
            columns,
            mode: relay.delivery_mode,
            ordering: relay.ordering.delivery_order(),
        },
        migration: MigrationOptions {
            covering_index: db.covering_index,
            notify: db.notify_trigger,
            skip_autovacuum: false,
        },
        publish_timeout,
        poll_interval,
        report_interval,
        processed_retention: processed_retention.flatten(),
        idle_in_transaction_timeout,
        dead_client_timeout,
        broker_heartbeat,
        vacuum_blocked_after,
        scaling: scaling.flatten(),
        suspended: spec.suspend,
        max_rate: relay.max_rate,
    })
}

/// The relay's own refusals of the session bounds (its --idle-in-transaction-timeout and
/// --dead-client-timeout), said of the fields, so a pod never crash-loops on them.
fn check_session_bounds(
    check: &mut Checker,
    publish_timeout: Option<Duration>,
    idle_in_transaction: Option<Duration>,
    dead_client: Option<Duration>,
) {
    // Unset, the relay keeps its default above the publish timeout by itself.
    let publish = publish_timeout.unwrap_or(outbox_relay::defaults::PUBLISH_TIMEOUT);
    if let Some(idle) = idle_in_transaction
        && idle <= publish
    {
        check.fail(
            "spec.relay.idleInTransactionTimeout",
            format!(
                "({idle:?}) must be longer than publishTimeout ({publish:?}): a batch awaits its \
                 confirms inside its transaction, and the server would end it meanwhile"
            ),
        );
    }
    let least = outbox_relay::defaults::DEAD_CLIENT_TIMEOUT_MIN;
    if dead_client.is_some_and(|dead| dead < least) {
        check.fail(
            "spec.relay.deadClientTimeout",
            format!(
                "must be at least {}s: a keepalive probe and three retries take whole seconds",
                least.as_secs()
            ),
        );
    }
}

/// The broker options that belong to the other protocol, refused as the relay would refuse
/// them (the CRD's rules say the same at `kubectl apply`).
/// The schema's rules on the pool mode, for objects that reached the operator without them.
fn check_pool_mode(check: &mut Checker, spec: &OutboxRelaySpec) {
    let transaction = spec.database.pool_mode == Some(PoolMode::Transaction);
    match (transaction, &spec.database.session_url_secret_ref) {
        (true, None) => check.fail(
            "spec.database.sessionUrlSecretRef",
            "poolMode transaction needs a URL with a session of its own (the server, or a \
             session pool): the migration, per-key ordering and LISTEN take session advisory \
             locks or listen",
        ),
        (false, Some(_)) => check.fail(
            "spec.database.sessionUrlSecretRef",
            "is only used with poolMode transaction: set it, or remove the session URL",
        ),
        _ => {}
    }
}

/// The schema's rules on the TLS blocks, for objects that reached the operator without them.
fn check_tls(check: &mut Checker, spec: &OutboxRelaySpec) {
    let database_ca = spec.database.tls.as_ref().and_then(|t| t.ca.as_ref());
    let broker_ca = spec.broker.tls.as_ref().and_then(|t| t.ca.as_ref());
    for (path, ca) in [
        ("spec.database.tls.ca", database_ca),
        ("spec.broker.tls.ca", broker_ca),
    ] {
        if let Some(ca) = ca
            && ca.secret_key_ref.is_some() == ca.config_map_key_ref.is_some()
        {
            check.fail(
                path,
                "give the CA in exactly one of secretKeyRef and configMapKeyRef",
            );
        }
    }
    let Some(tls) = &spec.database.tls else {
        return;
    };
    let verifies = matches!(
        tls.mode,
        PostgresTlsMode::Require | PostgresTlsMode::VerifyCa | PostgresTlsMode::VerifyFull
    );
    if tls.mode == PostgresTlsMode::VerifyCa && tls.ca.is_none() {
        check.fail(
            "spec.database.tls.ca",
            "mode verify-ca checks the server's certificate against a CA you give: set ca, or \
             use verify-full, which without ca trusts the system's CA store",
        );
    }
    if tls.ca.is_some() && !verifies {
        check.fail(
            "spec.database.tls.ca",
            "is only used to verify the server with mode require, verify-ca or verify-full: \
             use verify-full",
        );
    }
    if tls.mode == PostgresTlsMode::Disable && tls.client_certificate_secret_ref.is_some() {
        check.fail(
            "spec.database.tls.clientCertificateSecretRef",
            "mode disable never uses TLS, so a client certificate cannot be presented: remove \
             it or choose a mode that uses TLS",
        );
    }
}

fn check_protocol(check: &mut Checker, spec: &OutboxRelaySpec) {
    let broker = &spec.broker;
    let p = "spec.broker";
    if broker.protocol == BrokerProtocol::Amqp091 {
        if broker.address.is_some() {
            check.fail(
                &format!("{p}.address"),
                "is an AMQP 1.0 field; set spec.broker.protocol: amqp10, or publish to an \
                 exchange with amqp091",
            );
        }
        return;
    }
    match broker.address.as_deref() {
        None => check.fail(
            &format!("{p}.address"),
            "is required with protocol amqp10: the queue or topic to send to (e.g. orders, or \
             /amq/queue/orders on RabbitMQ)",
        ),
        Some(address) => check.not_empty(&format!("{p}.address"), address),
    }
    let given_091 = [
        (
            "spec.broker.exchange",
            broker.exchange.is_some(),
            "address says where messages go",
        ),
        (
            "spec.broker.routingKey",
            broker.routing_key.is_some(),
            "the row's type goes in the subject property",
        ),
        (
            "spec.database.columns.routingKey",
            spec.database.columns.routing_key.is_some(),
            "the row's type goes in the subject property",
        ),
        (
            "spec.broker.mandatory",
            broker.mandatory,
            "the broker refuses an unknown address when the link attaches",
        ),
        (
            "spec.broker.deadLetterExchange",
            broker.dead_letter_exchange.is_some(),
            "rows given up on keep their error in the error column",
        ),
        (
            "spec.broker.publisherConfirms",
            !broker.publisher_confirms,
            "amqp10 always waits for the broker's outcome",
        ),
    ];
    for (path, _, instead) in given_091.iter().filter(|(_, given, _)| *given) {
        check.fail(
            path,
            format!("is an AMQP 0-9-1 option with no meaning under protocol amqp10 ({instead}); remove it"),
        );
    }
}

/// The source must be one the relay accepts: the same check as its flag, so the pods never
/// crash-loop on it.
fn check_cloud_events(check: &mut Checker, spec: &CloudEventsSpec) {
    if let Err(e) = outbox_relay::broker::cloudevents::check_source(&spec.source) {
        check.fail("spec.broker.cloudEvents.source", e);
    }
}

/// The schema's rules on `spec.relay.tracing`, for objects that reached the operator without
/// them: the pods would export nowhere (or put a password into their spec) otherwise.
fn check_tracing(check: &mut Checker, tracing: &TracingSpec) {
    let p = "spec.relay.tracing";
    let example = "e.g. http://otel-collector.observability:4318";
    match url::Url::parse(tracing.otlp_endpoint.trim()) {
        Err(e) => check.fail(
            &format!("{p}.otlpEndpoint"),
            format!("is not a URL ({e}): give the collector's OTLP/HTTP base URL, {example}"),
        ),
        Ok(url) if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() => {
            check.fail(
                &format!("{p}.otlpEndpoint"),
                format!(
                    "must be an http:// or https:// URL (OTLP/HTTP; gRPC is not spoken), got scheme {}: {example}",
                    url.scheme()
                ),
            );
        }
        Ok(url) if url.host_str().is_none_or(str::is_empty) => check.fail(
            &format!("{p}.otlpEndpoint"),
            format!("has no host: {example}"),
        ),
        // Never repeats the URL: it holds the credentials it is refused for.
        Ok(url) if !url.username().is_empty() || url.password().is_some() => check.fail(
            &format!("{p}.otlpEndpoint"),
            "must not carry a user or password (it is written into the pod spec as plain text): put the credentials in the Secret of spec.relay.tracing.headersSecretRef",
        ),
        Ok(_) => {}
    }
    if let Some(ratio) = tracing.sample_ratio
        && !(0.0..=1.0).contains(&ratio)
    {
        check.fail(
            &format!("{p}.sampleRatio"),
            format!(
                "must be a number from 0 to 1 (the fraction of batches traced, e.g. 0.1), got {ratio}; remove it to trace every batch"
            ),
        );
    }
    if let Some(headers) = &tracing.headers_secret_ref {
        check.not_empty(&format!("{p}.headersSecretRef.name"), &headers.name);
        check.not_empty(&format!("{p}.headersSecretRef.key"), &headers.key);
    }
}

fn check_columns(check: &mut Checker, spec: &OutboxRelaySpec) -> Option<Columns> {
    let c = &spec.database.columns;
    let p = "spec.database.columns";
    let id = check.ident(&format!("{p}.id"), &c.id);
    let kind = check.ident(&format!("{p}.type"), &c.kind);
    let payload = check.ident(&format!("{p}.payload"), &c.payload);
    let occurred_at = check.ident(&format!("{p}.occurredAt"), &c.occurred_at);
    let processed_at = check.ident(&format!("{p}.processedAt"), &c.processed_at);
    let error = check.ident(&format!("{p}.error"), &c.error);
    let mut optional = |field: &str, name: &Option<String>| match name {
        None => Some(None),
        Some(name) => check.ident(&format!("{p}.{field}"), name).map(Some),
    };
    let routing_key = optional("routingKey", &c.routing_key);
    let headers = optional("headers", &c.headers);
    let attempts = optional("attempts", &c.attempts);
    let partition_key = optional("partitionKey", &c.partition_key);
    let traceparent = optional("traceparent", &c.traceparent);
    let tracestate = optional("tracestate", &c.tracestate);
    let columns = Columns {
        id: id?,
        kind: kind?,
        payload: payload?,
        occurred_at: occurred_at?,
        processed_at: processed_at?,
        error: error?,
        routing_key: routing_key?,
        headers: headers?,
        attempts: attempts?,
        partition_key: partition_key?,
        traceparent: traceparent?,
        tracestate: tracestate?,
    };
    if columns.tracestate.is_some() && columns.traceparent.is_none() {
        check.fail(
            &format!("{p}.tracestate"),
            "goes with a traceparent (W3C: a tracestate without one is discarded): set \
             traceparent too, or remove it",
        );
        return None;
    }
    // One column cannot play two parts: the relay would write its error text into the payload.
    let mut seen: Vec<&Ident> = Vec::new();
    for (_, column) in columns.mapped() {
        if seen.contains(&column) {
            check.fail(
                p,
                format!("column {column} is mapped twice; every role needs its own column"),
            );
            return None;
        }
        seen.push(column);
    }
    Some(columns)
}

fn check_scaling(check: &mut Checker, scaling: &ScalingSpec) -> Option<ScalingPlan> {
    let p = "spec.scaling";
    check.range(
        &format!("{p}.minReplicas"),
        scaling.min_replicas.into(),
        0,
        1000,
    );
    check.range(
        &format!("{p}.maxReplicas"),
        scaling.max_replicas.into(),
        1,
        1000,
    );
    if scaling.min_replicas > scaling.max_replicas {
        check.fail(
            p,
            format!(
                "minReplicas ({}) must not be greater than maxReplicas ({})",
                scaling.min_replicas, scaling.max_replicas
            ),
        );
    }
    check.at_least(
        &format!("{p}.targetBacklogPerReplica"),
        scaling.target_backlog_per_replica,
        1,
    );
    if let Some(seconds) = scaling.target_drain_seconds {
        check.at_least(&format!("{p}.targetDrainSeconds"), seconds, 1);
    }
    check.at_least(
        &format!("{p}.activationBacklog"),
        scaling.activation_backlog,
        0,
    );
    if !(0.0..=1.0).contains(&scaling.tolerance) {
        check.fail(
            &format!("{p}.tolerance"),
            format!("must be between 0 and 1, got {}", scaling.tolerance),
        );
    }
    check_rules(check, &format!("{p}.scaleUp"), &scaling.scale_up);
    check_rules(check, &format!("{p}.scaleDown"), &scaling.scale_down);
    check.range(
        &format!("{p}.fallback.replicas"),
        scaling.fallback.replicas.into(),
        1,
        scaling.max_replicas.max(1).into(),
    );
    let polling_interval =
        check.duration(&format!("{p}.pollingInterval"), &scaling.polling_interval);
    let cooldown_period = check.duration(&format!("{p}.cooldownPeriod"), &scaling.cooldown_period);
    let stale_after = check.duration(
        &format!("{p}.fallback.staleAfter"),
        &scaling.fallback.stale_after,
    );
    Some(ScalingPlan {
        polling_interval: polling_interval?,
        cooldown_period: cooldown_period?,
        stale_after: stale_after?,
    })
}

fn check_rules(check: &mut Checker, path: &str, rules: &ScalingRules) {
    check.range(
        &format!("{path}.stabilizationWindowSeconds"),
        rules.stabilization_window_seconds.into(),
        0,
        3600,
    );
    for (i, policy) in rules.policies.iter().enumerate() {
        check.at_least(
            &format!("{path}.policies[{i}].value"),
            policy.value.into(),
            1,
        );
        check.range(
            &format!("{path}.policies[{i}].periodSeconds"),
            policy.period_seconds.into(),
            1,
            1800,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{LEAK_CANARY, sample_spec};

    fn messages(spec: &OutboxRelaySpec) -> Vec<String> {
        validate(spec)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_sample_spec_becomes_a_plan() {
        let plan = validate(&sample_spec()).unwrap();
        assert_eq!(plan.table.name.to_string(), "outbox_messages");
        assert_eq!(plan.table.columns, Columns::default());
        assert_eq!(plan.publish_timeout, Duration::from_secs(10));
        assert_eq!(plan.poll_interval, Duration::from_millis(200));
        assert!(plan.scaling.is_none());
        assert!(!plan.migration.covering_index);
    }

    #[test]
    fn a_transaction_pool_needs_a_session_url_and_only_it_takes_one() {
        let mut spec = sample_spec();
        spec.database.pool_mode = Some(PoolMode::Transaction);
        assert!(messages(&spec)[0].starts_with("spec.database.sessionUrlSecretRef: poolMode"));
        spec.database.session_url_secret_ref = Some(crate::crd::SecretKeyRef {
            name: "orders-db-direct".into(),
            key: "url".into(),
        });
        assert!(validate(&spec).is_ok());
        spec.database.pool_mode = None;
        assert!(messages(&spec)[0].contains("only used with poolMode transaction"));
    }

    #[test]
    fn tls_combinations_the_schema_refuses_are_refused_here_too() {
        use crate::crd::{CaKeyRef, CaSource, DatabaseTlsSpec, TlsSecretRef};
        let both = CaSource {
            secret_key_ref: Some(CaKeyRef {
                name: "a".into(),
                key: "ca.crt".into(),
            }),
            config_map_key_ref: Some(CaKeyRef {
                name: "b".into(),
                key: "ca.crt".into(),
            }),
        };
        let mut spec = sample_spec();
        spec.database.tls = Some(DatabaseTlsSpec {
            mode: PostgresTlsMode::Disable,
            ca: Some(both),
            client_certificate_secret_ref: Some(TlsSecretRef { name: "c".into() }),
        });
        let paths: Vec<String> = messages(&spec)
            .iter()
            .map(|m| m.split(':').next().unwrap().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "spec.database.tls.ca",
                "spec.database.tls.ca",
                "spec.database.tls.clientCertificateSecretRef"
            ]
        );
        spec.database.tls = Some(DatabaseTlsSpec {
            mode: PostgresTlsMode::VerifyCa,
            ..Default::default()
        });
        assert!(messages(&spec)[0].contains("mode verify-ca checks"));
        spec.database.tls = Some(DatabaseTlsSpec::default());
        assert!(validate(&spec).is_ok());
    }

    #[test]
    fn a_max_rate_of_zero_or_less_names_its_field() {
        let mut spec = sample_spec();
        for bad in [0.0, -3.0, 0.5, f64::NAN, f64::INFINITY, 2e9] {
            spec.relay.max_rate = Some(bad);
            let found = messages(&spec);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0].starts_with("spec.relay.maxRate: must be between 1 and"),
                "{found:?}"
            );
        }
        spec.relay.max_rate = Some(250.5);
        assert_eq!(validate(&spec).unwrap().max_rate, Some(250.5));
        spec.relay.max_rate = None;
        assert_eq!(validate(&spec).unwrap().max_rate, None);
    }

    fn tracing(endpoint: &str) -> TracingSpec {
        TracingSpec {
            otlp_endpoint: endpoint.into(),
            sample_ratio: None,
            headers_secret_ref: None,
        }
    }

    #[test]
    fn a_tracing_endpoint_must_be_an_http_url_with_a_host_and_no_credentials() {
        let mut spec = sample_spec();
        for good in [
            "http://otel-collector.observability:4318",
            "https://api.honeycomb.io",
            "http://[::1]:4318/otlp",
        ] {
            spec.relay.tracing = Some(tracing(good));
            assert!(validate(&spec).is_ok(), "{good}");
        }
        for (bad, says) in [
            ("otel-collector:4318", "must be an http:// or https:// URL"),
            ("collector", "is not a URL"),
            ("grpc://collector:4317", "got scheme grpc"),
            ("http://", "is not a URL"),
            ("", "is not a URL"),
            (
                "mailto:ops@example.com",
                "must be an http:// or https:// URL",
            ),
        ] {
            spec.relay.tracing = Some(tracing(bad));
            let found = messages(&spec);
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert!(
                found[0].starts_with("spec.relay.tracing.otlpEndpoint: ")
                    && found[0].contains(says),
                "{bad}: {found:?}"
            );
            assert!(
                found[0].contains("4318"),
                "the fix has an example: {found:?}"
            );
        }
        spec.relay.tracing = Some(tracing(&format!(
            "https://user:{LEAK_CANARY}@collector.example.com"
        )));
        let found = messages(&spec);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("spec.relay.tracing.otlpEndpoint: must not carry a user")
                && found[0].contains("headersSecretRef"),
            "{found:?}"
        );
        assert!(!found[0].contains(LEAK_CANARY), "{found:?}");
    }

    #[test]
    fn a_sample_ratio_outside_zero_to_one_names_its_field() {
        let mut spec = sample_spec();
        let mut t = tracing("http://collector:4318");
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            t.sample_ratio = Some(bad);
            spec.relay.tracing = Some(t.clone());
            let found = messages(&spec);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0]
                    .starts_with("spec.relay.tracing.sampleRatio: must be a number from 0 to 1"),
                "{found:?}"
            );
        }
        for good in [0.0, 0.25, 1.0] {
            t.sample_ratio = Some(good);
            spec.relay.tracing = Some(t.clone());
            assert!(validate(&spec).is_ok(), "{good}");
        }
        t.headers_secret_ref = Some(crate::crd::OtlpHeadersSecretRef {
            name: " ".into(),
            key: "headers".into(),
        });
        spec.relay.tracing = Some(t);
        assert_eq!(
            messages(&spec),
            ["spec.relay.tracing.headersSecretRef.name: must not be empty"]
        );
    }

    #[test]
    fn bad_identifiers_name_their_field() {
        let mut spec = sample_spec();
        spec.database.table = "orders; drop table x".into();
        spec.database.columns.payload = "1body".into();
        spec.database.columns.routing_key = Some("".into());
        assert_eq!(
            messages(&spec),
            vec![
                "spec.database.table: table name \"orders; drop table x\" is not a plain SQL name; use letters, digits and underscores, starting with a letter or underscore",
                "spec.database.columns.payload: column name \"1body\" is not a plain SQL name; use letters, digits and underscores, starting with a letter or underscore",
                "spec.database.columns.routingKey: column name is empty; give a name like outbox_messages",
            ]
        );
    }

    #[test]
    fn ranges_and_durations_are_checked() {
        let mut spec = sample_spec();
        spec.relay.batch_size = 0;
        spec.relay.workers_per_pod = 65;
        spec.relay.poll_interval = "soon".into();
        spec.relay.publish_timeout = "0s".into();
        let all = messages(&spec);
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!(
            all[0],
            "spec.relay.batchSize: must be between 1 and 10000, got 0"
        );
        assert_eq!(
            all[1],
            "spec.relay.workersPerPod: must be between 1 and 64, got 65"
        );
        assert_eq!(
            all[2],
            "spec.relay.publishTimeout: must be greater than zero"
        );
        assert!(
            all[3].starts_with("spec.relay.pollInterval: ") && all[3].contains("\"soon\""),
            "{}",
            all[3]
        );
    }

    #[test]
    fn the_session_bounds_are_refused_as_the_relay_refuses_them() {
        let mut spec = sample_spec();
        spec.relay.publish_timeout = "20s".into();
        // Unset: the relay keeps its bound above the publish timeout by itself.
        assert!(validate(&spec).is_ok());
        spec.relay.idle_in_transaction_timeout = Some("15s".into());
        spec.relay.dead_client_timeout = Some("2s".into());
        spec.relay.broker_heartbeat = Some("never".into());
        let all = messages(&spec);
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(
            all[0].starts_with("spec.relay.brokerHeartbeat: "),
            "{all:?}"
        );
        assert!(
            all[1].starts_with("spec.relay.idleInTransactionTimeout: (15s) must be longer than publishTimeout (20s)"),
            "{all:?}"
        );
        assert_eq!(
            all[2],
            "spec.relay.deadClientTimeout: must be at least 4s: a keepalive probe and three retries take whole seconds"
        );
        spec.relay.idle_in_transaction_timeout = Some("25s".into());
        spec.relay.dead_client_timeout = Some("4s".into());
        spec.relay.broker_heartbeat = Some("5s".into());
        let plan = validate(&spec).unwrap();
        assert_eq!(
            plan.idle_in_transaction_timeout,
            Some(Duration::from_secs(25))
        );
        assert_eq!(plan.broker_heartbeat, Some(Duration::from_secs(5)));
    }

    #[test]
    fn min_above_max_is_refused() {
        let mut spec = sample_spec();
        spec.scaling = Some(ScalingSpec {
            min_replicas: 5,
            max_replicas: 3,
            ..Default::default()
        });
        assert_eq!(
            messages(&spec),
            vec!["spec.scaling: minReplicas (5) must not be greater than maxReplicas (3)"]
        );
    }

    #[test]
    fn one_column_cannot_play_two_parts() {
        let mut spec = sample_spec();
        spec.database.columns.error = "content".into();
        assert_eq!(
            messages(&spec),
            vec![
                "spec.database.columns: column content is mapped twice; every role needs its own column"
            ]
        );
    }

    fn amqp10_spec() -> OutboxRelaySpec {
        let mut spec = sample_spec();
        spec.broker.protocol = BrokerProtocol::Amqp10;
        spec.broker.address = Some("/amq/queue/orders".into());
        spec
    }

    #[test]
    fn amqp10_needs_an_address_and_amqp091_refuses_one() {
        assert!(validate(&amqp10_spec()).is_ok());
        let mut spec = amqp10_spec();
        spec.broker.address = None;
        assert_eq!(
            messages(&spec),
            vec![
                "spec.broker.address: is required with protocol amqp10: the queue or topic to send to (e.g. orders, or /amq/queue/orders on RabbitMQ)"
            ]
        );
        spec.broker.address = Some("  ".into());
        assert_eq!(
            messages(&spec),
            vec!["spec.broker.address: must not be empty"]
        );
        let mut spec = sample_spec();
        spec.broker.address = Some("orders".into());
        assert_eq!(
            messages(&spec),
            vec![
                "spec.broker.address: is an AMQP 1.0 field; set spec.broker.protocol: amqp10, or publish to an exchange with amqp091"
            ]
        );
    }

    #[test]
    fn amqp10_refuses_every_amqp091_option_by_name() {
        let mut spec = amqp10_spec();
        spec.broker.exchange = Some("outbox".into());
        spec.broker.routing_key = Some("orders".into());
        spec.database.columns.routing_key = Some("topic".into());
        spec.broker.mandatory = true;
        spec.broker.dead_letter_exchange = Some("dlx".into());
        spec.broker.publisher_confirms = false;
        let all = messages(&spec);
        let fields: Vec<&str> = all
            .iter()
            .map(|m| m.split(':').next().unwrap_or_default())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.broker.exchange",
                "spec.broker.routingKey",
                "spec.database.columns.routingKey",
                "spec.broker.mandatory",
                "spec.broker.deadLetterExchange",
                "spec.broker.publisherConfirms",
            ]
        );
        assert!(
            all.iter().all(|m| m
                .contains("is an AMQP 0-9-1 option with no meaning under protocol amqp10")
                && m.ends_with("; remove it")),
            "{all:#?}"
        );
    }

    #[test]
    fn cloudevents_need_a_source_the_relay_accepts() {
        let mut spec = sample_spec();
        spec.broker.cloud_events = Some(CloudEventsSpec {
            mode: Default::default(),
            source: "not a uri".into(),
        });
        let err = validate(&spec).unwrap_err().to_string();
        assert!(err.contains("spec.broker.cloudEvents.source"), "{err}");
        assert!(err.contains("URI-reference"), "{err}");
        spec.broker.cloud_events = Some(CloudEventsSpec {
            mode: Default::default(),
            source: "/orders".into(),
        });
        assert!(validate(&spec).is_ok());
        spec.database.columns.tracestate = Some("trace_state".into());
        let err = validate(&spec).unwrap_err().to_string();
        assert!(err.contains("spec.database.columns.tracestate"), "{err}");
    }

    #[test]
    fn per_key_ordering_and_the_partition_key_come_together() {
        let mut spec = sample_spec();
        spec.relay.ordering = RelayOrdering::PerKey;
        assert_eq!(
            messages(&spec),
            vec![
                "spec.relay.ordering: perKey orders the rows of each partition key: set spec.database.columns.partitionKey (e.g. the aggregate id), or use unordered"
            ]
        );
        spec.database.columns.partition_key = Some("order_id".into());
        let plan = validate(&spec).unwrap();
        assert_eq!(
            plan.table.ordering,
            outbox_relay::table::outbox::DeliveryOrder::PerKey
        );
        assert_eq!(
            plan.table.columns.partition_key.map(|c| c.to_string()),
            Some("order_id".into())
        );
        spec.relay.ordering = RelayOrdering::Unordered;
        assert_eq!(
            messages(&spec),
            vec![
                "spec.database.columns.partitionKey: only has a meaning with spec.relay.ordering perKey: set it, or remove the column"
            ]
        );
    }

    #[test]
    fn broker_names_fit_amqp() {
        let mut spec = sample_spec();
        spec.broker.exchange = Some("x".repeat(256));
        spec.broker.url_secret_ref.name = String::new();
        assert_eq!(
            messages(&spec),
            vec![
                "spec.broker.urlSecretRef.name: must not be empty",
                "spec.broker.exchange: is 256 bytes; AMQP allows at most 255",
            ]
        );
    }
}
