//! Damage that recovery refuses, and the repair that gets the directory back: the
//! issue's flipped bit under `--sync always`, the same question under `--sync
//! interval`, and repairs across segments and snapshot blocks.

use super::*;

/// Every file of `dir` but the lock, with its bytes.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "LOCK") {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The keys of every batch but those in `lost`, in key order.
fn keys_but(batches: usize, lost: &[usize]) -> Vec<Vec<u8>> {
    (0..batches)
        .filter(|b| !lost.contains(b))
        .flat_map(|b| (0..PER_BATCH).map(move |i| key(b, i)))
        .collect()
}

fn stored_keys(dir: &Path) -> Vec<Vec<u8>> {
    let store = Store::open(dir, Options::default()).unwrap();
    let t = store.table("t").unwrap();
    let keys = t.iter().map(|r| r.unwrap().key().to_vec()).collect();
    store.close().unwrap();
    keys
}

/// The case: batches acknowledged under `--sync always`, one byte flipped 10%
/// into the newest segment, in a batch with whole batches after it. Each of those was
/// written after the damaged one had been synced, so this is damage to data that was on
/// disk, not a torn write: the store refuses to open, names the file and the byte, and
/// changes nothing. The repair then keeps every batch but the damaged one and says which.
#[test]
fn under_sync_always_damage_followed_by_whole_batches_is_refused_then_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let always = Options::default();
    fill_with(dir.path(), 0..200, 100, always.clone());
    let (header, record) = record_layout();
    let segment = last_segment(dir.path());
    let damaged = 20; // 10% in
    let at = header + damaged * record + 30;
    flip(&segment, at);
    let before = contents(dir.path());
    let err = Store::open(dir.path(), always.clone())
        .unwrap_err()
        .to_string();
    let record_at = header + damaged * record;
    assert!(
        err.contains("damaged")
            && err.contains(&segment.display().to_string())
            && err.contains(&format!("at byte {record_at}"))
            && err.contains("statehub repair"),
        "{err}"
    );
    assert!(
        contents(dir.path()) == before,
        "a refused directory was changed"
    );
    // A dry run says what a repair would lose and changes nothing.
    let dry = repair(dir.path(), true).unwrap();
    assert_eq!(dry.losses.len(), 1, "{dry}");
    assert_eq!(
        dry.losses[0].batches,
        Some((damaged + 1, damaged + 1)),
        "{dry}"
    );
    assert!(
        contents(dir.path()) == before,
        "a dry run changed the directory"
    );
    let report = repair(dir.path(), false).unwrap();
    assert_eq!(report.batches, 199, "{report}");
    assert_eq!(report.losses, dry.losses, "{report}");
    assert_eq!(
        report.losses[0].bytes,
        record_at..record_at + record,
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains(&format!("batch {}", damaged + 1)), "{text}");
    let aside = report.moved_to.clone().unwrap();
    assert!(aside
        .join("journal")
        .join(segment.file_name().unwrap())
        .exists());
    assert_eq!(stored_keys(dir.path()), keys_but(200, &[damaged as usize]));
    // Repaired: it opens, writes on, and a second repair finds nothing.
    fill_with(dir.path(), 200..210, 100, always);
    assert_eq!(stored_keys(dir.path()), keys_but(210, &[damaged as usize]));
    let again = repair(dir.path(), false).unwrap();
    assert!(again.losses.is_empty() && !again.changed, "{again}");
}

/// Under `--sync interval`, what was written after the last sync may be torn by a power
/// cut, whatever follows it; what was synced before a later write was made may not. A
/// flip in the part a reopen synced (the first run's batches, followed by the second
/// run's, whose first write was made after that sync) is refused; a flip among the
/// second run's batches, none of them synced before the next was written, is a torn
/// tail: the store keeps the batches before it and sets the rest aside.
#[test]
fn under_sync_interval_only_unsynced_damage_is_a_torn_tail() {
    let source = tempfile::tempdir().unwrap();
    let interval = options();
    fill_with(source.path(), 0..50, 100, interval.clone());
    fill_with(source.path(), 50..100, 100, interval);
    let (header, record) = record_layout();
    let cases = [(10, "refused"), (80, "torn")];
    for (damaged, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        flip(&last_segment(dir.path()), header + damaged * record + 30);
        match outcome(dir.path(), 100) {
            Outcome::Refused(e) => assert_eq!(expected, "refused", "batch {damaged}: {e}"),
            Outcome::Recovered { batches, truncated } => {
                assert_eq!(expected, "torn", "batch {damaged} recovered");
                assert_eq!((batches as u64, truncated), (damaged, true));
            }
        }
    }
}

/// Repair across segments: a damaged closed segment and a deleted one lose their
/// batches, and every batch of the other segments is kept.
#[test]
fn repair_keeps_every_whole_batch_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    fill_segments(dir.path(), 4, 4 << 10);
    let segments = files_in(dir.path(), "log");
    assert!(segments.len() >= 4, "{segments:?}");
    flip(&segments[0], written(&segments[0]) / 2);
    std::fs::remove_file(&segments[2]).unwrap();
    assert!(matches!(
        Store::open(dir.path(), Options::default()),
        Err(OpenError::Corrupt { .. })
    ));
    let report = repair(dir.path(), false).unwrap();
    assert!(report.losses.len() >= 2, "{report}");
    let lost: Vec<(u64, u64)> = report.losses.iter().filter_map(|l| l.batches).collect();
    let kept = stored_keys(dir.path());
    let expected: Vec<Vec<u8>> = (0..200)
        .filter(|b| {
            !lost
                .iter()
                .any(|(first, last)| (*first..=*last).contains(&(*b as u64 + 1)))
        })
        .map(|b| key(b, 0))
        .collect();
    assert_eq!(kept, expected, "{report}");
    assert!(kept.len() < 200 && kept.len() > 100, "{report}");
}

/// A damaged snapshot block: the repair loses that block's records (and says so), keeps
/// the snapshot's others and the journal after it.
#[test]
fn repair_keeps_the_snapshot_blocks_that_pass_their_checksum() {
    let dir = with_snapshot();
    let snapshot = files_in(dir.path(), "snap").remove(0);
    flip(&snapshot, len(&snapshot) / 2);
    let report = repair(dir.path(), false).unwrap();
    assert_eq!(report.losses.len(), 1, "{report}");
    assert!(report.losses[0].what.contains("block"), "{report}");
    let kept = stored_keys(dir.path());
    assert!(
        kept.len() < 400 * PER_BATCH && kept.len() > 100 * PER_BATCH,
        "{} keys",
        kept.len()
    );
    assert!(repair(dir.path(), false).unwrap().losses.is_empty());
}
