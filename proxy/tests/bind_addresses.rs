//! Root test: the agent next to a kube-proxy that still holds kube-proxy's two ports (10256
//! healthz, 10249 metrics), as while kpr replaces it make-before-break. kube-proxy's behaviour is
//! the contract: by default a taken address is logged and bound once free (every 5 s) while the
//! dataplane serves; with `--bind-address-hard-fail` the agent exits naming it. kpr's own
//! readiness address (`--readiness-bind-address`, the DaemonSet's probes) is answered by the agent
//! only, so a probe cannot be answered by kube-proxy. Every process runs in a namespace this test
//! creates.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kpr_tests::agent::{Agent, AgentOptions, HEALTHZ_ADDR, METRICS_ADDR};
use kpr_tests::client::http_get;
use kpr_tests::netns::Netns;

const READINESS_ADDR: &str = "127.0.0.1:10266";

/// A stand-in for kube-proxy's two listeners in `ns`: every request gets `status` and the body
/// "kube-proxy". Stops (closing both ports) when dropped.
struct FakeKubeProxy {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeKubeProxy {
    fn start(ns: &Netns, status: u16) -> FakeKubeProxy {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [HEALTHZ_ADDR, METRICS_ADDR]
            .into_iter()
            .map(|addr| {
                let addr: SocketAddr = addr.parse().unwrap();
                // The socket belongs to the namespace it was made in.
                let listener = ns
                    .run(|| TcpListener::bind(addr))
                    .unwrap()
                    .unwrap_or_else(|e| panic!("binding {addr} in the test namespace: {e}"));
                listener.set_nonblocking(true).unwrap();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        match listener.accept() {
                            Ok((mut s, _)) => {
                                let _ = s.set_nonblocking(false);
                                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                                let mut buf = [0u8; 1024];
                                let _ = s.read(&mut buf);
                                let body = "kube-proxy";
                                let _ = write!(
                                    s,
                                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                    body.len()
                                );
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(20)),
                        }
                    }
                })
            })
            .collect();
        FakeKubeProxy { stop, threads }
    }
}

impl Drop for FakeKubeProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn get(ns: &Netns, addr: &str, path: &str) -> Result<(u16, String), String> {
    http_get(ns, addr.parse().unwrap(), path, Duration::from_secs(2)).map_err(|e| e.to_string())
}

/// Polls `GET addr path` until `want` holds of its answer.
fn wait_answer(
    ns: &Netns,
    addr: &str,
    path: &str,
    timeout: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + timeout;
    let mut last = Err("no request yet".to_string());
    while Instant::now() < deadline {
        last = get(ns, addr, path);
        if let Ok((code, body)) = &last {
            if want(*code, body) {
                return (*code, body.clone());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("GET {addr}{path}: not the answer wanted within {timeout:?}; last: {last:?}");
}

#[test]
fn taken_kube_proxy_ports_are_bound_once_free_and_readiness_is_kprs_own() {
    let ns = Netns::new("binds").unwrap();
    let kube_proxy = FakeKubeProxy::start(&ns, 200);
    let opts = AgentOptions::backend("userspace")
        .arg("--readiness-bind-address")
        .arg(READINESS_ADDR);
    // The harness's own wait (on 10256) is answered by the stand-in: what a probe of kube-proxy's
    // port gets while kube-proxy runs.
    let agent = Agent::start(&ns, &opts, &[]).unwrap();
    // kpr's readiness: the agent's, after its first sync.
    let (_, body) = wait_answer(
        &ns,
        READINESS_ADDR,
        "/readyz",
        Duration::from_secs(20),
        |c, _| c == 200,
    );
    assert_eq!(body.trim(), "ok", "the agent answers its readiness address");
    let log = agent
        .wait_for_log("cannot bind the healthz address", Duration::from_secs(5))
        .unwrap();
    assert!(
        log.contains("cannot bind the metrics address"),
        "the metrics address's failure is logged too:\n{log}"
    );
    assert_eq!(
        get(&ns, HEALTHZ_ADDR, "/healthz").unwrap().1,
        "kube-proxy",
        "kube-proxy still holds 10256"
    );
    // kube-proxy goes: the agent binds both within its 5 s retry period.
    drop(kube_proxy);
    let (_, body) = wait_answer(
        &ns,
        HEALTHZ_ADDR,
        "/healthz",
        Duration::from_secs(15),
        |c, b| c == 200 && b.trim() == "ok",
    );
    assert_eq!(body.trim(), "ok");
    agent
        .wait_for_log("the healthz address is bound now", Duration::from_secs(1))
        .unwrap();
    wait_answer(
        &ns,
        METRICS_ADDR,
        "/metrics",
        Duration::from_secs(15),
        |c, b| c == 200 && b.contains("# EOF"),
    );
    agent
        .state()
        .expect("/state on the metrics address, now the agent's");
}

#[test]
fn bind_address_hard_fail_exits_naming_the_taken_address() {
    let ns = Netns::new("bindhard").unwrap();
    // 503: the harness keeps waiting, so it sees the agent exit.
    let _kube_proxy = FakeKubeProxy::start(&ns, 503);
    let opts = AgentOptions::backend("userspace").arg("--bind-address-hard-fail");
    let err = match Agent::start(&ns, &opts, &[]) {
        Ok(agent) => panic!(
            "the agent kept running with its ports taken and --bind-address-hard-fail:\n{}",
            agent.log()
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("the agent exited"), "{err}");
    assert!(
        err.contains("binding the metrics address 127.0.0.1:10249 (--bind-address-hard-fail)"),
        "the error names the address and the flag: {err}"
    );
}
