//! Integration test harness (network namespaces, echo servers).
