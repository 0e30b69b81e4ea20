//! The variables a kubelet puts into every container for every Service of its namespace
//! (`enableServiceLinks`, on unless a pod turns it off), told apart from a user's.
//!
//! For a Service `cmpoll-hub` with ClusterIP 10.96.0.7 and one TCP port 443 named `https`,
//! the kubelet (pkg/kubelet/envvars/envvars.go) sets `CMPOLL_HUB_SERVICE_HOST=10.96.0.7`,
//! `CMPOLL_HUB_SERVICE_PORT=443`, `CMPOLL_HUB_SERVICE_PORT_HTTPS=443`,
//! `CMPOLL_HUB_PORT=tcp://10.96.0.7:443`, and `CMPOLL_HUB_PORT_443_TCP` (the same URL),
//! `…_TCP_PROTO=tcp`, `…_TCP_PORT=443`, `…_TCP_ADDR=10.96.0.7`. Whoever may create a
//! Service in a namespace chooses these names, so cmpoll never reads one as its settings:
//! no flag's variable has a link's name (a test over the table says so) and a k8s-sidecar
//! variable of that shape holding a link's value is the kubelet's, not the user's (a
//! container's own `env` wins over a link of the same name). A variable is a link only
//! when its name and its value both have a link's shape, so a typed
//! `CMPOLL_METRICS_PORT=9090` is still a typo to warn about.

use std::net::IpAddr;

/// Whether `name=value` is one the kubelet writes for a Service. Each shape is tried (a
/// Service may itself be named `x-service-port`).
pub fn is_service_link(name: &str, value: &str) -> bool {
    host(name, value) || port(name, value) || link(name, value) || port_link(name, value)
}

/// `P_SERVICE_HOST`: the ClusterIP.
fn host(name: &str, value: &str) -> bool {
    (name.strip_suffix("_SERVICE_HOST")).is_some_and(is_prefix) && value.parse::<IpAddr>().is_ok()
}

/// `P_SERVICE_PORT` (the first port) and `P_SERVICE_PORT_NAME` (each named one): a number.
/// Every place the suffix could start is tried: a port named `service-portal` makes
/// `P_SERVICE_PORT_SERVICE_PORTAL`.
fn port(name: &str, value: &str) -> bool {
    let tail = "_SERVICE_PORT";
    value.parse::<u16>().is_ok()
        && name.match_indices(tail).any(|(at, _)| {
            let (service, port_name) = (&name[..at], &name[at + tail.len()..]);
            let named = port_name.is_empty()
                || (port_name.strip_prefix('_')).is_some_and(|n| !n.is_empty() && is_upper(n));
            is_prefix(service) && named
        })
}

/// `P_PORT`: the first port's URL.
fn link(name: &str, value: &str) -> bool {
    (name.strip_suffix("_PORT")).is_some_and(is_prefix) && link_url(value).is_some()
}

/// `P_PORT_<port>_<PROTO>` (the URL), and it with `_PROTO`, `_PORT` or `_ADDR`; every
/// `_PORT_` is tried, as a Service's own name may hold one.
fn port_link(name: &str, value: &str) -> bool {
    name.match_indices("_PORT_")
        .any(|(at, _)| port_link_at(&name[..at], &name[at + "_PORT_".len()..], value))
}

fn port_link_at(service: &str, rest: &str, value: &str) -> bool {
    let mut parts = rest.splitn(3, '_');
    let (Some(port), Some(protocol)) = (parts.next(), parts.next()) else {
        return false;
    };
    let known = ["TCP", "UDP", "SCTP"].contains(&protocol);
    if !is_prefix(service) || port.parse::<u16>().is_err() || !known {
        return false;
    }
    let lower = protocol.to_ascii_lowercase();
    match parts.next() {
        None => link_url(value).is_some_and(|(p, to)| p == lower && to.port().to_string() == port),
        Some("PROTO") => value == lower,
        Some("PORT") => value == port,
        Some("ADDR") => value.parse::<IpAddr>().is_ok(),
        Some(_) => false,
    }
}

/// What a Service's name becomes (`cmpoll-hub` → `CMPOLL_HUB`): DNS-1035 label upper-cased,
/// `-` made `_`.
fn is_prefix(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase()) && is_upper(s)
}

fn is_upper(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A link's value, `tcp://10.96.0.7:443` or `udp://[fd00::7]:53`: its protocol and address.
fn link_url(value: &str) -> Option<(&str, std::net::SocketAddr)> {
    let (protocol, at) = value.split_once("://")?;
    ["tcp", "udp", "sctp"]
        .contains(&protocol)
        .then_some(())
        .and_then(|()| at.parse().ok())
        .map(|at| (protocol, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable the kubelet's envvars.go makes for a two-port Service, as it makes
    /// them (names and values copied from its algorithm), is a link; each with its value
    /// changed to what a user would type is not.
    #[test]
    fn the_kubelets_variables_are_links_and_a_users_are_not() {
        let kubelet = [
            ("CMPOLL_HUB_SERVICE_HOST", "10.96.0.7"),
            ("CMPOLL_HUB_SERVICE_PORT", "443"),
            ("CMPOLL_HUB_SERVICE_PORT_HTTPS", "443"),
            ("CMPOLL_HUB_SERVICE_PORT_METRICS_2", "9090"),
            ("CMPOLL_HUB_PORT", "tcp://10.96.0.7:443"),
            ("CMPOLL_HUB_PORT_443_TCP", "tcp://10.96.0.7:443"),
            ("CMPOLL_HUB_PORT_443_TCP_PROTO", "tcp"),
            ("CMPOLL_HUB_PORT_443_TCP_PORT", "443"),
            ("CMPOLL_HUB_PORT_443_TCP_ADDR", "10.96.0.7"),
            ("CMPOLL_HUB_PORT_53_UDP", "udp://[fd00::7]:53"),
            ("CMPOLL_HUB_PORT_53_UDP_ADDR", "fd00::7"),
            ("HEALTH_PORT", "tcp://10.96.0.9:8080"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            // Services named `a-port-8-tcp` and `x-service-port`.
            ("A_PORT_8_TCP_PORT_80_TCP_PORT", "80"),
            ("A_PORT_8_TCP_PORT", "tcp://10.96.0.3:80"),
            ("X_SERVICE_PORT_PORT", "tcp://10.96.0.4:80"),
            ("X_SERVICE_PORT_SERVICE_PORT", "80"),
            // A port named `service-portal`; a Service `a-port-80-tcp` with port 8080.
            ("X_SERVICE_PORT_SERVICE_PORTAL", "80"),
            ("A_PORT_80_TCP_PORT_8080_TCP", "tcp://10.96.0.3:8080"),
        ];
        for (name, value) in kubelet {
            assert!(is_service_link(name, value), "{name}={value}");
        }
        let user = [
            ("CMPOLL_HUB_SERVICE_HOST", "hub.example"),
            ("CMPOLL_HUB_SERVICE_PORT", "https"),
            ("CMPOLL_METRICS_PORT", "9090"),
            ("HEALTH_PORT", "8080"),
            ("CMPOLL_HUB_PORT_443_TCP", "tcp://10.96.0.7:80"),
            ("CMPOLL_HUB_PORT_443_TCP_PROTO", "udp"),
            ("CMPOLL_HUB_PORT_443_TCP_PORT", "80"),
            ("CMPOLL_HUB_PORT_443_HTTP", "tcp://10.96.0.7:443"),
            ("CMPOLL_HUB_PORT_443_TCP_HOST", "10.96.0.7"),
            ("CMPOLL_INTERVAL", "10s"),
            ("cmpoll_hub_PORT", "tcp://10.96.0.7:443"),
            ("_PORT", "tcp://10.96.0.7:443"),
        ];
        for (name, value) in user {
            assert!(!is_service_link(name, value), "{name}={value}");
        }
    }

    /// No flag's variable can be made by a Service's name, whatever its value: a Service
    /// named to collide sets nothing of cmpoll's.
    #[test]
    fn no_flag_is_named_as_a_link() {
        let values = ["10.96.0.7", "443", "tcp://10.96.0.7:443", "tcp"];
        for flag in crate::cli::table::flag::ALL {
            let var = flag.var();
            let named = values.iter().any(|v| is_service_link(&var, v))
                || var.ends_with("_PORT")
                || var.ends_with("_SERVICE_HOST")
                || var.contains("_SERVICE_PORT")
                || var.contains("_PORT_");
            assert!(!named, "{var} is a name a Service's link could have");
        }
    }
}
