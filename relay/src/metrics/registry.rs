//! Registering a collector in a process's own registry, shared by every metric family (and by
//! the operator's metrics).

use prometheus::Registry;

/// Registers a new collector in `registry` and hands it back, so each metric is defined in one
/// expression. Definitions are static, so a bad one or a name used twice is a bug: it panics.
pub fn registered<C>(registry: &Registry, collector: prometheus::Result<C>) -> C
where
    C: prometheus::core::Collector + Clone + 'static,
{
    let collector = collector.expect("static metric definition");
    registry
        .register(Box::new(collector.clone()))
        .expect("each metric name registers once");
    collector
}
