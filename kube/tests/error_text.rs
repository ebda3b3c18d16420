//! What an API server answers in an error reaches the plugin's log and the
//! CNI error the runtime records: whatever the body holds, the error's
//! text is one printable line of bounded length.

use std::time::Duration;

use linkerd_cni_kube::{Client, kubeconfig};
use testkit::{FakeApiServer, TempDir};

const FORGED: &str = "admission denied\n2026-01-01T00:00:00.000Z INFO  linkerd-cni[7]: pod meshed\n\u{1b}[1A\u{1b}[2K2026-01-01T00:00:00.000Z INFO  linkerd-cni[7]: all good\r";

#[test]
fn an_error_body_cannot_forge_log_lines() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-kube-error-text").unwrap();
    let kc = api.write_kubeconfig(dir.path()).unwrap();
    let client = || Client::new(kubeconfig::load(&kc).unwrap(), Duration::from_secs(5));
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "Invalid\nforged", "message": FORGED, "code": 422,
    })
    .to_string();
    let long = serde_json::json!({"kind": "Status", "message": "x".repeat(1 << 20)}).to_string();
    for (status, body) in [
        (422, status.as_str()),
        (400, FORGED),
        (403, status.as_str()),
        (409, long.as_str()),
    ] {
        api.fail_next_with(1, status, body);
        let e = client()
            .pod("default", "web-0")
            .expect_err("the answer is an error");
        let text = format!("{e}; {}", e.hint());
        assert!(
            !text.chars().any(char::is_control),
            "HTTP {status}: {text:?}"
        );
        assert!(text.len() < 2000, "HTTP {status}: {} bytes", text.len());
        if status != 403 {
            assert!(
                text.contains("admission denied") || text.contains("xxx"),
                "{text}"
            );
        }
    }
}
