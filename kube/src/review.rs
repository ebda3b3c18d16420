//! Questions any authenticated identity may ask about itself: who am I
//! (SelfSubjectReview: a token the server no longer accepts gets 401) and
//! may I (SelfSubjectAccessReview). The installer asks them to corroborate
//! a refusal before it acts on one.

use serde::Deserialize;
use serde_json::json;

use crate::{ApiError, Client};

pub const SELF_SUBJECT_REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
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
    #[serde(rename = "userInfo")]
    user_info: UserInfo,
    allowed: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UserInfo {
    username: String,
}

/// The user name the API server authenticates the client's token as; a
/// 401 when it does not accept it.
pub fn who_am_i(client: &Client) -> Result<String, ApiError> {
    let r: Review = client.create(
        SELF_SUBJECT_REVIEW_PATH,
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )?;
    // Logged by the caller: the server's word, made printable.
    Ok(crate::text::printable(&r.status.user_info.username, 256))
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
