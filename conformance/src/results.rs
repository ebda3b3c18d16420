//! Comparing CNI results of different pods or nodes: what differs by
//! construction (MAC addresses, netns paths, names of node-side links that
//! plugins pick at random) is masked; everything else must match.

use serde_json::Value;

/// `result` with per-sandbox values replaced by placeholders: interface
/// `mac` and `sandbox`, and the `name` of interfaces outside the pod (the
/// bridge and host-side veths, named per node or at random).
pub fn masked(result: &Value) -> Value {
    let mut r = result.clone();
    if let Some(ifaces) = r.get_mut("interfaces").and_then(Value::as_array_mut) {
        for iface in ifaces {
            let in_pod = iface.get("sandbox").is_some_and(|s| s != "");
            if let Some(mac) = iface.get_mut("mac") {
                *mac = "<mac>".into();
            }
            if let Some(sandbox) = iface.get_mut("sandbox") {
                *sandbox = "<sandbox>".into();
            }
            if !in_pod && let Some(name) = iface.get_mut("name") {
                *name = "<node-side link>".into();
            }
        }
    }
    r
}

/// The exact text of a JSON value: key order and number spelling included
/// (serde_json here keeps both).
pub fn exact(v: &Value) -> String {
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_only_per_sandbox_values() {
        let a = json!({"cniVersion": "1.0.0", "interfaces": [
            {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
            {"name": "veth1234", "mac": "bb:bb:bb:bb:bb:bb"},
            {"name": "eth0", "mac": "cc:cc:cc:cc:cc:cc", "sandbox": "/run/netns/a"}],
            "ips": [{"address": "10.1.2.2/24", "interface": 2}]});
        let mut b = a.clone();
        b["interfaces"][1]["name"] = "vethabcd".into();
        b["interfaces"][2]["sandbox"] = "/run/netns/b".into();
        b["interfaces"][2]["mac"] = "dd:dd:dd:dd:dd:dd".into();
        assert_eq!(masked(&a), masked(&b));
        assert_eq!(masked(&a)["interfaces"][2]["name"], "eth0");
        b["ips"][0]["address"] = "10.1.2.3/24".into();
        assert_ne!(masked(&a), masked(&b));
        b["ips"][0]["address"] = "10.1.2.2/24".into();
        b["interfaces"][2]["name"] = "net1".into();
        assert_ne!(masked(&a), masked(&b));
    }
}
