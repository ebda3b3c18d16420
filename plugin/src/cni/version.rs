//! CNI spec versions: which we speak, and what an empty result looks like in
//! each.

use serde_json::{Value, json};

/// Every released spec version; we answer all of them, because CRI-O drops a
/// whole network whose version one plugin of the list does not list.
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The version we answer VERSION with when the caller does not ask for one.
pub const LATEST: &str = "1.1.0";

/// The version a config without `cniVersion` is read as (libcni does the same).
pub const IMPLICIT: &str = "0.1.0";

/// A spec version as numbers, so "0.10.0" sorts after "0.3.0" (as strings
/// it would not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// `MAJOR.MINOR.PATCH`, digits only; anything else is None.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.').map(crate::decimal::<u32>);
        let v = Version(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }
}

/// The answer to VERSION.
pub fn version_info(requested: &str) -> Value {
    json!({ "cniVersion": requested, "supportedVersions": SUPPORTED })
}

/// A well-formed result with nothing in it, for a chained ADD that received no
/// prevResult. Multus and others fail on an empty stdout, so something valid
/// must be printed; `dns` is the one member every version's result carries.
pub fn empty_result(cni_version: &str) -> Value {
    if Version::parse(cni_version) >= Some(Version(0, 3, 0)) {
        json!({ "cniVersion": cni_version, "interfaces": [], "ips": [], "dns": {} })
    } else {
        json!({ "cniVersion": cni_version, "dns": {} })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_info_lists_all_seven() {
        let v = version_info("0.3.1");
        assert_eq!(v["cniVersion"], "0.3.1");
        let listed: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(
            listed,
            [
                "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
            ]
        );
    }

    #[test]
    fn versions_compare_as_numbers() {
        assert!(
            empty_result("0.10.0").get("ips").is_some(),
            "0.10.0 is after 0.3.0"
        );
        assert!(empty_result("0.2.0").get("ips").is_none());
        assert!(Version::parse("0.10.0") > Version::parse("0.3.0"));
        assert!(Version::parse("1.1.0") > Version::parse("1.0.0"));
        assert_eq!(Version::parse("1.0"), None);
        assert_eq!(Version::parse("1.0.0-rc1"), None);
        assert_eq!(Version::parse("+1.0.0"), None);
    }

    #[test]
    fn empty_results_match_their_version() {
        assert_eq!(
            empty_result("0.2.0").to_string(),
            r#"{"cniVersion":"0.2.0","dns":{}}"#
        );
        assert_eq!(
            empty_result("1.0.0").to_string(),
            r#"{"cniVersion":"1.0.0","interfaces":[],"ips":[],"dns":{}}"#
        );
    }
}
