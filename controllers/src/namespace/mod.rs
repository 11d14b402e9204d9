//! kube-controller-manager's namespace lifecycle controller (SIG API Machinery's
//! `pkg/controller/namespace`): [`deletion`], emptying a namespace being deleted and releasing it.
//!
//! A small controller on the shared [`crate::runtime`]; it imports no sibling (the layers test
//! keeps it so).

pub mod deletion;
