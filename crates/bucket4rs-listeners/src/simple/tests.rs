use super::*;

#[test]
fn totals_saturate_instead_of_wrapping() {
    let l = SimpleBucketListener::new();
    l.on_consumed(u64::MAX - 1);
    l.on_consumed(5);
    assert_eq!(l.consumed(), u64::MAX);
    l.on_rejected(u64::MAX);
    l.on_rejected(1);
    assert_eq!(l.rejected(), u64::MAX);
}

#[test]
fn each_event_has_its_own_total() {
    let l = SimpleBucketListener::default();
    l.on_consumed(1);
    l.on_rejected(2);
    l.on_delayed(3);
    l.on_before_parking(4);
    l.on_parked(5);
    l.on_interrupted();
    l.on_interrupted();
    assert_eq!(
        (
            l.consumed(),
            l.rejected(),
            l.delayed_nanos(),
            l.before_parking_nanos(),
            l.parked_nanos(),
            l.interrupted()
        ),
        (1, 2, 3, 4, 5, 2)
    );
}

#[test]
fn concurrent_updates_are_not_lost() {
    let l = SimpleBucketListener::new();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    l.on_consumed(3);
                }
            });
        }
    });
    assert_eq!(l.consumed(), 120_000);
}
