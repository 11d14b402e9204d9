//! Test infrastructure only: an in-memory Kubernetes API server (grown in its own issue).
