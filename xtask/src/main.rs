//! `cargo xtask`: project automation.
fn main() {
    eprintln!("usage: cargo xtask <task>");
    std::process::exit(2);
}
