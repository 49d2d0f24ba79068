//! Redis benchmark (work in progress).
fn main() {}
