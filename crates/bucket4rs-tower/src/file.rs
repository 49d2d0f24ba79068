//! Plans files: TOML with human durations, validated with errors that name the field.

use core::fmt;
use core::time::Duration;
use std::collections::{BTreeMap, HashMap};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use foldhash::fast::RandomState;
use toml::{Table, Value};

use crate::layer::RateLimitLayerBuilder;
use crate::limit::Limit;
use crate::plan::{Plan, PlanResolver};
use ipnet::IpNet;

/// Why a plans file was refused: the dotted path of the offending field and what is wrong.
///
/// ```
/// use bucket4rs_tower::PlanTable;
/// let err = PlanTable::from_toml(r#"
///     [plans.free]
///     limits = [{ capacity = 20, refill = 20, period = "1 fortnight" }]
/// "#).unwrap_err();
/// assert_eq!(err.path(), "plans.free.limits[0].period");
/// assert_eq!(err.to_string(), r#"plans.free.limits[0].period: "1 fortnight" is not a duration"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlansError {
    path: String,
    message: String,
}

impl PlansError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The dotted path of the offending field (empty for a TOML syntax error).
    ///
    /// ```
    /// let err = bucket4rs_tower::PlanTable::from_toml("plans = 3").unwrap_err();
    /// assert_eq!(err.path(), "plans");
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong.
    ///
    /// ```
    /// let err = bucket4rs_tower::PlanTable::from_toml("plans = 3").unwrap_err();
    /// assert_eq!(err.message(), "expected a table, found an integer");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PlansError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid TOML: {}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl core::error::Error for PlansError {}

/// Plans and the keys that use them, read from a plans file.
///
/// ```toml
/// [plans.free]
/// limits = ["20 per minute"]                    # capacity 20, refilled greedily 20/min
///
/// [plans.pro]
/// limits = [
///   { id = "burst", capacity = 200, refill = 200, period = "1m" },
///   { id = "daily", rate = "10000 per day" },
/// ]
///
/// [keys]                                        # API key = plan name
/// free-demo-key = "free"
/// pro-demo-key = "pro"
/// ```
///
/// A limit is either a rate string (`"N per <duration>"` or `"N/<duration>"`) or a table
/// with `capacity`, `refill` (default: the capacity), `period`, or `rate` instead of those
/// three, and optionally `id` (the policy name in the headers), `initial_tokens` and
/// `refill_kind` (`"greedy"`, the default, or `"intervally"`). Durations: `"1m"`, `"90s"`,
/// `"1h30m"`, `"2 hours"`, `"minute"`, `"500ms"`, … (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`,
/// `w` and their English names).
///
/// A plan or a further limit may lease on a shared store (feature `distributed`; see
/// [`Plan::with_leasing`]): `lease = true` for the default settings, or a table of
/// `processes`, `max_held_percent`, `period`, `lifetime` and `idle`, each at its default when
/// left out (`lease = { processes = 4, period = "50ms" }`); `lease = false`, as no `lease`,
/// leaves it to the store's manager. The settings the distributed crate refuses
/// ([`Leasing::check`](bucket4rs_distributed::Leasing::check)) are refused here, the field
/// named (`plans.hot.lease.period: period must be more than zero and at most the
/// lifetime`). The in-process store accepts them and has nothing to lease. Without feature
/// `distributed`, a `lease` other than `false` is refused.
///
/// ```
/// use bucket4rs_tower::{PlanResolver, PlanTable};
/// let table = PlanTable::from_toml(r#"
///     [plans.free]
///     limits = ["20 per minute"]
///     [keys]
///     k1 = "free"
/// "#)?;
/// assert_eq!(table.resolve("k1").unwrap().min_capacity(), 20);
/// assert!(table.resolve("k2").is_none());
/// # Ok::<(), bucket4rs_tower::PlansError>(())
/// ```
#[derive(Clone, Debug)]
pub struct PlanTable {
    plans: BTreeMap<String, Plan>,
    default_plan: Option<Plan>,
    limits: Vec<Limit>,
    exempt_keys: Vec<String>,
    exempt_networks: Vec<IpNet>,
    /// Seeded at random per table (`foldhash`): looked up by client-supplied keys on every
    /// request, so fast, but not predictable.
    keys: HashMap<String, Plan, RandomState>,
}

impl PlanResolver for PlanTable {
    fn resolve(&self, key: &str) -> Option<Plan> {
        self.keys.get(key).cloned()
    }

    /// Every plan of the table: a table lent to a layer is never changed.
    fn fixed_plans(&self) -> Option<Vec<Plan>> {
        Some(self.plans.values().cloned().collect())
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a datetime",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

fn expect_table<'a>(v: &'a Value, path: &str) -> Result<&'a Table, PlansError> {
    v.as_table()
        .ok_or_else(|| PlansError::new(path, format!("expected a table, found {}", type_name(v))))
}

fn expect_str<'a>(v: &'a Value, path: &str) -> Result<&'a str, PlansError> {
    v.as_str()
        .ok_or_else(|| PlansError::new(path, format!("expected a string, found {}", type_name(v))))
}

fn expect_u64(v: &Value, path: &str) -> Result<u64, PlansError> {
    match v {
        Value::Integer(i) => u64::try_from(*i)
            .map_err(|_| PlansError::new(path, format!("must not be negative, found {i}"))),
        other => Err(PlansError::new(
            path,
            format!("expected an integer, found {}", type_name(other)),
        )),
    }
}

impl PlanTable {
    /// Reads and validates a plans file.
    ///
    /// # Errors
    /// A [`PlansError`] naming the first offending field (or the TOML syntax error).
    ///
    /// ```
    /// let err = bucket4rs_tower::PlanTable::from_toml(r#"
    ///     [plans.free]
    ///     limits = ["20 per minute"]
    ///     [keys]
    ///     k1 = "gold"
    /// "#).unwrap_err();
    /// assert_eq!(err.to_string(), r#"keys.k1: plan "gold" is not defined in [plans]"#);
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, PlansError> {
        let root: Table = toml::from_str(text).map_err(|e| PlansError::new("", e.to_string()))?;
        for k in root.keys() {
            if !ROOT_FIELDS.contains(&k.as_str()) {
                return Err(PlansError::new(
                    k.as_str(),
                    format!("unknown field (expected one of {})", ROOT_FIELDS.join(", ")),
                ));
            }
        }
        let plans_v = root
            .get("plans")
            .ok_or_else(|| PlansError::new("plans", "missing: define at least one plan"))?;
        let plans_t = expect_table(plans_v, "plans")?;
        if plans_t.is_empty() {
            return Err(PlansError::new("plans", "define at least one plan"));
        }
        let mut plans = BTreeMap::new();
        for (name, v) in plans_t {
            let path = format!("plans.{name}");
            let Parsed {
                config,
                shadow,
                lease,
            } = parse_plan(v, &path, &[])?;
            let plan = Plan::new(name.as_str(), config);
            let plan = lease.apply(if shadow { plan.shadow() } else { plan })?;
            plans.insert(name.clone(), plan);
        }
        let default_plan = match root.get("default_plan") {
            Some(v) => {
                let name = expect_str(v, "default_plan")?;
                Some(plans.get(name).cloned().ok_or_else(|| {
                    PlansError::new(
                        "default_plan",
                        format!("plan {name:?} is not defined in [plans]"),
                    )
                })?)
            }
            None => plans.get("free").cloned(),
        };
        let mut limits = Vec::new();
        if let Some(v) = root.get("limits") {
            for (name, v) in expect_table(v, "limits")? {
                limits.push(parse_extra_limit(name, v, &format!("limits.{name}"))?);
            }
        }
        let (mut exempt_keys, mut exempt_networks) = (Vec::new(), Vec::new());
        if let Some(v) = root.get("exempt") {
            let t = expect_table(v, "exempt")?;
            for (k, v) in t {
                let path = format!("exempt.{k}");
                if k != "keys" && k != "networks" {
                    return Err(PlansError::new(
                        path,
                        "unknown field (expected `keys` or `networks`)",
                    ));
                }
                let Value::Array(items) = v else {
                    return Err(PlansError::new(
                        path,
                        format!("expected an array, found {}", type_name(v)),
                    ));
                };
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{path}[{i}]");
                    let s = expect_str(item, &at)?;
                    match k.as_str() {
                        "keys" => exempt_keys.push(s.to_owned()),
                        _ => exempt_networks
                            .push(parse_network(s).map_err(|m| PlansError::new(&at, m))?),
                    }
                }
            }
        }
        let mut keys = HashMap::with_hasher(RandomState::default());
        if let Some(keys_v) = root.get("keys") {
            for (key, v) in expect_table(keys_v, "keys")? {
                let path = format!("keys.{key}");
                let plan_name = expect_str(v, &path)?;
                let plan = plans.get(plan_name).ok_or_else(|| {
                    PlansError::new(
                        &path,
                        format!("plan {plan_name:?} is not defined in [plans]"),
                    )
                })?;
                if key.is_empty() {
                    return Err(PlansError::new(path, "a key must not be empty"));
                }
                keys.insert(key.clone(), plan.clone());
            }
        }
        Ok(Self {
            plans,
            default_plan,
            limits,
            exempt_keys,
            exempt_networks,
            keys,
        })
    }

    /// The plan every key gets when clients are keyed by address (`default_plan`, or the
    /// plan named `free`); `None` when the file names neither.
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml("default_plan = \"basic\"\n[plans.basic]\nlimits = [\"5/s\"]")?;
    /// assert_eq!(t.default_plan().unwrap().name(), "basic");
    /// # Ok::<(), bucket4rs_tower::PlansError>(())
    /// ```
    pub fn default_plan(&self) -> Option<&Plan> {
        self.default_plan.as_ref()
    }

    /// The further limits of the file (`[limits.NAME]`), in the file's order of names.
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml(r#"
    ///     [plans.free]
    ///     limits = ["20/minute"]
    ///     [limits.search]
    ///     path = "/books/search"
    ///     limits = ["100/minute"]
    /// "#)?;
    /// assert_eq!(t.limits()[0].name(), "search");
    /// # Ok::<(), bucket4rs_tower::PlansError>(())
    /// ```
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The file's plans, limits and allowlist on `builder`: its plans resolve the keys, its
    /// limits are added, its exempt keys and networks let through.
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml("[plans.free]\nlimits = [\"5/s\"]\n[exempt]\nkeys = [\"ops\"]")?;
    /// let layer = t.configure(bucket4rs_tower::RateLimitLayer::builder()).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configure(self, builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
        self.configure_with(builder, None)
    }

    /// As [`configure`](Self::configure), with every key resolved to `plan` (clients keyed
    /// by address: each gets the same plan).
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml("[plans.free]\nlimits = [\"5/s\"]")?;
    /// let free = t.default_plan().unwrap().clone();
    /// let layer = t.configure_with(bucket4rs_tower::RateLimitLayer::builder(), Some(free)).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configure_with(
        self,
        builder: RateLimitLayerBuilder,
        every_key: Option<Plan>,
    ) -> RateLimitLayerBuilder {
        let mut builder = builder
            .exempt_keys(self.exempt_keys.clone())
            .exempt_networks(self.exempt_networks.clone());
        for limit in self.limits.clone() {
            builder = builder.limit(limit);
        }
        match every_key {
            Some(plan) => builder.plans(plan),
            None => builder.plans(self),
        }
    }

    /// A plan by name.
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml("[plans.free]\nlimits = [\"5/s\"]")?;
    /// assert_eq!(t.plan("free").unwrap().min_capacity(), 5);
    /// # Ok::<(), bucket4rs_tower::PlansError>(())
    /// ```
    pub fn plan(&self, name: &str) -> Option<&Plan> {
        self.plans.get(name)
    }

    /// The plans, by name.
    ///
    /// ```
    /// let t = bucket4rs_tower::PlanTable::from_toml("[plans.a]\nlimits = [\"5/s\"]\n[plans.b]\nlimits = [\"9/s\"]")?;
    /// assert_eq!(t.plans().count(), 2);
    /// # Ok::<(), bucket4rs_tower::PlansError>(())
    /// ```
    pub fn plans(&self) -> impl Iterator<Item = (&str, &Plan)> {
        self.plans.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Assigns `key` to plan `plan` (e.g. keys from a database).
    ///
    /// # Errors
    /// When no plan has that name.
    ///
    /// ```
    /// let mut t = bucket4rs_tower::PlanTable::from_toml("[plans.a]\nlimits = [\"5/s\"]")?;
    /// t.assign("new-key", "a")?;
    /// assert!(t.assign("other", "zzz").is_err());
    /// # Ok::<(), bucket4rs_tower::PlansError>(())
    /// ```
    pub fn assign(&mut self, key: impl Into<String>, plan: &str) -> Result<(), PlansError> {
        let key = key.into();
        let p = self.plans.get(plan).ok_or_else(|| {
            PlansError::new(
                format!("keys.{key}"),
                format!("plan {plan:?} is not defined in [plans]"),
            )
        })?;
        self.keys.insert(key, p.clone());
        Ok(())
    }
}

/// The top-level fields of a plans file.
const ROOT_FIELDS: &[&str] = &["plans", "keys", "default_plan", "limits", "exempt"];

/// What a plan (or a further limit) of a plans file says besides its name.
struct Parsed {
    config: BucketConfiguration,
    shadow: bool,
    lease: Lease,
}

/// A plan (or a limit, whose `extra` fields the caller reads): its configuration, whether it
/// is in shadow mode, and how it leases.
fn parse_plan(v: &Value, path: &str, extra: &[&str]) -> Result<Parsed, PlansError> {
    let t = expect_table(v, path)?;
    for k in t.keys() {
        if !PLAN_FIELDS.contains(&k.as_str()) && !extra.contains(&k.as_str()) {
            let mut expected = PLAN_FIELDS.to_vec();
            expected.extend_from_slice(extra);
            return Err(PlansError::new(
                format!("{path}.{k}"),
                format!("unknown field (expected one of {})", expected.join(", ")),
            ));
        }
    }
    let shadow = match t.get("shadow") {
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            return Err(PlansError::new(
                format!("{path}.shadow"),
                format!("expected a boolean, found {}", type_name(other)),
            ));
        }
        None => false,
    };
    let limits_path = format!("{path}.limits");
    let limits = t
        .get("limits")
        .ok_or_else(|| PlansError::new(&limits_path, "missing: a plan needs at least one limit"))?;
    let Value::Array(limits) = limits else {
        return Err(PlansError::new(
            limits_path,
            format!("expected an array of limits, found {}", type_name(limits)),
        ));
    };
    if limits.is_empty() {
        return Err(PlansError::new(
            limits_path,
            "a plan needs at least one limit",
        ));
    }
    let mut bandwidths = Vec::with_capacity(limits.len());
    for (i, l) in limits.iter().enumerate() {
        bandwidths.push(parse_limit(l, &format!("{limits_path}[{i}]"))?);
    }
    let config = BucketConfiguration::new(bandwidths)
        .map_err(|e| PlansError::new(limits_path, e.to_string()))?;
    let lease = match t.get("lease") {
        Some(v) => parse_lease(v, &format!("{path}.lease"))?,
        None => Lease::default(),
    };
    Ok(Parsed {
        config,
        shadow,
        lease,
    })
}

/// The fields of a plan (a further limit has more).
const PLAN_FIELDS: &[&str] = &["limits", "shadow", "lease"];

/// The fields of a `lease` table.
#[cfg(feature = "distributed")]
const LEASE_FIELDS: &[&str] = &[
    "processes",
    "max_held_percent",
    "period",
    "lifetime",
    "idle",
];

/// A plan's `lease`: the settings (`None`: the plan leaves leasing to the store's manager)
/// and where the file gave them.
#[derive(Default)]
struct Lease {
    #[cfg(feature = "distributed")]
    settings: Option<bucket4rs_distributed::Leasing>,
    path: String,
}

/// What a plans file may make lease: a plan, a further limit.
trait Leasable: Sized {
    #[cfg(feature = "distributed")]
    fn leasing(
        self,
        leasing: bucket4rs_distributed::Leasing,
    ) -> Result<Self, bucket4rs_distributed::DistributedError>;
}

impl Leasable for Plan {
    #[cfg(feature = "distributed")]
    fn leasing(
        self,
        leasing: bucket4rs_distributed::Leasing,
    ) -> Result<Self, bucket4rs_distributed::DistributedError> {
        self.with_leasing(leasing)
    }
}

impl Leasable for Limit {
    #[cfg(feature = "distributed")]
    fn leasing(
        self,
        leasing: bucket4rs_distributed::Leasing,
    ) -> Result<Self, bucket4rs_distributed::DistributedError> {
        self.with_leasing(leasing)
    }
}

impl Lease {
    /// `to` leasing as the file says. The settings are checked here, by the distributed
    /// crate's own rules ([`Plan::with_leasing`]); a refusal names the field its reason
    /// names (`plans.hot.lease.period`), else the `lease` field.
    #[cfg(feature = "distributed")]
    fn apply<T: Leasable>(self, to: T) -> Result<T, PlansError> {
        let Some(settings) = self.settings else {
            return Ok(to);
        };
        to.leasing(settings).map_err(|e| match e {
            bucket4rs_distributed::DistributedError::InvalidSetting { reason, .. } => {
                let field = reason
                    .split_whitespace()
                    .next()
                    .filter(|w| LEASE_FIELDS.contains(w));
                let path = match field {
                    Some(f) => format!("{}.{f}", self.path),
                    None => self.path.clone(),
                };
                PlansError::new(path, reason)
            }
            e => PlansError::new(&self.path, e.to_string()),
        })
    }

    /// Without feature `distributed` a plans file has no leasing to give (see
    /// [`parse_lease`]).
    #[cfg(not(feature = "distributed"))]
    fn apply<T: Leasable>(self, to: T) -> Result<T, PlansError> {
        let _ = self.path;
        Ok(to)
    }
}

/// A `lease` field: `true` (the default settings), `false` (none: as the store's manager
/// says), or a table of `processes`, `max_held_percent`, `period`, `lifetime`, `idle`, each
/// at its default when left out.
#[cfg(feature = "distributed")]
fn parse_lease(v: &Value, path: &str) -> Result<Lease, PlansError> {
    use bucket4rs_distributed::Leasing;
    let field = |name: &str| format!("{path}.{name}");
    let settings = match v {
        Value::Boolean(on) => on.then(Leasing::new),
        Value::Table(t) => {
            let mut l = Leasing::new();
            for (k, v) in t {
                let at = field(k);
                let duration = |v: &Value| -> Result<Duration, PlansError> {
                    parse_duration(expect_str(v, &at)?).map_err(|m| PlansError::new(&at, m))
                };
                l = match k.as_str() {
                    "processes" => {
                        let n = expect_u64(v, &at)?;
                        l.processes(u32::try_from(n).map_err(|_| {
                            PlansError::new(&at, format!("{n} is too many (at most {})", u32::MAX))
                        })?)
                    }
                    // Above 255 is above 100 too: refused with the reason the check gives.
                    "max_held_percent" => {
                        l.max_held_percent(u8::try_from(expect_u64(v, &at)?).unwrap_or(u8::MAX))
                    }
                    "period" => l.period(duration(v)?),
                    "lifetime" => l.lifetime(duration(v)?),
                    "idle" => l.idle(duration(v)?),
                    _ => {
                        return Err(PlansError::new(
                            at,
                            format!(
                                "unknown field (expected one of {})",
                                LEASE_FIELDS.join(", ")
                            ),
                        ));
                    }
                };
            }
            Some(l)
        }
        other => {
            return Err(PlansError::new(
                path,
                format!(
                    "expected true, false or a table of lease settings, found {}",
                    type_name(other)
                ),
            ));
        }
    };
    Ok(Lease {
        settings,
        path: path.to_owned(),
    })
}

/// Without feature `distributed` there is no shared store to lease in and nothing to check
/// the settings against: `lease = false` is accepted, anything else refused.
#[cfg(not(feature = "distributed"))]
fn parse_lease(v: &Value, path: &str) -> Result<Lease, PlansError> {
    match v {
        Value::Boolean(false) => Ok(Lease {
            path: path.to_owned(),
        }),
        _ => Err(PlansError::new(
            path,
            "leasing needs the `distributed` feature of bucket4rs-tower (a shared store)",
        )),
    }
}

/// A further limit: `[limits.NAME]` with `limits`, optional `path` (a path prefix: a route
/// limit), `per` (`"all"`, the default: one bucket; `"client"`: a bucket per client),
/// `shadow` and `lease`.
fn parse_extra_limit(name: &str, v: &Value, path: &str) -> Result<Limit, PlansError> {
    let Parsed {
        config,
        shadow,
        lease,
    } = parse_plan(v, path, &["path", "per"])?;
    let t = expect_table(v, path)?;
    let mut limit = match t.get("per") {
        None => Limit::global(name, config),
        Some(p) => match expect_str(p, &format!("{path}.per"))? {
            "all" => Limit::global(name, config),
            "client" => Limit::per_client(name, config),
            other => {
                return Err(PlansError::new(
                    format!("{path}.per"),
                    format!("{other:?} is not \"all\" or \"client\""),
                ));
            }
        },
    };
    if let Some(p) = t.get("path") {
        let prefix = expect_str(p, &format!("{path}.path"))?;
        if !prefix.starts_with('/') {
            return Err(PlansError::new(
                format!("{path}.path"),
                format!("{prefix:?} is not a path (it starts with /)"),
            ));
        }
        limit = limit.path_prefix(prefix);
    }
    let limit = if shadow { limit.shadow() } else { limit };
    lease.apply(limit)
}

/// A network (`10.0.0.0/8`) or one address (`192.0.2.7`).
pub(crate) fn parse_network(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{s:?} is not a network (e.g. \"10.0.0.0/8\") or an address"))
}

const LIMIT_FIELDS: &[&str] = &[
    "id",
    "capacity",
    "refill",
    "period",
    "rate",
    "initial_tokens",
    "refill_kind",
];

fn parse_limit(v: &Value, path: &str) -> Result<Bandwidth, PlansError> {
    let field = |name: &str| format!("{path}.{name}");
    let (capacity, refill, period, mut builder);
    match v {
        Value::String(s) => {
            let (n, p) = parse_rate(s).map_err(|m| PlansError::new(path, m))?;
            (capacity, refill, period) = (n, n, p);
            builder = Bandwidth::builder();
        }
        Value::Table(t) => {
            for k in t.keys() {
                if !LIMIT_FIELDS.contains(&k.as_str()) {
                    return Err(PlansError::new(
                        field(k),
                        format!(
                            "unknown field (expected one of {})",
                            LIMIT_FIELDS.join(", ")
                        ),
                    ));
                }
            }
            builder = Bandwidth::builder();
            if let Some(rate) = t.get("rate") {
                for k in ["capacity", "refill", "period"] {
                    if t.contains_key(k) {
                        return Err(PlansError::new(
                            field(k),
                            "give either `rate` or `capacity`/`refill`/`period`, not both",
                        ));
                    }
                }
                let (n, p) = parse_rate(expect_str(rate, &field("rate"))?)
                    .map_err(|m| PlansError::new(field("rate"), m))?;
                (capacity, refill, period) = (n, n, p);
            } else {
                capacity = match t.get("capacity") {
                    Some(c) => expect_u64(c, &field("capacity"))?,
                    None => {
                        return Err(PlansError::new(
                            field("capacity"),
                            "missing (or give `rate`)",
                        ));
                    }
                };
                refill = match t.get("refill") {
                    Some(r) => expect_u64(r, &field("refill"))?,
                    None => capacity,
                };
                period = match t.get("period") {
                    Some(p) => {
                        let s = expect_str(p, &field("period"))?;
                        parse_duration(s).map_err(|m| PlansError::new(field("period"), m))?
                    }
                    None => return Err(PlansError::new(field("period"), "missing (e.g. \"1m\")")),
                };
            }
            if let Some(id) = t.get("id") {
                builder = builder.id(expect_str(id, &field("id"))?);
            }
            if let Some(n) = t.get("initial_tokens") {
                builder = builder.initial_tokens(expect_u64(n, &field("initial_tokens"))?);
            }
            if let Some(kind) = t.get("refill_kind") {
                match expect_str(kind, &field("refill_kind"))? {
                    "greedy" => {}
                    "intervally" => {
                        return builder
                            .capacity(capacity)
                            .refill_intervally(refill, period)
                            .build()
                            .map_err(|e| PlansError::new(path, e.to_string()));
                    }
                    other => {
                        return Err(PlansError::new(
                            field("refill_kind"),
                            format!(
                                "{other:?} is not a refill kind (expected \"greedy\" or \"intervally\")"
                            ),
                        ));
                    }
                }
            }
        }
        other => {
            return Err(PlansError::new(
                path,
                format!(
                    "expected a rate string like \"20 per minute\" or a table, found {}",
                    type_name(other)
                ),
            ));
        }
    }
    builder
        .capacity(capacity)
        .refill_greedy(refill, period)
        .build()
        .map_err(|e| PlansError::new(path, e.to_string()))
}

/// Parses a rate: `"20 per minute"`, `"20/min"`, `"5 per 10s"`; the count and the period.
///
/// # Errors
/// A message saying what is wrong.
pub(crate) fn parse_rate(s: &str) -> Result<(u64, Duration), String> {
    let bad = || format!("{s:?} is not a rate (expected e.g. \"20 per minute\" or \"20/1m\")");
    let (n, d) = s
        .split_once(" per ")
        .or_else(|| s.split_once('/'))
        .ok_or_else(bad)?;
    let n: u64 = n.trim().replace('_', "").parse().map_err(|_| bad())?;
    let d = parse_duration(d).map_err(|_| bad())?;
    Ok((n, d))
}

fn unit(word: &str) -> Option<Duration> {
    const S: u64 = 1;
    Some(match word {
        "ns" | "nanosecond" | "nanoseconds" => Duration::from_nanos(1),
        "us" | "µs" | "microsecond" | "microseconds" => Duration::from_micros(1),
        "ms" | "millisecond" | "milliseconds" | "millis" => Duration::from_millis(1),
        "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(S),
        "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(60),
        "h" | "hr" | "hrs" | "hour" | "hours" => Duration::from_secs(3_600),
        "d" | "day" | "days" => Duration::from_secs(86_400),
        "w" | "week" | "weeks" => Duration::from_secs(604_800),
        _ => return None,
    })
}

/// Parses a human duration: `"1m"`, `"90s"`, `"1h30m"`, `"2 hours"`, `"minute"`, `"500ms"`.
///
/// # Errors
/// `"<input>" is not a duration`, or a message for a zero or overflowing duration.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration");
    let text = s.trim().to_ascii_lowercase();
    if text.is_empty() {
        return Err(bad());
    }
    if let Some(u) = unit(&text) {
        return Ok(u);
    }
    let mut total = Duration::ZERO;
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u32 = rest[..digits].parse().map_err(|_| bad())?;
        rest = rest[digits..].trim_start();
        let word_len = rest
            .char_indices()
            .find(|(_, c)| !c.is_alphabetic())
            .map_or(rest.len(), |(i, _)| i);
        let u = unit(&rest[..word_len]).ok_or_else(bad)?;
        total = u
            .checked_mul(n)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(|| format!("{s:?} is too long"))?;
        rest = rest[word_len..].trim_start_matches([' ', ',']);
    }
    if total.is_zero() {
        return Err(format!("{s:?} is zero; a period must be positive"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_shadow_plans_exemptions_and_the_default_plan_are_read() {
        let t = PlanTable::from_toml(
            r#"
            default_plan = "basic"
            [plans.basic]
            limits = ["10 per minute"]
            [plans.trial]
            limits = ["5 per minute"]
            shadow = true
            [limits.search]
            path = "/books/search"
            per = "client"
            limits = ["3 per minute"]
            [limits.all]
            limits = ["1000 per second"]
            shadow = true
            [exempt]
            keys = ["ops-key"]
            networks = ["10.0.0.0/8", "2001:db8::1"]
            "#,
        )
        .unwrap();
        assert_eq!(t.default_plan().unwrap().name(), "basic");
        assert!(t.plan("trial").unwrap().is_shadow());
        assert!(!t.plan("basic").unwrap().is_shadow());
        let names: Vec<_> = t.limits().iter().map(Limit::name).collect();
        assert_eq!(names, ["all", "search"]);
        assert!(t.limits()[0].plan().is_shadow());
        assert_eq!(t.exempt_keys, ["ops-key"]);
        assert_eq!(t.exempt_networks.len(), 2);
        // `free` is the default plan unless the file names another; none without either.
        let t = PlanTable::from_toml("[plans.free]\nlimits = [\"1/s\"]").unwrap();
        assert_eq!(t.default_plan().unwrap().name(), "free");
        let t = PlanTable::from_toml("[plans.pro]\nlimits = [\"1/s\"]").unwrap();
        assert!(t.default_plan().is_none());
        for (text, path, says) in [
            (
                "default_plan = \"gold\"\n[plans.free]\nlimits = [\"1/s\"]",
                "default_plan",
                "not defined",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\nshadow = 1",
                "plans.free.shadow",
                "boolean",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[limits.x]\nlimits = [\"1/s\"]\nper = \"ip\"",
                "limits.x.per",
                "not",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[limits.x]\nlimits = [\"1/s\"]\npath = \"books\"",
                "limits.x.path",
                "not a path",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[limits.x]\nlimit = [\"1/s\"]",
                "limits.x.limit",
                "unknown field",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[exempt]\nnetworks = [\"10.0.0.0/33\"]",
                "exempt.networks[0]",
                "not a network",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[exempt]\nhosts = []",
                "exempt.hosts",
                "unknown field",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[routes]",
                "routes",
                "unknown field",
            ),
        ] {
            let e = PlanTable::from_toml(text).unwrap_err();
            assert_eq!(e.path(), path, "{text}: {e}");
            assert!(e.message().contains(says), "{text}: {e}");
        }
    }

    #[cfg(feature = "distributed")]
    #[test]
    fn plans_and_limits_lease_as_the_file_says_and_bad_settings_name_their_field() {
        use bucket4rs_distributed::Leasing;
        let t = PlanTable::from_toml(
            r#"
            [plans.free]
            limits = ["20 per minute"]
            [plans.pro]
            limits = ["200 per minute"]
            lease = true
            [plans.partner]
            limits = ["1000 per second"]
            lease = { processes = 4, max_held_percent = 20, period = "50 ms", lifetime = "2s", idle = "100ms" }
            [plans.trial]
            limits = ["1000 per second"]
            lease = { processes = 3 }
            shadow = true
            [plans.plain]
            limits = ["5/s"]
            lease = false
            [limits.all]
            limits = ["10000 per second"]
            lease = true
            "#,
        )
        .unwrap();
        let lease = |name: &str| t.plan(name).unwrap().leasing();
        assert_eq!(lease("free"), None);
        assert_eq!(lease("plain"), None);
        assert_eq!(lease("pro"), Some(Leasing::new()));
        assert_eq!(
            lease("partner"),
            Some(
                Leasing::new()
                    .processes(4)
                    .max_held_percent(20)
                    .period(Duration::from_millis(50))
                    .lifetime(Duration::from_secs(2))
                    .idle(Duration::from_millis(100))
            )
        );
        assert_eq!(lease("trial"), Some(Leasing::new().processes(3)));
        assert!(t.plan("trial").unwrap().is_shadow());
        assert_eq!(t.limits()[0].plan().leasing(), Some(Leasing::new()));
        let plan = |lease: &str| format!("[plans.hot]\nlimits = [\"5/s\"]\nlease = {lease}");
        for (text, path, says) in [
            (plan("1"), "plans.hot.lease", "expected true, false or a table"),
            (plan("{ processes = 0 }"), "plans.hot.lease.processes", "at least 1"),
            (plan("{ processes = -1 }"), "plans.hot.lease.processes", "negative"),
            (plan("{ processes = 5000000000 }"), "plans.hot.lease.processes", "too many"),
            (plan("{ max_held_percent = 0 }"), "plans.hot.lease.max_held_percent", "from 1 to 100"),
            (plan("{ max_held_percent = 101 }"), "plans.hot.lease.max_held_percent", "from 1 to 100"),
            (plan("{ max_held_percent = 256 }"), "plans.hot.lease.max_held_percent", "from 1 to 100"),
            (plan("{ lifetime = \"31s\" }"), "plans.hot.lease.lifetime", "at most 30 s"),
            (plan("{ period = \"2s\" }"), "plans.hot.lease.period", "at most the lifetime"),
            (plan("{ period = \"0s\" }"), "plans.hot.lease.period", "zero"),
            (plan("{ idle = \"soon\" }"), "plans.hot.lease.idle", "not a duration"),
            (plan("{ idle = 5 }"), "plans.hot.lease.idle", "expected a string"),
            (plan("{ processess = 2 }"), "plans.hot.lease.processess", "unknown field"),
            (
                "[plans.free]\nlimits = [\"1/s\"]\n[limits.all]\nlimits = [\"1/s\"]\nlease = { lifetime = \"1 minute\" }".to_owned(),
                "limits.all.lease.lifetime",
                "at most 30 s",
            ),
            (
                "[plans.free]\nlimits = [\"1/s\"]\nleasing = true".to_owned(),
                "plans.free.leasing",
                "expected one of limits, shadow, lease",
            ),
        ] {
            let e = PlanTable::from_toml(&text).unwrap_err();
            assert_eq!(e.path(), path, "{text}: {e}");
            assert!(e.message().contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn rates_and_durations_parse_in_human_forms() {
        assert_eq!(
            parse_rate("20 per minute"),
            Ok((20, Duration::from_secs(60)))
        );
        assert_eq!(
            parse_rate("1000/day"),
            Ok((1000, Duration::from_secs(86_400)))
        );
        assert_eq!(
            parse_rate("1_000 per 10s"),
            Ok((1000, Duration::from_secs(10)))
        );
        assert!(parse_rate("lots per minute").is_err());
        assert!(parse_rate("20 minutes").is_err());
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("minute"), Ok(Duration::from_secs(60)));
        assert_eq!(
            parse_duration("2 hours, 5 s"),
            Ok(Duration::from_secs(7205))
        );
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_duration("1 fortnight"),
            Err(r#""1 fortnight" is not a duration"#.to_owned())
        );
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999 weeks").is_err());
    }
}
