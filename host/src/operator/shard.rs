//! Which shard a resource belongs to, and how a replica sees only its shards' resources.
//!
//! With `--shards K`, the resources of the served Kinds are split into K shards, each served by
//! whichever replica holds its Lease (see `shards`). A resource's shard is decided from its
//! identity alone: a stable hash (64-bit FNV-1a) of `namespace/name`, or of the namespace with
//! `--shard-by namespace`, modulo K. It is the same in every replica, in every build and across
//! restarts.
//!
//! The operator keeps that shard in a label on the resource, [`SHARD_LABEL`], so that each
//! replica's watch asks the API server for its shards' resources alone. One rule says who may
//! write a resource, whatever the label says: **a resource belongs to the shard its label names
//! when that is a number below K, and to shard 0 otherwise** (no label, a label of an earlier,
//! larger K, or one a person wrote). Only the holder of that shard's Lease writes the resource,
//! its children or its status; when the hash names another shard, that holder moves it there
//! with one write of the label, and serves it no more. A new resource, or every resource after K
//! changed, is so moved once. A resource with no label (a new one, or one a single leader served)
//! is selected by no shard's watch: shard 0's holder labels it with the shard its hash names, 0
//! included, from a watch of the unlabelled resources' metadata that it keeps nowhere
//! (`labeller`), so that it holds a share of the resources like every other holder.
//!
//! Children carry their owner's shard in the same label, so that a replica keeps only its own
//! shards' children (those of other shards are known by a hash of their name, as objects the
//! operator does not own are: `children::Elsewhere`).

use std::collections::BTreeMap;
use std::fmt;

pub use crate::ownership::SHARD_LABEL;

/// What a resource's shard is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ShardBy {
    /// Its namespace and name: resources spread evenly.
    #[default]
    Name,
    /// Its namespace alone: a namespace's resources are all served by one replica.
    Namespace,
}

impl fmt::Display for ShardBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Name => "name",
            Self::Namespace => "namespace",
        })
    }
}

/// How the resources are split: into how many shards, by what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// K, at least 1.
    pub count: u32,
    pub by: ShardBy,
}

/// One shard of a [`Sharding`]: what one pipeline of a replica serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub sharding: Sharding,
    pub index: u32,
}

/// 64-bit FNV-1a: small, stable across builds and platforms (unlike `std`'s hasher), and
/// spreads short keys well.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Sharding {
    /// The shard the hash names for the resource `namespace/name`.
    pub fn of(&self, namespace: &str, name: &str) -> u32 {
        let h = match self.by {
            ShardBy::Name => fnv1a(format!("{namespace}/{name}").as_bytes()),
            ShardBy::Namespace => fnv1a(namespace.as_bytes()),
        };
        // Below `count`, a u32.
        u32::try_from(h % u64::from(self.count.max(1))).unwrap_or(0)
    }

    /// The shard a resource with `labels` belongs to now: its label's, when that is a shard of
    /// this sharding, else 0.
    pub fn current(&self, labels: Option<&BTreeMap<String, String>>) -> u32 {
        labels
            .and_then(|l| l.get(SHARD_LABEL))
            .and_then(|v| label_value(v))
            .filter(|s| *s < self.count)
            .unwrap_or(0)
    }

    /// The label selector of the resources of shard `index`, as the API server takes it; none
    /// with one shard (everything is its).
    pub fn selector(&self, index: u32) -> Option<String> {
        match (self.count, index) {
            (0 | 1, _) => None,
            // A label of 0 or of no shard of this count: any value but the other shards'.
            // Resources with no label are selected by none: shard 0's holder labels them
            // (`labeller`).
            (count, 0) => Some(format!(
                "{SHARD_LABEL},{SHARD_LABEL} notin ({})",
                (1..count)
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            (_, index) => Some(format!("{SHARD_LABEL}={index}")),
        }
    }
}

/// A label value that names a shard: a decimal number as the operator writes it (no sign, no
/// leading zero), so that one shard has one value and the selectors match it.
pub(crate) fn label_value(v: &str) -> Option<u32> {
    let canonical = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && !(v.len() > 1 && v.starts_with('0'));
    canonical.then(|| v.parse().ok()).flatten()
}

impl Shard {
    /// Whether a resource with `labels` is this shard's now (only this shard's Lease holder may
    /// write it).
    pub fn owns(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.sharding.current(labels) == self.index
    }

    /// Where the resource `namespace/name` with `labels`, this shard's, must go: `None` when it
    /// stays (its label, or no label for shard 0, says so already: nothing is written); else the
    /// shard its hash names.
    pub fn destination(
        &self,
        namespace: &str,
        name: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Option<u32> {
        if self.sharding.count <= 1 {
            return None;
        }
        let target = self.sharding.of(namespace, name);
        (target != self.sharding.current(labels)).then_some(target)
    }

    /// Whether this shard renders the resource `namespace/name` with `labels`: it is this
    /// shard's and stays here. One it only moves to another shard (or sees just before it moved
    /// away) is read for its metadata alone.
    pub fn serves(
        &self,
        namespace: &str,
        name: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        self.owns(labels) && self.destination(namespace, name, labels).is_none()
    }

    /// Whether a child whose shard label is `label` is one of this shard's: it names this
    /// shard.
    pub fn holds_child(&self, label: Option<&str>) -> bool {
        label.is_some_and(|v| v == self.index.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(value: Option<&str>) -> BTreeMap<String, String> {
        value
            .map(|v| [(SHARD_LABEL.to_owned(), v.to_owned())].into())
            .unwrap_or_default()
    }

    #[test]
    fn the_hash_is_fnv1a_and_stable() {
        // The published FNV-1a 64 test vectors: the hash must never change between builds, or
        // every resource would move on an upgrade.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let s = Sharding {
            count: 4,
            by: ShardBy::Name,
        };
        assert_eq!(s.of("default", "web"), s.of("default", "web"));
        assert_eq!(
            s.of("default", "web"),
            u32::try_from(fnv1a(b"default/web") % 4).unwrap()
        );
    }

    #[test]
    fn by_namespace_a_namespace_is_one_shard() {
        let s = Sharding {
            count: 8,
            by: ShardBy::Namespace,
        };
        let first = s.of("team-a", "x");
        assert!((0..100).all(|i| s.of("team-a", &format!("r{i}")) == first));
    }

    #[test]
    fn resources_spread_over_every_shard() {
        let s = Sharding {
            count: 4,
            by: ShardBy::Name,
        };
        let mut counts = [0u32; 4];
        for i in 0..10_000 {
            counts[s.of("default", &format!("svc-{i}")) as usize] += 1;
        }
        // 2,500 each on average; FNV-1a spreads sequential names within a few percent.
        assert!(
            counts.iter().all(|c| (2_300..=2_700).contains(c)),
            "{counts:?}"
        );
    }

    #[test]
    fn a_resource_is_its_labels_shard_when_that_is_one_else_shard_0s() {
        let s = Sharding {
            count: 3,
            by: ShardBy::Name,
        };
        assert_eq!(s.current(None), 0);
        assert_eq!(s.current(Some(&labels(Some("2")))), 2);
        // Of an earlier, larger K; or written by a person.
        assert_eq!(s.current(Some(&labels(Some("3")))), 0);
        assert_eq!(s.current(Some(&labels(Some("02")))), 0);
        assert_eq!(s.current(Some(&labels(Some("-1")))), 0);
        assert_eq!(s.current(Some(&labels(Some("x")))), 0);
        assert_eq!(s.current(Some(&labels(Some("")))), 0);
    }

    #[test]
    fn each_shard_selects_what_it_owns() {
        let s = Sharding {
            count: 3,
            by: ShardBy::Name,
        };
        assert_eq!(
            s.selector(0).as_deref(),
            Some("wasm-operator.dev/shard,wasm-operator.dev/shard notin (1,2)")
        );
        assert_eq!(s.selector(2).as_deref(), Some("wasm-operator.dev/shard=2"));
        let one = Sharding {
            count: 1,
            by: ShardBy::Name,
        };
        assert_eq!(one.selector(0), None);
    }

    #[test]
    fn a_resource_moves_to_the_shard_its_hash_names_once() {
        let sharding = Sharding {
            count: 2,
            by: ShardBy::Name,
        };
        let target = sharding.of("default", "web");
        let here = Shard { sharding, index: 0 };
        // Unlabelled, it is shard 0's: moved if its hash names another, else left as it is.
        let unlabelled = (target != 0).then_some(target);
        assert_eq!(here.destination("default", "web", None), unlabelled);
        // Labelled with its shard: it stays, with no write.
        let right = labels(Some(&target.to_string()));
        assert_eq!(here.destination("default", "web", Some(&right)), None);
        // Labelled with another: moved.
        let wrong = labels(Some(&(1 - target).to_string()));
        assert_eq!(
            here.destination("default", "web", Some(&wrong)),
            Some(target)
        );
        // A label no shard of two has: shard 0's, moved only if the hash names another.
        assert_eq!(
            here.destination("default", "web", Some(&labels(Some("7")))),
            unlabelled
        );
        // With one shard nothing is labelled.
        let one = Shard {
            sharding: Sharding {
                count: 1,
                by: ShardBy::Name,
            },
            index: 0,
        };
        assert_eq!(one.destination("default", "web", None), None);
    }

    #[test]
    fn a_shard_serves_what_it_owns_and_keeps() {
        let sharding = Sharding {
            count: 4,
            by: ShardBy::Name,
        };
        let names: Vec<String> = (0..20).map(|i| format!("svc-{i}")).collect();
        let home = |n: &str| sharding.of("default", n);
        let stays = names.iter().find(|n| home(n) == 2).expect("one of shard 2");
        let leaves = names.iter().find(|n| home(n) == 1).expect("one of shard 1");
        let (zero, two) = (Shard { sharding, index: 0 }, Shard { sharding, index: 2 });
        let at = |s: u32| labels(Some(&s.to_string()));
        // Labelled with the shard its hash names: served there, and nowhere else.
        assert!(two.serves("default", stays, Some(&at(2))));
        assert!(!zero.serves("default", stays, Some(&at(2))));
        // Unlabelled and named for shard 0: shard 0's (which labels it, `labeller`).
        let of_zero = names.iter().find(|n| home(n) == 0).expect("one of shard 0");
        assert!(zero.serves("default", of_zero, None));
        assert!(!two.serves("default", of_zero, None));
        // Unlabelled and named for another: shard 0's to move, served by none until labelled.
        assert!(!zero.serves("default", stays, None));
        assert!(!two.serves("default", stays, None));
        // Labelled with shard 2 but named for shard 1: shard 2 moves it and does not serve it.
        assert!(!two.serves("default", leaves, Some(&at(2))));
        let one = Shard {
            sharding: Sharding {
                count: 1,
                by: ShardBy::Name,
            },
            index: 0,
        };
        assert!(one.serves("default", leaves, None));
    }
}
