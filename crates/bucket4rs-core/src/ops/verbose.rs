//! [`Verbose`]: any operation, also returning the state after it.

use super::{Mutation, Operation, Planning, Refilled, Single};
use crate::config::Bandwidth;
use crate::error::OperationError;
use crate::listener::BucketListener;
use crate::state::BandwidthState;

/// Runs an operation and also returns every bandwidth's state after it (refilled to `now`):
/// the basis of verbose results and diagnostics.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{TryConsume, Verbose}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// let (consumed, after) = state.apply(&config, 0, &Verbose(TryConsume(3)))?;
/// assert!(consumed);
/// assert_eq!(after.bandwidths()[0].tokens(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verbose<O>(pub O);

impl<O: Operation> Operation for Verbose<O> {
    type Output = (O::Output, crate::BucketState);
    fn notify<L: BucketListener + ?Sized>(&self, output: &Self::Output, listener: &L) {
        self.0.notify(&output.0, listener);
    }
}

impl<O: Operation> Planning<(O::Output, crate::BucketState)> for Verbose<O> {
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<((O::Output, crate::BucketState), Option<Mutation>), OperationError> {
        let (out, mutation) = self.0.plan(view)?;
        let after = view
            .config
            .bandwidths()
            .iter()
            .enumerate()
            .map(|(i, b)| match mutation {
                Some(m) => m.apply(b, view.get(i)),
                None => view.get(i),
            })
            .collect::<crate::state::Bandwidths>();
        let after = crate::BucketState::from_inline(after);
        Ok(((out, after), mutation))
    }
    const HAS_SINGLE: bool = O::HAS_SINGLE;
    /// The wrapped operation's one-bandwidth shortcut, and the state it leaves (`s`, refilled
    /// to `now`, when it changes nothing): what `plan` answers.
    #[inline]
    fn plan_single(
        &self,
        b: &Bandwidth,
        s: BandwidthState,
        now: i64,
    ) -> Option<Single<(O::Output, crate::BucketState)>> {
        let single = self.0.plan_single(b, s, now)?;
        Some(single.map(|(out, new)| {
            let after =
                crate::BucketState::from_inline(core::iter::once(new.unwrap_or(s)).collect());
            ((out, after), new)
        }))
    }
}
