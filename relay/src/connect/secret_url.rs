//! Connection URLs carry passwords. [`SecretUrl`] keeps the full text for the drivers and shows
//! only a redacted form in `Debug`, `Display`, logs and error messages.

use std::fmt;

use crate::connect::libpq_url;

/// Which service a URL is for; decides the accepted schemes and the error wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlKind {
    Postgres,
    Amqp,
}

impl UrlKind {
    fn schemes(self) -> &'static [&'static str] {
        match self {
            UrlKind::Postgres => &["postgres", "postgresql"],
            UrlKind::Amqp => &["amqp", "amqps"],
        }
    }

    fn example(self) -> &'static str {
        match self {
            UrlKind::Postgres => "postgres://user:password@host:5432/database",
            UrlKind::Amqp => "amqp://user:password@host:5672/%2f",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("is not a URL ({reason}); expected something like {example}")]
    Unparseable {
        reason: String,
        example: &'static str,
    },
    #[error("has scheme {scheme:?}; use one of {allowed:?}")]
    Scheme {
        scheme: String,
        allowed: &'static [&'static str],
    },
    #[error("has no host; expected something like {example}")]
    NoHost { example: &'static str },
}

/// A validated connection URL whose password never leaves through formatting.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    full: String,
    /// `full`, or for libpq's multi-host form the URL of its first host: what `url` parses.
    first_host: String,
    redacted: String,
}

impl SecretUrl {
    pub fn parse(text: &str, kind: UrlKind) -> Result<Self, UrlError> {
        let example = kind.example();
        let text = text.trim();
        // libpq's multi-host form (`h1:5432,h2:5433`) is no URL to the parser: each host is
        // checked as a URL of its own, and all of them are shown.
        let hosts = match kind {
            UrlKind::Postgres => {
                Some(libpq_url::split(text).map_err(|e| UrlError::Unparseable {
                    reason: e.to_string(),
                    example,
                })?)
            }
            UrlKind::Amqp => None,
        };
        let first = match &hosts {
            Some(list) => list.hosts[0].url.as_str(),
            None => text,
        };
        // The parser's own message never contains the input, so it is safe to pass on.
        let parsed = url::Url::parse(first).map_err(|e| UrlError::Unparseable {
            reason: e.to_string(),
            example,
        })?;
        if !kind.schemes().contains(&parsed.scheme()) {
            return Err(UrlError::Scheme {
                scheme: parsed.scheme().to_string(),
                allowed: kind.schemes(),
            });
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(UrlError::NoHost { example });
        }
        let redacted = match &hosts {
            Some(list) if list.hosts.len() > 1 => {
                for host in &list.hosts[1..] {
                    url::Url::parse(&host.url).map_err(|e| UrlError::Unparseable {
                        reason: format!("host {}: {e}", host.endpoint),
                        example,
                    })?;
                }
                let endpoints: Vec<&str> = list.hosts.iter().map(|h| h.endpoint.as_str()).collect();
                redact_with_hosts(&parsed, &endpoints.join(","))
            }
            _ => redact(&parsed),
        };
        Ok(Self {
            full: text.to_string(),
            first_host: first.to_string(),
            redacted,
        })
    }

    /// The complete URL, for handing to a driver. Never log this.
    pub fn expose(&self) -> &str {
        &self.full
    }

    /// The URL parsed; for libpq's multi-host form, its first host's URL (the parameters are
    /// the same for every host). Never log this.
    pub fn parsed(&self) -> Option<url::Url> {
        url::Url::parse(&self.first_host).ok()
    }

    /// The password as given (percent-decoded), so tests and log scanners can look for it.
    pub fn password(&self) -> Option<String> {
        let parsed = self.parsed()?;
        let raw = parsed.password()?;
        Some(percent_decode(raw))
    }

    /// The user name as given (percent-decoded); `None` when the URL has none.
    pub fn username(&self) -> Option<String> {
        let parsed = self.parsed()?;
        Some(parsed.username())
            .filter(|user| !user.is_empty())
            .map(percent_decode)
    }

    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The scheme, e.g. `amqps`.
    pub fn scheme(&self) -> &str {
        self.full.split_once("://").map_or("", |(scheme, _)| scheme)
    }
}

fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    // Query strings may hold passwords too (`?password=`), so they are dropped from the shown form.
    shown.set_query(None);
    shown.to_string()
}

/// The redacted form of a multi-host URL: the first host's URL, redacted, with every host in
/// its authority.
fn redact_with_hosts(first: &url::Url, hosts: &str) -> String {
    let mut userinfo = first.username().to_string();
    if first.password().is_some() {
        userinfo.push_str(":***");
    }
    if !userinfo.is_empty() {
        userinfo.push('@');
    }
    format!("{}://{userinfo}{hosts}{}", first.scheme(), first.path())
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({})", self.redacted)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let url = SecretUrl::parse(
            "postgres://app:s3cr%40t%2Fpw@db.example:5432/app?password=other",
            UrlKind::Postgres,
        )
        .unwrap();
        for shown in [
            format!("{url}"),
            format!("{url:?}"),
            url.redacted().to_string(),
        ] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(!shown.contains("other"), "{shown}");
            assert!(shown.contains("db.example"), "{shown}");
        }
        assert_eq!(url.password().as_deref(), Some("s3cr@t/pw"));
        assert!(url.expose().contains("s3cr%40t"));
    }

    #[test]
    fn a_multi_host_url_is_taken_and_shows_every_host() {
        let url = SecretUrl::parse(
            "postgres://app:s3cret@h1:5432,h2:5433/orders?target_session_attrs=read-write",
            UrlKind::Postgres,
        )
        .unwrap();
        assert_eq!(url.redacted(), "postgres://app:***@h1:5432,h2:5433/orders");
        assert_eq!(url.password().as_deref(), Some("s3cret"));
        let err =
            SecretUrl::parse("postgres://app:s3cret@h1:x,h2/db", UrlKind::Postgres).unwrap_err();
        assert!(err.to_string().contains("not a port number"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        let err = SecretUrl::parse("mysql://u:hunter2@h/db", UrlKind::Postgres).unwrap_err();
        assert!(matches!(err, UrlError::Scheme { .. }));
        assert!(!err.to_string().contains("hunter2"));
        let err = SecretUrl::parse("not a url hunter2", UrlKind::Amqp).unwrap_err();
        assert!(matches!(err, UrlError::Unparseable { .. }));
        assert!(!err.to_string().contains("hunter2"));
        let err = SecretUrl::parse("amqp://", UrlKind::Amqp).unwrap_err();
        assert!(matches!(err, UrlError::NoHost { .. }), "{err:?}");
    }
}
