//! The operations that add, reset or read tokens without consuming them.

use super::{Mutation, Operation, Planning, Refilled, Single, check_tokens};
use crate::config::Bandwidth;
use crate::error::OperationError;
use crate::state::BandwidthState;

/// Add tokens, never above capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{AddTokens, TryConsume}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &TryConsume(5))?;
/// state.apply(&config, 0, &AddTokens(2))?;
/// assert_eq!(state.available_tokens(&config, 0), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddTokens(pub u64);

impl Operation for AddTokens {
    type Output = ();
}

impl Planning<()> for AddTokens {
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::AddTokens(check_tokens(self.0)?))))
    }
}

/// Add tokens, even above capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::ForceAddTokens};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &ForceAddTokens(2))?;
/// assert_eq!(state.available_tokens(&config, 0), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForceAddTokens(pub u64);

impl Operation for ForceAddTokens {
    type Output = ();
}

impl Planning<()> for ForceAddTokens {
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::ForceAddTokens(check_tokens(self.0)?))))
    }
}

/// Set every bandwidth to its capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{Reset, TryConsume}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &TryConsume(5))?;
/// state.apply(&config, 0, &Reset)?;
/// assert_eq!(state.available_tokens(&config, 0), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset;

impl Operation for Reset {
    type Output = ();
}

impl Planning<()> for Reset {
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::Reset)))
    }
}

/// The balance after refill (may be negative). Never fails.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::AvailableTokens};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &AvailableTokens)?, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvailableTokens;

impl Operation for AvailableTokens {
    type Output = i64;
}

impl Planning<i64> for AvailableTokens {
    const HAS_SINGLE: bool = true;
    #[inline]
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(i64, Option<Mutation>), OperationError> {
        Ok((view.available(), None))
    }
    #[inline]
    fn plan_single(&self, _b: &Bandwidth, s: BandwidthState, _now: i64) -> Option<Single<i64>> {
        Some(Ok((s.tokens, None)))
    }
}
