//! `cargo run --release -p controllers --example cold_start -- [SERVICES] [PODS_PER_SERVICE]`:
//! the EndpointSlice controller's cold start against the test API server (default 20000 x 4).

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let services: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let pods: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let d = controllers::bench::cold_start(services, pods)?;
    println!(
        "endpointslice cold start: {services} services x {pods} pods: {:.2} s",
        d.as_secs_f64()
    );
    Ok(())
}
