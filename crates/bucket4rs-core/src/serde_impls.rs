//! Serde support for configurations: deserialized values go through the same validation as the
//! builders, so a stored configuration can never bypass a rule.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{Bandwidth, BucketConfiguration, RefillKind};

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
enum RefillRepr {
    Greedy {
        tokens: u64,
        period_nanos: u64,
    },
    Intervally {
        tokens: u64,
        period_nanos: u64,
    },
    IntervallyAligned {
        tokens: u64,
        period_nanos: u64,
        time_of_first_refill_nanos: u64,
        #[serde(default)]
        adaptive_initial_tokens: bool,
    },
}

#[derive(Serialize, Deserialize)]
struct BandwidthRepr {
    capacity: u64,
    refill: RefillRepr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    initial_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
}

impl Serialize for Bandwidth {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (tokens, period_nanos) = (self.refill_tokens as u64, self.refill_period as u64);
        let refill = match self.kind {
            RefillKind::Greedy => RefillRepr::Greedy {
                tokens,
                period_nanos,
            },
            RefillKind::Intervally => RefillRepr::Intervally {
                tokens,
                period_nanos,
            },
            RefillKind::IntervallyAligned {
                first_refill_nanos,
                adaptive_initial_tokens,
            } => RefillRepr::IntervallyAligned {
                tokens,
                period_nanos,
                time_of_first_refill_nanos: first_refill_nanos as u64,
                adaptive_initial_tokens,
            },
        };
        BandwidthRepr {
            capacity: self.capacity as u64,
            refill,
            initial_tokens: self.initial_tokens.map(|t| t as u64),
            id: self.id.as_deref().map(String::from),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let r = BandwidthRepr::deserialize(deserializer)?;
        let mut b = Bandwidth::builder().capacity(r.capacity);
        b = match r.refill {
            RefillRepr::Greedy {
                tokens,
                period_nanos,
            } => b.refill_greedy(tokens, Duration::from_nanos(period_nanos)),
            RefillRepr::Intervally {
                tokens,
                period_nanos,
            } => b.refill_intervally(tokens, Duration::from_nanos(period_nanos)),
            RefillRepr::IntervallyAligned {
                tokens,
                period_nanos,
                time_of_first_refill_nanos,
                adaptive_initial_tokens,
            } => {
                let (p, f) = (
                    Duration::from_nanos(period_nanos),
                    Duration::from_nanos(time_of_first_refill_nanos),
                );
                if adaptive_initial_tokens {
                    b.refill_intervally_aligned_adaptive(tokens, p, f)
                } else {
                    b.refill_intervally_aligned(tokens, p, f)
                }
            }
        };
        if let Some(t) = r.initial_tokens {
            b = b.initial_tokens(t);
        }
        if let Some(id) = r.id {
            b = b.id(Arc::<str>::from(id));
        }
        b.build().map_err(serde::de::Error::custom)
    }
}

impl Serialize for BucketConfiguration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.bandwidths())
    }
}

impl<'de> Deserialize<'de> for BucketConfiguration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bandwidths = Vec::<Bandwidth>::deserialize(deserializer)?;
        BucketConfiguration::new(bandwidths).map_err(serde::de::Error::custom)
    }
}
