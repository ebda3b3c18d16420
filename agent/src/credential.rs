//! The plugin's credential: which token goes into the node's kubeconfig.
//!
//! The installer mints it through the TokenRequest API for the plugin's own
//! ServiceAccount (`LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT`, default
//! `linkerd-cni-plugin`, in the installer's namespace), which may only read
//! what the plugin reads. It is bound to the Node where the API server
//! supports it, for [`LIFETIME`] (or the server's cap), so it outlives the
//! installer pod: a rolling update, a restart, a force-delete or an
//! eviction leaves the plugin a valid token. It dies with its
//! ServiceAccount (an uninstall), with the Node, or at expiry.
//!
//! A token already in the file is kept while more than half of its
//! lifetime is left and the API server has not refused it: a restarted
//! installer, or two installers on one node (a force-delete overlap, a
//! `maxSurge` rollout), write nothing, so the runtime is not made to reload
//! its config. Past half its lifetime the token is replaced; a token found
//! in the file is checked once per process (a GET the plugin's role
//! allows), so that one whose ServiceAccount was deleted and created again
//! is replaced at once.
//!
//! Under RBAC without `create` on `serviceaccounts/token` (the linkerd2-cni
//! chart's, whose installer token only reads), the installer falls back to
//! its own projected token, as upstream does, says so once, and asks again
//! every [`REFUSED_RETRY`]; a second installer on the node then keeps the
//! first one's token while the API server accepts it. A 403 is taken for
//! that RBAC only when a SelfSubjectAccessReview with this pod's token says
//! it may not create the token: under deploy/'s RBAC a 403 also comes from
//! a binding not yet in effect or an authorization webhook, and this pod's
//! token, which may delete pods and patch Nodes, must not reach the node's
//! disk for that. A refused TokenRequest is asked again a few times within
//! the attempt first; a review that allows it, or gives no answer, counts
//! as any other failure. Any other failure
//! (the API server down, the plugin's ServiceAccount missing) keeps the
//! token in the file while it is still valid, else writes the kubeconfig
//! without one until a TokenRequest succeeds: the node is chained, and the
//! plugin, refused and seeing this installer alive, has the runtime retry
//! its pods. This pod's own token, which under deploy/'s RBAC may delete
//! pods and patch Nodes, never goes into the file then. Failures are
//! retried with a backoff, so an API server that is down costs a pass no
//! more than one bounded attempt now and then.
//!
//! A token the plugin can use may still lack the right to read pods: the
//! plugin's ClusterRole or its binding deleted. No new token fixes that, so
//! when the plugin reports rejected credentials (its ADD counters), the
//! installer asks the API server with the plugin's token whether it may get
//! pods ([`plugin_access`]) and tells the plugin what it found through the
//! heartbeat: then a 403 passes pods through instead of having every pod
//! of the node retried for as long as the RBAC stays missing. A 401 on
//! that review says the token itself is revoked (its ServiceAccount deleted
//! and created again): the next pass mints another.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use linkerd_cni_state::outcomes::{self, Outcome, PassCause, RetryCause};

use linkerd_cni_kube::token::{self, Claims};
use linkerd_cni_kube::{ApiError, names::segment};
use serde_json::json;

use crate::api::{self, Api};
use crate::config::Config;
use crate::kubeconfig::{self, KubeconfigError};
use crate::repair::backoff::Policy;

/// The lifetime asked for. The API server may grant less
/// (`--service-account-max-token-expiration`); the token's own claims say.
pub const LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The most one attempt's API calls may take: a pass must stay short.
const API_TIMEOUT: Duration = Duration::from_secs(3);
/// After a refused TokenRequest (403): RBAC does not change by itself.
pub const REFUSED_RETRY: Duration = Duration::from_secs(600);
/// Pauses before asking again within one attempt after a 403 (RBAC
/// applied a moment ago takes about that long to be in effect).
const FORBIDDEN_RETRIES: [Duration; 2] = [Duration::from_millis(250), Duration::from_millis(750)];
/// What the check GETs with a token found in the file: the plugin's role
/// allows it, and it exists in every cluster.
const PROBE_PATH: &str = "/api/v1/namespaces/default/services/kubernetes";

/// Where a SelfSubjectAccessReview is created.
const SELF_SUBJECT_ACCESS_REVIEW_PATH: &str =
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// Why no token was minted.
enum Failed {
    /// No right to ask (the linkerd2-cni chart's RBAC): fall back.
    Refused(String),
    /// Refused, though a review does not say this pod may not ask.
    Unsure(String),
    Other(String),
}

/// What to do about a TokenRequest the API server did not answer as
/// asked (the installer's own call, made with this pod's token).
fn mint_hint(e: &ApiError) -> &'static str {
    match e {
        _ if e.transient() => {
            "check that the API server (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT) is up \
             and reachable from this node; the plugin's kubeconfig keeps the token it holds \
             while that one is valid"
        }
        ApiError::Unauthorized { status: 401, .. } => {
            "the API server refused this pod's own service-account token: restart the pod \
             (kubectl -n linkerd-cni rollout restart daemonset/linkerd-cni)"
        }
        ApiError::Tls { .. } => {
            "check the API server's CA (KUBE_CA_FILE) and address (KUBERNETES_SERVICE_HOST)"
        }
        _ => "the API server's answer was unexpected: see the message",
    }
}

#[derive(Default)]
pub struct Credential {
    /// The plugin's token last minted, or found in the file and not
    /// refused: kept without asking again.
    trusted: Option<String>,
    /// Not before this: a TokenRequest failed (None: at once).
    next_try: Option<Instant>,
    failures: u32,
    /// While set, the installer's own token is used, until the instant.
    fallback: Option<(Instant, String)>,
    /// The API server refused to bind a token to the Node: ask unbound.
    unbound: bool,
    /// The interim use of this pod's own token was said.
    said_interim: bool,
    /// A refused TokenRequest not taken for the chart's RBAC was said.
    said_unsure: bool,
}

/// What the plugin's token must be: its ServiceAccount's subject.
fn plugin_subject(cfg: &Config, account: &str) -> Result<String, String> {
    Ok(token::subject(&crate::owner::namespace(cfg)?, account))
}

/// Whether `claims` are of a plugin token worth keeping at `now`: the
/// plugin's account, bound to no other node, more than half its lifetime
/// left.
fn keepable(cfg: &Config, subject: &str, claims: &Claims, now: SystemTime) -> bool {
    claims.subject == subject
        && claims
            .node
            .as_ref()
            .is_none_or(|n| cfg.node_name.as_ref() == Some(n))
        && claims.remaining(now) > claims.lifetime() / 2
}

/// Whether `t` is a plugin token not expired at `now`.
fn unexpired(subject: &str, t: &str, now: SystemTime) -> bool {
    token::claims(t).is_some_and(|c| c.subject == subject && c.remaining(now) > Duration::ZERO)
}

/// Whether the API server refuses `t`: only a 401 says so (a 403 is a
/// valid token without that right; no answer tells nothing).
fn refused(cfg: &Config, t: &str) -> bool {
    let answer = kubeconfig::api_with(cfg, t).map(|config| {
        api::blocking(config, API_TIMEOUT, async |api| {
            api.get::<serde_json::Value>(PROBE_PATH).await
        })
        .and_then(|r| r)
    });
    matches!(answer, Ok(Err(ApiError::Unauthorized { status: 401, .. })))
}

/// The plugin's ADDs whose pod GET the API server refused its credentials
/// for (401 or 403: passed through or retried), as its counters in
/// `state_dir` say; `None` when they cannot be read.
pub fn plugin_rejections(state_dir: &Path) -> Option<u64> {
    let counts = outcomes::read(state_dir).ok()?;
    let rejected = counts.iter().filter(|(o, _)| {
        matches!(
            o,
            Outcome::PassedThrough(PassCause::Unauthorized | PassCause::Forbidden)
                | Outcome::TryAgain(RetryCause::CredentialsRejected)
        )
    });
    Some(rejected.map(|(_, n)| n).sum())
}

/// Whether the token in the node's kubeconfig may get pods, asked of the
/// API server (a SelfSubjectAccessReview, cluster-wide): `Some(why not)`
/// when it answers no, `None` when it answers yes, and `previous` when it
/// gives no answer (down, slow, the token refused: no finding either way).
/// A token refused (401) is no longer trusted: the next pass checks it and
/// mints another.
pub fn plugin_access(
    credential: &mut Credential,
    cfg: &Config,
    previous: Option<String>,
) -> Option<String> {
    let Some(t) = kubeconfig::file_token(cfg) else {
        return previous;
    };
    let Ok(config) = kubeconfig::api_with(cfg, &t) else {
        return previous;
    };
    let get_pods = json!({"namespace": "", "verb": "get", "resource": "pods", "name": ""});
    let answer = api::blocking(config, API_TIMEOUT, async |api| {
        allowed(api, get_pods).await
    })
    .and_then(|r| r);
    match answer {
        Ok(true) => None,
        Ok(false) => {
            let who = token::claims(&t).map_or_else(|| "its subject".into(), |c| c.subject);
            Some(format!(
                "a SelfSubjectAccessReview with the kubeconfig's token says {who} may not get pods"
            ))
        }
        Err(ApiError::Unauthorized { status: 401, .. }) => {
            credential.trusted = None;
            previous
        }
        Err(e) => {
            tracing::debug!("cannot ask whether the plugin's token may get pods: {e}");
            previous
        }
    }
}

/// How the kubeconfig's token compares with what this installer would
/// accept, for the readiness check (which runs as a process of its own and
/// asks no API): None when fine, else why not.
pub fn problem(cfg: &Config, file_token: &str) -> Option<String> {
    let own = kubeconfig::own_token(cfg).ok();
    if own.as_deref() == Some(file_token) {
        // The fallback (the linkerd2-cni chart's RBAC).
        return None;
    }
    if let (Some(o), Some(f)) = (
        own.as_deref().and_then(token::claims),
        token::claims(file_token),
    ) && o.subject == f.subject
        && f.pod.is_some()
    {
        // The fallback, with another installer's token (see `projected`).
        return None;
    }
    let Some(account) = &cfg.plugin_service_account else {
        return Some(
            "its token is not this pod's, which it must be without a plugin account".into(),
        );
    };
    let subject = match plugin_subject(cfg, account) {
        Ok(s) => s,
        Err(e) => return Some(e),
    };
    let now = SystemTime::now();
    match token::claims(file_token) {
        Some(c) if c.subject != subject => Some(format!(
            "its token is {}'s, neither the plugin's ({subject}) nor this pod's",
            c.subject
        )),
        Some(c) if c.remaining(now) == Duration::ZERO => {
            Some("its token (the plugin's) has expired".into())
        }
        Some(c) if c.remaining(now) < c.lifetime() / 4 => Some(format!(
            "its token (the plugin's) expires in {} s and was not replaced",
            c.remaining(now).as_secs()
        )),
        Some(_) => None,
        None => Some("its token is neither the plugin's nor this pod's".into()),
    }
}

impl Credential {
    /// The token the kubeconfig should hold now; `None`: none yet (the
    /// kubeconfig is written without credentials).
    /// Err: this pod's own token, which the fallback needs, is unreadable.
    pub fn token(&mut self, cfg: &Config) -> Result<Option<String>, KubeconfigError> {
        // Without a token of its own the installer can neither mint nor
        // fall back: no kubeconfig, and so no entry (pods start unmeshed).
        let own = kubeconfig::own_token(cfg)?;
        let Some(account) = cfg.plugin_service_account.clone() else {
            return Ok(Some(self.projected(cfg, own)));
        };
        if let Some((until, _)) = &self.fallback
            && Instant::now() < *until
        {
            return Ok(Some(self.projected(cfg, own)));
        }
        let subject = match plugin_subject(cfg, &account) {
            Ok(s) => s,
            Err(why) => return Ok(self.keep_or_none(kubeconfig::file_token(cfg), &why)),
        };
        let now = SystemTime::now();
        let file = kubeconfig::file_token(cfg);
        if let Some(t) = &file
            && token::claims(t).is_some_and(|c| keepable(cfg, &subject, &c, now))
            && self.still_accepted(cfg, t)
        {
            return Ok(Some(t.clone()));
        }
        let file = file.filter(|t| unexpired(&subject, t, now));
        if self.next_try.is_some_and(|t| Instant::now() < t) {
            return Ok(self.keep_or_none(file, "backing off after a failed TokenRequest"));
        }
        match self.mint(cfg, &account, &own) {
            Ok(t) => Ok(Some(t)),
            Err(Failed::Refused(e)) => {
                let why = format!(
                    "{e}: the kubeconfig on the node holds this pod's own token, which dies with \
                     this pod (grant create on serviceaccounts/token for {}, as \
                     deploy/linkerd-cni.yaml does, for a token that outlives it); asking again \
                     every {} min",
                    account,
                    REFUSED_RETRY.as_secs() / 60
                );
                // Into the fallback, saying why once.
                if self.fallback.as_ref().is_none_or(|(_, w)| *w != why) {
                    tracing::warn!("{why}");
                }
                self.fallback = Some((Instant::now() + REFUSED_RETRY, why));
                self.trusted = None;
                Ok(Some(self.projected(cfg, own)))
            }
            Err(Failed::Unsure(e)) => {
                let backoff = self.back_off();
                if !self.said_unsure {
                    self.said_unsure = true;
                    tracing::warn!(
                        "{e}: not taken for RBAC without that right, so the node keeps its \
                         credential; asking again with a backoff (now {} s)",
                        backoff.as_secs()
                    );
                }
                // In the fallback already: this pod's token stays there.
                if let (Some((until, _)), Some(next)) = (&mut self.fallback, self.next_try) {
                    *until = next;
                    return Ok(Some(self.projected(cfg, own)));
                }
                Ok(self.keep_or_none(file, "a refused TokenRequest"))
            }
            Err(Failed::Other(e)) => {
                let backoff = self.back_off();
                // One line for the failure, what it leaves the node with
                // included (said once, as keep_or_none would say it).
                let interim = if file.is_none() && !self.said_interim {
                    self.said_interim = true;
                    "; no token for the plugin yet: the kubeconfig holds none until a \
                     TokenRequest succeeds, and meshed and unmeshed pods on this node are \
                     retried by the runtime meanwhile"
                } else {
                    ""
                };
                tracing::warn!(
                    "cannot mint the plugin's token: {e}; retrying in {} s{interim}",
                    backoff.as_secs()
                );
                Ok(file)
            }
        }
    }

    /// One more failure in a row: when to ask again.
    fn back_off(&mut self) -> Duration {
        self.failures += 1;
        let backoff = Policy::INSTALLER.nominal(self.failures);
        self.next_try = Some(Instant::now() + backoff);
        backoff
    }

    /// In the fallback: this pod's own token, unless the file holds another
    /// pod's token of the same ServiceAccount that the API server still
    /// accepts (a second installer on the node: taking turns would rewrite
    /// the file on every pass). That one is asked about on every pass while
    /// it is there, so that one revoked with its pod is replaced within a
    /// pass.
    fn projected(&mut self, cfg: &Config, own: String) -> String {
        let Some(file) = kubeconfig::file_token(cfg).filter(|f| *f != own) else {
            return own;
        };
        let (Some(o), Some(f)) = (token::claims(&own), token::claims(&file)) else {
            return own;
        };
        let another_pods = f.subject == o.subject
            && f.pod.is_some()
            && f.pod != o.pod
            && f.remaining(SystemTime::now()) > Duration::ZERO;
        if another_pods && !refused(cfg, &file) {
            return file;
        }
        own
    }

    /// After a failure: the plugin token still in the file while it is
    /// valid, else no token at all until a TokenRequest succeeds. Never
    /// this pod's own: under deploy/'s RBAC it may delete pods and patch
    /// Nodes, rights that must not reach the node's disk. The plugin's
    /// requests are then anonymous and refused, and, this installer being
    /// alive, it asks the runtime to retry the pod (which it would have to
    /// anyway: the API server the installer cannot reach, the plugin cannot
    /// either), so no pod starts without its rules meanwhile.
    fn keep_or_none(&mut self, file: Option<String>, why: &str) -> Option<String> {
        if file.is_some() {
            return file;
        }
        if !self.said_interim {
            self.said_interim = true;
            tracing::warn!(
                "no token for the plugin yet ({why}): the kubeconfig holds none until a \
                 TokenRequest succeeds, and meshed and unmeshed pods on this node are retried \
                 by the runtime meanwhile"
            );
        }
        None
    }

    /// Whether `t` (a plugin token found in the file) is accepted: asked
    /// once per token and process.
    fn still_accepted(&mut self, cfg: &Config, t: &str) -> bool {
        if self.trusted.as_deref() == Some(t) {
            return true;
        }
        if refused(cfg, t) {
            tracing::info!(
                "the plugin's token in {} is refused (HTTP 401): minting another",
                cfg.kubeconfig_path().display()
            );
            return false;
        }
        self.trusted = Some(t.to_string());
        true
    }

    fn mint(&mut self, cfg: &Config, account: &str, own: &str) -> Result<String, Failed> {
        let namespace = crate::owner::namespace(cfg).map_err(Failed::Other)?;
        let config = kubeconfig::api_with(cfg, own).map_err(Failed::Other)?;
        let node = if self.unbound {
            None
        } else {
            cfg.node_name.as_deref()
        };
        let answer = api::blocking(config, API_TIMEOUT, async |api| {
            let mut r = request(api, &namespace, account, node).await;
            for pause in FORBIDDEN_RETRIES {
                if !matches!(r, Err(ApiError::Unauthorized { status: 403, .. })) {
                    break;
                }
                tokio::time::sleep(pause).await;
                r = request(api, &namespace, account, node).await;
            }
            // Whether this pod may create the account's tokens.
            let may_mint = json!({
                "namespace": namespace, "verb": "create", "resource": "serviceaccounts",
                "subresource": "token", "name": account,
            });
            let review = match r {
                Err(ApiError::Unauthorized { status: 403, .. }) => allowed(api, may_mint).await,
                _ => Ok(true),
            };
            (r, review)
        });
        // No client (which does not happen in practice): as a failed call.
        let (minted, review) = answer.unwrap_or_else(|e| (Err(e), Ok(true)));
        let account_id = format!("{namespace}/{account}");
        let minted = minted.map_err(|e| match e {
            ApiError::Unauthorized { status: 403, .. } => {
                let e = format!(
                    "may not request a token for ServiceAccount {account_id} (HTTP 403 on \
                     create serviceaccounts/token)"
                );
                match review {
                    Ok(false) => Failed::Refused(e),
                    Ok(true) => Failed::Unsure(format!(
                        "{e}, though a SelfSubjectAccessReview says this pod may (RBAC not yet \
                         in effect, or an authorization webhook)"
                    )),
                    Err(why) => Failed::Unsure(format!(
                        "{e}, and a SelfSubjectAccessReview of that right failed ({why})"
                    )),
                }
            }
            // Allowed to ask, so not the linkerd2-cni chart's RBAC: this
            // pod's token may be strong. No fallback; retried.
            ApiError::NotFound { .. } => Failed::Other(format!(
                "ServiceAccount {account_id} does not exist (HTTP 404 on its TokenRequest) \
                 (LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT names the plugin's ServiceAccount, which \
                 deploy/linkerd-cni.yaml creates)"
            )),
            e => Failed::Other(format!(
                "cannot request a token for ServiceAccount {account_id}: {e}; {}",
                mint_hint(&e)
            )),
        })?;
        if node.is_some() && !minted.node_bound {
            self.unbound = true;
            tracing::info!(
                "the API server does not bind tokens to Nodes: the plugin's token is bound to \
                 its ServiceAccount only (it dies with it, or at expiry)"
            );
        }
        if let Some((_, why)) = self.fallback.take() {
            tracing::info!("minted the plugin's token again (before: {why})");
        }
        let lifetime = token::claims(&minted.token).map(|c| c.lifetime());
        tracing::info!(
            "minted a token for ServiceAccount {namespace}/{account}{}{}",
            match (minted.node_bound, &cfg.node_name) {
                (true, Some(n)) => format!(", bound to Node {n}"),
                _ => String::new(),
            },
            lifetime.map_or(String::new(), |l| format!(", valid {} s", l.as_secs()))
        );
        self.failures = 0;
        self.said_interim = false;
        self.said_unsure = false;
        self.next_try = None;
        self.trusted = Some(minted.token.clone());
        Ok(minted.token)
    }
}

/// Whether the asker may do what `attributes` (a SelfSubjectAccessReview's
/// `resourceAttributes`) say, as the API server answers.
async fn allowed(api: &Api, attributes: serde_json::Value) -> Result<bool, ApiError> {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    });
    let r: serde_json::Value = api.create(SELF_SUBJECT_ACCESS_REVIEW_PATH, &review).await?;
    Ok(r["status"]["allowed"] == true)
}

/// A token the API server issued.
struct Minted {
    token: String,
    /// Bound to the Node asked for; false when none was asked for or the
    /// server does not bind tokens to Nodes.
    node_bound: bool,
}

/// Requests a token of ServiceAccount `namespace/name` valid for
/// [`LIFETIME`] (the server may shorten it: read the token's claims),
/// bound to Node `node` when given and the server supports it (one that
/// does not refuses the binding with 400: then asked again unbound).
async fn request(
    api: &Api,
    namespace: &str,
    name: &str,
    node: Option<&str>,
) -> Result<Minted, ApiError> {
    let path = format!(
        "/api/v1/namespaces/{}/serviceaccounts/{}/token",
        segment(namespace),
        segment(name)
    );
    let body = |node: Option<&str>| {
        let mut spec = json!({ "expirationSeconds": LIFETIME.as_secs() });
        if let Some(n) = node {
            spec["boundObjectRef"] = json!({ "apiVersion": "v1", "kind": "Node", "name": n });
        }
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    };
    let (r, node_bound): (serde_json::Value, _) = match api.create(&path, &body(node)).await {
        Ok(r) => (r, node.is_some()),
        Err(ApiError::Status { status: 400, .. }) if node.is_some() => {
            (api.create(&path, &body(None)).await?, false)
        }
        Err(e) => return Err(e),
    };
    let token = r["status"]["token"]
        .as_str()
        .ok_or_else(|| ApiError::Decode {
            method: linkerd_cni_kube::error::Method::Post,
            path,
            cause: "the TokenRequest's answer holds no status.token".into(),
        })?;
    Ok(Minted {
        token: token.to_string(),
        node_bound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn cfg(node: Option<&str>) -> Config {
        Config::from_env(|k| {
            match k {
                "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1"),
                "KUBERNETES_SERVICE_PORT" => Some("6443"),
                "CNI_NETWORK_CONFIG" => Some(r#"{"type":"linkerd-cni"}"#),
                "LINKERD_CNI_POD_NAMESPACE" => Some("linkerd-cni"),
                "LINKERD_CNI_NODE_NAME" => node,
                _ => None,
            }
            .map(str::to_string)
        })
        .unwrap()
    }

    fn claims(subject: &str, node: Option<&str>, iat: u64, exp: u64) -> Claims {
        Claims {
            subject: subject.into(),
            issued_at: UNIX_EPOCH + Duration::from_secs(iat),
            expires_at: UNIX_EPOCH + Duration::from_secs(exp),
            node: node.map(str::to_string),
            pod: None,
        }
    }

    /// Kept while more than half its lifetime is left, for the plugin's
    /// account and this node only.
    #[test]
    fn keeps_a_plugin_token_until_half_its_lifetime() {
        let c = cfg(Some("node-1"));
        let subject = plugin_subject(&c, "linkerd-cni-plugin").unwrap();
        assert_eq!(
            subject,
            "system:serviceaccount:linkerd-cni:linkerd-cni-plugin"
        );
        let at = |s| UNIX_EPOCH + Duration::from_secs(s);
        let ours = claims(&subject, Some("node-1"), 1000, 2000);
        assert!(keepable(&c, &subject, &ours, at(1400)));
        assert!(
            !keepable(&c, &subject, &ours, at(1600)),
            "past half: replaced"
        );
        assert!(!keepable(&c, &subject, &ours, at(2500)), "expired");
        let unbound = claims(&subject, None, 1000, 2000);
        assert!(keepable(&c, &subject, &unbound, at(1400)));
        let other_node = claims(&subject, Some("node-2"), 1000, 2000);
        assert!(!keepable(&c, &subject, &other_node, at(1400)));
        let installer = claims(
            "system:serviceaccount:linkerd-cni:linkerd-cni",
            None,
            1000,
            2000,
        );
        assert!(!keepable(&c, &subject, &installer, at(1400)));
    }
}

/// Against the fake API server.
#[cfg(test)]
mod api_tests;
