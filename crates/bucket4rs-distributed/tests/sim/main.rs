//! The simulation of a fleet leasing one hot key (`fleet.rs`, whose module doc says what it
//! models and checks): 10 and 100 processes, every answer checked against the no-over-grant
//! guarantee and the under-grant bound. The 1,000-process run and the table of
//! docs/distributed.md come from `cargo run --release -p bucket4rs-benches --example
//! lease_fleet` (see benches/README.md), which runs this same file.

mod fleet;

use fleet::{Report, Scenario, run};

/// Runs a scenario, failing with what a check saw if one fails, and makes sure the run went
/// through what it is meant to check: grants and refusals or failures, crashes, lost requests
/// and replies, busy periods that ended.
fn checked(scenario: &Scenario) -> Report {
    let report = run(scenario).unwrap_or_else(|e| {
        panic!(
            "{} processes, seed {}: {e}",
            scenario.processes, scenario.seed
        )
    });
    println!(
        "{}\n{}\n{}",
        Report::header(),
        report.row(),
        report.details()
    );
    assert!(
        report.granted > 0 && report.refused + report.failed > 0,
        "{report:?}"
    );
    assert!(report.crashes > 0, "no process crashed: {report:?}");
    assert!(
        report.lost.0 > 0 && report.lost.1 > 0,
        "nothing was lost: {report:?}"
    );
    assert!(report.busy_periods > 1, "no busy period ended: {report:?}");
    report
}

/// Ten processes: leases are taken and serve most calls; the same seed gives the same run,
/// answer for answer.
#[test]
fn ten_processes_lease_a_hot_key_with_no_over_grant_and_a_bounded_under_grant() {
    let scenario = Scenario::fleet(10, 5_000, 3);
    let report = checked(&scenario);
    assert!(report.max_held > 0, "{report:?}");
    assert!(report.round_trips_per_call() < 0.5, "{report:?}");
    assert_eq!(run(&scenario), Ok(report), "the same seed gave another run");
}

/// A hundred processes: leases are still taken (only leases count towards the 24 a key may
/// hold, not the entries other processes' calls leave behind).
#[test]
fn a_hundred_processes_lease_a_hot_key_with_no_over_grant_and_a_bounded_under_grant() {
    let report = checked(&Scenario::fleet(100, 2_000, 3));
    assert!(report.max_held > 0, "{report:?}");
}
