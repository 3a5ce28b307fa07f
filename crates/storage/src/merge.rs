//! Merging a table's snapshot records with the journal's later changes to them, both in
//! key order: what reads and compaction see.

use std::cmp::Ordering;
use std::iter::Peekable;

use bytes::Bytes;

/// The records of `base` (key order) with `changes` (key order, one per key) applied: a
/// change replaces the base record of its key, a `None` change removes it. Errors of
/// `base` pass through where they occur.
pub(crate) fn merge<E, I>(
    base: I,
    changes: Vec<(Bytes, Option<Bytes>)>,
) -> impl Iterator<Item = Result<(Bytes, Bytes), E>>
where
    I: Iterator<Item = Result<(Bytes, Bytes), E>>,
{
    Merge {
        base: base.peekable(),
        changes: changes.into_iter().peekable(),
    }
}

struct Merge<I: Iterator> {
    base: Peekable<I>,
    changes: Peekable<std::vec::IntoIter<(Bytes, Option<Bytes>)>>,
}

impl<E, I> Iterator for Merge<I>
where
    I: Iterator<Item = Result<(Bytes, Bytes), E>>,
{
    type Item = Result<(Bytes, Bytes), E>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let change_first = match (self.base.peek(), self.changes.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => false,
                (None, Some(_)) => true,
                (Some(Ok((key, _))), Some((changed, _))) => match changed.cmp(key) {
                    Ordering::Less => true,
                    Ordering::Equal => {
                        self.base.next();
                        true
                    }
                    Ordering::Greater => false,
                },
            };
            if !change_first {
                return self.base.next();
            }
            if let Some((key, Some(value))) = self.changes.next() {
                return Some(Ok((key, value)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    proptest::proptest! {
        /// Against a map: the base's records, then each change inserted or removed.
        #[test]
        fn merge_is_the_base_with_the_changes_applied(
            base in proptest::collection::btree_map("[a-f]{1,2}", "[0-9]{0,2}", 0..12),
            changes in proptest::collection::btree_map("[a-f]{1,2}", proptest::option::of("[0-9]{0,2}"), 0..12),
        ) {
            let mut expected: BTreeMap<String, String> = base.clone();
            for (k, v) in &changes {
                match v {
                    Some(v) => { expected.insert(k.clone(), v.clone()); }
                    None => { expected.remove(k); }
                }
            }
            let base_iter = base.iter().map(|(k, v)| Ok::<_, ()>((b(k), b(v))));
            let changes: Vec<(Bytes, Option<Bytes>)> = changes.iter().map(|(k, v)| (b(k), v.as_deref().map(b))).collect();
            let merged: Vec<(Bytes, Bytes)> = merge(base_iter, changes).collect::<Result<_, _>>().unwrap();
            let expected: Vec<(Bytes, Bytes)> = expected.iter().map(|(k, v)| (b(k), b(v))).collect();
            proptest::prop_assert_eq!(merged, expected);
        }
    }

    #[test]
    fn a_base_error_passes_through() {
        let base = vec![Ok((b("a"), b("1"))), Err("damaged")].into_iter();
        let out: Vec<_> = merge(base, vec![(b("b"), Some(b("2")))]).collect();
        assert_eq!(
            out,
            vec![Ok((b("a"), b("1"))), Err("damaged"), Ok((b("b"), b("2")))]
        );
    }
}
