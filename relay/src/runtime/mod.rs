//! A running relay process: the workers (each one database connection and one publisher), the
//! reporter, the LISTEN task and the HTTP endpoints, started and stopped in order by [`run`].

pub mod alarm;
pub mod backoff;
pub mod health;
pub mod http;
pub mod lanes;
pub mod listener;
pub mod nacks;
pub mod rate;
pub mod reporter;
pub mod run;
pub mod suspend;
pub mod worker;
