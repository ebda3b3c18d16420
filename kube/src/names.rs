//! Kubernetes object names as the API server validates them, and their
//! place in API paths: each name is one path segment, percent-encoded, so
//! that no name (a namespace `kube-system/pods/coredns?`, a pod `..`) can
//! reach another object whatever its caller checked.

use std::fmt::Write;

/// A DNS-1123 label (namespaces, and each part of a subdomain): 1-63
/// lowercase letters, digits and `-`, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (pods, nodes, DaemonSets): at most 253 characters,
/// labels joined by `.`.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// `s` as one path segment: every byte but RFC 3986's unreserved ones
/// percent-encoded, and `.` too when the segment is all dots (a path
/// normaliser would resolve `.` and `..`).
pub fn segment(s: &str) -> String {
    let all_dots = !s.is_empty() && s.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~' | b'.'))
            && !(all_dots && b == b'.')
        {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_the_api_server_checks_them() {
        for ok in ["default", "kube-system", "a", "x1-2"] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", "a_b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for ok in ["web-0", "ip-10-0-1-2.eu-west-1.compute.internal", "a.b"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "..",
            "a..b",
            ".a",
            "a/b",
            "a?b",
            "Web",
            &"x".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("web-0.a_b~"), "web-0.a_b~");
        assert_eq!(
            segment("kube-system/pods/coredns?"),
            "kube-system%2Fpods%2Fcoredns%3F"
        );
        assert_eq!(segment("a#b%c d"), "a%23b%25c%20d");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("."), "%2E");
        assert_eq!(segment("a..b"), "a..b");
        assert_eq!(segment("é"), "%C3%A9");
    }
}
