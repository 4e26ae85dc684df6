//! What connecting to PostgreSQL and to the broker needs before a driver is involved, shared
//! by both: URLs that never show their password ([`secret_url`]), libpq's multi-host URL form
//! split into one URL per host ([`libpq_url`]), passwords read from a file at each new
//! connection ([`secret_file`]), and the words for a server certificate refused for its dates
//! ([`certificate_dates`]), and keepalives on the process's own TCP connections, which no driver
//! sets ([`tcp_keepalive`]). Leaves: nothing here imports from the rest of the crate but
//! [`crate::defaults`].

pub mod certificate_dates;
pub mod libpq_url;
pub mod secret_file;
pub mod secret_url;
pub mod tcp_keepalive;
