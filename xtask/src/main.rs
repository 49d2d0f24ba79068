//! `cargo xtask`: project automation for bucket4rs (see CONTRIBUTING.md).
//!
//! Every task runs from the workspace root, whatever the current directory. Each command it
//! runs is echoed first, so the log says what was done.

mod api;
mod bench;
mod ci;
mod flags;
mod services;
mod tidy;

use std::path::{Path, PathBuf};

use anyhow::Result;
use xshell::Shell;

fn main() {
    // Report the failing step, not an anyhow backtrace (RUST_BACKTRACE is often set in CI).
    if let Err(e) = run(flags::Xtask::from_env_or_exit()) {
        eprintln!("\nxtask failed: {e:#}");
        std::process::exit(1);
    }
}

fn run(flags: flags::Xtask) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(project_root());
    match flags.subcommand {
        flags::XtaskCmd::Test(_) => ci::test(&sh),
        flags::XtaskCmd::Ci(_) => ci::ci(&sh),
        flags::XtaskCmd::Bench(b) => bench::run_with(
            &sh,
            &bench::Options {
                quick: b.quick,
                report_only: b.report_only,
                update_docs: b.update_docs,
                filter: b.filter,
            },
        ),
        flags::XtaskCmd::Loom(_) => ci::loom(&sh),
        flags::XtaskCmd::CheckDeps(_) => ci::check_deps(&sh),
        flags::XtaskCmd::Api(a) if a.check => api::check(&sh),
        flags::XtaskCmd::Api(_) => api::write(&sh),
        flags::XtaskCmd::Tidy(_) => {
            tidy::check(&project_root())?;
            println!("tidy: ok");
            Ok(())
        }
    }
}

/// The workspace root: the parent of this crate's directory.
fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Prints a step header, so a CI log reads as a list of steps.
fn step(name: &str) {
    println!("\n==> {name}");
}
