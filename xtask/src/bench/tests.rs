use std::fs;

use serde_json::json;

use super::{Machine, Row, collect, report};

fn write(dir: &std::path::Path, group: &str, function: &str, param: Option<&str>, median: f64) {
    let mut path = dir.join(group.replace('/', "_")).join(function);
    if let Some(p) = param {
        path = path.join(p);
    }
    let new = path.join("new");
    fs::create_dir_all(&new).unwrap();
    let meta = json!({"group_id": group, "function_id": function, "value_str": param,
        "throughput": {"Elements": 1}});
    fs::write(new.join("benchmark.json"), meta.to_string()).unwrap();
    let est =
        json!({"median": {"point_estimate": median}, "mean": {"point_estimate": median + 1.0}});
    fs::write(new.join("estimates.json"), est.to_string()).unwrap();
}

fn machine() -> Machine {
    Machine {
        cpu: "cpu".into(),
        cores: 2,
        os: "os".into(),
        clocksource: "tsc".into(),
        rustc: "rustc".into(),
        commit: "abc".into(),
        date: "today".into(),
        load: "0 0 0".into(),
    }
}

#[test]
fn reads_criterion_output_and_renders_every_report() {
    let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    write(&dir, "single_thread/success", "governor", None, 20.0);
    write(&dir, "single_thread/success", "lock-free", None, 10.0);
    write(&dir, "contention/success", "governor", Some("2"), 40.0);
    write(&dir, "contention/success", "lock-free", Some("2"), 50.0);
    write(
        &dir,
        "contention/success",
        "lock-free",
        Some("8-oversubscribed"),
        80.0,
    );
    let rows = collect(&dir, 0).unwrap();
    let _ = fs::remove_dir_all(&dir);
    assert_eq!(rows.len(), 5);
    let over = rows
        .iter()
        .find(|r| r.param.as_deref() == Some("8-oversubscribed"))
        .unwrap();
    assert_eq!(over.param_num(), Some(8.0));
    assert!((over.mops().unwrap() - 12.5).abs() < 1e-9);

    let data = report::Data {
        machine: machine(),
        mode: "full".into(),
        rows,
        memory: json!({"local": [{"strategy": "lock-free", "bandwidths": 1, "size_of": 80,
            "heap_after_build": 192.0, "heap_after_use": 192.0, "allocs_per_success": 0.0,
            "allocs_per_denial": 0.0}], "peers": [], "keyed": []}),
        notes: vec!["keyed: Redis backend skipped".into()],
    };
    let md = report::markdown(&data);
    assert!(md.contains(
        "| Lock-free success path vs governor `check()`, 1 thread (time ratio) | **0.50** |"
    ));
    assert!(
        md.contains("| Lock-free 2-thread throughput vs governor (throughput ratio) | **0.80** |")
    );
    assert!(md.contains("| lock-free | 1 | 80 | 192 | 192 | 272 | 0 | 0 |"));
    assert!(md.contains("Redis backend skipped"));
    let html = report::html(&data).unwrap();
    assert!(html.contains("<svg") && html.contains("</html>"));
}

#[test]
fn rows_without_a_parameter_have_no_number() {
    let row = Row {
        group: "g".into(),
        function: "f".into(),
        param: None,
        median_ns: 1.0,
        mean_ns: 1.0,
        elements: None,
    };
    assert_eq!(row.param_num(), None);
    assert_eq!(row.mops(), None);
}

#[test]
fn keyed_headlines_pair_each_parameter_and_the_memory_figures() {
    let dir = std::env::temp_dir().join(format!("xtask-bench-keyed-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let p = "10000 keys, 2 threads";
    write(&dir, "keyed/success", "KeyedBucket", Some(p), 30.0);
    write(
        &dir,
        "keyed/success",
        "KeyedBucket (SipHash)",
        Some(p),
        45.0,
    );
    write(&dir, "keyed/success", "governor keyed", Some(p), 40.0);
    write(
        &dir,
        "keyed/rejection",
        "KeyedBucket",
        Some("1 key, 1 thread"),
        22.0,
    );
    write(
        &dir,
        "keyed/rejection",
        "governor keyed",
        Some("1 key, 1 thread"),
        20.0,
    );
    // No governor figure at this parameter: no headline.
    write(
        &dir,
        "keyed/rejection",
        "KeyedBucket",
        Some("1 key, 2 threads"),
        20.0,
    );
    let rows = collect(&dir, 0).unwrap();
    let _ = fs::remove_dir_all(&dir);
    let row = |name: &str, contender: &str, key: &str, bytes: f64| {
        json!({"name": name, "contender": contender, "keys": 1_000_000, "key": key,
            "heap_bytes_per_key": bytes})
    };
    let data = report::Data {
        machine: machine(),
        mode: "full".into(),
        rows,
        memory: json!({"keyed": [
            row("ours<String>", "KeyedBucket", "String", 90.0),
            row("theirs<String>", "governor keyed", "String", 75.0),
            row("ours<u64>", "KeyedBucket", "u64", 50.0),
            row("theirs<u64>", "governor keyed", "u64", 25.0),
        ]}),
        notes: vec![],
    };
    let md = report::markdown(&data);
    assert!(md.contains(
        "| KeyedBucket vs governor keyed, success path, 10000 keys, 2 threads (time ratio) | \
         **0.75** | ≤ 1.00 | met | KeyedBucket 30.0 ns / governor keyed 40.0 ns"
    ));
    assert!(md.contains(
        "| KeyedBucket vs governor keyed, denied path, 1 key, 1 thread (time ratio) | **1.10** \
         | ≤ 1.00 | **missed** |"
    ));
    assert!(!md.contains("denied path, 1 key, 2 threads"));
    assert!(md.contains(
        "String keys at 1,000,000 keys (ratio) | **1.20** | ≤ 1.50 | met | ours<String> 90.0 B \
         / theirs<String> 75.0 B per key |"
    ));
    assert!(md.contains("u64 keys at 1,000,000 keys (ratio) | **2.00** | information | – |"));
    // The table's × governor column divides by governor keyed at the same parameter.
    assert!(md.contains(
        "| KeyedBucket (SipHash) | 10000 keys, 2 threads | 45.0 | 46.0 | 22.22 | 1.12 |"
    ));
    let html = report::html(&data).unwrap();
    assert!(html.contains("keyed/success @ 10000 keys, 2 threads"));
}
