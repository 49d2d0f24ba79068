//! The listener trait: what a bucket tells observers about consumption.

/// Observes consumption. Every method has a no-op default, so an implementation overrides only
/// what it needs. Only consuming operations notify: estimates, `available_tokens`, adding
/// tokens and resets stay silent.
///
/// Buckets call listeners *after* their state change is committed, so a listener that panics
/// cannot corrupt a bucket.
///
/// ```
/// use bucket4rs_core::BucketListener;
/// use core::sync::atomic::{AtomicU64, Ordering};
///
/// #[derive(Default)]
/// struct Rejections(AtomicU64);
/// impl BucketListener for Rejections {
///     fn on_rejected(&self, tokens: u64) {
///         self.0.fetch_add(tokens, Ordering::Relaxed);
///     }
/// }
/// let l = Rejections::default();
/// l.on_rejected(3);
/// l.on_consumed(5); // default: ignored
/// assert_eq!(l.0.load(Ordering::Relaxed), 3);
/// ```
///
/// # Composing listeners
/// A tuple of two or three listeners is a listener that notifies each member in order, the
/// first member first; members may be references or `Arc`s. (Bucket4j's `toListenable`
/// *replaces* a bucket's listener; a tuple *adds* one.) If a member panics, the members after
/// it are not notified, but the bucket's state change is already committed.
///
/// ```
/// use bucket4rs_core::{BucketListener, NoopListener};
/// use core::sync::atomic::{AtomicU64, Ordering};
///
/// #[derive(Default)]
/// struct Consumed(AtomicU64);
/// impl BucketListener for Consumed {
///     fn on_consumed(&self, tokens: u64) {
///         self.0.fetch_add(tokens, Ordering::Relaxed);
///     }
/// }
/// let (a, b) = (Consumed::default(), Consumed::default());
/// let both = (&a, &b);
/// both.on_consumed(2);
/// (&a, NoopListener, &b).on_consumed(3);
/// assert_eq!((a.0.into_inner(), b.0.into_inner()), (5, 5));
/// ```
pub trait BucketListener {
    /// `tokens` were consumed.
    fn on_consumed(&self, _tokens: u64) {}
    /// A request for `tokens` was rejected.
    fn on_rejected(&self, _tokens: u64) {}
    /// A non-blocking reservation (async) must wait `nanos` before its tokens are paid for.
    fn on_delayed(&self, _nanos: u64) {}
    /// A blocking caller is about to park for `nanos`.
    fn on_before_parking(&self, _nanos: u64) {}
    /// A blocking caller parked for `nanos`.
    fn on_parked(&self, _nanos: u64) {}
    /// A wait was interrupted or cancelled.
    fn on_interrupted(&self) {}
}

impl<L: BucketListener + ?Sized> BucketListener for &L {
    fn on_consumed(&self, tokens: u64) {
        (**self).on_consumed(tokens)
    }
    fn on_rejected(&self, tokens: u64) {
        (**self).on_rejected(tokens)
    }
    fn on_delayed(&self, nanos: u64) {
        (**self).on_delayed(nanos)
    }
    fn on_before_parking(&self, nanos: u64) {
        (**self).on_before_parking(nanos)
    }
    fn on_parked(&self, nanos: u64) {
        (**self).on_parked(nanos)
    }
    fn on_interrupted(&self) {
        (**self).on_interrupted()
    }
}

impl<L: BucketListener + ?Sized> BucketListener for alloc::sync::Arc<L> {
    fn on_consumed(&self, tokens: u64) {
        (**self).on_consumed(tokens)
    }
    fn on_rejected(&self, tokens: u64) {
        (**self).on_rejected(tokens)
    }
    fn on_delayed(&self, nanos: u64) {
        (**self).on_delayed(nanos)
    }
    fn on_before_parking(&self, nanos: u64) {
        (**self).on_before_parking(nanos)
    }
    fn on_parked(&self, nanos: u64) {
        (**self).on_parked(nanos)
    }
    fn on_interrupted(&self) {
        (**self).on_interrupted()
    }
}

/// The listener that does nothing; buckets use it by default and it compiles away.
///
/// ```
/// use bucket4rs_core::{BucketListener, NoopListener};
/// NoopListener.on_consumed(1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NoopListener;

impl BucketListener for NoopListener {}

/// Implements [`BucketListener`] for a tuple: every event goes to each member, in order.
macro_rules! tuple_listener {
    ($($name:ident . $idx:tt),+) => {
        impl<$($name: BucketListener),+> BucketListener for ($($name,)+) {
            fn on_consumed(&self, tokens: u64) {
                $(self.$idx.on_consumed(tokens);)+
            }
            fn on_rejected(&self, tokens: u64) {
                $(self.$idx.on_rejected(tokens);)+
            }
            fn on_delayed(&self, nanos: u64) {
                $(self.$idx.on_delayed(nanos);)+
            }
            fn on_before_parking(&self, nanos: u64) {
                $(self.$idx.on_before_parking(nanos);)+
            }
            fn on_parked(&self, nanos: u64) {
                $(self.$idx.on_parked(nanos);)+
            }
            fn on_interrupted(&self) {
                $(self.$idx.on_interrupted();)+
            }
        }
    };
}

// Composition: see "Composing listeners" on the trait.
tuple_listener!(A.0, B.1);
tuple_listener!(A.0, B.1, C.2);
