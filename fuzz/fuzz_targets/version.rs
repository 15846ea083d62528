//! Kubernetes and node image versions: parsing never panics, what parses prints back as it was
//! written, and comparison is a total order consistent with equality and hashing (the input is
//! split into up to three versions at newlines, or into two halves).

#![no_main]

use std::cmp::Ordering;
use std::hash::{BuildHasher, Hash};

use libfuzzer_sys::fuzz_target;

use flotilla_engine::version::{ImageVersion, KubeVersion, split_family_version};
use flotilla_fuzz::parts;

fn total_order<T: Ord + Hash + std::fmt::Debug>(all: &[T]) {
    let hasher = std::collections::hash_map::RandomState::new();
    for a in all {
        assert_eq!(a.cmp(a), Ordering::Equal);
        for b in all {
            let ab = a.cmp(b);
            assert_eq!(ab == Ordering::Equal, a == b, "{a:?} {b:?}");
            assert_eq!(a.partial_cmp(b), Some(ab));
            assert_eq!(b.cmp(a), ab.reverse(), "{a:?} {b:?}");
            if a == b {
                assert_eq!(hasher.hash_one(a), hasher.hash_one(b));
            }
            for c in all {
                if ab != Ordering::Greater && b.cmp(c) != Ordering::Greater {
                    assert_ne!(a.cmp(c), Ordering::Greater, "{a:?} <= {b:?} <= {c:?}");
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let pieces = parts(&text, 3);
    let mut kube = Vec::new();
    let mut image = Vec::new();
    for piece in &pieces {
        if let Some(v) = KubeVersion::parse(piece) {
            assert_eq!(
                v.to_string(),
                *piece,
                "a Kubernetes version prints as written"
            );
            assert_eq!(KubeVersion::parse(&v.to_string()), Some(v));
            // A Kubernetes version is also a node-image-style version, ordered the same way.
            assert!(
                ImageVersion::parse(piece).is_some(),
                "a Kubernetes version is dotted numbers"
            );
            kube.push(v);
        }
        if let Some(v) = ImageVersion::parse(piece) {
            assert_eq!(v.as_str(), *piece);
            assert_eq!(v.to_string(), *piece);
            assert_eq!(ImageVersion::parse(v.as_str()).as_ref(), Some(&v));
            image.push(v);
        }
        if let Some((family, version)) = split_family_version(piece) {
            assert!(!family.is_empty() && !version.is_empty());
            assert!(!version.contains('-'));
            assert_eq!(format!("{family}-{version}"), *piece);
            let _ = ImageVersion::parse(version);
        }
    }
    total_order(&kube);
    total_order(&image);
    // Kubernetes versions order like the dotted numbers they are, and by minor line first.
    for a in &kube {
        for b in &kube {
            let (ia, ib) = (
                ImageVersion::parse(&a.to_string()).unwrap(),
                ImageVersion::parse(&b.to_string()).unwrap(),
            );
            assert_eq!(a.cmp(b), ia.cmp(&ib), "{a} {b}");
            if a.minor_line() < b.minor_line() {
                assert!(a < b);
            }
        }
    }
});
