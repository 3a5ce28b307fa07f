//! The checker on hand-made histories: ones that are linearizable pass, and each kind
//! of violation the store could commit is caught (so the test against the binary can
//! fail).

use std::time::Duration;

use super::check_history;
use super::model::{Cond, Op, Ret};
use super::wgl::Operation;

const BUDGET: Duration = Duration::from_secs(10);
const NEVER: u64 = u64::MAX;

/// Client `c` ran `op` on key `k` from `call` to `ret` (`None`: never answered).
fn op(
    c: usize,
    k: usize,
    call: u64,
    ret: Option<(u64, Ret)>,
    op: Op,
) -> Operation<(usize, Op), Ret> {
    Operation {
        client: c,
        call,
        ret,
        op: (k, op),
    }
}

fn set(value: u8) -> Op {
    Op::Set {
        value,
        cond: Cond::Always,
        ft: None,
    }
}

fn set_with(value: u8, cond: Cond, ft: Option<u8>) -> Op {
    Op::Set { value, cond, ft }
}

fn ok(ops: &[Operation<(usize, Op), Ret>]) -> bool {
    check_history(ops, NEVER, BUDGET).is_ok()
}

#[test]
fn a_write_then_its_read() {
    assert!(ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(1, 0, 20, Some((30, Ret::Value(1, (5, 0)))), Op::Get),
    ]));
}

#[test]
fn a_stale_read_is_caught() {
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(1, 0, 20, Some((30, Ret::Nil)), Op::Get),
    ]));
    // Overlapping the write, either answer is fine.
    for ret in [Ret::Nil, Ret::Value(1, (5, 0))] {
        assert!(ok(&[
            op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
            op(1, 0, 5, Some((30, ret)), Op::Get),
        ]));
    }
}

#[test]
fn reads_that_go_back_in_time_are_caught() {
    let writes = [
        op(0, 0, 0, Some((100, Ret::Ok((5, 0)))), set(1)),
        op(1, 0, 0, Some((100, Ret::Ok((6, 0)))), set(2)),
    ];
    let mut h = writes.to_vec();
    h.push(op(2, 0, 110, Some((120, Ret::Value(2, (6, 0)))), Op::Get));
    h.push(op(2, 0, 130, Some((140, Ret::Value(1, (5, 0)))), Op::Get));
    assert!(!ok(&h));
    // A read during the writes may see the first one, then the last one wins.
    let mut h = writes.to_vec();
    h.push(op(2, 0, 50, Some((120, Ret::Value(1, (5, 0)))), Op::Get));
    h.push(op(2, 0, 130, Some((140, Ret::Value(2, (6, 0)))), Op::Get));
    assert!(ok(&h));
}

#[test]
fn a_wrong_version_is_caught() {
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(1, 0, 20, Some((30, Ret::Value(1, (4, 0)))), Op::Get),
    ]));
    assert!(
        !ok(&[
            op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
            op(0, 0, 20, Some((30, Ret::Ok((5, 0)))), set(2)),
        ]),
        "a version that does not grow"
    );
}

#[test]
fn two_nx_winners_are_caught() {
    let nx = |v| set_with(v, Cond::Nx, None);
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), nx(1)),
        op(1, 0, 0, Some((10, Ret::Ok((6, 0)))), nx(2)),
    ]));
    assert!(ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), nx(1)),
        op(1, 0, 0, Some((10, Ret::NotSet((5, 0)))), nx(2)),
    ]));
}

#[test]
fn nex_renews_only_its_own_value() {
    let nex = |v| set_with(v, Cond::Nex, None);
    assert!(ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), nex(1)),
        op(0, 0, 20, Some((30, Ret::Ok((6, 0)))), nex(1)),
        op(1, 0, 40, Some((50, Ret::NotSet((6, 0)))), nex(2)),
    ]));
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), nex(1)),
        op(1, 0, 20, Some((30, Ret::Ok((6, 0)))), nex(2)),
    ]));
}

#[test]
fn fencing_violations_are_caught() {
    let fenced = op(
        0,
        0,
        0,
        Some((10, Ret::Ok((5, 0)))),
        set_with(1, Cond::Always, Some(2)),
    );
    assert!(!ok(&[
        fenced.clone(),
        op(
            1,
            0,
            20,
            Some((30, Ret::Ok((6, 0)))),
            set_with(2, Cond::Always, Some(1))
        ),
    ]));
    assert!(ok(&[
        fenced.clone(),
        op(
            1,
            0,
            20,
            Some((30, Ret::FenceLower)),
            set_with(2, Cond::Always, Some(1))
        ),
        op(
            1,
            0,
            40,
            Some((50, Ret::FenceRequired)),
            Op::Del { ft: None }
        ),
        op(
            1,
            0,
            60,
            Some((70, Ret::Deleted((7, 0)))),
            Op::Del { ft: Some(2) }
        ),
        op(1, 0, 80, Some((90, Ret::Ok((8, 0)))), set(3)),
    ]));
    assert!(!ok(&[
        fenced,
        op(
            1,
            0,
            40,
            Some((50, Ret::Deleted((6, 0)))),
            Op::Del { ft: None }
        ),
    ]));
}

#[test]
fn vdel_compares_the_value() {
    assert!(ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(
            1,
            0,
            20,
            Some((30, Ret::Mismatch((5, 0)))),
            Op::VDel { value: 2, ft: None }
        ),
        op(
            1,
            0,
            40,
            Some((50, Ret::Deleted((6, 0)))),
            Op::VDel { value: 1, ft: None }
        ),
        op(1, 0, 60, Some((70, Ret::Absent)), Op::Del { ft: None }),
    ]));
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(
            1,
            0,
            20,
            Some((30, Ret::Deleted((6, 0)))),
            Op::VDel { value: 2, ft: None }
        ),
    ]));
}

#[test]
fn versions_across_keys_follow_real_time() {
    assert!(!ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(1, 1, 20, Some((30, Ret::Ok((3, 0)))), set(1)),
    ]));
    assert!(ok(&[
        op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
        op(1, 1, 5, Some((30, Ret::Ok((3, 0)))), set(1)),
    ]));
    assert!(
        !ok(&[
            op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1)),
            op(1, 1, 0, Some((30, Ret::Ok((5, 0)))), set(1)),
        ]),
        "one version issued twice"
    );
}

#[test]
fn a_crash_loses_only_what_was_in_flight() {
    let kill = 100;
    let check = |h: &[Operation<(usize, Op), Ret>]| check_history(h, kill, BUDGET).is_ok();
    let acked = op(0, 0, 0, Some((10, Ret::Ok((5, 0)))), set(1));
    let in_flight = op(1, 0, 50, None, set(2));
    // After the restart the in-flight write may be there (with a version nobody saw)...
    assert!(check(&[
        acked.clone(),
        in_flight.clone(),
        op(2, 0, 200, Some((210, Ret::Value(2, (9, 0)))), Op::Get),
        op(2, 0, 220, Some((230, Ret::Value(2, (9, 0)))), Op::Get),
    ]));
    // ...or not,
    assert!(check(&[
        acked.clone(),
        in_flight.clone(),
        op(2, 0, 200, Some((210, Ret::Value(1, (5, 0)))), Op::Get),
    ]));
    // but not come and go,
    assert!(!check(&[
        acked.clone(),
        in_flight.clone(),
        op(2, 0, 200, Some((210, Ret::Value(2, (9, 0)))), Op::Get),
        op(2, 0, 220, Some((230, Ret::Value(1, (5, 0)))), Op::Get),
    ]));
    // nor show a version it cannot have (not above the acknowledged one),
    assert!(!check(&[
        acked.clone(),
        in_flight,
        op(2, 0, 200, Some((210, Ret::Value(2, (4, 0)))), Op::Get),
    ]));
    // and an acknowledged write is never lost.
    assert!(!check(&[
        acked,
        op(2, 0, 200, Some((210, Ret::Nil)), Op::Get),
    ]));
}
