//! The broker's nodes as the user writes them: one URL, or a comma-separated list of full URLs
//! (`amqp://u:p@h1:5672/%2f,amqp://u:p@h2:5672/%2f`), the spelling Spring Boot's
//! `spring.rabbitmq.addresses` and other RabbitMQ clients take. Each element is a whole URL, so
//! each may carry its own credentials, vhost and query; a bare `host:port` that would inherit
//! them from the first is refused: one spelling, and nothing implied about which parts carry
//! over. The list splits only at a comma that starts another URL (`scheme://`), so a
//! single URL whose password holds a raw comma keeps working as before.

use std::fmt;

use crate::connect::secret_url::{SecretUrl, UrlError, UrlKind};

/// Why a list is refused. It names the element by position and never shows its text (an
/// element may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error("is empty; expected a URL such as amqp://user:password@host:5672/%2f")]
    Empty,
    #[error("{at}is empty: remove the extra comma")]
    EmptyElement { at: Place },
    #[error("{at}{error}{hint}")]
    Element {
        at: Place,
        error: UrlError,
        hint: &'static str,
    },
    #[error(
        "{at}has a comma after its user and password: each element of \
         a broker list is a full URL (amqp://user:password@host1:5672/%2f,\
         amqp://user:password@host2:5672/%2f), a bare host:port is not taken; write a comma in a \
         vhost as %2C"
    )]
    HostList { at: Place },
}

/// Which element of a list an error is about: "element 2 of 3 ", or nothing for one URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub position: usize,
    pub count: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count > 1 {
            write!(f, "element {} of {} ", self.position, self.count)?;
        }
        Ok(())
    }
}

const FULL_URL_HINT: &str = "; each element of a broker list is a full URL \
    (amqp://user:password@host1:5672/%2f,amqp://user:password@host2:5672/%2f), a bare host:port \
    is not taken";

/// One or more broker URLs, in the order given.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerUrls(Vec<SecretUrl>);

impl BrokerUrls {
    pub fn parse(text: &str) -> Result<Self, ListError> {
        let elements = split(text);
        let count = elements.len();
        if count == 1 && elements[0].trim().is_empty() {
            return Err(ListError::Empty);
        }
        let mut urls = Vec::with_capacity(count);
        for (index, element) in elements.iter().enumerate() {
            let at = Place {
                position: index + 1,
                count,
            };
            if element.trim().is_empty() {
                return Err(ListError::EmptyElement { at });
            }
            if comma_after_userinfo(element) {
                return Err(ListError::HostList { at });
            }
            let url = SecretUrl::parse(element, UrlKind::Amqp).map_err(|error| {
                // A bare host:port parses as a URL whose scheme is the host name: say what a
                // list element must be instead of "has scheme h2".
                let hint = if count > 1 || element.contains(',') {
                    FULL_URL_HINT
                } else {
                    ""
                };
                ListError::Element { at, error, hint }
            })?;
            urls.push(url);
        }
        Ok(Self(urls))
    }

    /// One URL, e.g. from a test or a tool that takes one node.
    pub fn one(url: SecretUrl) -> Self {
        Self(vec![url])
    }

    pub fn first(&self) -> &SecretUrl {
        &self.0[0]
    }

    pub fn iter(&self) -> impl Iterator<Item = &SecretUrl> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The `host:port` a URL names, for logs and metric labels: nothing secret, nothing that varies
/// between the workers of one process. A URL without a port shows the scheme's default.
pub fn host_port(url: &SecretUrl) -> String {
    let Ok(parsed) = url::Url::parse(url.expose()) else {
        return String::new();
    };
    let port = parsed.port().unwrap_or(if parsed.scheme() == "amqps" {
        5671
    } else {
        5672
    });
    format!("{}:{port}", parsed.host_str().unwrap_or_default())
}

/// A comma in the host, port, vhost or query: a host list or a bare `host:port` that did not
/// split off (no scheme after its comma). One in the user or password is theirs.
fn comma_after_userinfo(element: &str) -> bool {
    let rest = element.split_once("://").map_or(element, |(_, rest)| rest);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let after_userinfo = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    rest[after_userinfo..].contains(',')
}

/// `scheme://` at the start of `text` (any scheme: a wrong one is then named as such).
fn starts_with_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Splits at each comma followed (after blanks) by a `scheme://`.
fn split(text: &str) -> Vec<&str> {
    let mut elements = Vec::new();
    let mut start = 0;
    for (at, _) in text.match_indices(',') {
        let rest = text[at + 1..].trim_start();
        let next_is_url = starts_with_scheme(rest);
        // An empty element (",,", or a trailing comma) is split off too, so it can be named.
        if next_is_url || rest.is_empty() || rest.starts_with(',') {
            elements.push(&text[start..at]);
            start = at + 1;
        }
    }
    elements.push(&text[start..]);
    elements
}

impl fmt::Debug for BrokerUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.0).finish()
    }
}

/// The redacted URLs, comma-separated as given.
impl fmt::Display for BrokerUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, url) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            fmt::Display::fmt(url, f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_or_a_list_of_full_urls() {
        let one = BrokerUrls::parse("amqp://u:p@h1:5672/%2f").unwrap();
        assert_eq!(one.len(), 1);
        let list = BrokerUrls::parse(
            "amqp://u:secret1@h1:5672/%2f, amqps://v:secret2@h2/prod,AMQP://w@h3:5782",
        )
        .unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(
            list.to_string(),
            "amqp://u:***@h1:5672/%2f,amqps://v:***@h2/prod,amqp://w@h3:5782"
        );
        let hosts: Vec<String> = list.iter().map(host_port).collect();
        assert_eq!(hosts, ["h1:5672", "h2:5671", "h3:5782"]);
        assert_eq!(list.iter().nth(1).unwrap().password().unwrap(), "secret2");
    }

    #[test]
    fn a_raw_comma_in_a_password_is_not_a_separator() {
        let url = BrokerUrls::parse("amqp://u:pa,ss@h1:5672/%2f").unwrap();
        assert_eq!(url.len(), 1);
        assert_eq!(url.first().password().unwrap(), "pa,ss");
    }

    #[test]
    fn bad_elements_are_named_by_position_without_their_text() {
        let cases = [
            (
                "amqp://u:hunter2@h1/%2f,http://u:hunter2@h2",
                "element 2 of 2 has scheme",
            ),
            ("amqp://u:hunter2@h1/%2f,", "element 2 of 2 is empty"),
            (
                "amqp://u:hunter2@h1/%2f,,amqp://h3",
                "element 2 of 3 is empty",
            ),
            ("amqp://u:hunter2@h1,h2:5672/%2f", "has a comma after"),
            ("amqp://u:hunter2@h1:5672,h2:5672/%2f", "has a comma after"),
            ("amqp://u:hunter2@h1/%2f, h2:5672", "has a comma after"),
            ("", "is empty"),
            ("amqp://", "has no host"),
        ];
        for (text, expected) in cases {
            let error = BrokerUrls::parse(text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text}: {error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
        let error = BrokerUrls::parse("amqp://u:hunter2@h1:5672,amqp:h2")
            .unwrap_err()
            .to_string();
        assert!(error.contains("full URL"), "{error}");
    }
}
