//! A fixed number of `try_consume(1)` calls on the embedded backend, for instruction counts
//! (two versions of the backend compared under callgrind, where wall-clock timings on a
//! shared machine are noise).
//!
//! ```text
//! cargo build --release -p bucket4rs-benches --example embedded_ops
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/embedded_ops KEYS 0
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/embedded_ops KEYS 100000
//! ```
//!
//! The difference of the two totals (`Collected`) divided by the calls is the cost of one call
//! on `KEYS` keys (visited round-robin, each created before the count starts), manager and
//! `block_on` included. It prints the calls granted, which must be all of them.

use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let (Some(Ok(keys)), Some(Ok(calls))) = (args.next(), args.next()) else {
        eprintln!("usage: embedded_ops KEYS CALLS");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let manager = ProxyManager::new(EmbeddedBackend::new());
    let buckets: Vec<_> = (0..keys.max(1))
        .map(|k| {
            manager
                .builder()
                .build(format!("k{k}"), bucket4rs_benches::keyed_config)
                .expect("bucket")
        })
        .collect();
    for b in &buckets {
        assert!(rt.block_on(b.try_consume(1)).expect("warm-up"));
    }
    let mut granted = 0u64;
    for i in 0..calls {
        let b = &buckets[i % buckets.len()];
        granted += u64::from(rt.block_on(b.try_consume(1)).expect("call"));
    }
    println!("embedded_ops: {keys} keys, {calls} calls, {granted} granted");
    assert_eq!(granted, calls as u64);
}
