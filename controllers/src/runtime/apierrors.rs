//! What an API error means to a controller, as apimachinery's `api/errors` package tells it:
//! not found, already exists, a conflict, a namespace being deleted, and the message upstream's
//! `err.Error()` would show in an Event or a condition.
//!
//! Owns: reading `kube::Error`s. Every controller asks here rather than matching status codes
//! itself, so a rule (say, how a terminating namespace is recognised) holds for all of them.

use kube::core::Status;

/// The `StatusCause` reason the API server's NamespaceLifecycle admission puts on a create refused
/// because the namespace is being deleted (`v1.NamespaceTerminatingCause`).
pub const NAMESPACE_TERMINATING_CAUSE: &str = "NamespaceTerminating";

/// The API server's `Status`, when the error is one.
pub fn status(e: &kube::Error) -> Option<&Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

/// The message upstream's error would carry: the API server's message for an API error, the
/// error itself otherwise (and for an API error without a message).
pub fn api_message(e: &kube::Error) -> String {
    match status(e) {
        Some(s) if !s.message.is_empty() => s.message.clone(),
        _ => e.to_string(),
    }
}

/// Whether the API server answered with `code`.
pub fn has_code(e: &kube::Error, code: u16) -> bool {
    status(e).is_some_and(|s| s.code == code)
}

/// `apierrors.IsNotFound`: reason NotFound, or 404 with a reason apimachinery does not know.
pub fn is_not_found(e: &kube::Error) -> bool {
    status(e).is_some_and(Status::is_not_found)
}

/// `apierrors.IsAlreadyExists`: reason AlreadyExists (a create of a name in use, 409).
pub fn is_already_exists(e: &kube::Error) -> bool {
    status(e).is_some_and(Status::is_already_exists)
}

/// `apierrors.IsConflict`: reason Conflict, or 409 with a reason apimachinery does not know (a
/// write with a stale resourceVersion or a failed precondition; not AlreadyExists).
pub fn is_conflict(e: &kube::Error) -> bool {
    status(e).is_some_and(Status::is_conflict)
}

/// `apierrors.HasStatusCause(err, NamespaceTerminatingCause)`: a create refused because the
/// namespace is being deleted; every other create there would be refused too. Also recognised by
/// the admission plugin's 403 message, for a server that leaves the cause out.
pub fn namespace_terminating(e: &kube::Error) -> bool {
    let Some(s) = status(e) else { return false };
    let cause = s.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == NAMESPACE_TERMINATING_CAUSE)
    });
    cause || (s.code == 403 && s.message.contains("because it is being terminated"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn ctl_errors_classified_as_apimachinery_does() {
        let not_found = api(404, "NotFound", "pods \"a\" not found");
        let exists = api(409, "AlreadyExists", "pods \"a\" already exists");
        let conflict = api(409, "Conflict", "the object has been modified");
        let quota = api(403, "Forbidden", "exceeded quota");
        let cases: [(&str, &kube::Error, [bool; 3]); 4] = [
            ("404", &not_found, [true, false, false]),
            ("409 AlreadyExists", &exists, [false, true, false]),
            ("409 Conflict", &conflict, [false, false, true]),
            ("403", &quota, [false, false, false]),
        ];
        for (name, e, [nf, ae, c]) in cases {
            assert_eq!(is_not_found(e), nf, "{name}: not found");
            assert_eq!(is_already_exists(e), ae, "{name}: already exists");
            assert_eq!(is_conflict(e), c, "{name}: conflict");
        }
        assert!(has_code(&quota, 403));
        assert!(!has_code(
            &kube::Error::LinesCodecMaxLineLengthExceeded,
            403
        ));
    }

    #[test]
    fn ctl_namespace_terminating_by_cause_or_message() {
        let by_message = api(
            403,
            "Forbidden",
            "pods \"x\" is forbidden: unable to create new content in namespace ns because it is being terminated",
        );
        assert!(
            namespace_terminating(&by_message),
            "a creation in a terminating namespace counts as done"
        );
        let by_cause: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "refused", "reason": "Forbidden", "code": 403,
            "details": {"causes": [{"reason": NAMESPACE_TERMINATING_CAUSE}]},
        }))
        .unwrap();
        assert!(namespace_terminating(&kube::Error::Api(Box::new(by_cause))));
        assert!(!namespace_terminating(&api(
            403,
            "Forbidden",
            "exceeded quota"
        )));
    }

    #[test]
    fn ctl_api_message_is_the_servers() {
        assert_eq!(
            api_message(&api(403, "Forbidden", "exceeded quota")),
            "exceeded quota",
            "the condition and the Event carry the API server's message"
        );
        let empty = api(500, "InternalError", "");
        assert_eq!(api_message(&empty), empty.to_string());
    }
}
