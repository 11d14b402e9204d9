//! The DaemonSet controller (being built): one Pod per eligible node through node affinity, RollingUpdate
//! with maxUnavailable and maxSurge, OnDelete, ControllerRevision history.

pub mod plan;
