//! The configurations whose keys run on the compact word, interned: an entry names its plan by
//! index (four bytes beside its word), and every key of a plan shares one copy of it.

use std::collections::HashMap;

use bucket4rs_core::forms::{CompactForm, ScaledState};
use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState};

use crate::primitive::Mutex;

/// The most plans interned; keys of further configurations run on a synchronized bucket of
/// their own (still exact, one more allocation per key), so a source that returns a new
/// configuration per key cannot grow the table without bound.
const MAX_PLANS: usize = 1024;

/// How many of the first plans are compared by identity before the table is searched: a
/// source of a few plans (a configuration per tier) is found without a lock.
const BY_IDENTITY: usize = 8;

/// How long compact values counted from reading 0 must keep fitting `i64` for a plan to count
/// from 0 (then a try_consume needs no subtraction); otherwise it counts from its first use.
const HORIZON: i64 = 10 * 366 * 24 * 3_600 * 1_000_000_000;

/// Whether a full state of `b` encodes in `form` at reading `from` and still does `HORIZON`
/// later (values grow with the readings).
fn lasts(form: &CompactForm, b: &Bandwidth, from: i64) -> bool {
    let capacity = i64::try_from(b.capacity()).unwrap_or(i64::MAX);
    let full = |t: i64| {
        ScaledState::from_state(b, BandwidthState::from_parts(t, capacity, 0))
            .and_then(|s| form.encode(s))
    };
    full(from).is_some() && from.checked_add(HORIZON).and_then(full).is_some()
}

/// A configuration whose keys run on the compact word.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) config: BucketConfiguration,
    pub(crate) form: CompactForm,
    /// A fresh bucket is full (initial tokens at capacity): a full key may be forgotten.
    pub(crate) fresh_is_full: bool,
}

impl Plan {
    /// The plan of `config` if its keys can run on the compact word, counting from `base`
    /// (for `rate > 1`, the reading of the plan's first use, so values fit for centuries).
    fn of(config: &BucketConfiguration, base: i64) -> Option<Self> {
        let [b] = config.bandwidths() else {
            return None;
        };
        let form = CompactForm::new(b, 0)
            .filter(|f| lasts(f, b, base))
            .or_else(|| CompactForm::new(b, base))?;
        let fresh = BucketState::new(config, base);
        Some(Self {
            config: config.clone(),
            form,
            fresh_is_full: fresh.forgettable_at(config, base) == Some(base),
        })
    }
}

/// The interned plans: an append-only table, searched by identity first. The table is
/// boxcar's (a plan is pushed once, under the index lock, and never moved or removed, so a
/// reference to it lives as long as the table); it stays outside the loom models, which see
/// the index lock through `primitive`.
#[derive(Debug, Default)]
pub(crate) struct Plans {
    table: boxcar::Vec<Plan>,
    /// Configuration to index, for the search past the first plans; the lock also makes
    /// interning one configuration twice impossible.
    index: Mutex<HashMap<BucketConfiguration, u32>>,
}

impl Plans {
    /// Plan `i`.
    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&Plan> {
        self.table.get(i as usize)
    }

    /// The index of `config`'s plan, interning it at reading `now` if it is new; `None` when
    /// its keys cannot run on the compact word or the table is full.
    pub(crate) fn intern(&self, config: &BucketConfiguration, now: i64) -> Option<u32> {
        for (i, plan) in self.table.iter().take(BY_IDENTITY) {
            if core::ptr::eq(plan.config.bandwidths(), config.bandwidths()) {
                return u32::try_from(i).ok();
            }
        }
        self.index.with(|index| {
            if let Some(&i) = index.get(config) {
                return Some(i);
            }
            if self.table.count() >= MAX_PLANS {
                return None;
            }
            let plan = Plan::of(config, now)?;
            let i = u32::try_from(self.table.push(plan)).ok()?;
            index.insert(config.clone(), i);
            Some(i)
        })
    }
}
