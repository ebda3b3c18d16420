//! A throwaway PKI: a CA and a server certificate it signed, valid for
//! `localhost`, `127.0.0.1` and `::1`, as the kubeconfig's
//! `certificate-authority-data` and the fake API server need them.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA and one server certificate.
pub struct TestPki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server certificate, DER.
    pub server_cert: CertificateDer<'static>,
    /// The server's private key, PKCS#8 DER.
    pub server_key: Vec<u8>,
}

impl TestPki {
    /// A fresh CA and a server certificate for the loopback names.
    pub fn new() -> TestPki {
        Self::with_names(&["localhost", "127.0.0.1", "::1"])
    }

    /// A fresh CA and a server certificate for `names` (DNS names or IPs).
    pub fn with_names(names: &[&str]) -> TestPki {
        let ca_key = KeyPair::generate().expect("generate CA key");
        let key = KeyPair::generate().expect("generate server key");
        Self::signed(names, ca_key, key)
    }

    /// The loopback certificates with RSA-2048 keys (kubeadm's default
    /// for an API server) instead of ECDSA P-256: the two cost a TLS client
    /// very different amounts to verify. The keys are fixed (ring cannot
    /// generate RSA keys), published in the repository, for tests only.
    pub fn rsa() -> TestPki {
        let key = |pem: &str| {
            KeyPair::from_pem_and_sign_algo(pem, &rcgen::PKCS_RSA_SHA256).expect("test RSA key")
        };
        Self::signed(
            &["localhost", "127.0.0.1", "::1"],
            key(include_str!("../keys/rsa-2048-ca.pem")),
            key(include_str!("../keys/rsa-2048-server.pem")),
        )
    }

    fn signed(names: &[&str], ca_key: KeyPair, key: KeyPair) -> TestPki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "testkit fake kubernetes CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, ca_key).expect("self-sign CA");

        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &ca).expect("sign server cert");
        TestPki {
            ca_pem: ca.pem(),
            server_cert: cert.der().clone(),
            server_key: key.serialize_der(),
        }
    }

    pub(crate) fn server_key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key.clone()))
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
