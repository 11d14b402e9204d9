//! The userspace backend (in progress).
