//! W3C trace context (https://www.w3.org/TR/trace-context/) carried from an outbox row to its
//! message: the `traceparent` (and `tracestate`) the producing service wrote in its transaction,
//! checked here and sent on as the message headers of those names, so the consumer continues
//! the producer's trace.
//!
//! Written by hand rather than taken from the `opentelemetry` crate: its
//! `TraceContextPropagator` needs the whole OpenTelemetry API (context, global propagators) to
//! check 55 characters, and the relay must stay free of it while no spans are built. The format
//! is small and fixed: version `-` trace-id `-` parent-id `-` flags, lowercase hex.
//!
//! The parsed ids are kept, not only the text, so that the relay's batch spans can later link
//! to each message's context without parsing it again.

/// The headers (AMQP 0-9-1) and application properties (AMQP 1.0) the context goes out as: the
/// W3C names, which OpenTelemetry's propagators and its messaging instrumentations read.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// `tracestate` holds at most this many list members (W3C, "tracestate Header Field Values").
const TRACESTATE_MEMBERS_MAX: usize = 32;

/// A `traceparent` that passed the checks, with its `tracestate` when that passed too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext<'a> {
    /// The header as the row had it (surrounding whitespace trimmed): sent on unchanged, so a
    /// later version's extra fields reach the consumer.
    pub traceparent: &'a str,
    pub trace_id: [u8; 16],
    /// The producer's span: the parent of the consumer's span.
    pub span_id: [u8; 8],
    pub flags: u8,
    pub tracestate: Option<&'a str>,
}

impl TraceContext<'_> {
    /// The `sampled` flag: the producer recorded its span.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Which of the two headers was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceField {
    Traceparent,
    Tracestate,
}

impl TraceField {
    pub fn label(self) -> &'static str {
        match self {
            TraceField::Traceparent => TRACEPARENT,
            TraceField::Tracestate => TRACESTATE,
        }
    }
}

/// A header the row gave that the relay did not send on, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub field: TraceField,
    pub reason: &'static str,
}

/// What a message carries of its row's trace context: the context to send (if any), and what
/// was dropped as malformed (counted, never a reason to hold the message back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageTrace<'a> {
    pub context: Option<TraceContext<'a>>,
    pub dropped: Option<Dropped>,
}

impl<'a> MessageTrace<'a> {
    /// The trace of a row that gave `traceparent` (None: none) and `tracestate`. A tracestate
    /// without a valid traceparent has no meaning (W3C: it is discarded with it); a malformed
    /// tracestate is dropped alone and the traceparent still goes.
    pub fn of(traceparent: Option<&'a str>, tracestate: Option<&'a str>) -> Self {
        let Some(text) = traceparent else {
            return Self::default();
        };
        let mut context = match parse_traceparent(text) {
            Ok(context) => context,
            Err(reason) => {
                return Self {
                    context: None,
                    dropped: Some(Dropped {
                        field: TraceField::Traceparent,
                        reason,
                    }),
                };
            }
        };
        let mut dropped = None;
        match tracestate.map(str::trim).filter(|state| !state.is_empty()) {
            None => {}
            Some(state) => match check_tracestate(state) {
                Ok(()) => context.tracestate = Some(state),
                Err(reason) => {
                    dropped = Some(Dropped {
                        field: TraceField::Tracestate,
                        reason,
                    });
                }
            },
        }
        Self {
            context: Some(context),
            dropped,
        }
    }
}

/// Lowercase hex only: the W3C format refuses uppercase.
fn hex_digit(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    }
}

fn hex_bytes<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = hex_digit(pair[0])? << 4 | hex_digit(pair[1])?;
    }
    Some(out)
}

/// Checks a `traceparent` header: `vv-<32 hex trace-id>-<16 hex parent-id>-ff` in lowercase,
/// neither id all zeros, version `ff` invalid. Version 00 is exactly 55 characters; a later
/// version may append fields after a `-` (W3C "Versioning of traceparent"), which are kept.
pub fn parse_traceparent(text: &str) -> Result<TraceContext<'_>, &'static str> {
    let text = text.trim();
    let bytes = text.as_bytes();
    if bytes.len() < 55 {
        return Err("shorter than the 55 characters of version-trace_id-parent_id-flags");
    }
    let version =
        hex_bytes::<1>(&bytes[0..2]).ok_or("the version is not two lowercase hex digits")?[0];
    if version == 0xff {
        return Err("version ff is invalid");
    }
    if [2, 35, 52].iter().any(|&at| bytes[at] != b'-') {
        return Err("the fields are not separated by '-' where the format puts them");
    }
    match (version, bytes.get(55)) {
        (0, Some(_)) => return Err("version 00 is exactly 55 characters"),
        (_, Some(b'-')) | (_, None) => {}
        (_, Some(_)) => return Err("a later version's extra fields must follow a '-'"),
    }
    let trace_id =
        hex_bytes::<16>(&bytes[3..35]).ok_or("the trace-id is not 32 lowercase hex digits")?;
    if trace_id == [0; 16] {
        return Err("the trace-id is all zeros");
    }
    let span_id =
        hex_bytes::<8>(&bytes[36..52]).ok_or("the parent-id is not 16 lowercase hex digits")?;
    if span_id == [0; 8] {
        return Err("the parent-id is all zeros");
    }
    let flags =
        hex_bytes::<1>(&bytes[53..55]).ok_or("the flags are not two lowercase hex digits")?[0];
    Ok(TraceContext {
        traceparent: text,
        trace_id,
        span_id,
        flags,
        tracestate: None,
    })
}

/// A light check of `tracestate`: printable ASCII, at most 32 comma-separated `key=value`
/// members. What each vendor puts in its value is its own business; this keeps out what would
/// make the header unreadable to every consumer.
fn check_tracestate(state: &str) -> Result<(), &'static str> {
    if !state.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err("not printable ASCII");
    }
    let mut members = 0;
    for member in state.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        members += 1;
        match member.split_once('=') {
            Some((key, _)) if !key.is_empty() => {}
            _ => return Err("a list member is not key=value"),
        }
    }
    if members > TRACESTATE_MEMBERS_MAX {
        return Err("more than 32 list members");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_parses() {
        let context = parse_traceparent(VALID).unwrap();
        assert_eq!(context.traceparent, VALID);
        assert_eq!(context.trace_id[0], 0x4b);
        assert_eq!(context.trace_id[15], 0x36);
        assert_eq!(
            context.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(context.sampled());
        // Surrounding whitespace (a char(n) column, a copied header) is not part of it.
        assert_eq!(
            parse_traceparent(&format!(" {VALID}\n"))
                .unwrap()
                .traceparent,
            VALID
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let cases = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01é",
        ];
        for case in cases {
            assert!(parse_traceparent(case).is_err(), "{case:?} was accepted");
        }
    }

    #[test]
    fn later_versions_keep_their_extra_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever";
        assert_eq!(parse_traceparent(later).unwrap().traceparent, later);
        let exact = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!parse_traceparent(exact).unwrap().sampled());
    }

    #[test]
    fn tracestate_goes_with_a_valid_traceparent_only() {
        let trace = MessageTrace::of(Some(VALID), Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert_eq!(
            trace.context.unwrap().tracestate,
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        assert_eq!(trace.dropped, None);

        let bad_parent = MessageTrace::of(Some("nope"), Some("rojo=1"));
        assert_eq!(bad_parent.context, None);
        assert_eq!(bad_parent.dropped.unwrap().field, TraceField::Traceparent);

        let bad_state = MessageTrace::of(Some(VALID), Some("rojo=1,\u{7}"));
        assert_eq!(bad_state.context.unwrap().tracestate, None);
        assert_eq!(bad_state.dropped.unwrap().field, TraceField::Tracestate);
        let too_many: Vec<String> = (0..33).map(|n| format!("k{n}=v")).collect();
        let too_many = too_many.join(",");
        let crowded = MessageTrace::of(Some(VALID), Some(&too_many));
        assert_eq!(crowded.dropped.unwrap().field, TraceField::Tracestate);

        // An empty tracestate is no tracestate, not a malformed one.
        assert_eq!(MessageTrace::of(Some(VALID), Some("  ")).dropped, None);
        assert_eq!(
            MessageTrace::of(None, Some("rojo=1")),
            MessageTrace::default()
        );
    }
}
