//! Kubernetes versions (`major.minor.patch`) and node image versions (`202602.10.0`).

use std::cmp::Ordering;
use std::fmt;

/// A full Kubernetes version, `major.minor.patch` (SEMANTICS §1). `semver` is not used because it
/// accepts pre-release suffixes and rejects nothing Kubernetes-specific.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubeVersion {
    pub fn parse(text: &str) -> Option<KubeVersion> {
        let mut parts = text.split('.');
        let mut next = || -> Option<u32> {
            let p = parts.next()?;
            if p.is_empty() || p.len() > 6 || !p.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            if p.len() > 1 && p.starts_with('0') {
                return None;
            }
            p.parse().ok()
        };
        let v = KubeVersion {
            major: next()?,
            minor: next()?,
            patch: next()?,
        };
        parts.next().is_none().then_some(v)
    }

    /// `(major, minor)`, for the minor-distance rules.
    pub fn minor_line(self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

/// Written as its text, `"1.31.2"`.
impl serde::Serialize for KubeVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KubeVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KubeVersion::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not a version major.minor.patch"))
        })
    }
}

/// Written as its text, `"202602.10.0"`.
impl serde::Serialize for ImageVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ImageVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        ImageVersion::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not a node image version"))
        })
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A node image version such as `202602.10.0`: dot-separated numbers compared numerically.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageVersion {
    text: String,
    parts: Vec<u64>,
}

impl ImageVersion {
    pub fn parse(text: &str) -> Option<ImageVersion> {
        let parts = text
            .split('.')
            .map(|p| {
                if p.is_empty() || p.len() > 12 || !p.bytes().all(|c| c.is_ascii_digit()) {
                    None
                } else {
                    p.parse().ok()
                }
            })
            .collect::<Option<Vec<u64>>>()?;
        Some(ImageVersion {
            text: text.to_string(),
            parts,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Ord for ImageVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts
            .cmp(&other.parts)
            .then_with(|| self.text.cmp(&other.text))
    }
}

impl PartialOrd for ImageVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ImageVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Splits an API-form image `<family>-<version>` (`AKSUbuntu-2204gen2containerd-202602.20.0`)
/// at its last `-`.
pub fn split_family_version(full: &str) -> Option<(&str, &str)> {
    let (family, version) = full.rsplit_once('-')?;
    (!family.is_empty() && !version.is_empty()).then_some((family, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_versions() {
        let v = KubeVersion::parse("1.30.5").unwrap();
        assert_eq!(v.to_string(), "1.30.5");
        assert!(KubeVersion::parse("1.30").is_none());
        assert!(KubeVersion::parse("v1.30.5").is_none());
        assert!(KubeVersion::parse("1.30.5.1").is_none());
        assert!(KubeVersion::parse("1.030.5").is_none());
        assert!(KubeVersion::parse("1.30.x").is_none());
        assert!(KubeVersion::parse("1.9.0").unwrap() < KubeVersion::parse("1.10.0").unwrap());
    }

    #[test]
    fn image_versions_compare_numerically() {
        let a = ImageVersion::parse("202602.9.0").unwrap();
        let b = ImageVersion::parse("202602.10.0").unwrap();
        assert!(a < b);
        assert!(ImageVersion::parse("2026..1").is_none());
        assert_eq!(
            split_family_version("AKSUbuntu-2204gen2containerd-202602.20.0"),
            Some(("AKSUbuntu-2204gen2containerd", "202602.20.0"))
        );
    }
}
