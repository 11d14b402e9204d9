//! The StatefulSet controller (being built): ordinal Pods, volumeClaimTemplates PVCs, OrderedReady and
//! Parallel management, RollingUpdate with partition and OnDelete, ControllerRevision history.
