//! The relay's spans: one trace per batch that claimed rows, with a span for each step
//!
//! ```text
//! outbox batch <table>            INTERNAL, linked to every message's trace context
//! ├── claim <table>               CLIENT, PostgreSQL (SELECT … FOR UPDATE SKIP LOCKED, or UPDATE)
//! ├── publish <exchange>          PRODUCER, the messaging conventions' batch "send", linked too
//! └── settle <table>              CLIENT, PostgreSQL (the mark, then COMMIT)
//! ```
//!
//! Links, not parents: one batch carries the messages of many traces, and each of those traces
//! goes on in its consumer (the message keeps its own `traceparent`). The OpenTelemetry
//! messaging conventions put such links on the batch's send span; the batch span has them too,
//! so a producer's trace leads to the whole batch, its claim and its settle included.
//!
//! The spans are built after the batch from the times it noted ([`BatchTimeline`]): while
//! tracing is off the batch notes nothing and no span exists at all, and an empty claim (an idle
//! poll) never makes a trace.

use std::time::SystemTime;

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use crate::broker::Message;
use crate::broker::trace_context::TraceContext;

/// The messaging system a broker protocol is, in the conventions' words: `rabbitmq` for AMQP
/// 0-9-1. The conventions name no value for AMQP 1.0 as such (Artemis, Service Bus and RabbitMQ
/// all speak it), so that one is `amqp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagingSystem {
    RabbitMq,
    Amqp10,
}

impl MessagingSystem {
    fn name(self) -> &'static str {
        match self {
            MessagingSystem::RabbitMq => "rabbitmq",
            MessagingSystem::Amqp10 => "amqp",
        }
    }

    /// The conventions' `messaging.operation.name`: the protocol's own word for a send.
    fn operation(self) -> &'static str {
        match self {
            MessagingSystem::RabbitMq => "publish",
            MessagingSystem::Amqp10 => "send",
        }
    }
}

/// What the spans of every batch of a process share: the tracer and the names and attributes
/// that do not change.
#[derive(Debug, Clone)]
pub struct BatchSpans {
    tracer: SdkTracer,
    table: String,
    destination: String,
    system: MessagingSystem,
    database: Vec<KeyValue>,
    messaging: Vec<KeyValue>,
}

impl BatchSpans {
    /// `table` as the relay names it (schema-qualified), `database` the database it is in
    /// (when the URL names it), `destination` the exchange (AMQP 0-9-1) or address (AMQP 1.0)
    /// messages go to.
    pub fn new(
        tracer: SdkTracer,
        table: &str,
        database: Option<&str>,
        destination: &str,
        system: MessagingSystem,
    ) -> Self {
        let mut database_attributes = vec![
            KeyValue::new("db.system.name", "postgresql"),
            KeyValue::new("db.collection.name", table.to_string()),
        ];
        if let Some(database) = database {
            database_attributes.push(KeyValue::new("db.namespace", database.to_string()));
        }
        Self {
            tracer,
            table: table.to_string(),
            destination: destination.to_string(),
            system,
            database: database_attributes,
            messaging: vec![
                KeyValue::new("messaging.system", system.name()),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.operation.name", system.operation()),
                KeyValue::new("messaging.destination.name", destination.to_string()),
            ],
        }
    }

    /// Builds the spans of one batch from what it noted. Nothing for a batch that claimed no
    /// rows and did not fail.
    pub fn record(&self, timeline: BatchTimeline, end: BatchEnd) {
        if timeline.rows == 0 && !matches!(end, BatchEnd::Failed(_)) {
            return;
        }
        let now = SystemTime::now();
        let tracer = &self.tracer;
        let mut attributes = vec![
            KeyValue::new("outbox.table", self.table.clone()),
            KeyValue::new("messaging.batch.message_count", timeline.rows as i64),
        ];
        if let BatchEnd::Settled(counts) = &end {
            attributes.extend(counts.attributes());
        }
        let batch = tracer
            .span_builder(format!("outbox batch {}", self.table))
            .with_kind(SpanKind::Internal)
            .with_start_time(timeline.started)
            .with_attributes(attributes)
            .with_links(timeline.links.clone())
            .start_with_context(tracer, &Context::new());
        let parent = Context::new().with_span(batch);

        let claimed = timeline.claimed.unwrap_or(now);
        self.step(
            &parent,
            "claim",
            timeline.claim_statement,
            timeline.started,
            claimed,
        );
        if let Some((started, ended)) = timeline.publish {
            let mut messaging = self.messaging.clone();
            messaging.push(KeyValue::new(
                "messaging.batch.message_count",
                timeline.messages as i64,
            ));
            let publish = tracer
                .span_builder(format!("{} {}", self.system.operation(), self.destination))
                .with_kind(SpanKind::Producer)
                .with_start_time(started)
                .with_attributes(messaging)
                .with_links(timeline.links)
                .start_with_context(tracer, &parent);
            let publish = Context::new().with_span(publish);
            if let Some(failure) = timeline.broker_failure {
                publish.span().set_status(Status::error(failure));
            }
            publish.span().end_with_timestamp(ended);
        }
        let settle_from = timeline.publish.map_or(claimed, |(_, ended)| ended);
        if timeline.claimed.is_some() {
            let statement = if timeline.marked { "UPDATE" } else { "COMMIT" };
            self.step(&parent, "settle", statement, settle_from, now);
        }
        if let BatchEnd::Failed(error) = end {
            parent.span().set_status(Status::error(error));
        }
        parent.span().end_with_timestamp(now);
    }

    /// A database step of the batch, as the database conventions describe a client call.
    fn step(
        &self,
        parent: &Context,
        step: &'static str,
        statement: &'static str,
        started: SystemTime,
        ended: SystemTime,
    ) {
        let mut attributes = self.database.clone();
        attributes.push(KeyValue::new("db.operation.name", statement));
        let span = self
            .tracer
            .span_builder(format!("{step} {}", self.table))
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        Context::new()
            .with_span(span)
            .span()
            .end_with_timestamp(ended);
    }
}

/// How a batch ended, for its span.
#[derive(Debug)]
pub enum BatchEnd {
    Settled(SettledCounts),
    /// The batch rolled back (a database error, a COMMIT that did not return).
    Failed(String),
}

/// What became of a settled batch's rows.
#[derive(Debug, Default, Clone, Copy)]
pub struct SettledCounts {
    pub published: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub untouched: usize,
    pub nacked: usize,
}

impl SettledCounts {
    fn attributes(&self) -> [KeyValue; 5] {
        [
            KeyValue::new("outbox.messages.published", self.published as i64),
            KeyValue::new("outbox.messages.retried", self.retried as i64),
            KeyValue::new("outbox.messages.dead_lettered", self.dead_lettered as i64),
            KeyValue::new("outbox.messages.untouched", self.untouched as i64),
            KeyValue::new("outbox.messages.nacked", self.nacked as i64),
        ]
    }
}

/// The times and facts of one batch that its spans are built from. Noting them costs a clock
/// read each; a batch notes nothing while tracing is off (its timeline is None).
#[derive(Debug)]
pub struct BatchTimeline {
    started: SystemTime,
    claim_statement: &'static str,
    claimed: Option<SystemTime>,
    rows: usize,
    messages: usize,
    links: Vec<Link>,
    publish: Option<(SystemTime, SystemTime)>,
    broker_failure: Option<String>,
    marked: bool,
}

impl BatchTimeline {
    /// Starts the timeline as the claim's transaction begins. `settling_claim`: the claim is an
    /// UPDATE that marks the rows as it takes them.
    pub fn start(settling_claim: bool) -> Self {
        Self {
            started: SystemTime::now(),
            claim_statement: if settling_claim { "UPDATE" } else { "SELECT" },
            claimed: None,
            rows: 0,
            messages: 0,
            links: Vec::new(),
            publish: None,
            broker_failure: None,
            marked: false,
        }
    }

    /// The claim returned `rows` rows.
    pub fn claimed(&mut self, rows: usize) {
        self.claimed = Some(SystemTime::now());
        self.rows = rows;
    }

    /// The messages the batch sends: a link to each one's trace context, with its id.
    pub fn messages<'m, 'a: 'm>(&mut self, messages: impl Iterator<Item = &'m Message<'a>>) {
        for message in messages {
            self.messages += 1;
            if let Some(context) = &message.trace.context {
                self.links.push(link(context, message.id));
            }
        }
    }

    /// The messages went to the broker from `started` until now (every wave, under per-key
    /// ordering); `failure`: the connection broke meanwhile.
    pub fn published(&mut self, started: SystemTime, failure: Option<String>) {
        self.publish = Some((started, SystemTime::now()));
        self.broker_failure = failure;
    }

    /// The settle step ran an UPDATE (some rows were marked or put back).
    pub fn marked(&mut self) {
        self.marked = true;
    }
}

/// The link to a message's producer span, as the messaging conventions describe it.
fn link(context: &TraceContext<'_>, id: uuid::Uuid) -> Link {
    let state = context
        .tracestate
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    let span = SpanContext::new(
        TraceId::from_bytes(context.trace_id),
        SpanId::from_bytes(context.span_id),
        TraceFlags::new(context.flags),
        true,
        state,
    );
    Link::new(
        span,
        vec![KeyValue::new("messaging.message.id", id.to_string())],
        0,
    )
}
