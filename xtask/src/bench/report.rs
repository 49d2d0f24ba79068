//! The bench report: headline ratios, tables, memory figures, charts (inline SVG drawn with
//! `plotters`), as HTML, markdown and a terminal summary.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use serde_json::Value;

use super::{Machine, Row};

/// Everything a report shows.
#[derive(Debug)]
pub(crate) struct Data {
    pub(crate) machine: Machine,
    pub(crate) mode: String,
    pub(crate) rows: Vec<Row>,
    pub(crate) memory: Value,
    pub(crate) notes: Vec<String>,
}

/// A headline comparison, measured side by side in the same run.
struct Headline {
    what: String,
    ratio: f64,
    detail: String,
    target: &'static str,
    met: Option<bool>,
}

fn find<'a>(rows: &'a [Row], group: &str, function: &str, param: Option<&str>) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.group == group
            && r.function == function
            && match param {
                None => r.param.is_none(),
                Some(p) => r
                    .param
                    .as_deref()
                    .is_some_and(|q| q == p || q.starts_with(&format!("{p}-"))),
            }
    })
}

/// The governor figure a row is compared with: same group and parameter.
fn baseline<'a>(rows: &'a [Row], row: &Row) -> Option<&'a Row> {
    ["governor", "governor keyed"]
        .iter()
        .find_map(|f| find(rows, &row.group, f, row.param.as_deref()))
        .filter(|b| b.function != row.function)
}

/// The keyed groups compared with governor's keyed limiter, and the path each measures.
const KEYED_GROUPS: [(&str, &str); 2] = [
    ("keyed/success", "success path"),
    ("keyed/rejection", "denied path"),
];

fn headlines(rows: &[Row], memory: &Value) -> Vec<Headline> {
    let mut out = Vec::new();
    // Time ratios: ours / theirs (below 1 is faster).
    let mut time = |what: &str,
                    group: &str,
                    ours: &str,
                    theirs: &str,
                    param,
                    target,
                    want_below: Option<f64>| {
        if let (Some(a), Some(b)) = (
            find(rows, group, ours, param),
            find(rows, group, theirs, param),
        ) {
            let ratio = a.median_ns / b.median_ns;
            out.push(Headline {
                what: what.to_owned(),
                ratio,
                detail: format!(
                    "{ours} {:.1} ns / {theirs} {:.1} ns (`{group}`{})",
                    a.median_ns,
                    b.median_ns,
                    param.map(|p| format!(", {p} threads")).unwrap_or_default()
                ),
                target,
                met: want_below.map(|t| ratio <= t),
            });
        }
    };
    time(
        "Lock-free success path vs governor `check()`, 1 thread (time ratio)",
        "single_thread/success",
        "lock-free",
        "governor",
        None,
        "≤ 1.00 (no slower than governor)",
        Some(1.0),
    );
    time(
        "Lock-free denied path vs governor, 1 thread (time ratio)",
        "single_thread/rejection",
        "lock-free",
        "governor",
        None,
        "≤ 1.00",
        Some(1.0),
    );
    time(
        "Lock-free vs governor, both on quanta's TSC clock (time ratio)",
        "same_clock/quanta",
        "lock-free",
        "governor",
        None,
        "≤ 1.00",
        Some(1.0),
    );
    time(
        "Lock-free vs governor, both on `Instant` (time ratio)",
        "same_clock/instant",
        "lock-free",
        "governor",
        None,
        "≤ 1.00",
        Some(1.0),
    );
    time(
        "Synchronized vs lock-free, uncontended (time ratio)",
        "single_thread/success",
        "synchronized",
        "lock-free",
        None,
        "information",
        None,
    );
    time(
        "Lock-free denied path vs governor, 2 threads (time ratio)",
        "contention/rejection",
        "lock-free",
        "governor",
        Some("2"),
        "≤ 1.00",
        Some(1.0),
    );
    // Throughput ratios: theirs time / ours time (above 1 is more throughput).
    for ours in ["lock-free", "synchronized"] {
        let group = "contention/success";
        if let (Some(a), Some(b)) = (
            find(rows, group, ours, Some("2")),
            find(rows, group, "governor", Some("2")),
        ) {
            let ratio = b.median_ns / a.median_ns;
            out.push(Headline {
                what: if ours == "lock-free" {
                    "Lock-free 2-thread throughput vs governor (throughput ratio)"
                } else {
                    "Synchronized 2-thread throughput vs governor (throughput ratio)"
                }
                .to_owned(),
                ratio,
                detail: format!(
                    "{ours} {:.1} Mops/s / governor {:.1} Mops/s (`{group}`, 2 threads); goal: \
                     Bucket4j SYNCHRONIZED's 22 Mops/s from the anchors",
                    a.mops().unwrap_or(0.0),
                    b.mops().unwrap_or(0.0)
                ),
                target: "≥ 1.00 (at least governor's throughput)",
                met: Some(ratio >= 1.0),
            });
        }
    }
    keyed_headlines(rows, memory, &mut out);
    out
}

/// `KeyedBucket` against governor's keyed limiter: the time ratio at every key and thread
/// count both ran, then heap bytes per key (`String` keys: the target; `u64`: information).
fn keyed_headlines(rows: &[Row], memory: &Value, out: &mut Vec<Headline>) {
    for (group, path) in KEYED_GROUPS {
        for ours in rows
            .iter()
            .filter(|r| r.group == group && r.function == "KeyedBucket")
        {
            let Some(theirs) = rows.iter().find(|r| {
                r.group == group && r.function == "governor keyed" && r.param == ours.param
            }) else {
                continue;
            };
            let param = ours.param.as_deref().unwrap_or("");
            let ratio = ours.median_ns / theirs.median_ns;
            out.push(Headline {
                what: format!("KeyedBucket vs governor keyed, {path}, {param} (time ratio)"),
                ratio,
                detail: format!(
                    "KeyedBucket {:.1} ns / governor keyed {:.1} ns (`{group}`, {param})",
                    ours.median_ns, theirs.median_ns
                ),
                target: "≤ 1.00",
                met: Some(ratio <= 1.0),
            });
        }
    }
    for (key, target, want_below) in [
        ("String", "≤ 1.50", Some(1.5)),
        ("u64", "information", None),
    ] {
        let (Some(ours), Some(theirs)) = (
            keyed_memory(memory, "KeyedBucket", key),
            keyed_memory(memory, "governor keyed", key),
        ) else {
            continue;
        };
        let (a, b) = (ours.1, theirs.1);
        let ratio = a / b;
        out.push(Headline {
            what: format!(
                "KeyedBucket vs governor keyed, heap bytes per key, {key} keys at 1,000,000 keys \
                 (ratio)"
            ),
            ratio,
            detail: format!("{} {a:.1} B / {} {b:.1} B per key", ours.0, theirs.0),
            target,
            met: want_below.map(|t| ratio <= t),
        });
    }
}

/// The name and heap bytes per key of `contender`'s keyed memory row with `key` keys.
fn keyed_memory<'a>(memory: &'a Value, contender: &str, key: &str) -> Option<(&'a str, f64)> {
    let row = memory["keyed"]
        .as_array()?
        .iter()
        .find(|k| k["contender"].as_str() == Some(contender) && k["key"].as_str() == Some(key))?;
    Some((
        row["name"].as_str().unwrap_or("?"),
        row["heap_bytes_per_key"].as_f64()?,
    ))
}

/// Whether any strategy allocates on the success or denied path (target: never).
fn allocation_verdict(memory: &Value) -> Option<String> {
    let local = memory["local"].as_array()?;
    let worst = local
        .iter()
        .flat_map(|r| [&r["allocs_per_success"], &r["allocs_per_denial"]])
        .filter_map(Value::as_f64)
        .fold(0.0_f64, f64::max);
    Some(format!(
        "Heap allocations per `try_consume(1)`, worst strategy and bandwidth count, success or \
         denied: {worst} (target 0: {}).",
        if worst == 0.0 { "met" } else { "**missed**" }
    ))
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "–",
    }
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 10_000.0 {
        format!("{:.1} µs", ns / 1000.0)
    } else {
        format!("{ns:.1}")
    }
}

fn groups(rows: &[Row]) -> Vec<&str> {
    let order = [
        "single_thread/success",
        "single_thread/rejection",
        "single_thread/probe",
        "single_thread/estimate",
        "single_thread/two_bandwidths",
        "same_clock/quanta",
        "same_clock/instant",
        "single_thread/floor",
        "clock/read",
        "contention/success",
        "contention/rejection",
        "keyed/success",
        "keyed/rejection",
        "keyed_remote/try_consume",
        "backends/try_consume",
        "listener/lock_free",
        "listener/synchronized",
        "memory/build",
    ];
    let mut gs: Vec<&str> = order
        .iter()
        .copied()
        .filter(|g| rows.iter().any(|r| r.group == *g))
        .collect();
    for r in rows {
        if !gs.contains(&r.group.as_str()) {
            gs.push(&r.group);
        }
    }
    gs
}

fn machine_lines(m: &Machine, mode: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CPU", m.cpu.clone()),
        ("cores", format!("{} (available to this process)", m.cores)),
        ("OS", m.os.clone()),
        ("clock source", m.clocksource.clone()),
        ("rustc", m.rustc.clone()),
        ("git commit", m.commit.clone()),
        ("date", m.date.clone()),
        ("load", m.load.clone()),
        (
            "mode",
            if mode == "quick" {
                "quick (smoke run: 0.05 s warm-up, 0.1 s measurement, 10 samples — not representative)"
                    .to_owned()
            } else {
                "full (1 s warm-up, 100 samples over 3 s per benchmark; `[profile.bench]` fat LTO, \
                 codegen-units = 1)"
                    .to_owned()
            },
        ),
    ]
}

fn noise_notes(data: &Data) -> Vec<String> {
    let mut notes = vec![
        format!(
            "Shared machine with {} cores; other engineers build on it concurrently, so absolute \
             times drift from run to run. Compare the ratios, which are measured side by side in \
             this one run.",
            data.machine.cores
        ),
        "Figures are criterion's median time per iteration; for multi-threaded benchmarks that is \
         the aggregate time per operation (wall time from the barrier's release to the last \
         thread's end, divided by all threads' operations)."
            .to_owned(),
        format!(
            "Thread counts above {} are labelled `-oversubscribed`: there the OS time-slices the \
             threads, and a thread holding a lock or a contended line may be descheduled.",
            data.machine.cores
        ),
        "Keyed groups: both limiters own `String` keys, rendered once (`k0`, `k1`, …) and visited \
         round-robin, each thread from its own offset with no shared counter; both are a dashmap \
         of the key to a 64-bit GCRA word, with the same shard count. Hashers: governor's \
         `DefaultKeyedRateLimiter` uses dashmap's default, std's `RandomState` (SipHash-1-3); \
         `KeyedBucket` uses foldhash by default, and `KeyedBucket (SipHash)` is the same limiter \
         on std's `RandomState`, so its ratio is the difference without the hasher. Clocks: each \
         side's default (governor's quanta clock, bucket4rs's `FastClock`). Success: 2^32 − 1 \
         tokens refilling one a second on both sides (never dry, never full again, so no key may \
         be forgotten); rejection: one token an hour, taken from every key before measuring. \
         Every run checks that every call was allowed (refused) and that every key is still held."
            .to_owned(),
        "Redis and PostgreSQL calls use `block_on` on a current-thread runtime, one round trip \
         each."
            .to_owned(),
    ];
    notes.extend(data.notes.iter().cloned());
    notes
}

/// Markdown tables of every group (shared by report.md and the docs section).
fn markdown_tables(data: &Data, out: &mut String) {
    let rows = &data.rows;
    for group in groups(rows) {
        let in_group: Vec<&Row> = rows.iter().filter(|r| r.group == group).collect();
        let _ = writeln!(out, "\n### `{group}`\n");
        let _ = writeln!(
            out,
            "| contender | param | median ns/op | mean ns/op | Mops/s | × governor |"
        );
        let _ = writeln!(out, "|---|---|---:|---:|---:|---:|");
        for r in in_group {
            let ratio = baseline(rows, r).map_or_else(
                || "–".to_owned(),
                |b| format!("{:.2}", r.median_ns / b.median_ns),
            );
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                r.function,
                r.param.as_deref().unwrap_or(""),
                fmt_ns(r.median_ns),
                fmt_ns(r.mean_ns),
                r.mops()
                    .map_or_else(|| "–".to_owned(), |m| format!("{m:.2}")),
                ratio
            );
        }
    }
}

fn f(v: &Value) -> String {
    v.as_f64().map_or_else(
        || v.as_u64().map_or_else(|| "–".to_owned(), |n| n.to_string()),
        |x| {
            if x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            }
        },
    )
}

fn markdown_memory(memory: &Value, out: &mut String) {
    let Some(local) = memory["local"].as_array() else {
        out.push_str("\n(no memory figures: run `cargo xtask bench`)\n");
        return;
    };
    out.push_str(
        "\n### Bytes per local bucket\n\n`size_of` is the handle; heap is what the bucket asked the \
         allocator for (counting global allocator, allocator overhead not included), averaged \
         over 10,000 buckets, after building and after each bucket's first `try_consume(1)`. \
         Allocations per operation over 100,000 calls.\n\n\
         | strategy | bandwidths | size_of | heap after build | heap after first use | total bytes | allocs / success | allocs / denial |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in local {
        let total =
            r["size_of"].as_f64().unwrap_or(0.0) + r["heap_after_use"].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {total:.0} | {} | {} |",
            r["strategy"].as_str().unwrap_or("?"),
            f(&r["bandwidths"]),
            f(&r["size_of"]),
            f(&r["heap_after_build"]),
            f(&r["heap_after_use"]),
            f(&r["allocs_per_success"]),
            f(&r["allocs_per_denial"]),
        );
    }
    if let Some(peers) = memory["peers"].as_array() {
        out.push_str("\nPeers, for scale:\n\n| limiter | size_of | heap |\n|---|---:|---:|\n");
        for p in peers {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                p["name"].as_str().unwrap_or("?"),
                f(&p["size_of"]),
                f(&p["heap"])
            );
        }
    }
    if let Some(keyed) = memory["keyed"].as_array() {
        out.push_str(
            "\n### Keyed: heap bytes per key\n\nEach limiter holds 1,000,000 keys (`\"k<n>\"` or \
             `n`), each used once (its one token of the hour taken, so no key is full, and none \
             may be forgotten; the count of keys is checked); the empty map is left out. Both own \
             their keys: a `String` key's own heap is counted on both sides.\n\n\
             | limiter | keys | key | heap bytes / key |\n|---|---:|---|---:|\n",
        );
        for k in keyed {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                k["name"].as_str().unwrap_or("?"),
                f(&k["keys"]),
                k["key"].as_str().unwrap_or(""),
                f(&k["heap_bytes_per_key"])
            );
        }
    }
}

fn markdown_headlines(rows: &[Row], memory: &Value, out: &mut String) {
    out.push_str(
        "| comparison (same run) | ratio | target | verdict | figures |\n|---|---:|---|---|---|\n",
    );
    for h in headlines(rows, memory) {
        let _ = writeln!(
            out,
            "| {} | **{:.2}** | {} | {} | {} |",
            h.what,
            h.ratio,
            h.target,
            verdict(h.met),
            h.detail
        );
    }
}

/// The figures section of docs/benchmarks.md.
pub(crate) fn docs_section(data: &Data) -> String {
    let mut out = String::new();
    out.push_str("### Machine\n\n");
    for (k, v) in machine_lines(&data.machine, &data.mode) {
        let _ = writeln!(out, "- {k}: {v}");
    }
    out.push_str("\n### Headline ratios\n\n");
    markdown_headlines(&data.rows, &data.memory, &mut out);
    if let Some(line) = allocation_verdict(&data.memory) {
        let _ = writeln!(out, "\n{line}");
    }
    out.push_str("\n### Notes on noise\n\n");
    for n in noise_notes(data) {
        let _ = writeln!(out, "- {n}");
    }
    out.push_str("\n### All figures\n");
    markdown_tables(data, &mut out);
    out.push_str("\n### Memory\n");
    markdown_memory(&data.memory, &mut out);
    out
}

/// report.md.
pub(crate) fn markdown(data: &Data) -> String {
    let mut out = String::from("# bucket4rs benchmark report\n\n");
    out.push_str(&docs_section(data));
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// index.html: one self-contained page.
pub(crate) fn html(data: &Data) -> Result<String> {
    let rows = &data.rows;
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>bucket4rs benchmarks</title>\
         <style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
         table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px}\
         td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}\
         .missed{color:#b00;font-weight:bold}.met{color:#070}svg{max-width:100%;height:auto}\
         .charts{display:flex;flex-wrap:wrap;gap:12px}</style></head><body>\
         <h1>bucket4rs benchmark report</h1><table>",
    );
    for (k, v) in machine_lines(&data.machine, &data.mode) {
        let _ = write!(h, "<tr><th>{k}</th><td>{}</td></tr>", esc(&v));
    }
    h.push_str("</table><h2>Headline ratios (measured side by side in this run)</h2><table><tr><th>comparison</th><th>ratio</th><th>target</th><th>verdict</th><th>figures</th></tr>");
    for hl in headlines(rows, &data.memory) {
        let class = match hl.met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "",
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"n\"><b>{:.2}</b></td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td></tr>",
            esc(&hl.what),
            hl.ratio,
            esc(hl.target),
            verdict(hl.met).trim_matches('*'),
            esc(&hl.detail)
        );
    }
    h.push_str("</table>");
    if let Some(line) = allocation_verdict(&data.memory) {
        let _ = write!(h, "<p>{}</p>", esc(&line.replace("**", "")));
    }
    h.push_str("<h2>Notes</h2><ul>");
    for n in noise_notes(data) {
        let _ = write!(h, "<li>{}</li>", esc(&n));
    }
    h.push_str("</ul><h2>Charts</h2><div class=\"charts\">");
    for (group, metric) in [
        ("contention/success", Metric::Ns),
        ("contention/success", Metric::Mops),
        ("contention/rejection", Metric::Ns),
        ("contention/rejection", Metric::Mops),
    ] {
        if let Some(svg) = thread_chart(rows, group, metric, data.machine.cores)? {
            h.push_str(&svg);
        }
    }
    for (group, param) in [
        ("single_thread/success", None),
        ("single_thread/rejection", None),
        ("same_clock/quanta", None),
        ("same_clock/instant", None),
        ("contention/success", Some("2")),
        ("contention/rejection", Some("2")),
    ] {
        if let Some(svg) = ratio_chart(rows, group, param)? {
            h.push_str(&svg);
        }
    }
    for (group, _) in KEYED_GROUPS {
        for r in rows
            .iter()
            .filter(|r| r.group == group && r.function == "governor keyed")
        {
            if let Some(svg) = ratio_chart(rows, group, r.param.as_deref())? {
                h.push_str(&svg);
            }
        }
    }
    h.push_str("</div><h2>All figures</h2>");
    for group in groups(rows) {
        let _ = write!(
            h,
            "<h3>{}</h3><table><tr><th>contender</th><th>param</th><th>median ns/op</th><th>mean ns/op</th><th>Mops/s</th><th>× governor</th></tr>",
            esc(group)
        );
        for r in rows.iter().filter(|r| r.group == group) {
            let ratio = baseline(rows, r).map_or_else(
                || "–".to_owned(),
                |b| format!("{:.2}", r.median_ns / b.median_ns),
            );
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{ratio}</td></tr>",
                esc(&r.function),
                esc(r.param.as_deref().unwrap_or("")),
                fmt_ns(r.median_ns),
                fmt_ns(r.mean_ns),
                r.mops()
                    .map_or_else(|| "–".to_owned(), |m| format!("{m:.2}")),
            );
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Memory</h2>");
    // The memory tables are simple; render the markdown ones as preformatted-free HTML tables.
    let mut md = String::new();
    markdown_memory(&data.memory, &mut md);
    h.push_str(&markdown_to_html_tables(&md));
    h.push_str("</body></html>\n");
    Ok(h)
}

/// Converts the few constructs `markdown_memory` emits (### headings, paragraphs, pipe
/// tables) to HTML.
fn markdown_to_html_tables(md: &str) -> String {
    let mut h = String::new();
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells
                .iter()
                .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
            {
                continue;
            }
            let tag = if in_table { "td" } else { "th" };
            if !in_table {
                h.push_str("<table>");
                in_table = true;
            }
            h.push_str("<tr>");
            for c in cells {
                let _ = write!(h, "<{tag}>{}</{tag}>", esc(c));
            }
            h.push_str("</tr>");
            continue;
        }
        if in_table {
            h.push_str("</table>");
            in_table = false;
        }
        if let Some(t) = line.strip_prefix("### ") {
            let _ = write!(h, "<h3>{}</h3>", esc(t));
        } else if !line.trim().is_empty() {
            let _ = write!(h, "<p>{}</p>", esc(line));
        }
    }
    if in_table {
        h.push_str("</table>");
    }
    h
}

#[derive(Clone, Copy)]
enum Metric {
    Ns,
    Mops,
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// A line per contender: ns/op or Mops/s against threads.
fn thread_chart(rows: &[Row], group: &str, metric: Metric, cores: usize) -> Result<Option<String>> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    // The atomic floor would flatten every limiter's throughput line; it stays in the tables
    // and in the ns/op chart.
    let skip_floor = matches!(metric, Metric::Mops);
    for r in rows
        .iter()
        .filter(|r| r.group == group && !(skip_floor && r.function.starts_with("floor")))
    {
        let (Some(x), Some(y)) = (
            r.param_num(),
            match metric {
                Metric::Ns => Some(r.median_ns),
                Metric::Mops => r.mops(),
            },
        ) else {
            continue;
        };
        match series.iter_mut().find(|s| s.0 == r.function) {
            Some(s) => s.1.push((x, y)),
            None => series.push((r.function.clone(), vec![(x, y)])),
        }
    }
    if series.is_empty() {
        return Ok(None);
    }
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        * 1.1;
    let (title, ylabel) = match metric {
        Metric::Ns => (
            format!("{group}: aggregate ns/op (lower is better)"),
            "ns/op",
        ),
        Metric::Mops => (format!("{group}: throughput (higher is better)"), "Mops/s"),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (540, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0.5_f64..8.5_f64, 0.0_f64..ymax.max(1.0))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(format!("threads (>{cores} oversubscribed)"))
            .y_desc(ylabel)
            .x_labels(9)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(plot_err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(Some(svg))
}

/// Horizontal bars: each contender's time divided by governor's, same group and parameter.
fn ratio_chart(rows: &[Row], group: &str, param: Option<&str>) -> Result<Option<String>> {
    let bars: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| {
            r.group == group
                && match param {
                    None => r.param.is_none(),
                    Some(p) => r.param.as_deref().is_some_and(|q| q == p),
                }
        })
        .filter_map(|r| baseline(rows, r).map(|b| (r.function.clone(), r.median_ns / b.median_ns)))
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    let xmax = bars.iter().map(|b| b.1).fold(1.0_f64, f64::max) * 1.6;
    #[allow(clippy::cast_precision_loss)]
    let n = bars.len() as f64;
    let title = format!(
        "{group}{}: time ÷ governor's (lower is better)",
        param.map(|p| format!(" @ {p}")).unwrap_or_default()
    );
    let mut svg = String::new();
    {
        let height = 70 + 28 * u32::try_from(bars.len()).unwrap_or(10);
        let root = SVGBackend::with_string(&mut svg, (540, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 14))
            .margin(10)
            .x_label_area_size(25)
            .y_label_area_size(5)
            .build_cartesian_2d(0.0_f64..xmax, 0.0_f64..n)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, v)) in bars.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let y = n - 1.0 - i as f64;
            let color = if *v <= 1.0 {
                RGBColor(46, 139, 87)
            } else {
                RGBColor(200, 80, 60)
            };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y + 0.15), (*v, y + 0.85)],
                    color.filled(),
                )))
                .map_err(plot_err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{name}  {v:.2}×"),
                    (*v + xmax * 0.01, y + 0.65),
                    ("sans-serif", 12),
                )))
                .map_err(plot_err)?;
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, n)],
                BLACK.stroke_width(1),
            )))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(Some(svg))
}

/// The terminal summary: headline ratios, then every benchmark.
pub(crate) fn print_summary(data: &Data) {
    let rows = &data.rows;
    println!(
        "\n==> bench summary ({} run, {} benchmarks)",
        data.mode,
        rows.len()
    );
    println!(
        "{} | {} cores | {} | {}",
        data.machine.cpu, data.machine.cores, data.machine.rustc, data.machine.commit
    );
    let width = rows
        .iter()
        .map(|r| r.group.len() + r.function.len() + r.param.as_ref().map_or(0, |p| p.len() + 1) + 1)
        .max()
        .unwrap_or(20)
        .max(20);
    println!(
        "\n{:<width$} {:>12} {:>10} {:>11}",
        "benchmark", "median ns/op", "Mops/s", "× governor"
    );
    for r in groups(rows)
        .into_iter()
        .flat_map(|g| rows.iter().filter(move |r| r.group == g))
    {
        let mut id = format!("{}/{}", r.group, r.function);
        if let Some(p) = &r.param {
            id = format!("{id}/{p}");
        }
        let ratio = baseline(rows, r)
            .map_or_else(String::new, |b| format!("{:.2}", r.median_ns / b.median_ns));
        println!(
            "{id:<width$} {:>12} {:>10} {ratio:>11}",
            fmt_ns(r.median_ns),
            r.mops().map_or_else(String::new, |m| format!("{m:.2}"))
        );
    }
    println!("\nheadline ratios (same run):");
    for h in headlines(rows, &data.memory) {
        println!(
            "  {:.2}  {}  [target {}: {}]",
            h.ratio,
            h.what,
            h.target,
            verdict(h.met).trim_matches('*')
        );
    }
    for n in &data.notes {
        println!("note: {n}");
    }
}
