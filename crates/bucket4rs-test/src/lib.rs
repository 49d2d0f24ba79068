//! Test support shared by every bucket4rs crate: the loader and replayer of the Bucket4j
//! conformance traces (`testdata/conformance`, format in its README).
//!
//! One loader, many engines: each bucket implementation (the pure core, each local strategy,
//! the blocking view, every distributed backend) implements [`Engine`] and is replayed against
//! the same traces by [`replay_all`].
//!
//! ```
//! let dir = bucket4rs_test::conformance_dir();
//! assert!(dir.ends_with("conformance") || std::env::var_os("BUCKET4RS_CONFORMANCE_DIR").is_some());
//! ```

use core::fmt::Write as _;
use core::time::Duration;
use std::path::{Path, PathBuf};

use bucket4rs_core::{
    Bandwidth, BucketConfiguration, ConsumptionProbe, EstimationProbe, ManualClock,
    TokensInheritanceStrategy,
};
use serde_json::{Value, json};

#[cfg(feature = "local")]
pub mod local;
pub mod recorder;

/// The environment variable naming another directory of traces to replay instead.
pub const DIR_VARIABLE: &str = "BUCKET4RS_CONFORMANCE_DIR";

/// The directory replayed: `$BUCKET4RS_CONFORMANCE_DIR` when set, else the repository's
/// `testdata/conformance`.
///
/// ```
/// assert!(bucket4rs_test::conformance_dir().is_absolute());
/// ```
pub fn conformance_dir() -> PathBuf {
    match std::env::var_os(DIR_VARIABLE) {
        Some(dir) if !dir.is_empty() => {
            let p = PathBuf::from(dir);
            if p.is_absolute() {
                p
            } else {
                std::env::current_dir().unwrap_or_default().join(p)
            }
        }
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/conformance"),
    }
}

/// One operation of a trace, with arguments already checked to be representable.
#[derive(Clone, Debug)]
pub enum Op {
    /// `try_consume`
    TryConsume(u64),
    /// `try_consume_and_return_remaining`
    TryConsumeAndReturnRemaining(u64),
    /// `estimate_ability_to_consume`
    EstimateAbilityToConsume(u64),
    /// `try_consume_as_much_as_possible`
    TryConsumeAsMuchAsPossible(Option<u64>),
    /// `add_tokens`
    AddTokens(u64),
    /// `force_add_tokens`
    ForceAddTokens(u64),
    /// `reset`
    Reset,
    /// `available_tokens`
    AvailableTokens,
    /// `consume_ignoring_rate_limits`
    ConsumeIgnoringRateLimits(u64),
    /// `replace_configuration`
    ReplaceConfiguration(BucketConfiguration, TokensInheritanceStrategy),
    /// `blocking_try_consume`: reserve and park (the park advances the manual clock).
    BlockingTryConsume {
        /// tokens
        tokens: u64,
        /// max wait
        max_wait_nanos: u64,
    },
    /// `blocking_consume`
    BlockingConsume(u64),
}

/// A bucket implementation under test.
pub trait Engine {
    /// Runs one operation and returns its result in the trace's JSON shape (see the `outcome`
    /// helpers), or an error description. Blocking operations must advance the shared
    /// [`ManualClock`] by the time they park.
    fn execute(&mut self, op: &Op) -> Result<Value, String>;

    /// A comparable picture of the configuration and state, used to check that a failing
    /// operation changed nothing.
    fn snapshot(&mut self) -> String;
}

/// Builds the JSON results engines return.
pub mod outcome {
    use super::*;

    /// A consumption probe.
    pub fn probe(p: &ConsumptionProbe) -> Value {
        json!({"consumed": p.is_consumed(), "remaining_tokens": p.remaining_tokens(),
               "nanos_to_wait_for_refill": p.wait_for_refill().as_nanos() as u64,
               "nanos_to_wait_for_reset": p.wait_for_reset().as_nanos() as u64})
    }
    /// An estimation probe.
    pub fn estimate(p: &EstimationProbe) -> Value {
        json!({"can_be_consumed": p.can_be_consumed(), "remaining_tokens": p.remaining_tokens(),
               "nanos_to_wait_for_refill": p.wait_for_refill().as_nanos() as u64})
    }
    /// A blocking try-consume: `Some(parked)` when consumed.
    pub fn blocking_try(parked: Option<u64>) -> Value {
        json!({"consumed": parked.is_some(), "parked_nanos": parked.unwrap_or(0)})
    }
    /// A blocking consume.
    pub fn blocking(parked: u64) -> Value {
        json!({"parked_nanos": parked})
    }
    /// An operation without a result.
    pub fn unit() -> Value {
        Value::Null
    }
}

/// A loaded trace.
#[derive(Debug)]
pub struct Trace {
    /// File name.
    pub file: String,
    /// Scenario name.
    pub name: String,
    /// Clock start.
    pub start_nanos: i64,
    /// Clock flag.
    pub wall_clock_based: bool,
    /// The initial bandwidths, as JSON.
    pub bandwidths: Value,
    /// Whether building must fail.
    pub build_error: bool,
    /// The steps, as JSON.
    pub steps: Vec<Value>,
}

/// Loads every `*.json` trace of `dir`, sorted by file name.
///
/// # Panics
/// On an unreadable directory or a malformed trace (a test-support function).
pub fn load_traces(dir: &Path) -> Vec<Trace> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read conformance dir {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: invalid JSON: {e}", path.display()));
            let file = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let clock = &v["clock"];
            Trace {
                name: v["name"].as_str().unwrap_or(&file).to_owned(),
                start_nanos: clock["start_nanos"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{file}: clock.start_nanos missing")),
                wall_clock_based: clock["wall_clock_based"].as_bool().unwrap_or(false),
                bandwidths: v["bandwidths"].clone(),
                build_error: v.get("build_error").is_some_and(|b| !b.is_null()),
                steps: v["steps"].as_array().cloned().unwrap_or_default(),
                file,
            }
        })
        .collect()
}

fn int(v: &Value, field: &str) -> Result<i64, String> {
    v.get(field)
        .and_then(Value::as_i64)
        .ok_or_else(|| format!("field `{field}` missing or not an integer"))
}

/// A trace value the Rust API cannot represent (a negative count or duration): Bucket4j
/// rejects it with `IllegalArgumentException`, Rust's types reject it before any call.
fn unsigned(v: &Value, field: &str) -> Result<Result<u64, String>, String> {
    let x = int(v, field)?;
    Ok(u64::try_from(x)
        .map_err(|_| format!("`{field}` = {x} is negative: not representable as u64")))
}

/// Converts one trace bandwidth; `Ok(Err(_))` when the bandwidth is invalid (by our validation
/// or by being unrepresentable), `Err(_)` when the trace itself is malformed.
fn bandwidth(v: &Value) -> Result<Result<Bandwidth, String>, String> {
    let refill = v.get("refill").ok_or("bandwidth without refill")?;
    let capacity = match unsigned(v, "capacity")? {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    let tokens = match unsigned(refill, "tokens")? {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    let period = match unsigned(refill, "period_nanos")? {
        Ok(c) => Duration::from_nanos(c),
        Err(e) => return Ok(Err(e)),
    };
    let mut b = Bandwidth::builder().capacity(capacity);
    b = match refill["kind"].as_str() {
        Some("greedy") => b.refill_greedy(tokens, period),
        Some("intervally") => b.refill_intervally(tokens, period),
        Some("intervally_aligned") => {
            let first = match unsigned(refill, "time_of_first_refill_nanos")? {
                Ok(f) => Duration::from_nanos(f),
                Err(e) => return Ok(Err(e)),
            };
            if refill["adaptive_initial_tokens"].as_bool().unwrap_or(false) {
                b.refill_intervally_aligned_adaptive(tokens, period, first)
            } else {
                b.refill_intervally_aligned(tokens, period, first)
            }
        }
        other => return Err(format!("unknown refill kind {other:?}")),
    };
    if v.get("initial_tokens").is_some_and(|t| !t.is_null()) {
        match unsigned(v, "initial_tokens")? {
            Ok(t) => b = b.initial_tokens(t),
            Err(e) => return Ok(Err(e)),
        }
    }
    if let Some(id) = v.get("id").and_then(Value::as_str) {
        b = b.id(id);
    }
    Ok(b.build().map_err(|e| e.to_string()))
}

/// Converts a trace's bandwidth list into a configuration (see the private `bandwidth` for the nesting).
pub fn configuration(v: &Value) -> Result<Result<BucketConfiguration, String>, String> {
    let list = v.as_array().ok_or("bandwidths is not an array")?;
    let mut out = Vec::with_capacity(list.len());
    for b in list {
        match bandwidth(b)? {
            Ok(b) => out.push(b),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(BucketConfiguration::new(out).map_err(|e| e.to_string()))
}

fn strategy(name: &str) -> Result<TokensInheritanceStrategy, String> {
    Ok(match name {
        "PROPORTIONALLY" => TokensInheritanceStrategy::Proportionally,
        "AS_IS" => TokensInheritanceStrategy::AsIs,
        "ADDITIVE" => TokensInheritanceStrategy::Additive,
        "RESET" => TokensInheritanceStrategy::Reset,
        other => return Err(format!("unknown strategy {other:?}")),
    })
}

/// Parses a step's operation: `Ok(Err(reason))` when its arguments cannot be represented or
/// its replacement configuration is invalid (the step must then expect an error).
fn parse_op(step: &Value) -> Result<Result<Op, String>, String> {
    let name = step["op"].as_str().ok_or("step without op")?;
    macro_rules! arg {
        ($field:expr) => {
            match unsigned(step, $field)? {
                Ok(v) => v,
                Err(e) => return Ok(Err(e)),
            }
        };
    }
    Ok(Ok(match name {
        "try_consume" => Op::TryConsume(arg!("tokens")),
        "try_consume_and_return_remaining" => Op::TryConsumeAndReturnRemaining(arg!("tokens")),
        "estimate_ability_to_consume" => Op::EstimateAbilityToConsume(arg!("tokens")),
        "try_consume_as_much_as_possible" => {
            if step.get("limit").is_some_and(|l| !l.is_null()) {
                Op::TryConsumeAsMuchAsPossible(Some(arg!("limit")))
            } else {
                Op::TryConsumeAsMuchAsPossible(None)
            }
        }
        "add_tokens" => Op::AddTokens(arg!("tokens")),
        "force_add_tokens" => Op::ForceAddTokens(arg!("tokens")),
        "reset" => Op::Reset,
        "available_tokens" => Op::AvailableTokens,
        "consume_ignoring_rate_limits" => Op::ConsumeIgnoringRateLimits(arg!("tokens")),
        "replace_configuration" => {
            let s = strategy(
                step["strategy"]
                    .as_str()
                    .ok_or("replace without strategy")?,
            )?;
            match configuration(&step["bandwidths"])? {
                Ok(c) => Op::ReplaceConfiguration(c, s),
                Err(e) => return Ok(Err(e)),
            }
        }
        "blocking_try_consume" => Op::BlockingTryConsume {
            tokens: arg!("tokens"),
            max_wait_nanos: arg!("max_wait_nanos"),
        },
        "blocking_consume" => Op::BlockingConsume(arg!("tokens")),
        other => return Err(format!("unknown op {other:?}")),
    }))
}

/// What replaying a set of traces through one engine found.
#[derive(Debug, Default)]
struct Summary {
    /// Traces replayed.
    traces: usize,
    /// Steps (clock advances included) that matched.
    steps: usize,
    /// One line per failing trace.
    failures: Vec<String>,
}

impl Summary {
    /// Counts one replayed trace: its matching steps, or its failure.
    fn record(&mut self, trace: &Trace, result: Result<usize, String>) {
        self.traces += 1;
        match result {
            Ok(n) => self.steps += n,
            Err(e) => self
                .failures
                .push(format!("{} ({}): {e}", trace.file, trace.name)),
        }
    }

    /// Panics listing every failing trace, if any, naming the `engine`.
    fn panic_on_failures(&self, engine: &str) {
        if self.failures.is_empty() {
            return;
        }
        let mut msg = String::new();
        for f in &self.failures {
            let _ = writeln!(msg, "  {f}");
        }
        panic!(
            "{} of {} traces failed on {engine}:\n{msg}",
            self.failures.len(),
            self.traces
        );
    }
}

/// Replays one trace. `build` makes the engine from a configuration and the shared manual
/// clock (it must apply the clock rule V9 itself). Returns the number of matching steps.
///
/// # Errors
/// A description of the first mismatch.
pub fn replay<E, B>(trace: &Trace, build: &mut B) -> Result<usize, String>
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let clock = if trace.wall_clock_based {
        ManualClock::wall_clock(trace.start_nanos)
    } else {
        ManualClock::new(trace.start_nanos)
    };
    replay_on(trace, build, clock)
}

/// Whether `trace` can run on a [monotonic](bucket4rs_core::Clock::is_monotonic) manual clock:
/// not wall-clock based, and its clock never moves back.
pub fn never_goes_back(trace: &Trace) -> bool {
    !trace.wall_clock_based
        && trace.steps.iter().all(|step| {
            step.get("advance_nanos")
                .and_then(Value::as_i64)
                .is_none_or(|by| by >= 0)
        })
}

/// Replays every trace of [`conformance_dir`] whose clock never goes back
/// ([`never_goes_back`]) on a manual clock that declares itself monotonic — the clock under
/// which one-bandwidth lock-free buckets keep their compact word — through the engine made by
/// `build`. Prints `conformance: N traces, M steps passed (engine: label, monotonic clock;
/// skipped: K ...)` and panics listing every failing trace.
pub fn replay_all_monotonic<E, B>(label: &str, mut build: B)
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let dir = conformance_dir();
    let traces = load_traces(&dir);
    let mut summary = Summary::default();
    let mut skipped = 0;
    for trace in &traces {
        if !never_goes_back(trace) {
            skipped += 1;
            continue;
        }
        summary.record(
            trace,
            replay_on(trace, &mut build, ManualClock::monotonic(trace.start_nanos)),
        );
    }
    println!(
        "conformance: {} traces, {} steps passed (engine: {label}, monotonic clock; failed: {}; \
         skipped: {skipped} whose clock goes back or is wall-clock based; dir: {})",
        summary.traces - summary.failures.len(),
        summary.steps,
        summary.failures.len(),
        dir.canonicalize().unwrap_or(dir.clone()).display()
    );
    summary.panic_on_failures(&format!("{label} (monotonic clock)"));
}

fn replay_on<E, B>(trace: &Trace, build: &mut B, clock: ManualClock) -> Result<usize, String>
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let built = configuration(&trace.bandwidths)?.and_then(|c| build(c, clock.clone()));
    let mut engine = match (built, trace.build_error) {
        (Ok(_), true) => {
            return Err("building succeeded but the trace expects a build error".into());
        }
        (Err(_), true) => return Ok(1),
        (Err(e), false) => return Err(format!("building failed: {e}")),
        (Ok(engine), false) => engine,
    };
    let mut matched = 1; // the build itself
    for (i, step) in trace.steps.iter().enumerate() {
        if let Some(by) = step.get("advance_nanos") {
            let by = by
                .as_i64()
                .ok_or_else(|| format!("step {i}: bad advance_nanos"))?;
            clock.advance_nanos(by);
            matched += 1;
            continue;
        }
        let op = parse_op(step).map_err(|e| format!("step {i}: {e}"))?;
        let wants_error = step.get("expect_error").is_some();
        let expected = step.get("expect").cloned().unwrap_or(Value::Null);
        let before = engine.snapshot();
        let t_before = bucket4rs_core::Clock::now_nanos(&clock);
        let got = match &op {
            Ok(op) => engine.execute(op),
            Err(reason) => Err(reason.clone()),
        };
        match (got, wants_error) {
            (Ok(v), false) if v == expected => {}
            (Ok(v), false) => {
                return Err(format!("step {i} ({step}): expected {expected}, got {v}"));
            }
            (Ok(v), true) => return Err(format!("step {i} ({step}): expected an error, got {v}")),
            (Err(e), false) => return Err(format!("step {i} ({step}): unexpected error {e}")),
            (Err(_), true) => {
                let after = engine.snapshot();
                if after != before || bucket4rs_core::Clock::now_nanos(&clock) != t_before {
                    return Err(format!(
                        "step {i} ({step}): failing operation changed state:\n{before}\n{after}"
                    ));
                }
            }
        }
        matched += 1;
    }
    Ok(matched)
}

/// Replays every trace of [`conformance_dir`] through the engine made by `build`, prints
/// `conformance: N traces, M steps passed (engine: label; ...)`, and panics listing every failing trace (or
/// when no trace was found).
pub fn replay_all<E, B>(label: &str, mut build: B)
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let dir = conformance_dir();
    let traces = load_traces(&dir);
    assert!(
        !traces.is_empty(),
        "no conformance trace found in {}",
        dir.display()
    );
    let mut summary = Summary::default();
    for trace in &traces {
        summary.record(trace, replay(trace, &mut build));
    }
    let passed = summary.traces - summary.failures.len();
    println!(
        "conformance: {passed} traces, {} steps passed (engine: {label}; failed: {}; dir: {})",
        summary.steps,
        summary.failures.len(),
        dir.canonicalize().unwrap_or(dir.clone()).display()
    );
    summary.panic_on_failures(label);
}
