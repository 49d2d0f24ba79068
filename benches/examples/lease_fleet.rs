//! Leasing past this machine (issue #31): the deterministic simulation of a fleet of 10, 100
//! and 1,000 processes leasing one hot key, with skewed and bursty traffic, a lossy network
//! and crashes, every answer checked against the no-over-grant guarantee and the under-grant
//! bound. Prints the table of docs/distributed.md ("Leasing in a fleet: the simulation").
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --example lease_fleet [seconds] [processes...]
//! ```
//!
//! `seconds` of simulated traffic (default 10) on a key of 20,000 tokens refilled 20,000 a
//! second, for each number of processes (default 10, 100 and 1,000). The simulation is
//! bucket4rs-distributed's `tests/sim/fleet.rs` (its module doc says what it models and
//! checks); CI runs it at 10 and 100 processes on smaller keys. A check that fails ends the
//! program with what it saw (exit code 1).

#[path = "../../crates/bucket4rs-distributed/tests/sim/fleet.rs"]
mod fleet;

use std::time::Instant;

/// The hot key: 20,000 tokens, refilled 20,000 a second (a lease cap of 2 tokens at 1,000
/// processes, the smallest lease).
const CAPACITY: u64 = 20_000;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let seconds = match args.next() {
        None => 10,
        Some(Ok(s)) if s > 0 => s,
        Some(_) => usage(),
    };
    let mut sizes: Vec<usize> = args
        .map(|a| match a {
            Ok(n) if n > 0 => usize::try_from(n).unwrap_or_else(|_| usage()),
            _ => usage(),
        })
        .collect();
    if sizes.is_empty() {
        sizes = vec![10, 100, 1_000];
    }
    println!(
        "{seconds} simulated seconds on a key of {CAPACITY} tokens refilled {CAPACITY} a second\n"
    );
    println!("{}", fleet::Report::header());
    let mut details = Vec::new();
    for n in sizes {
        let started = Instant::now();
        match fleet::run(&fleet::Scenario::fleet(n, CAPACITY, seconds)) {
            Ok(report) => {
                println!("{}", report.row());
                details.push(format!(
                    "{} ({:.1} s of wall time)",
                    report.details(),
                    started.elapsed().as_secs_f64()
                ));
            }
            Err(e) => {
                eprintln!("{n} processes: a check failed: {e}");
                std::process::exit(1);
            }
        }
    }
    println!();
    for d in details {
        println!("- {d}");
    }
}

fn usage() -> ! {
    eprintln!("usage: lease_fleet [seconds] [processes...]");
    std::process::exit(2);
}
