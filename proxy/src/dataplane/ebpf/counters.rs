//! The kernel side's packet counters on `/metrics`: what the XDP program (`xdp`) and the DSR
//! programs (`dsr`) counted, read from their pinned per-CPU maps at each scrape. It owns the
//! metric names and labels only; reading the maps is `xdp::XdpCounts`' and `dsr::DsrCounts`'.

use std::path::PathBuf;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use super::dsr::DsrCounts;
use super::xdp::XdpCounts;

/// Reads `<maps_dir>/KPR_XDP_STATS` and `KPR_DSR_STATS` on each scrape. A map that cannot be
/// read (an agent of an older object, a pin removed by `proxy cleanup`) leaves its metric out
/// of that scrape rather than failing the whole page.
#[derive(Debug)]
pub struct KernelCounters {
    maps_dir: PathBuf,
}

impl KernelCounters {
    pub fn new(maps_dir: PathBuf) -> Self {
        KernelCounters { maps_dir }
    }

    /// The counters as the maps hold them now.
    fn read(&self) -> Vec<CounterFamily> {
        let mut out = Vec::new();
        if let Ok(x) = XdpCounts::from_pin(&self.maps_dir) {
            out.push(CounterFamily {
                name: "xdp_packets",
                help:
                    "Packets the XDP program on the external interfaces handled, by outcome: sent \
                 (translated and sent back out by XDP), passed_route (a service flow whose route \
                 leaves by another interface, left to tc), passed_new (a flow's first packet, \
                 balanced by tc)",
                label: "outcome",
                values: vec![
                    ("sent", x.sent),
                    ("passed_route", x.passed_route),
                    ("passed_new", x.passed_new),
                ],
            });
        }
        if let Ok(d) = DsrCounts::from_pin(&self.maps_dir) {
            out.push(CounterFamily {
                name: "dsr_packets",
                help:
                    "Packets of direct-server-return flows (--nodeport-mode dsr|hybrid), by event: \
                 option_added (sent on to the backend's node with the service address), \
                 option_failed (dropped: the option did not fit), recorded (arrived with the \
                 option for a backend of this node), reply_rewritten (a backend's reply sent \
                 straight to the client from the service address)",
                label: "event",
                values: vec![
                    ("option_added", d.options_added),
                    ("option_failed", d.options_failed),
                    ("recorded", d.recorded),
                    ("reply_rewritten", d.replies_rewritten),
                ],
            });
        }
        out
    }
}

/// One counter metric with one label: its values as (label value, count).
struct CounterFamily {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: Vec<(&'static str, u64)>,
}

impl Collector for KernelCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.read() {
            let mut family =
                encoder.encode_descriptor(f.name, f.help, None, MetricType::Counter)?;
            for (value, n) in f.values {
                let labels = [(f.label, value)];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
