//! Unit tests of the keyed map: its memory per entry, the work of the key cap, forgetting with
//! a second chance, and (under `--cfg bucket4rs_loom`) the loom model of its protocol.

#[cfg(not(bucket4rs_loom))]
#[test]
fn an_entry_is_sixteen_bytes() {
    // A key's whole bucket beside its key in the map: the memory figure per key rests on it.
    assert_eq!(core::mem::size_of::<super::Entry>(), 16);
}
