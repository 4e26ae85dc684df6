//! The one bounded wait of the tests and tools: poll a condition until it holds or a deadline
//! passes, and when it gives up, say what it was waiting for and for how long.

use std::future::Future;
use std::time::Duration;

/// How often a condition is looked at.
const POLL: Duration = Duration::from_millis(100);

/// A wait that gave up.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {after:?} waiting until {what}")]
pub struct TimedOut {
    pub what: String,
    pub after: Duration,
}

/// [`until`] for callers that decide what a timeout means themselves (an assertion with its
/// own context, a tool's own message): true once `check` holds; false after `timeout`, having
/// said on stderr what it waited for, so the failure that follows is explained.
pub async fn holds<F, Fut>(what: &str, timeout: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    match until(what, timeout, check).await {
        Ok(()) => true,
        Err(timed_out) => {
            eprintln!("{timed_out}");
            false
        }
    }
}

/// Polls `check` until it returns true; `Err` names `what` once `timeout` has passed.
pub async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<(), TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for_value(what, timeout, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Polls `probe` until it yields a value; `Err` names `what` once `timeout` has passed.
pub async fn for_value<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Like [`until`], for a check that can also fail for good: an `Err` from `check` ends the wait
/// at once with that error, so a tool does not wait out its timeout on something that will not
/// recover.
pub async fn until_or_fail<F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                after: timeout,
            }
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_that_gives_up_names_what_it_waited_for() {
        let error = until(
            "the moon turns blue",
            Duration::from_millis(250),
            || async { false },
        )
        .await
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "timed out after 250ms waiting until the moon turns blue"
        );
        let mut polls = 0;
        let value = for_value("three polls", Duration::from_secs(5), || {
            polls += 1;
            let ready = polls >= 3;
            async move { ready.then_some(polls) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn a_failing_check_ends_the_wait_at_once() {
        let started = std::time::Instant::now();
        let error = until_or_fail("never", Duration::from_secs(60), || async {
            anyhow::bail!("relay 0 exited with code 2")
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("code 2"));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
