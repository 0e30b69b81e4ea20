//! Which proxy, if any, carries requests to the apiserver — decided as kubectl decides.
//!
//! A kubeconfig cluster's `proxy-url` is used for every request. Otherwise Go's
//! `httpproxy` rules apply: `HTTPS_PROXY` (or `https_proxy`) for an `https://` server,
//! `HTTP_PROXY` (or `http_proxy`) for `http://`, a value without a scheme meaning
//! `http://`; never for `localhost` or a loopback address; and not for hosts `NO_PROXY`
//! matches: `*`, IP addresses, CIDR ranges, domain names (which also match their
//! subdomains), `.suffix` or `*.suffix` (subdomains only), each optionally with `:port`.
//! Only plain `http://` proxies are supported (HTTP CONNECT tunnels).

use std::net::IpAddr;

/// The proxy URL for `server`, or `None` for a direct connection.
pub fn choose(
    server: &str,
    proxy_url: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, String> {
    if let Some(url) = proxy_url.filter(|u| !u.is_empty()) {
        return check(url, "proxy-url").map(Some);
    }
    let https = server.starts_with("https://");
    let (upper, lower) = if https {
        ("HTTPS_PROXY", "https_proxy")
    } else {
        ("HTTP_PROXY", "http_proxy")
    };
    let Some((var, value)) = [upper, lower]
        .into_iter()
        .find_map(|v| env(v).filter(|x| !x.is_empty()).map(|x| (v, x)))
    else {
        return Ok(None);
    };
    let (host, port) = host_port(server, https);
    let no_proxy = env("NO_PROXY")
        .filter(|x| !x.is_empty())
        .or_else(|| env("no_proxy"))
        .unwrap_or_default();
    if !use_proxy(&host, &port, &no_proxy) {
        return Ok(None);
    }
    let url = if value.contains("://") {
        value
    } else {
        format!("http://{value}")
    };
    check(&url, var).map(Some)
}

fn check(url: &str, what: &str) -> Result<String, String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "{what}: '{}' is not supported: only http:// (HTTP CONNECT) proxies are",
            crate::http::url::redact(url)
        ));
    };
    if rest.trim_end_matches('/').is_empty() {
        return Err(format!(
            "{what}: '{}' has no host",
            crate::http::url::redact(url)
        ));
    }
    // The rest of the URL is for ureq to judge, once, when the client is built.
    Ok(url.to_string())
}

/// The host (without brackets) and port (the scheme's default when absent) of a URL.
fn host_port(server: &str, https: bool) -> (String, String) {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let default = if https { "443" } else { "80" };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').unwrap_or((v6, ""));
        let port = after.strip_prefix(':').unwrap_or(default);
        return (host.to_ascii_lowercase(), port.to_string());
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_ascii_lowercase(), p.to_string()),
        None => (authority.to_ascii_lowercase(), default.to_string()),
    }
}

/// Go's `httpproxy.Config.useProxy`.
fn use_proxy(host: &str, port: &str, no_proxy: &str) -> bool {
    let ip: Option<IpAddr> = host.parse().ok();
    if host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) {
        return false;
    }
    for entry in no_proxy.split(',') {
        let entry = entry.trim().to_ascii_lowercase();
        if entry.is_empty() {
            continue;
        }
        if entry == "*" {
            return false;
        }
        if let Some((net, bits)) = entry.split_once('/') {
            if let (Ok(net), Ok(bits), Some(ip)) = (net.parse::<IpAddr>(), bits.parse(), ip)
                && in_cidr(ip, net, bits)
            {
                return false;
            }
            continue;
        }
        let (phost, pport) = split_entry(&entry);
        if phost.is_empty() {
            continue;
        }
        let port_ok = pport.is_empty() || pport == port;
        if let Ok(pip) = phost.parse::<IpAddr>() {
            if ip == Some(pip) && port_ok {
                return false;
            }
            continue;
        }
        let phost = phost.strip_prefix('*').unwrap_or(phost);
        let (suffix, exact) = match phost.strip_prefix('.') {
            Some(_) => (phost.to_string(), None),
            None => (format!(".{phost}"), Some(phost)),
        };
        if (host.ends_with(&suffix) || exact == Some(host)) && port_ok {
            return false;
        }
    }
    true
}

/// `host`, `host:port`, `[v6]:port`, or a bare IPv6 address.
fn split_entry(entry: &str) -> (&str, &str) {
    if let Some(v6) = entry.strip_prefix('[') {
        let (h, after) = v6.split_once(']').unwrap_or((v6, ""));
        return (h, after.strip_prefix(':').unwrap_or(""));
    }
    if entry.matches(':').count() > 1 {
        return (entry, "");
    }
    entry.split_once(':').unwrap_or((entry, ""))
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_matches_as_go_does() {
        let table: &[(&str, &str, &str, bool)] = &[
            // (host, port, NO_PROXY, proxied)
            ("api.example.com", "443", "", true),
            ("localhost", "443", "", false),
            ("127.0.0.1", "443", "", false),
            ("::1", "443", "", false),
            ("api.example.com", "443", "*", false),
            ("api.example.com", "443", "example.com", false),
            ("example.com", "443", "example.com", false),
            ("notexample.com", "443", "example.com", true),
            ("example.com", "443", ".example.com", true),
            ("api.example.com", "443", ".example.com", false),
            ("api.example.com", "443", "*.example.com", false),
            ("example.com", "443", "*.example.com", true),
            ("api.example.com", "443", "example.com:6443", true),
            ("api.example.com", "6443", "example.com:6443", false),
            ("api.example.com", "443", " other.org , EXAMPLE.com ", false),
            ("10.96.0.1", "443", "10.0.0.0/8", false),
            ("10.96.0.1", "443", "10.96.0.0/12", false),
            ("10.112.0.1", "443", "10.96.0.0/12", true),
            ("10.96.0.1", "443", "10.96.0.1", false),
            ("10.96.0.1", "443", "10.96.0.1:6443", true),
            ("10.96.0.1", "443", "10.96.0.2", true),
            ("fd00::1", "443", "fd00::/8", false),
            ("fd00::1", "443", "fd00::1", false),
            ("fd00::1", "443", "[fd00::1]:443", false),
            ("fd00::1", "443", "fe80::/10", true),
            ("10.96.0.1", "443", "10.0.0.0/33", true),
            ("10.96.0.1", "443", "0.0.0.0/0", false),
            ("api.example.com", "443", "10.0.0.0/8", true),
        ];
        for (host, port, no_proxy, want) in table {
            assert_eq!(
                use_proxy(host, port, no_proxy),
                *want,
                "{host}:{port} with NO_PROXY={no_proxy:?}"
            );
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn choosing_the_proxy() {
        let e = env(&[
            ("HTTPS_PROXY", "proxy:3128"),
            ("http_proxy", "http://plain:80"),
        ]);
        let https = "https://api.example.com:6443";
        assert_eq!(
            choose(https, None, &e).unwrap().as_deref(),
            Some("http://proxy:3128")
        );
        assert_eq!(
            choose("http://api.example.com", None, &e)
                .unwrap()
                .as_deref(),
            Some("http://plain:80")
        );
        assert_eq!(choose("https://127.0.0.1:6443", None, &e).unwrap(), None);
        assert_eq!(
            choose("https://127.0.0.1:6443", Some("http://kc:1"), &e)
                .unwrap()
                .as_deref(),
            Some("http://kc:1"),
            "proxy-url applies to every server"
        );
        let lower = env(&[("https_proxy", "http://low:1"), ("NO_PROXY", "example.com")]);
        assert_eq!(choose(https, None, &lower).unwrap(), None);
        assert_eq!(
            choose("https://other.org", None, &lower)
                .unwrap()
                .as_deref(),
            Some("http://low:1")
        );
        assert_eq!(choose(https, None, &env(&[])).unwrap(), None);
        let e = choose(https, Some("socks5://user:pw@p:1080"), &env(&[])).unwrap_err();
        assert_eq!(
            e,
            "proxy-url: 'socks5://[REDACTED]@p:1080' is not supported: only http:// (HTTP CONNECT) proxies are"
        );
        let e = choose(https, None, &env(&[("HTTPS_PROXY", "https://p:1")])).unwrap_err();
        assert!(e.starts_with("HTTPS_PROXY: "), "{e}");
    }

    #[test]
    fn hosts_and_ports_of_servers() {
        assert_eq!(
            host_port("https://[fd00::1]:6443/x", true),
            ("fd00::1".into(), "6443".into())
        );
        assert_eq!(
            host_port("https://[fd00::1]", true),
            ("fd00::1".into(), "443".into())
        );
        assert_eq!(
            host_port("http://API.example.com", false),
            ("api.example.com".into(), "80".into())
        );
        assert_eq!(
            host_port("https://10.0.0.1:8443", true),
            ("10.0.0.1".into(), "8443".into())
        );
    }
}
