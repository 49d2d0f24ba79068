//! The Bucket4j conformance traces and their replayer: behaviour recorded from Bucket4j 8.19,
//! one scenario per trace (format and semantics in the repository's `testdata/conformance`),
//! replayed through any bucket implementation that implements [`Engine`].
//!
//! The traces are bundled in this crate; set [`DIR_VARIABLE`] (`BUCKET4RS_CONFORMANCE_DIR`)
//! to replay the traces of another directory instead.
//!
//! ```
//! let traces = bucket4rs_testkit::conformance::traces();
//! assert!(!traces.is_empty() || std::env::var_os("BUCKET4RS_CONFORMANCE_DIR").is_some());
//! ```

use core::fmt::Write as _;
use core::time::Duration;
use std::path::{Path, PathBuf};

use bucket4rs_core::{
    Bandwidth, BucketConfiguration, ConsumptionProbe, EstimationProbe, ManualClock,
    TokensInheritanceStrategy,
};
use serde_json::{Value, json};

/// The environment variable naming another directory of traces to replay instead of the
/// bundled ones.
///
/// ```
/// assert_eq!(bucket4rs_testkit::conformance::DIR_VARIABLE, "BUCKET4RS_CONFORMANCE_DIR");
/// ```
pub const DIR_VARIABLE: &str = "BUCKET4RS_CONFORMANCE_DIR";

/// The traces recorded from Bucket4j, as shipped with this crate.
static BUNDLED: include_dir::Dir<'static> =
    include_dir::include_dir!("$CARGO_MANIFEST_DIR/conformance");

/// The directory named by [`DIR_VARIABLE`], if it is set (relative to the current directory
/// unless absolute); `None`: the bundled traces are replayed.
///
/// ```
/// if std::env::var_os("BUCKET4RS_CONFORMANCE_DIR").is_none() {
///     assert_eq!(bucket4rs_testkit::conformance::other_dir(), None);
/// }
/// ```
pub fn other_dir() -> Option<PathBuf> {
    match std::env::var_os(DIR_VARIABLE) {
        Some(dir) if !dir.is_empty() => {
            let p = PathBuf::from(dir);
            Some(if p.is_absolute() {
                p
            } else {
                std::env::current_dir().unwrap_or_default().join(p)
            })
        }
        _ => None,
    }
}

/// The traces to replay: those of [`other_dir`] when it is set, else the bundled ones, sorted
/// by file name.
///
/// # Panics
/// On an unreadable directory or a malformed trace (a test-support function).
///
/// ```
/// let traces = bucket4rs_testkit::conformance::traces();
/// assert!(traces.windows(2).all(|w| w[0].file < w[1].file));
/// ```
pub fn traces() -> Vec<Trace> {
    match other_dir() {
        Some(dir) => load_traces(&dir),
        None => bundled_traces(),
    }
}

/// Where [`traces`] come from, for reports: the other directory, or `bundled`.
fn source() -> String {
    match other_dir() {
        Some(dir) => dir.canonicalize().unwrap_or(dir).display().to_string(),
        None => "bundled".into(),
    }
}

/// The traces shipped with this crate, sorted by file name.
///
/// # Panics
/// On a malformed trace (never for the bundled set, which the crate's tests replay).
///
/// ```
/// assert!(bucket4rs_testkit::conformance::bundled_traces().len() > 100);
/// ```
pub fn bundled_traces() -> Vec<Trace> {
    let mut files: Vec<_> = BUNDLED
        .files()
        .filter(|f| f.path().extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort_by_key(|f| f.path());
    files
        .into_iter()
        .map(|f| {
            let name = f.path().to_string_lossy().into_owned();
            let text = f
                .contents_utf8()
                .unwrap_or_else(|| panic!("{name}: not UTF-8"));
            parse_trace(name, text)
        })
        .collect()
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
            let file = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            parse_trace(file, &text)
        })
        .collect()
}

/// One trace from its file name and text.
fn parse_trace(file: String, text: &str) -> Trace {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: invalid JSON: {e}"));
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

/// Replays every trace (see [`traces`]) whose clock never goes back
/// ([`never_goes_back`]) on a manual clock that declares itself monotonic — the clock under
/// which one-bandwidth lock-free buckets keep their compact word — through the engine made by
/// `build`. Prints `conformance: N traces, M steps passed (engine: label, monotonic clock;
/// skipped: K ...)` and panics listing every failing trace.
pub fn replay_all_monotonic<E, B>(label: &str, mut build: B)
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let traces = traces();
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
        source()
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

/// Replays every trace (see [`traces`]) through the engine made by `build`, prints
/// `conformance: N traces, M steps passed (engine: label; ...)`, and panics listing every
/// failing trace (or when no trace was found).
///
/// ```
/// use bucket4rs_core::{ManualClock, ops};
/// use bucket4rs_testkit::conformance::{Engine, Op, outcome, replay_all};
///
/// /// The core's state under a manual clock: the smallest engine.
/// struct Core(bucket4rs_core::BucketConfiguration, bucket4rs_core::BucketState, ManualClock);
///
/// impl Engine for Core {
///     fn execute(&mut self, op: &Op) -> Result<serde_json::Value, String> {
///         use bucket4rs_core::Clock;
///         let (c, s, now) = (&self.0, &mut self.1, self.2.now_nanos());
///         let e = |e: bucket4rs_core::OperationError| e.to_string();
///         Ok(match op {
///             Op::TryConsume(n) => s.apply(c, now, &ops::TryConsume(*n)).map_err(e)?.into(),
///             Op::AvailableTokens => s.apply(c, now, &ops::AvailableTokens).map_err(e)?.into(),
///             other => return Err(format!("{other:?} left out of this example")),
///         })
///     }
///     fn snapshot(&mut self) -> String {
///         format!("{:?}", self.1)
///     }
/// }
/// # let _ = (outcome::unit(), || replay_all("core", |config, clock| {
/// #     let state = bucket4rs_core::BucketState::new(&config, bucket4rs_core::Clock::now_nanos(&clock));
/// #     Ok(Core(config, state, clock))
/// # }));
/// ```
pub fn replay_all<E, B>(label: &str, mut build: B)
where
    E: Engine,
    B: FnMut(BucketConfiguration, ManualClock) -> Result<E, String>,
{
    let traces = traces();
    assert!(
        !traces.is_empty(),
        "no conformance trace found in {}",
        source()
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
        source()
    );
    summary.panic_on_failures(label);
}
