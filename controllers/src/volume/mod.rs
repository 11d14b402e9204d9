//! kube-controller-manager's storage controllers (upstream's `pkg/controller/volume/`), each a
//! module of its own on the shared [`crate::runtime`], none importing a sibling (the layers test
//! keeps it so):
//!
//! - [`persistentvolume`]: `persistentvolume-binder`, binding claims to volumes, handing claims
//!   to external provisioners, reclaiming released volumes;
//! - [`pvcprotection`] and [`pvprotection`]: the `kubernetes.io/pvc-protection` and
//!   `kubernetes.io/pv-protection` finalizers that keep a claim in use by a Pod, and a bound
//!   volume, from going;
//! - [`ephemeral`]: `ephemeral-volume`, the claims of Pods' generic ephemeral volumes;
//! - [`expand`]: `persistentvolume-expander`, handing a grown claim to its volume's resizer;
//! - [`vacprotection`]: the `kubernetes.io/vac-protection` finalizer that keeps a
//!   VolumeAttributesClass a claim or a volume names from going;
//! - [`attachdetach`]: `persistentvolume-attach-detach`, the VolumeAttachments of the CSI
//!   volumes Pods use on a node, and the node's `volumesAttached`.
//!
//! What they do and how they differ from upstream is in docs/VOLUMES.md.

pub mod attachdetach;
pub mod ephemeral;
pub mod expand;
pub mod persistentvolume;
pub mod pvcprotection;
pub mod pvprotection;
pub mod vacprotection;
