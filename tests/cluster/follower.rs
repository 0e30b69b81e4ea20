//! A follower pod of its own service account listing the hubs through their Service, by
//! its DNS name (CoreDNS, the only name server the kubelet gives the pod) and kube-proxy's
//! rules, with the kubelet's Service links in its environment (the pod leaves
//! `enableServiceLinks` at its default, as a user's own pod would): the hub reviews the
//! pod-bound token with the real apiserver, and a Service named like cmpoll's variables
//! changes nothing.

use std::time::Duration;

use super::{Node, eventually};

pub fn lists_through_the_service(node: &Node) {
    node.apply(ACCOUNT);
    node.apply(FOLLOWER);
    let phase = eventually(
        "the follower pod to finish",
        Duration::from_secs(120),
        || {
            let pod = node.json(&["-n", "cmpoll", "get", "pod", "follower"]);
            match pod["status"]["phase"].as_str() {
                Some(p @ ("Succeeded" | "Failed")) => Ok(p.to_string()),
                other => Err(format!("{other:?}: {}", pod["status"])),
            }
        },
    );
    let log = node.kubectl(&["-n", "cmpoll", "logs", "follower"]);
    assert_eq!(phase, "Succeeded", "{log}");
    // What the real apiserver selects, every one of it, through the hub.
    let selected = node.json(&["get", "configmaps", "-A", "-l", "cmpoll.io/module=true"]);
    let selected: Vec<String> = (selected["items"].as_array().unwrap().iter())
        .map(|c| {
            format!(
                "{}/{}",
                c["metadata"]["namespace"].as_str().unwrap(),
                c["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(selected.len() >= 3, "{selected:?}");
    for module in &selected {
        assert!(
            log.lines().any(|l| l.starts_with(&format!("{module} "))),
            "{module} not listed: {log}"
        );
    }
    // The name was found by cluster DNS, not in /etc/hosts.
    assert!(
        log.contains("resolv.conf: nameserver 10.96.0.10\nhosts naming the hub: 0\n"),
        "{log}"
    );
    // The links were there, and cmpoll neither read nor warned about them.
    assert!(log.contains("CMPOLL_INTERVAL_SERVICE_HOST="), "{log}");
    assert!(log.contains("CMPOLL_HUB_PORT_443_TCP_ADDR="), "{log}");
    assert!(
        !log.contains("CMPOLL_INTERVAL_SERVICE_HOST names no flag")
            && !log.contains("CMPOLL_HUB_PORT names no flag"),
        "{log}"
    );
    // The warning is alive: the typo the pod also carries gets one.
    assert!(
        log.contains("CMPOLL_INTERVL names no flag of cmpoll"),
        "{log}"
    );
    assert_eq!(log.matches("names no flag").count(), 1, "{log}");
}

/// The follower's account: what a hub authorizes a follower for (fleet.rs's followers
/// use it too).
pub const ACCOUNT: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: follower, namespace: cmpoll}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cmpoll-follower}
rules: [{apiGroups: [''], resources: [configmaps], verbs: [list, get, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cmpoll-follower}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cmpoll-follower}
subjects: [{kind: ServiceAccount, name: follower, namespace: cmpoll}]
";

/// The follower pod: the -webhook image, for the shell that prints the links and name
/// server it was given before it lists.
const FOLLOWER: &str = "apiVersion: v1
kind: Pod
metadata: {name: follower, namespace: cmpoll}
spec:
  serviceAccountName: follower
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: follower
      image: ghcr.io/cmpoll/cmpoll:0.1.0-webhook
      imagePullPolicy: Never
      env: [{name: CMPOLL_INTERVL, value: 1s}]
      command: [/bin/sh, -c]
      args:
        - |
          env | grep -E '^CMPOLL_(INTERVAL|HUB)_' | sort
          echo \"resolv.conf: $(grep '^nameserver' /etc/resolv.conf)\"
          echo \"hosts naming the hub: $(grep -c cmpoll-hub /etc/hosts)\"
          exec cmpoll list --server https://cmpoll-hub.cmpoll.svc --ca-file /ca/ca.crt --token-file /var/run/secrets/kubernetes.io/serviceaccount/token 2>&1
      securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumeMounts:
        - {name: ca, mountPath: /ca}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - {name: ca, configMap: {name: cmpoll-hub-ca}}
    - {name: tmp, emptyDir: {}}
";
