//! What to say when a server's certificate is refused for its dates (expired, or not valid
//! yet), for PostgreSQL and the broker alike: the host, the date the certificate gives, the time
//! this host's clock reads (a wrong clock makes a good certificate look expired), and what to do.
//! rustls gives the dates in its `…Context` variants; the plain variants get the words without
//! them.

use rustls::CertificateError;
use rustls::pki_types::UnixTime;

/// Who refuses and how to fix it, in the words of one connection.
pub struct Refusing<'a> {
    /// Whose certificate it is, e.g. "the database server's".
    pub whose: &'a str,
    /// The host the connection was made to.
    pub host: &'a str,
    /// The setting that checks the dates, e.g. "sslmode=verify-full".
    pub checked_by: &'a str,
    /// Where the certificate is renewed, e.g. "the server's certificate (ssl_cert_file)".
    pub renew: &'a str,
}

/// The message for a certificate refused for its dates; `None` for any other refusal.
pub fn problem(e: &CertificateError, refusing: &Refusing<'_>) -> Option<String> {
    let Refusing {
        whose,
        host,
        checked_by,
        renew,
    } = refusing;
    let message = match e {
        CertificateError::Expired => format!(
            "{whose} certificate for {host} has expired, and {checked_by} refuses it: renew \
             {renew}; if it should still be valid, check this host's clock"
        ),
        CertificateError::ExpiredContext { time, not_after } => format!(
            "{whose} certificate for {host} expired on {} (this host's clock reads {}), and \
             {checked_by} refuses it: renew {renew}; if it should still be valid, check this \
             host's clock",
            shown(not_after),
            shown(time)
        ),
        CertificateError::NotValidYet => format!(
            "{whose} certificate for {host} is not valid yet, and {checked_by} refuses it: \
             check the clocks of this host and of the one that issued it"
        ),
        CertificateError::NotValidYetContext { time, not_before } => format!(
            "{whose} certificate for {host} is valid only from {} (this host's clock reads {}), \
             and {checked_by} refuses it: check the clocks of this host and of the one that \
             issued it",
            shown(not_before),
            shown(time)
        ),
        _ => return None,
    };
    Some(message)
}

/// A UTC date and time to the second; the raw seconds if chrono cannot place them (they come
/// from a certificate, which may hold any date).
fn shown(time: &UnixTime) -> String {
    let seconds = time.as_secs();
    i64::try_from(seconds)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{seconds} seconds after 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const REFUSING: Refusing<'static> = Refusing {
        whose: "the database server's",
        host: "db.internal",
        checked_by: "sslmode=verify-full",
        renew: "the server's certificate (ssl_cert_file)",
    };

    fn at(seconds: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(seconds))
    }

    #[test]
    fn an_expired_certificate_names_its_host_its_date_the_clock_and_the_fix() {
        let e = CertificateError::ExpiredContext {
            time: at(1_796_256_000),      // 2026-12-03
            not_after: at(1_609_459_200), // 2021-01-01
        };
        let message = problem(&e, &REFUSING).unwrap();
        for part in [
            "certificate for db.internal expired on 2021-01-01 00:00:00 UTC",
            "clock reads 2026-12-03",
            "sslmode=verify-full",
            "renew the server's certificate (ssl_cert_file)",
            "check this host's clock",
        ] {
            assert!(message.contains(part), "{part:?} missing in: {message}");
        }
        let plain = problem(&CertificateError::Expired, &REFUSING).unwrap();
        assert!(
            plain.contains("has expired") && plain.contains("renew"),
            "{plain}"
        );
    }

    #[test]
    fn a_certificate_not_valid_yet_points_at_the_clocks() {
        let e = CertificateError::NotValidYetContext {
            time: at(0),
            not_before: at(1_609_459_200),
        };
        let message = problem(&e, &REFUSING).unwrap();
        assert!(message.contains("valid only from 2021-01-01"), "{message}");
        assert!(message.contains("1970-01-01"), "{message}");
        assert!(message.contains("clocks"), "{message}");
    }

    #[test]
    fn other_refusals_and_far_dates_are_not_its_business_or_do_not_panic() {
        assert_eq!(problem(&CertificateError::UnknownIssuer, &REFUSING), None);
        assert_eq!(problem(&CertificateError::NotValidForName, &REFUSING), None);
        let far = CertificateError::ExpiredContext {
            time: at(u64::MAX),
            not_after: at(u64::MAX - 1),
        };
        assert!(
            problem(&far, &REFUSING)
                .unwrap()
                .contains("seconds after 1970")
        );
    }
}
