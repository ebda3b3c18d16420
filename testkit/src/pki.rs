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

        let key = KeyPair::generate().expect("generate server key");
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
