//! `spec.podFailurePolicy` (kube-controller-manager v1.34's `pod_failure_policy.go`): the first
//! rule matching a failed Pod decides whether the failure fails the Job (FailJob, with the
//! message of the FailureTarget condition), fails its index (FailIndex), is counted against the
//! backoff limit (Count) or ignored (Ignore). Pure.

use crate::runtime::cached_pod::{CachedContainerStatus, CachedPod};
use k8s_openapi::api::batch::v1::{PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement};

/// A rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail the whole Job.
    FailJob,
    /// Fail the Pod's index (backoffLimitPerIndex).
    FailIndex,
    /// Count the failure (as without a policy).
    Count,
    /// Do not count the failure.
    Ignore,
}

/// What the policy says about one failed Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// For FailJob: the message of the Job's failure condition.
    pub fail_job: Option<String>,
    /// Whether the failure counts against the backoff limit.
    pub count: bool,
    /// The matching rule's action, if a rule matched.
    pub action: Option<Action>,
}

impl Verdict {
    const COUNTED: Verdict = Verdict {
        fail_job: None,
        count: true,
        action: None,
    };
}

fn exit_code_matches(code: i32, req: &PodFailurePolicyOnExitCodesRequirement) -> bool {
    match req.operator.as_str() {
        "In" => req.values.contains(&code),
        "NotIn" => !req.values.contains(&code),
        _ => false,
    }
}

fn matching_container<'a>(
    statuses: Option<&'a Vec<CachedContainerStatus>>,
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<&'a CachedContainerStatus> {
    statuses.into_iter().flatten().find(|cs| {
        let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            return false;
        };
        req.container_name.as_ref().is_none_or(|n| *n == cs.name)
            && t.exit_code != 0
            && exit_code_matches(t.exit_code, req)
    })
}

/// `matchPodFailurePolicy` for a failed Pod. Without a policy every failure counts.
pub fn match_policy(policy: Option<&PodFailurePolicy>, pod: &CachedPod) -> Verdict {
    let Some(policy) = policy else {
        return Verdict::COUNTED;
    };
    let status = pod.status.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    for (index, rule) in policy.rules.iter().enumerate() {
        let fail_job_message;
        if let Some(req) = rule.on_exit_codes.as_ref() {
            let Some(cs) = matching_container(status.container_statuses.as_ref(), req)
                .or_else(|| matching_container(status.init_container_statuses.as_ref(), req))
            else {
                continue;
            };
            let code = cs
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code)
                .unwrap_or_default();
            fail_job_message = format!(
                "Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                cs.name, rule.action
            );
        } else if let Some(patterns) = rule.on_pod_conditions.as_ref() {
            let Some(cond) = status.conditions.iter().flatten().find(|c| {
                patterns
                    .iter()
                    .any(|p| p.type_ == c.type_ && p.status == c.status)
            }) else {
                continue;
            };
            fail_job_message = format!(
                "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                cond.type_, rule.action
            );
        } else {
            continue;
        }
        return match rule.action.as_str() {
            "Ignore" => Verdict {
                fail_job: None,
                count: false,
                action: Some(Action::Ignore),
            },
            "FailIndex" => Verdict {
                fail_job: None,
                count: true,
                action: Some(Action::FailIndex),
            },
            "Count" => Verdict {
                fail_job: None,
                count: true,
                action: Some(Action::Count),
            },
            "FailJob" => Verdict {
                fail_job: Some(fail_job_message),
                count: true,
                action: Some(Action::FailJob),
            },
            // An action this release does not know: the rule is skipped, as upstream's switch
            // falls through to the next rule.
            _ => continue,
        };
    }
    Verdict::COUNTED
}
