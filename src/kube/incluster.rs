//! In-cluster credentials, as client-go's `InClusterConfig` finds them: the apiserver at
//! `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT` (IPv6 in brackets), the pod's
//! service-account token, CA and namespace files.

use std::path::{Path, PathBuf};

/// Where kubelet mounts the service-account volume.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `https://host:port`, with brackets around an IPv6 host (`net.JoinHostPort`).
pub fn server_url(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The service-account files under `dir`.
pub struct Files {
    pub token: PathBuf,
    pub ca: PathBuf,
    pub namespace: PathBuf,
}

pub fn files(dir: &Path) -> Files {
    Files {
        token: dir.join("token"),
        ca: dir.join("ca.crt"),
        namespace: dir.join("namespace"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        for (host, port, want) in [
            ("10.96.0.1", "443", "https://10.96.0.1:443"),
            ("fd00::1", "443", "https://[fd00::1]:443"),
            ("::1", "6443", "https://[::1]:6443"),
            (
                "kubernetes.default.svc",
                "443",
                "https://kubernetes.default.svc:443",
            ),
        ] {
            assert_eq!(server_url(host, port), want);
        }
    }
}
