//! Where Services and EndpointSlices come from: the Kubernetes API (`kube`) or a directory of
//! manifests (`file`). A source only reports what it saw, as [`SourceEvent`]s; the sync runner owns
//! the tracker and applies them. Each object is converted (`convert::ServiceEntry`,
//! `convert::SliceEntry`) as soon as the source has read it, so what travels and what a listing
//! buffers is the proxy's compact form, never whole Kubernetes objects.

use crate::convert::{ServiceEntry, SliceEntry};
use crate::error::InvalidObject;
use crate::tracker::Tracker;

pub mod file;
pub mod kube;

/// One thing a source saw.
#[derive(Debug)]
pub enum SourceEvent {
    ApplyService(Box<ServiceEntry>),
    DeleteService {
        namespace: String,
        name: String,
    },
    ApplySlice(Box<SliceEntry>),
    DeleteSlice {
        namespace: String,
        name: String,
    },
    /// A complete listing of Services (initial list, relist): anything not in it is gone.
    ReplaceServices(Vec<ServiceEntry>),
    /// A complete listing of EndpointSlices.
    ReplaceSlices(Vec<SliceEntry>),
    /// Problems the source found outside any single object (an unparseable file), replacing the
    /// previous ones of the same source key.
    SourceErrors {
        source: String,
        errors: Vec<InvalidObject>,
    },
    /// The node's `topology.kubernetes.io/zone` label (`None`: not labelled, or no Node object
    /// for this node), for topology hints.
    NodeZone(Option<String>),
    /// The initial listing is complete: programming may start.
    Synced,
}

impl SourceEvent {
    /// Applies the event to the tracker. Returns true for [`SourceEvent::Synced`].
    pub fn apply(self, tracker: &mut Tracker) -> bool {
        match self {
            SourceEvent::ApplyService(s) => tracker.apply_service_entry(*s),
            SourceEvent::DeleteService { namespace, name } => {
                tracker.delete_service(&namespace, &name)
            }
            SourceEvent::ApplySlice(s) => tracker.apply_slice_entry(*s),
            SourceEvent::DeleteSlice { namespace, name } => tracker.delete_slice(&namespace, &name),
            SourceEvent::ReplaceServices(v) => tracker.replace_services(v),
            SourceEvent::ReplaceSlices(v) => tracker.replace_slices(v),
            SourceEvent::SourceErrors { source, errors } => {
                tracker.set_source_errors(&source, errors)
            }
            SourceEvent::NodeZone(zone) => tracker.set_node_zone(zone),
            SourceEvent::Synced => return true,
        }
        false
    }
}
