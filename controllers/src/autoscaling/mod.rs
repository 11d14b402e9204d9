//! kube-controller-manager's autoscaling controllers: [`podautoscaler`] (the horizontal Pod
//! autoscaler, autoscaling/v2, on resource metrics).
//!
//! Each is a controller on the shared [`crate::runtime`]; none imports a sibling (the layers
//! test keeps it so).

pub mod podautoscaler;
