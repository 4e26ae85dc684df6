//! SQL identifiers that come from users and custom resources.
//!
//! Every table and column name the relay puts into SQL passes through [`Ident`]: it is
//! validated against a conservative pattern and always emitted double-quoted, so neither a
//! typo nor a hostile value can change the meaning of a statement. Values are never formatted
//! into SQL; they are bound as parameters.

use std::fmt;

/// PostgreSQL truncates identifiers longer than 63 bytes (NAMEDATALEN - 1); refusing them is
/// kinder than silently talking about a different object.
pub const MAX_IDENT_LEN: usize = 63;

/// Why a user-supplied identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    #[error("is empty; give a name like outbox_messages")]
    Empty,
    #[error("is {0} characters long; PostgreSQL names are at most 63")]
    TooLong(usize),
    #[error(
        "{0:?} is not a plain SQL name; use letters, digits and underscores, starting with a letter or underscore"
    )]
    Invalid(String),
}

/// A validated SQL identifier, matching `[A-Za-z_][A-Za-z0-9_]{0,62}`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    pub fn new(name: &str) -> Result<Self, IdentError> {
        if name.is_empty() {
            return Err(IdentError::Empty);
        }
        let count = name.chars().count();
        if count > MAX_IDENT_LEN {
            return Err(IdentError::TooLong(count));
        }
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(IdentError::Invalid(name.to_string()));
        }
        Ok(Self(name.to_string()))
    }

    /// The name as the user wrote it (and as PostgreSQL stores it, since we always quote).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The quoted form for SQL text. The pattern excludes `"`, so no escaping is needed.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A table name, optionally schema-qualified (`schema.table`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    pub schema: Option<Ident>,
    pub table: Ident,
}

impl TableName {
    pub fn parse(text: &str) -> Result<Self, IdentError> {
        match text.split_once('.') {
            None => Ok(Self {
                schema: None,
                table: Ident::new(text)?,
            }),
            Some((schema, table)) => Ok(Self {
                schema: Some(Ident::new(schema)?),
                table: Ident::new(table)?,
            }),
        }
    }

    /// `"schema"."table"` or `"table"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), self.table.quoted()),
            None => self.table.quoted(),
        }
    }

    /// A name derived from the table for objects the migration creates (indexes), so that two
    /// outbox tables in one database never collide. Truncated to stay a legal identifier.
    pub fn derived(&self, suffix: &str) -> Ident {
        let mut base = self.table.as_str().to_string();
        let room = MAX_IDENT_LEN.saturating_sub(suffix.len() + 1);
        base.truncate(room);
        Ident::new(&format!("{base}_{suffix}")).expect("derived from a valid identifier")
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.table),
            None => write!(f, "{}", self.table),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_plain_names() {
        for name in ["outbox", "_x", "Outbox_Messages2", &"a".repeat(63)] {
            assert_eq!(Ident::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn refuses_everything_else() {
        let cases = [
            ("", IdentError::Empty),
            (
                "outbox; drop table x",
                IdentError::Invalid("outbox; drop table x".into()),
            ),
            ("a\"b", IdentError::Invalid("a\"b".into())),
            ("has space", IdentError::Invalid("has space".into())),
            ("1abc", IdentError::Invalid("1abc".into())),
            ("tablé", IdentError::Invalid("tablé".into())),
            (&"a".repeat(64), IdentError::TooLong(64)),
        ];
        for (name, expected) in cases {
            assert_eq!(Ident::new(name).unwrap_err(), expected, "{name:?}");
        }
    }

    #[test]
    fn table_names_may_carry_a_schema() {
        let plain = TableName::parse("outbox").unwrap();
        assert_eq!(plain.quoted(), "\"outbox\"");
        let qualified = TableName::parse("app.outbox").unwrap();
        assert_eq!(qualified.quoted(), "\"app\".\"outbox\"");
        assert_eq!(qualified.to_string(), "app.outbox");
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse(".outbox").is_err());
        assert!(TableName::parse("app.").is_err());
    }

    #[test]
    fn derived_names_stay_legal() {
        let long = TableName::parse(&"t".repeat(63)).unwrap();
        let derived = long.derived("pending_idx");
        assert!(derived.as_str().len() <= MAX_IDENT_LEN);
        assert!(derived.as_str().ends_with("_pending_idx"));
    }

    proptest! {
        #[test]
        fn quoting_never_lets_a_quote_through(name in "\\PC{0,80}") {
            if let Ok(ident) = Ident::new(&name) {
                let quoted = ident.quoted();
                prop_assert_eq!(quoted.matches('"').count(), 2);
                prop_assert_eq!(&quoted[1..quoted.len() - 1], name.as_str());
            }
        }

        #[test]
        fn fuzz_identifier_validator_agrees_with_the_pattern(name in "[\\x00-\\x7f]{0,70}|\\PC{0,70}") {
            let pattern_ok = !name.is_empty()
                && name.len() <= MAX_IDENT_LEN
                && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            prop_assert_eq!(Ident::new(&name).is_ok(), pattern_ok);
            let _ = TableName::parse(&name);
        }

        #[test]
        fn every_valid_pattern_is_accepted(name in "[A-Za-z_][A-Za-z0-9_]{0,62}") {
            prop_assert!(Ident::new(&name).is_ok());
        }
    }
}
