//! The replica recommendation: a pure function of the scaling history, the time, what was
//! observed and the configuration, with the semantics users know from the HPA and KEDA:
//!
//! - desired = ceil(backlog / targetBacklogPerReplica), or with `targetDrainSeconds`,
//!   ceil(backlog / (measured rate per pod × targetDrainSeconds));
//! - no change while the ratio desired/current stays within the tolerance;
//! - 0 → 1 when the backlog exceeds activationBacklog, 1 → 0 only after cooldownPeriod without;
//! - scale-up takes the lowest and scale-down the highest recommendation of its stabilization
//!   window, then the rate policies cap the step;
//! - stale or missing reports → fallback replicas, never zero; `paused` freezes the replicas;
//! - with `spec.relay.maxRate`, no more pods than the limit can use ([`rate_cap`]).

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::crd::{PolicyType, ScalingRules, ScalingSpec, SelectPolicy};
use crate::reconcile::input::validate::ScalingPlan;

/// The scaling block with its durations parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub target_backlog_per_replica: i64,
    pub target_drain_seconds: Option<i64>,
    pub activation_backlog: i64,
    pub cooldown: Duration,
    pub tolerance: f64,
    pub scale_up: ScalingRules,
    pub scale_down: ScalingRules,
    pub fallback_replicas: i32,
    pub stale_after: Duration,
    pub paused: bool,
}

impl ScalingConfig {
    pub fn new(spec: &ScalingSpec, plan: &ScalingPlan) -> Self {
        Self {
            min_replicas: spec.min_replicas.max(0),
            max_replicas: spec.max_replicas.max(spec.min_replicas.max(1)),
            target_backlog_per_replica: spec.target_backlog_per_replica.max(1),
            target_drain_seconds: spec.target_drain_seconds.filter(|s| *s > 0),
            activation_backlog: spec.activation_backlog.max(0),
            cooldown: plan.cooldown_period,
            tolerance: spec.tolerance.clamp(0.0, 1.0),
            scale_up: spec.scale_up.clone(),
            scale_down: spec.scale_down.clone(),
            fallback_replicas: spec.fallback.replicas.max(1),
            stale_after: plan.stale_after,
            paused: spec.paused,
        }
    }
}

/// What the operator saw this round.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Replicas the Deployment asks for now.
    pub current_replicas: i32,
    /// Pending rows, when a fresh enough measurement exists.
    pub backlog: Option<i64>,
    /// Age of that measurement.
    pub backlog_age: Option<Duration>,
    /// Messages per second summed over the reporting pods.
    pub publish_rate: f64,
    /// Pods that reported a rate.
    pub reporting_pods: usize,
    /// `spec.relay.maxRate` and what the reports say of it; None without a limit.
    pub rate_limit: Option<RateLimitSeen>,
}

/// The relay-wide rate limit as this round saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimitSeen {
    /// `spec.relay.maxRate`, messages per second across the pods.
    pub max_rate: f64,
    /// The pods publish at about their limits: the limit holds them back, not the broker.
    pub held_back: bool,
}

/// Remembered between rounds (in the operator's memory, per relay).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScalingHistory {
    /// Recommendations (after clamping, before stabilization) with their time.
    recommendations: VecDeque<(DateTime<Utc>, i32)>,
    /// Replica changes actually made, for the rate policies.
    changes: VecDeque<(DateTime<Utc>, i32)>,
    /// Last time the backlog was above the activation threshold.
    last_active: Option<DateTime<Utc>>,
    /// Last time the replicas changed.
    pub last_scale_time: Option<DateTime<Utc>>,
}

/// Why the recommendation is what it is (the reasons show in conditions and events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Computed from the backlog.
    Backlog,
    /// `paused: true`.
    Paused,
    /// Reports are stale or missing: fallback replicas.
    StaleReports,
    /// The replicas changed moments ago and the new pods have not reported yet: kept as is.
    AwaitingReports,
}

/// What held the recommendation back from the raw desired count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    TooManyReplicas,
    BelowMin,
    Stabilizing,
    ScaleUpLimit,
    ScaleDownLimit,
    CoolingDown,
    WithinTolerance,
    /// `spec.relay.maxRate` leaves more pods nothing to do ([`rate_cap`]).
    RateLimited,
}

impl Limit {
    pub fn reason(self) -> &'static str {
        match self {
            Limit::TooManyReplicas => "TooManyReplicas",
            Limit::BelowMin => "BelowMin",
            Limit::Stabilizing => "Stabilizing",
            Limit::ScaleUpLimit => "ScaleUpLimit",
            Limit::ScaleDownLimit => "ScaleDownLimit",
            Limit::CoolingDown => "CoolingDown",
            Limit::WithinTolerance => "WithinTolerance",
            Limit::RateLimited => "RateLimited",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    pub replicas: i32,
    /// The recommendation after the bounds, before the windows and policies.
    pub bounded: i32,
    /// What the backlog alone asks for, before bounds, windows and policies.
    pub desired: i32,
    pub reason: Reason,
    pub limit: Option<Limit>,
}

impl Recommendation {
    pub fn message(&self, observation: &Observation) -> String {
        match self.reason {
            Reason::Paused => format!("scaling is paused at {} replicas", self.replicas),
            Reason::StaleReports => format!(
                "no fresh lag report; running the fallback of {} replicas",
                self.replicas
            ),
            Reason::AwaitingReports => format!(
                "waiting for the first reports of the pods after the last scale; keeping {} replicas",
                self.replicas
            ),
            Reason::Backlog => {
                let why = match (self.limit, observation.rate_limit) {
                    (Some(Limit::RateLimited), Some(rate)) if rate.held_back => format!(
                        " (spec.relay.maxRate {} msg/s holds the relay back: more pods would \
                         only wait for permits)",
                        rate.max_rate
                    ),
                    (Some(Limit::RateLimited), Some(rate)) => format!(
                        " (no more pods than spec.relay.maxRate {} msg/s keeps busy)",
                        rate.max_rate
                    ),
                    _ => String::new(),
                };
                format!(
                    "backlog {} asks for {} replicas; recommending {}{why}",
                    observation.backlog.unwrap_or(0),
                    self.desired,
                    self.replicas
                )
            }
        }
    }
}

fn since(now: DateTime<Utc>, then: DateTime<Utc>) -> Duration {
    (now - then).to_std().unwrap_or_default()
}

/// The raw desired count from the backlog (no bounds).
fn desired_from_backlog(backlog: i64, observation: &Observation, config: &ScalingConfig) -> f64 {
    if let Some(drain) = config.target_drain_seconds
        && observation.reporting_pods > 0
        && observation.publish_rate > 0.0
    {
        let per_pod = observation.publish_rate / observation.reporting_pods as f64;
        return backlog as f64 / (per_pod * drain as f64);
    }
    backlog as f64 / config.target_backlog_per_replica as f64
}

/// The most pods `spec.relay.maxRate` can keep busy, or None without a limit. More pods only
/// split the same limit: they would sit waiting for permits.
///
/// - While the pods publish at about their limits (`held_back`), the pods there are already
///   use all of it: no more than `current`.
/// - Otherwise, when the pods publish at all, as many as reach the limit at the rate one pod
///   manages now: ceil(maxRate / (publish rate / reporting pods)). (Under a backlog the
///   autoscaler acts on, a pod publishes what it can; with little backlog this cap is high
///   and the backlog decides anyway.)
/// - Never more than maxRate pods: each pod's share is at least 1 msg/s.
pub fn rate_cap(observation: &Observation, current: i32) -> Option<i32> {
    let limit = observation.rate_limit?;
    let most_shares = limit.max_rate.floor().clamp(1.0, f64::from(i32::MAX)) as i32;
    let usable = if limit.held_back {
        current.max(1)
    } else if observation.reporting_pods > 0 && observation.publish_rate > 0.0 {
        let per_pod = observation.publish_rate / observation.reporting_pods as f64;
        (limit.max_rate / per_pod)
            .ceil()
            .clamp(1.0, f64::from(i32::MAX)) as i32
    } else {
        i32::MAX
    };
    Some(usable.min(most_shares))
}

/// The most replicas the rate policies allow from `current` now.
fn scale_up_limit(
    current: i32,
    rules: &ScalingRules,
    history: &ScalingHistory,
    now: DateTime<Utc>,
) -> i32 {
    let limits = rules.policies.iter().map(|policy| {
        let start = (current - history.changed_within(now, policy.period_seconds, 1)).max(0);
        match policy.kind {
            PolicyType::Pods => start + policy.value,
            PolicyType::Percent => {
                (f64::from(start) * (1.0 + f64::from(policy.value) / 100.0)).ceil() as i32
            }
        }
    });
    let limit = match rules.select_policy {
        SelectPolicy::Max => limits.max(),
        SelectPolicy::Min => limits.min(),
        SelectPolicy::Disabled => Some(current),
    }
    .unwrap_or(i32::MAX);
    // Percent policies cannot leave zero; waking from zero is the activation's job.
    if current == 0 && rules.select_policy != SelectPolicy::Disabled {
        limit.max(1)
    } else {
        limit
    }
}

/// The fewest replicas the rate policies allow from `current` now.
fn scale_down_limit(
    current: i32,
    rules: &ScalingRules,
    history: &ScalingHistory,
    now: DateTime<Utc>,
) -> i32 {
    let limits = rules.policies.iter().map(|policy| {
        let start = current + history.changed_within(now, policy.period_seconds, -1);
        match policy.kind {
            PolicyType::Pods => start - policy.value,
            PolicyType::Percent => {
                (f64::from(start) * (1.0 - f64::from(policy.value) / 100.0)).ceil() as i32
            }
        }
    });
    match rules.select_policy {
        // "Max" selects the policy that allows the most change: the lowest floor.
        SelectPolicy::Max => limits.min(),
        SelectPolicy::Min => limits.max(),
        SelectPolicy::Disabled => Some(current),
    }
    .unwrap_or(0)
    .max(0)
}

/// Recommends replicas. Pure: the caller stores the returned history.
pub fn recommend(
    history: &ScalingHistory,
    now: DateTime<Utc>,
    observation: &Observation,
    config: &ScalingConfig,
) -> (Recommendation, ScalingHistory) {
    let mut next = history.clone();
    let current = observation.current_replicas.max(0);
    let floor = config.min_replicas.max(0);
    let ceiling = config.max_replicas.max(floor).max(1);

    if config.paused {
        let rec = Recommendation {
            replicas: current,
            bounded: current,
            desired: current,
            reason: Reason::Paused,
            limit: None,
        };
        return (rec, next);
    }

    let fresh = observation
        .backlog_age
        .is_some_and(|age| age <= config.stale_after);
    let backlog = match (observation.backlog, fresh) {
        (Some(backlog), true) => backlog.max(0),
        _ => {
            // Pods just started (or just added) have not reported yet: that is not staleness
            // until staleAfter has passed since the change, so a fresh scale-up does not bounce
            // to the fallback.
            let settling = current > 0
                && next
                    .last_scale_time
                    .is_some_and(|at| since(now, at) < config.stale_after);
            let (replicas, reason) = if settling {
                (current, Reason::AwaitingReports)
            } else {
                (
                    config.fallback_replicas.clamp(floor.max(1), ceiling),
                    Reason::StaleReports,
                )
            };
            let rec = Recommendation {
                replicas,
                bounded: replicas,
                desired: replicas,
                reason,
                limit: None,
            };
            // The fallback enters the stabilization history like any recommendation, so
            // leaving it is as calm as any other scale-down.
            next.recommendations.push_back((now, replicas));
            next.record_change(now, current, replicas);
            next.forget_before(now, config);
            return (rec, next);
        }
    };

    let active = backlog > config.activation_backlog;
    if active {
        next.last_active = Some(now);
    }
    let raw = desired_from_backlog(backlog, observation, config);
    let desired = raw.ceil().min(f64::from(i32::MAX)) as i32;

    // Zero is entered only after the cooldown without activation, and left only on activation;
    // both steps skip the stabilization windows, as KEDA's activation phase does.
    let cooled = next
        .last_active
        .is_none_or(|at| since(now, at) >= config.cooldown);
    if floor == 0 && !active && (current == 0 || cooled) {
        let rec = Recommendation {
            replicas: 0,
            bounded: 0,
            desired,
            reason: Reason::Backlog,
            limit: None,
        };
        next.record_change(now, current, 0);
        next.recommendations.clear();
        return (rec, next);
    }
    let lower = floor.max(1);

    // Inside the tolerance the current count is kept, as the HPA does.
    let mut limit = None;
    let mut wanted = desired;
    if current > 0 && ((raw / f64::from(current)) - 1.0).abs() <= config.tolerance {
        wanted = current;
        limit = Some(Limit::WithinTolerance);
    }
    if let Some(cap) = rate_cap(observation, current)
        && wanted > cap
    {
        wanted = cap;
        limit = Some(Limit::RateLimited);
    }
    if wanted > ceiling {
        limit = Some(Limit::TooManyReplicas);
    } else if wanted < lower {
        limit = Some(if floor == 0 {
            Limit::CoolingDown
        } else {
            Limit::BelowMin
        });
    }
    let clamped = wanted.clamp(lower, ceiling);

    // Stabilization: the lowest recommendation of the up window, the highest of the down window.
    next.recommendations.push_back((now, clamped));
    let window = |rules: &ScalingRules| {
        Duration::from_secs(rules.stabilization_window_seconds.max(0) as u64)
    };
    let in_window = |w: Duration| {
        next.recommendations
            .iter()
            .filter(move |(at, _)| since(now, *at) <= w)
            .map(|(_, r)| *r)
    };
    let up_floor = in_window(window(&config.scale_up)).min().unwrap_or(clamped);
    let down_ceiling = in_window(window(&config.scale_down))
        .max()
        .unwrap_or(clamped);
    let stabilized = if current == 0 {
        clamped // waking from zero: activation decided, no window applies
    } else if up_floor > current {
        up_floor
    } else if down_ceiling < current {
        down_ceiling
    } else {
        current
    };
    if stabilized != clamped && limit != Some(Limit::WithinTolerance) {
        limit = Some(Limit::Stabilizing);
    }

    // Rate policies cap the step.
    let mut replicas = stabilized;
    if stabilized > current {
        let cap = scale_up_limit(current, &config.scale_up, &next, now);
        if stabilized > cap {
            replicas = cap.max(current);
            limit = Some(Limit::ScaleUpLimit);
        }
    } else if stabilized < current {
        let cap = scale_down_limit(current, &config.scale_down, &next, now);
        if stabilized < cap {
            replicas = cap.min(current);
            limit = Some(Limit::ScaleDownLimit);
        }
    }
    let replicas = replicas.clamp(lower, ceiling);

    next.record_change(now, current, replicas);
    next.forget_before(now, config);
    (
        Recommendation {
            replicas,
            bounded: clamped,
            desired,
            reason: Reason::Backlog,
            limit,
        },
        next,
    )
}

impl ScalingHistory {
    /// Pods added (`direction` 1) or removed (-1) during the last `period_seconds`: what a rate
    /// policy counts against its period's starting point.
    fn changed_within(&self, now: DateTime<Utc>, period_seconds: i32, direction: i32) -> i32 {
        let period = Duration::from_secs(period_seconds.max(1) as u64);
        self.changes
            .iter()
            .filter(|(at, delta)| delta.signum() == direction && since(now, *at) < period)
            .map(|(_, delta)| delta.abs())
            .sum()
    }

    fn record_change(&mut self, now: DateTime<Utc>, from: i32, to: i32) {
        if from != to {
            self.changes.push_back((now, to - from));
            self.last_scale_time = Some(now);
        }
    }

    /// Keeps only what a window or a policy period can still look at.
    fn forget_before(&mut self, now: DateTime<Utc>, config: &ScalingConfig) {
        let longest_window = config
            .scale_up
            .stabilization_window_seconds
            .max(config.scale_down.stabilization_window_seconds)
            .max(0) as u64;
        let longest_period = config
            .scale_up
            .policies
            .iter()
            .chain(&config.scale_down.policies)
            .map(|p| p.period_seconds.max(0) as u64)
            .max()
            .unwrap_or(0);
        let keep = Duration::from_secs(longest_window.max(longest_period) + 1);
        while self
            .recommendations
            .front()
            .is_some_and(|(at, _)| since(now, *at) > keep)
        {
            self.recommendations.pop_front();
        }
        while self
            .changes
            .front()
            .is_some_and(|(at, _)| since(now, *at) > keep)
        {
            self.changes.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> ScalingConfig {
        ScalingConfig {
            min_replicas: 1,
            max_replicas: 10,
            target_backlog_per_replica: 1000,
            target_drain_seconds: None,
            activation_backlog: 0,
            cooldown: Duration::from_secs(300),
            tolerance: 0.1,
            scale_up: ScalingRules::default_up(),
            scale_down: ScalingRules::default_down(),
            fallback_replicas: 2,
            stale_after: Duration::from_secs(60),
            paused: false,
        }
    }

    fn seen(current: i32, backlog: i64) -> Observation {
        Observation {
            current_replicas: current,
            backlog: Some(backlog),
            backlog_age: Some(Duration::from_secs(1)),
            publish_rate: 0.0,
            reporting_pods: current as usize,
            rate_limit: None,
        }
    }

    fn t(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    /// Runs rounds at the given times and backlogs, applying each recommendation.
    fn simulate(
        config: &ScalingConfig,
        start: i32,
        rounds: &[(i64, i64)],
    ) -> Vec<(i64, Recommendation, i32)> {
        let mut history = ScalingHistory::default();
        let mut current = start;
        let mut out = Vec::new();
        for (at, backlog) in rounds {
            let (rec, next) = recommend(&history, t(*at), &seen(current, *backlog), config);
            history = next;
            out.push((*at, rec.clone(), current));
            current = rec.replicas;
        }
        out
    }

    #[test]
    fn desired_is_backlog_over_target_clamped() {
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &seen(1, 3_500), &config());
        assert_eq!((rec.desired, rec.replicas), (4, 4));
        let (rec, _) = recommend(
            &ScalingHistory::default(),
            t(0),
            &seen(1, 1_000_000),
            &config(),
        );
        assert_eq!(rec.desired, 1000);
        assert_eq!(
            rec.replicas, 5,
            "+4 pods per 15 s beats +100 % from one pod"
        );
        assert_eq!(rec.limit, Some(Limit::ScaleUpLimit));
    }

    #[test]
    fn rate_policies_step_up_per_period() {
        let rounds: Vec<(i64, i64)> = (0..6).map(|i| (i * 15, 1_000_000)).collect();
        let replicas: Vec<i32> = simulate(&config(), 1, &rounds)
            .iter()
            .map(|(_, r, _)| r.replicas)
            .collect();
        assert_eq!(replicas, vec![5, 10, 10, 10, 10, 10]);
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window() {
        let mut rounds = vec![(0, 8_000)];
        rounds.extend((1..=25).map(|i| (i * 15, 0)));
        let out = simulate(&config(), 8, &rounds);
        for (at, rec, _) in &out {
            if *at < 300 {
                assert_eq!(rec.replicas, 8, "scaled down at {at} s, inside the window");
            }
        }
        assert_eq!(out.last().unwrap().1.replicas, 1);
    }

    #[test]
    fn scale_to_zero_only_after_cooldown_and_back_on_activation() {
        let config = ScalingConfig {
            min_replicas: 0,
            cooldown: Duration::from_secs(60),
            activation_backlog: 10,
            ..config()
        };
        let out = simulate(&config, 1, &[(0, 500), (30, 0), (61, 0), (70, 5), (80, 50)]);
        let replicas: Vec<i32> = out.iter().map(|(_, r, _)| r.replicas).collect();
        assert_eq!(replicas, vec![1, 1, 0, 0, 1]);
        assert_eq!(out[1].1.limit, Some(Limit::CoolingDown));
    }

    #[test]
    fn stale_or_missing_reports_run_the_fallback() {
        let config = ScalingConfig {
            min_replicas: 0,
            ..config()
        };
        let missing = Observation {
            backlog: None,
            backlog_age: None,
            ..seen(0, 0)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &missing, &config);
        assert_eq!((rec.replicas, rec.reason), (2, Reason::StaleReports));
        let stale = Observation {
            backlog_age: Some(Duration::from_secs(61)),
            ..seen(5, 0)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &stale, &config);
        assert_eq!(rec.replicas, 2);
    }

    #[test]
    fn new_pods_get_time_to_report_before_the_fallback() {
        let config = ScalingConfig {
            fallback_replicas: 1,
            ..config()
        };
        let (up, history) = recommend(&ScalingHistory::default(), t(0), &seen(1, 4_000), &config);
        assert_eq!(up.replicas, 4);
        let silent = Observation {
            backlog: None,
            backlog_age: None,
            ..seen(4, 0)
        };
        let (rec, history) = recommend(&history, t(5), &silent, &config);
        assert_eq!((rec.replicas, rec.reason), (4, Reason::AwaitingReports));
        let (rec, _) = recommend(&history, t(61), &silent, &config);
        assert_eq!((rec.replicas, rec.reason), (1, Reason::StaleReports));
    }

    #[test]
    fn leaving_the_fallback_is_stabilized_like_any_scale_down() {
        let config = ScalingConfig {
            fallback_replicas: 6,
            ..config()
        };
        let silent = Observation {
            backlog: None,
            backlog_age: None,
            ..seen(2, 0)
        };
        let (fallback, history) = recommend(&ScalingHistory::default(), t(0), &silent, &config);
        assert_eq!(fallback.replicas, 6);
        // Reports are back and ask for 1; the 300 s window still remembers the 6.
        let (rec, history) = recommend(&history, t(30), &seen(6, 500), &config);
        assert_eq!((rec.replicas, rec.limit), (6, Some(Limit::Stabilizing)));
        let (rec, _) = recommend(&history, t(301), &seen(6, 500), &config);
        assert_eq!(rec.replicas, 1);
    }

    #[test]
    fn paused_freezes_and_drain_target_uses_the_rate() {
        let paused = ScalingConfig {
            paused: true,
            ..config()
        };
        let (rec, _) = recommend(
            &ScalingHistory::default(),
            t(0),
            &seen(3, 1_000_000),
            &paused,
        );
        assert_eq!((rec.replicas, rec.reason), (3, Reason::Paused));
        let drain = ScalingConfig {
            target_drain_seconds: Some(10),
            ..config()
        };
        // 2 pods publish 1,000 msg/s together: 500 each; 20,000 rows in 10 s needs 4 pods.
        let observation = Observation {
            publish_rate: 1_000.0,
            reporting_pods: 2,
            ..seen(2, 20_000)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &observation, &drain);
        assert_eq!(rec.desired, 4);
    }

    #[test]
    fn a_rate_limit_that_holds_the_pods_back_adds_no_pods() {
        // 2 pods at their limit (1,000 msg/s together) and a backlog asking for 10: more pods
        // would only split the same 1,000 msg/s.
        let held = Observation {
            publish_rate: 990.0,
            rate_limit: Some(RateLimitSeen {
                max_rate: 1_000.0,
                held_back: true,
            }),
            ..seen(2, 10_000)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &held, &config());
        assert_eq!(rec.desired, 10);
        assert_eq!((rec.replicas, rec.limit), (2, Some(Limit::RateLimited)));
        // Not held back, 2 pods at 250 msg/s each: 4 pods reach the 1,000 msg/s limit.
        let below = Observation {
            publish_rate: 500.0,
            rate_limit: Some(RateLimitSeen {
                max_rate: 1_000.0,
                held_back: false,
            }),
            ..seen(2, 10_000)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &below, &config());
        assert_eq!((rec.replicas, rec.limit), (4, Some(Limit::RateLimited)));
        // Without a limit the backlog decides (+100 % from 2 pods, or +4: 6).
        let free = Observation {
            rate_limit: None,
            ..below.clone()
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &free, &config());
        assert_eq!(rec.replicas, 6);
        // A backlog that asks for fewer pods than the cap is not limited by it.
        let small = Observation {
            publish_rate: 990.0,
            rate_limit: Some(RateLimitSeen {
                max_rate: 1_000.0,
                held_back: true,
            }),
            ..seen(2, 2_000)
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &small, &config());
        assert_eq!((rec.replicas, rec.limit), (2, Some(Limit::WithinTolerance)));
    }

    #[test]
    fn never_more_pods_than_the_limit_has_shares() {
        // maxRate 3: each pod gets at least 1 msg/s, so at most 3 pods; nothing reported yet.
        let tiny = Observation {
            rate_limit: Some(RateLimitSeen {
                max_rate: 3.5,
                held_back: false,
            }),
            ..seen(1, 1_000_000)
        };
        assert_eq!(rate_cap(&tiny, 1), Some(3));
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &tiny, &config());
        assert_eq!((rec.replicas, rec.limit), (3, Some(Limit::RateLimited)));
        // minReplicas wins over the cap: the user asked for those pods.
        let at_least_five = ScalingConfig {
            min_replicas: 5,
            ..config()
        };
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &tiny, &at_least_five);
        assert_eq!(rec.replicas, 5);
        assert_eq!(rate_cap(&seen(1, 5), 1), None);
    }

    #[test]
    fn tolerance_keeps_the_count() {
        let (rec, _) = recommend(&ScalingHistory::default(), t(0), &seen(4, 4_300), &config());
        assert_eq!((rec.replicas, rec.limit), (4, Some(Limit::WithinTolerance)));
    }

    fn arbitrary_config() -> impl Strategy<Value = ScalingConfig> {
        (
            0..4i32,
            1..20i32,
            1..5_000i64,
            0..100i64,
            0..120u64,
            0..200u64,
            0.0..0.5f64,
            1..5i32,
        )
            .prop_map(
                |(min, extra, target, activation, cooldown, window, tolerance, fallback)| {
                    ScalingConfig {
                        min_replicas: min,
                        max_replicas: min.max(1) + extra,
                        target_backlog_per_replica: target,
                        activation_backlog: activation,
                        cooldown: Duration::from_secs(cooldown),
                        tolerance,
                        scale_down: ScalingRules {
                            stabilization_window_seconds: window as i32,
                            ..ScalingRules::default_down()
                        },
                        fallback_replicas: fallback,
                        ..config()
                    }
                },
            )
    }

    fn arbitrary_rounds() -> impl Strategy<Value = Vec<(i64, i64)>> {
        proptest::collection::vec((1..40i64, prop_oneof![Just(0i64), 0..200_000i64]), 1..40)
            .prop_map(|steps| {
                let mut at = 0;
                steps
                    .into_iter()
                    .map(|(gap, backlog)| {
                        at += gap;
                        (at, backlog)
                    })
                    .collect()
            })
    }

    proptest! {
        #[test]
        fn never_outside_min_and_max(config in arbitrary_config(), rounds in arbitrary_rounds(), start in 0..30i32) {
            for (_, rec, _) in simulate(&config, start, &rounds) {
                prop_assert!(rec.replicas >= config.min_replicas && rec.replicas <= config.max_replicas, "{rec:?}");
            }
        }

        #[test]
        fn constant_load_inside_the_tolerance_never_changes_replicas(
            config in arbitrary_config(), current in 1..10i32, offset in -1.0..1.0f64, rounds in 1..30usize
        ) {
            let current = current.clamp(config.min_replicas.max(1), config.max_replicas);
            let load = f64::from(current) * (1.0 + offset * config.tolerance * 0.99);
            let backlog = (load * config.target_backlog_per_replica as f64).floor() as i64;
            prop_assume!(backlog > config.activation_backlog);
            let steps: Vec<(i64, i64)> = (0..rounds as i64).map(|i| (i * 15, backlog)).collect();
            for (at, rec, _) in simulate(&config, current, &steps) {
                prop_assert_eq!(rec.replicas, current, "changed at {} s", at);
            }
        }

        #[test]
        fn scale_down_never_happens_inside_the_stabilization_window(config in arbitrary_config(), rounds in arbitrary_rounds(), start in 1..30i32) {
            let window = config.scale_down.stabilization_window_seconds as i64;
            let out = simulate(&config, start, &rounds);
            for (i, (at, rec, before)) in out.iter().enumerate() {
                if rec.replicas < *before && rec.replicas > 0 {
                    for (earlier_at, earlier, _) in &out[..=i] {
                        if at - earlier_at <= window {
                            prop_assert!(earlier.bounded <= rec.replicas,
                                "scaled {before} -> {} at {at} s though {earlier_at} s recommended {}", rec.replicas, earlier.bounded);
                        }
                    }
                }
            }
        }

        #[test]
        fn scale_up_respects_the_default_policies(config in arbitrary_config(), rounds in arbitrary_rounds(), start in 0..30i32) {
            let out = simulate(&config, start, &rounds);
            for (at, rec, before) in &out {
                // Replicas in effect 15 s earlier: the period's starting point.
                let base = out.iter().rev().find(|(t, _, _)| *t <= at - 15).map(|(_, r, _)| r.replicas)
                    .unwrap_or(start.max(0));
                let allowed = (base * 2).max(base + 4).max(1);
                if rec.replicas > *before {
                    prop_assert!(rec.replicas <= allowed.max(config.min_replicas.max(1)),
                        "{before} -> {} at {at} s; period started at {base}", rec.replicas);
                }
            }
        }

        #[test]
        fn stale_reports_never_lead_to_zero(config in arbitrary_config(), current in 0..30i32, age in 61..10_000u64, missing in any::<bool>()) {
            let observation = Observation {
                backlog: if missing { None } else { Some(0) },
                backlog_age: if missing { None } else { Some(Duration::from_secs(age)) },
                ..seen(current, 0)
            };
            let (rec, _) = recommend(&ScalingHistory::default(), t(0), &observation, &config);
            prop_assert!(rec.replicas >= 1);
            prop_assert_eq!(rec.reason, Reason::StaleReports);
        }

        #[test]
        fn stale_reports_never_lead_to_zero_whatever_came_before(
            config in arbitrary_config(), rounds in arbitrary_rounds(), start in 0..30i32, gap in 1..200i64
        ) {
            let mut history = ScalingHistory::default();
            let mut current = start;
            for (at, backlog) in &rounds {
                let (rec, next) = recommend(&history, t(*at), &seen(current, *backlog), &config);
                history = next;
                current = rec.replicas;
            }
            let last = rounds.last().map_or(0, |(at, _)| *at);
            let silent = Observation { backlog: None, backlog_age: None, ..seen(current, 0) };
            let (rec, _) = recommend(&history, t(last + gap), &silent, &config);
            prop_assert!(rec.replicas >= 1, "stale reports led to zero: {rec:?}");
        }
    }
}
