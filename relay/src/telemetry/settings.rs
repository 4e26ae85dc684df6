//! Whether and where spans go, read from the OpenTelemetry SDK's standard environment variables
//! (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/ and the
//! OTLP exporter's): the same settings every other service of a cluster already gets, so the
//! relay needs no flags of its own. Export is off unless an endpoint is named.
//!
//! Read here, once, so that a setting this build cannot honour (gRPC, another exporter, a client
//! certificate) stops the process at start naming the variable, instead of spans silently going
//! nowhere. The exporter crate reads the endpoint, headers, timeout and compression itself.

use std::path::PathBuf;

/// The endpoint variables, the traces-only one first: it wins (the specification's order).
const ENDPOINT: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];
const PROTOCOL: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
const CERTIFICATE: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
];
const CLIENT_CERTIFICATE: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];
/// The one protocol built in.
pub const HTTP_PROTOBUF: &str = "http/protobuf";
/// The specification's default endpoint for OTLP/HTTP, used when `OTEL_TRACES_EXPORTER=otlp`
/// asks for export without naming an endpoint.
const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// Where spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpTarget {
    /// The endpoint as configured (a base URL, or the traces URL itself), for the start-up log
    /// line: its user info, if any, is left out.
    pub endpoint: String,
    /// Over https: the CA file trusted besides the system's store, if one is named.
    pub ca_file: Option<PathBuf>,
}

/// A setting this build cannot follow: the process stops at start with this, exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtlpSettingError {
    #[error(
        "{variable}={value}: this build exports spans over OTLP/HTTP with protobuf only; set it \
         to {HTTP_PROTOBUF} (or unset it) and point OTEL_EXPORTER_OTLP_ENDPOINT at the \
         collector's HTTP port (4318 by default)"
    )]
    Protocol {
        variable: &'static str,
        value: String,
    },
    #[error(
        "OTEL_TRACES_EXPORTER={0}: this build exports spans over OTLP only; set it to otlp, or to \
         none to turn spans off"
    )]
    Exporter(String),
    #[error(
        "{variable}: not an http:// or https:// URL ({reason}); give the collector's OTLP/HTTP \
         address, e.g. http://otel-collector.observability:4318"
    )]
    Endpoint {
        variable: &'static str,
        reason: String,
    },
    #[error(
        "{0}: client certificates for the OTLP endpoint are not supported by this build; unset \
         it and authenticate with OTEL_EXPORTER_OTLP_HEADERS instead"
    )]
    ClientCertificate(&'static str),
}

/// The first of `names` that is set (and not empty), with its value.
fn first_set(
    names: &[&'static str],
    get: &impl Fn(&str) -> Option<String>,
) -> Option<(&'static str, String)> {
    names.iter().find_map(|&name| {
        get(name)
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
            .map(|value| (name, value))
    })
}

/// What the environment (through `get`) asks for: None when spans are off, which they are
/// unless an endpoint is named or `OTEL_TRACES_EXPORTER=otlp` asks for the default one.
pub fn otlp_target(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<OtlpTarget>, OtlpSettingError> {
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let exporter = first_set(&["OTEL_TRACES_EXPORTER"], &get).map(|(_, value)| value);
    let asked = match exporter.as_deref() {
        None => false,
        Some(list) => {
            let names: Vec<&str> = list.split(',').map(str::trim).collect();
            if let Some(other) = names.iter().find(|n| !matches!(**n, "otlp" | "none")) {
                return Err(OtlpSettingError::Exporter(other.to_string()));
            }
            if !names.contains(&"otlp") {
                return Ok(None);
            }
            true
        }
    };
    let endpoint = match first_set(&ENDPOINT, &get) {
        Some((variable, value)) => {
            check_endpoint(variable, &value)?;
            value
        }
        None if asked => DEFAULT_ENDPOINT.to_string(),
        None => return Ok(None),
    };
    if let Some((variable, value)) = first_set(&PROTOCOL, &get)
        && value != HTTP_PROTOBUF
    {
        return Err(OtlpSettingError::Protocol { variable, value });
    }
    if let Some((variable, _)) = first_set(&CLIENT_CERTIFICATE, &get) {
        return Err(OtlpSettingError::ClientCertificate(variable));
    }
    Ok(Some(OtlpTarget {
        endpoint: without_user_info(&endpoint),
        ca_file: first_set(&CERTIFICATE, &get).map(|(_, path)| PathBuf::from(path)),
    }))
}

fn check_endpoint(variable: &'static str, value: &str) -> Result<(), OtlpSettingError> {
    let url = url::Url::parse(value).map_err(|e| OtlpSettingError::Endpoint {
        variable,
        reason: e.to_string(),
    })?;
    match url.scheme() {
        "http" | "https" if url.host_str().is_some() => Ok(()),
        "http" | "https" => Err(OtlpSettingError::Endpoint {
            variable,
            reason: "no host".into(),
        }),
        other => Err(OtlpSettingError::Endpoint {
            variable,
            reason: format!("scheme {other}"),
        }),
    }
}

/// The endpoint for a log line: a URL's user and password are never shown.
fn without_user_info(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        _ => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn spans_are_off_until_an_endpoint_is_named() {
        assert_eq!(otlp_target(env(&[])), Ok(None));
        assert_eq!(
            otlp_target(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])),
            Ok(None),
            "a protocol alone turns nothing on"
        );
        let on = otlp_target(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(on.endpoint, "http://collector:4318");
        assert_eq!(on.ca_file, None);
        let default = otlp_target(env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
            .unwrap()
            .unwrap();
        assert_eq!(default.endpoint, DEFAULT_ENDPOINT);
    }

    #[test]
    fn the_traces_endpoint_wins_and_none_or_disabled_turn_spans_off() {
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://all:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://traces:443/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem"),
        ]);
        let target = otlp_target(both).unwrap().unwrap();
        assert_eq!(target.endpoint, "https://traces:443/v1/traces");
        assert_eq!(target.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        for off in [
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://all:4318"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ]),
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://all:4318"),
                ("OTEL_SDK_DISABLED", "TRUE"),
            ]),
        ] {
            assert_eq!(otlp_target(off), Ok(None));
        }
    }

    #[test]
    fn what_this_build_cannot_do_is_refused_naming_the_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317");
        let grpc = otlp_target(env(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]))
        .unwrap_err();
        assert!(
            grpc.to_string()
                .starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc: this build exports"),
            "{grpc}"
        );
        let zipkin =
            otlp_target(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "otlp,zipkin")])).unwrap_err();
        assert_eq!(zipkin, OtlpSettingError::Exporter("zipkin".into()));
        let bad =
            otlp_target(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")])).unwrap_err();
        assert!(
            bad.to_string()
                .starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: not an http"),
            "{bad}"
        );
        let client = otlp_target(env(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem"),
        ]))
        .unwrap_err();
        assert_eq!(
            client,
            OtlpSettingError::ClientCertificate("OTEL_EXPORTER_OTLP_CLIENT_KEY")
        );
    }

    #[test]
    fn a_password_in_the_endpoint_is_not_shown() {
        let target = otlp_target(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://user:s3cret@collector:4318",
        )]))
        .unwrap()
        .unwrap();
        assert!(!target.endpoint.contains("s3cret"), "{}", target.endpoint);
        assert!(!target.endpoint.contains("user"), "{}", target.endpoint);
    }
}
