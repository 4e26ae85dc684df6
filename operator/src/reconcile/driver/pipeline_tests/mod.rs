//! Request-level tests of the whole pipeline: a scripted API server and a scripted database,
//! assembled per test by [`scenario::Scenario`].

mod deletion;
mod failures;
mod lifecycle;
mod oom_kills;
mod scaling;
mod scenario;
mod spans;
mod table_health;
