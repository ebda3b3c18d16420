//! A question any authenticated identity may ask about itself: may I
//! (SelfSubjectAccessReview)? The installer asks it with the plugin's token:
//! does the plugin's RBAC still let it get pods?

use serde::Deserialize;
use serde_json::json;

use crate::{ApiError, Client};

pub const SELF_SUBJECT_ACCESS_REVIEW_PATH: &str =
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

#[derive(Deserialize, Default)]
#[serde(default)]
struct Review {
    status: ReviewStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ReviewStatus {
    allowed: bool,
}

/// Whether the client may `verb` the `resource` named `name` in
/// `namespace`.
pub fn may(
    client: &Client,
    verb: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> Result<bool, ApiError> {
    let r: Review = client.create(
        SELF_SUBJECT_ACCESS_REVIEW_PATH,
        &json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {
                "namespace": namespace, "verb": verb, "resource": resource, "name": name,
            }},
        }),
    )?;
    Ok(r.status.allowed)
}
