//! The few fields of Kubernetes objects the plugin reads. Everything else in
//! the API's answer is ignored; missing or null fields read as empty.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `null` reads as the default, as Go's decoder treats it.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ObjectMeta {
    #[serde(deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    #[serde(deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(deserialize_with = "nullable")]
    pub containers: Vec<Container>,
    #[serde(deserialize_with = "nullable")]
    pub init_containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Container {
    #[serde(deserialize_with = "nullable")]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Namespace {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Service {
    pub spec: ServiceSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ServiceSpec {
    #[serde(deserialize_with = "nullable")]
    pub ports: Vec<ServicePort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    pub port: i64,
    /// A number or a named port: read as JSON, because serde's untagged
    /// enums cannot read numbers with serde_json's arbitrary_precision.
    pub target_port: Value,
}

impl ServicePort {
    /// `targetPort` when it is a port number.
    pub fn target_port_number(&self) -> Option<u16> {
        self.target_port
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerates_nulls_and_extra_fields() {
        let p: Pod = serde_json::from_str(
            r#"{"kind":"Pod","metadata":{"name":"a","annotations":null,"labels":{"x":"y"},"uid":"u"},
                "spec":{"containers":[{"name":"app","image":"i"}],"initContainers":null}}"#,
        )
        .unwrap();
        assert_eq!(p.metadata.labels["x"], "y");
        assert!(p.metadata.annotations.is_empty());
        assert_eq!(p.spec.containers[0].name, "app");
        assert!(p.spec.init_containers.is_empty());
        let p: Pod = serde_json::from_str("{}").unwrap();
        assert!(p.spec.containers.is_empty());
    }

    #[test]
    fn target_ports_numbers_only() {
        let s: Service = serde_json::from_str(
            r#"{"spec":{"ports":[{"port":443,"targetPort":6443},{"port":80,"targetPort":"http"},{"port":8443}]}}"#,
        )
        .unwrap();
        let t: Vec<Option<u16>> = s
            .spec
            .ports
            .iter()
            .map(ServicePort::target_port_number)
            .collect();
        assert_eq!(t, [Some(6443), None, None]);
        assert_eq!(s.spec.ports[0].port, 443);
    }
}
