//! `cargo xtask bench [--quick] [--report-only] [--update-docs] [--filter REGEX]`: runs the
//! criterion benchmarks of `bucket4rs-benches` and its `bucket4rs-memory` binary, then writes
//! `<target>/bench-report/index.html` (tables and inline SVG charts) and `report.md`, both
//! headed by the machine description, and prints a summary.
//!
//! Why xtask depends on `serde_json` and `plotters` here, against the house style's "anyhow,
//! xshell, xflags and nothing else": criterion's results are JSON files, and the report needs
//! charts. Hand-parsing JSON and hand-writing SVG would be more code to keep correct than two
//! well-known crates that are already workspace dependencies. `plotters` is built with only
//! its SVG backend and line series (no fonts, no bitmap codecs), so xtask still builds in
//! seconds; only `cargo xtask` pays for them, never a library crate.

mod report;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::{project_root, step};

/// What `cargo xtask bench` was asked to do.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) report_only: bool,
    pub(crate) update_docs: bool,
    pub(crate) filter: Option<String>,
}

/// Criterion settings of the smoke run: every benchmark for a fraction of a second.
const QUICK_ARGS: [&str; 9] = [
    "--warm-up-time",
    "0.05",
    "--measurement-time",
    "0.1",
    "--sample-size",
    "10",
    "--nresamples",
    "1000",
    "--noplot",
];

/// Criterion settings of a full run: 1 s of warm-up, then 100 samples over 3 s.
const FULL_ARGS: [&str; 5] = ["--warm-up-time", "1", "--measurement-time", "3", "--noplot"];

/// The features the benchmarks are built with: the Redis and PostgreSQL backends are
/// measured when their servers answer, and skipped with a note when they do not; the SQLite
/// backend on a file of its own.
const FEATURES: &str = "redis,postgres,sqlite";

/// The hook `cargo xtask ci` calls (`ci::BENCH`).
pub(crate) fn run(sh: &Shell, quick: bool) -> Result<()> {
    run_with(
        sh,
        &Options {
            quick,
            ..Options::default()
        },
    )
}

/// `cargo xtask bench`.
pub(crate) fn run_with(sh: &Shell, opts: &Options) -> Result<()> {
    if opts.update_docs && opts.quick {
        bail!("--update-docs needs a full run: quick figures are not representative");
    }
    let target = target_dir();
    let criterion = target.join("criterion");
    let out = target.join("bench-report");
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let stamp = out.join("run.json");
    let notes_path = out.join("notes.txt");
    let memory_path = out.join("memory.json");

    let started = Instant::now();
    let load_before = load_average();
    let mode = if opts.quick { "quick" } else { "full" };
    if opts.report_only {
        step("bench: report only, from the last run's criterion data");
    } else {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().saturating_sub(1));
        fs::write(
            &stamp,
            serde_json::json!({
                "since": since,
                "mode": mode,
                "load_before": load_before,
                "filter": opts.filter,
            })
            .to_string(),
        )?;
        fs::write(&notes_path, "")?;

        step(&format!(
            "bench ({mode}): cargo bench -p bucket4rs-benches --features {FEATURES}"
        ));
        println!(
            "(criterion prints each benchmark as it runs; build with fat LTO first, a few minutes \
             on a cold target dir)"
        );
        let args: Vec<&str> = if opts.quick {
            QUICK_ARGS.to_vec()
        } else {
            FULL_ARGS.to_vec()
        };
        let filter = opts.filter.as_deref().into_iter();
        cmd!(
            sh,
            "cargo bench -p bucket4rs-benches --features {FEATURES} --bench bucket4rs -- {args...} {filter...}"
        )
        .env("BUCKET4RS_BENCH_NOTES", &notes_path)
        .env("CRITERION_HOME", &criterion)
        .run()?;

        step("bench: memory figures (bucket4rs-memory, counting allocator)");
        let json = cmd!(
            sh,
            "cargo run --quiet --profile bench -p bucket4rs-benches --features {FEATURES} --bin bucket4rs-memory"
        )
        .read()?;
        serde_json::from_str::<Value>(&json).context("bucket4rs-memory printed invalid JSON")?;
        fs::write(&memory_path, json)?;
    }

    let run: Value = fs::read_to_string(&stamp)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let since = run["since"].as_u64().unwrap_or(0);
    let rows = collect(&criterion, since)?;
    if rows.is_empty() {
        bail!(
            "no criterion results under {} (run `cargo xtask bench` first)",
            criterion.display()
        );
    }
    let memory: Value = fs::read_to_string(&memory_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let mut notes: Vec<String> = fs::read_to_string(&notes_path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    notes.dedup();

    let machine = Machine::detect(sh, &run, load_average());
    let data = report::Data {
        machine,
        mode: run["mode"].as_str().unwrap_or(mode).to_owned(),
        rows,
        memory,
        notes,
    };
    let markdown = report::markdown(&data);
    fs::write(out.join("report.md"), &markdown)?;
    fs::write(out.join("index.html"), report::html(&data)?)?;
    report::print_summary(&data);
    if opts.update_docs {
        update_docs(&report::docs_section(&data))?;
        println!("docs/benchmarks.md: figures section replaced");
    }
    println!(
        "\nbench: report in {} and report.md ({}s)",
        out.join("index.html").display(),
        started.elapsed().as_secs()
    );
    Ok(())
}

/// The cargo target directory: `CARGO_TARGET_DIR`, else the workspace's `target`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| project_root().join("target"), PathBuf::from)
}

/// One criterion benchmark's result.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// e.g. `contention/success`.
    pub(crate) group: String,
    /// e.g. `lock-free`.
    pub(crate) function: String,
    /// e.g. `2` or `4-oversubscribed`; `None` for unparameterised benchmarks.
    pub(crate) param: Option<String>,
    /// Median time per iteration (aggregate time per operation), nanoseconds.
    pub(crate) median_ns: f64,
    /// Mean time per iteration, nanoseconds.
    pub(crate) mean_ns: f64,
    /// Elements per iteration, when the benchmark declared a throughput.
    pub(crate) elements: Option<f64>,
}

impl Row {
    /// The leading number of the parameter (threads or keys), if any.
    pub(crate) fn param_num(&self) -> Option<f64> {
        let p = self.param.as_deref()?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// Millions of operations per second (aggregate), from the median.
    pub(crate) fn mops(&self) -> Option<f64> {
        self.elements.map(|e| e * 1e3 / self.median_ns)
    }
}

/// Every `new/benchmark.json` under `dir` written at or after `since` (seconds since the
/// epoch; 0: all), with its `new/estimates.json`, sorted by group, function and parameter.
fn collect(dir: &Path, since: u64) -> Result<Vec<Row>> {
    let mut files = Vec::new();
    find_benchmarks(dir, &mut files);
    let mut rows = BTreeMap::new();
    for bench in files {
        let fresh = fs::metadata(&bench)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .is_some_and(|t| t >= Duration::from_secs(since));
        if !fresh {
            continue;
        }
        let meta: Value = serde_json::from_str(&fs::read_to_string(&bench)?)
            .with_context(|| format!("parsing {}", bench.display()))?;
        let estimates_path = bench.with_file_name("estimates.json");
        let Ok(text) = fs::read_to_string(&estimates_path) else {
            continue;
        };
        let est: Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", estimates_path.display()))?;
        let (Some(median), Some(mean)) = (
            est["median"]["point_estimate"].as_f64(),
            est["mean"]["point_estimate"].as_f64(),
        ) else {
            continue;
        };
        let group = meta["group_id"].as_str().unwrap_or_default().to_owned();
        let function = meta["function_id"].as_str().unwrap_or_default().to_owned();
        let param = meta["value_str"].as_str().map(str::to_owned);
        #[allow(clippy::cast_precision_loss)]
        let elements = meta["throughput"]["Elements"].as_u64().map(|e| e as f64);
        let row = Row {
            group,
            function,
            param,
            median_ns: median,
            mean_ns: mean,
            elements,
        };
        let key = (
            row.group.clone(),
            row.function.clone(),
            row.param_num().map(|n| n as u64),
            row.param.clone(),
        );
        rows.insert(key, row);
    }
    Ok(rows.into_values().collect())
}

fn find_benchmarks(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n == "report" || n == "base")
            {
                continue;
            }
            find_benchmarks(&path, out);
        } else if path.file_name().is_some_and(|n| n == "benchmark.json")
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == "new")
        {
            out.push(path);
        }
    }
}

/// The machine the figures come from.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) os: String,
    pub(crate) clocksource: String,
    pub(crate) rustc: String,
    pub(crate) commit: String,
    pub(crate) date: String,
    pub(crate) load: String,
}

impl Machine {
    fn detect(sh: &Shell, run: &Value, load_after: String) -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, v)| v.trim().to_owned());
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let pretty = fs::read_to_string("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_else(|| std::env::consts::OS.to_owned());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let os = format!(
            "{pretty}, Linux {} ({})",
            kernel.trim(),
            std::env::consts::ARCH
        );
        let clocksource =
            fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
        let rustc = cmd!(sh, "rustc --version")
            .read()
            .unwrap_or_else(|_| "unknown".into());
        // A snapshot outside git (e.g. `git archive HEAD`) can name its commit.
        let commit = std::env::var("BUCKET4RS_BENCH_COMMIT")
            .ok()
            .filter(|c| !c.is_empty());
        let commit = commit.map_or_else(|| git_commit(sh), Ok::<String, ()>);
        let commit = commit.unwrap_or_else(|()| "unknown (not a git checkout)".to_owned());
        let date = cmd!(sh, "date -u +%Y-%m-%dT%H:%MZ")
            .quiet()
            .read()
            .unwrap_or_else(|_| "unknown".into());
        let before = run["load_before"].as_str().unwrap_or("?");
        let load = format!("{before} before, {load_after} after (1/5/15-min load averages)");
        Self {
            cpu,
            cores,
            os,
            clocksource,
            rustc,
            commit,
            date,
            load,
        }
    }
}

/// The short commit, marked when tracked files have uncommitted changes.
fn git_commit(sh: &Shell) -> Result<String, ()> {
    let c = cmd!(sh, "git rev-parse --short HEAD")
        .quiet()
        .ignore_stderr()
        .read()
        .map_err(drop)?;
    let dirty = cmd!(sh, "git status --porcelain --untracked-files=no")
        .quiet()
        .read()
        .is_ok_and(|s| !s.trim().is_empty());
    Ok(if dirty {
        format!("{c} + uncommitted changes")
    } else {
        c
    })
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Markers around the generated section of docs/benchmarks.md.
pub(crate) const DOCS_BEGIN: &str =
    "<!-- bench-figures:begin (generated by `cargo xtask bench --update-docs`) -->";
pub(crate) const DOCS_END: &str = "<!-- bench-figures:end -->";

fn update_docs(section: &str) -> Result<()> {
    let path = project_root().join("docs/benchmarks.md");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (Some(b), Some(e)) = (text.find(DOCS_BEGIN), text.find(DOCS_END)) else {
        bail!(
            "{} has no `{DOCS_BEGIN}` … `{DOCS_END}` markers",
            path.display()
        );
    };
    let new = format!("{}{DOCS_BEGIN}\n{section}\n{}", &text[..b], &text[e..]);
    fs::write(&path, new)?;
    Ok(())
}

#[cfg(test)]
mod tests;
