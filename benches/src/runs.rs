//! Figures over several runs, as `examples/redis_bench.rs` and `examples/postgres_bench.rs`
//! print them: each run's figure, the median and the range of a ratio, scenarios in the order
//! they first ran; and the runtime their clients run on.

/// The tokio runtime the examples drive their clients on: two workers, the machine's two
/// cores.
#[must_use]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The median of `v` (the mean of the middle two for an even count; NaN for none).
#[must_use]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each run's figure, rounded to a whole number, joined by ` / `.
#[must_use]
pub fn each_run(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// `median (lowest–highest)` of ratios, two decimals.
#[must_use]
pub fn median_and_range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2} ({lo:.2}–{hi:.2})", median(v.to_vec()))
}

/// The distinct names, in the order they first appear.
#[must_use]
pub fn in_order<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen
}
