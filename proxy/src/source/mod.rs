//! Where Services and EndpointSlices come from: the Kubernetes API (`kube`) or a directory of
//! manifests (`file`). A source only reports what it saw, as [`SourceEvent`]s; the sync runner owns
//! the tracker and applies them.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::error::InvalidObject;
use crate::tracker::Tracker;

pub mod file;
pub mod kube;

/// One thing a source saw.
#[derive(Debug)]
pub enum SourceEvent {
    ApplyService(Box<Service>),
    DeleteService {
        namespace: String,
        name: String,
    },
    ApplySlice(Box<EndpointSlice>),
    DeleteSlice {
        namespace: String,
        name: String,
    },
    /// A complete listing of Services (initial list, relist): anything not in it is gone.
    ReplaceServices(Vec<Service>),
    /// A complete listing of EndpointSlices.
    ReplaceSlices(Vec<EndpointSlice>),
    /// Problems the source found outside any single object (an unparseable file), replacing the
    /// previous ones of the same source key.
    SourceErrors {
        source: String,
        errors: Vec<InvalidObject>,
    },
    /// The initial listing is complete: programming may start.
    Synced,
}

impl SourceEvent {
    /// Applies the event to the tracker. Returns true for [`SourceEvent::Synced`].
    pub fn apply(self, tracker: &mut Tracker) -> bool {
        match self {
            SourceEvent::ApplyService(s) => tracker.apply_service(&s),
            SourceEvent::DeleteService { namespace, name } => {
                tracker.delete_service(&namespace, &name)
            }
            SourceEvent::ApplySlice(s) => tracker.apply_slice(&s),
            SourceEvent::DeleteSlice { namespace, name } => tracker.delete_slice(&namespace, &name),
            SourceEvent::ReplaceServices(v) => tracker.replace_services(&v),
            SourceEvent::ReplaceSlices(v) => tracker.replace_slices(&v),
            SourceEvent::SourceErrors { source, errors } => {
                tracker.set_source_errors(&source, errors)
            }
            SourceEvent::Synced => return true,
        }
        false
    }
}
