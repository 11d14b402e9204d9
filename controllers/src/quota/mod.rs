//! kube-controller-manager's quota controller: [`resourcequota`], the usage in every
//! ResourceQuota's status.
//!
//! A controller here imports no sibling (the layers test keeps it so): what it shares with the
//! others lives in [`crate::runtime`] or [`crate::helpers`].

pub mod resourcequota;
