//! Where the run's password shows in a log only by leaking. Counting every occurrence of it
//! fails a run whose password is also a word the logs rightly print (`postgres`, the user and
//! the database of many local set-ups, in a redacted `postgres://postgres:***@…/postgres`); so a
//! password that also names something else in the URL is counted only in the shapes a leak
//! takes: a URL's user-info, or the value of something called a password.

/// Occurrences of `password` in `log` that only a leak could put there. `url` is the URL the
/// password belongs to: any other part of it that the password also spells makes the plain
/// word unusable as evidence.
pub fn leaks(log: &str, password: &str, url: &url::Url) -> usize {
    if password.is_empty() {
        return 0;
    }
    if !names_something_else(password, url) {
        return log.matches(password).count();
    }
    let lower = log.to_ascii_lowercase();
    let userinfo = log.matches(&format!(":{password}@")).count();
    let assigned: usize = [
        format!("password={password}"),
        format!("password: {password}"),
        format!("password\":\"{password}\""),
    ]
    .iter()
    .map(|shape| lower.matches(&shape.to_ascii_lowercase()).count())
    .sum();
    userinfo + assigned
}

/// Whether the URL without its password still spells it (as its user, host, database or a
/// parameter), so that its plain occurrences in a log say nothing.
fn names_something_else(password: &str, url: &url::Url) -> bool {
    let mut without = url.clone();
    if without.set_password(None).is_err() {
        return false;
    }
    without.as_str().contains(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDACTED: &str =
        "WARN cannot connect endpoint=postgres://postgres:***@127.0.0.1:5432/postgres";

    #[test]
    fn a_password_that_is_also_the_user_counts_only_when_it_leaks() {
        let url = url::Url::parse("postgres://postgres:postgres@127.0.0.1:5432/postgres").unwrap();
        assert_eq!(leaks(REDACTED, "postgres", &url), 0);
        let planted = format!(
            "{REDACTED}\nINFO connecting to postgres://postgres:postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(leaks(&planted, "postgres", &url), 1);
        assert_eq!(
            leaks("password=postgres user=postgres", "postgres", &url),
            1
        );
        assert_eq!(leaks(r#"{"password":"postgres"}"#, "postgres", &url), 1);
        assert_eq!(
            leaks(
                r#"{"user":"postgres","database":"postgres"}"#,
                "postgres",
                &url
            ),
            0
        );
    }

    #[test]
    fn a_distinctive_password_counts_wherever_it_shows() {
        let url = url::Url::parse("postgres://app:Chaos-7-Pw@db:5432/orders").unwrap();
        assert_eq!(
            leaks(
                "endpoint=postgres://app:***@db:5432/orders",
                "Chaos-7-Pw",
                &url
            ),
            0
        );
        assert_eq!(
            leaks("token Chaos-7-Pw in a message", "Chaos-7-Pw", &url),
            1
        );
    }
}
