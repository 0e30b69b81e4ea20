#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for tests/cluster.rs and for trying a
# shape by hand: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy of tests/kube/go.mod (tests/kube/build.sh builds them), Debian's containerd,
# runc and CNI plugins, the pause image built from the Kubernetes module's pause.c and
# cmpoll's images from packaging/image/build.sh, imported with ctr; cluster DNS as kubeadm
# installs it (its CoreDNS add-on's manifests, CoreDNS of tests/coredns at its version).
# The recipe, and why each setting: ../shared/real-cluster.md (docs/operations.md, "A real node").
#
#   tests/cluster/node.sh check          # the assumptions, each said when it fails
#   tests/cluster/node.sh up DIR [BIN [OWNER]]  # DIR: an empty folder; BIN: the cmpoll for
#                                        # images; OWNER: a pid whose end takes it down
#   tests/cluster/node.sh down DIR       # whatever happened: nothing left behind
#
# `up` writes DIR/kubeconfig (system:masters) and prints it. One cluster per machine: the
# control plane listens on its fixed ports and containerd on /run/containerd. Needs root.
# What `up` changes outside DIR, `down` puts back: processes (by pid file), mounts under DIR
# and /run/containerd, the pods' network namespaces, iptables rules (saved before, restored
# after), the sysctls the kubelet and kube-proxy set, the kubepods cgroups, the CNI state of
# this network, /var/log/pods and /var/log/containers when it made them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
B=$repo/tests/kube/bin
NODE=cmpoll-node
NET=cmpoll-cluster
PORTS="6443 2379 2380 10248 10249 10250 10256 10257 10259"
SYSCTLS="net.ipv4.ip_forward net.ipv4.conf.all.route_localnet vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

die() { echo "node.sh: $*" >&2; exit 1; }

# The address the node registers: the default route's source, else the first global one.
node_ip() {
  local ip; ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  [ -n "$ip" ] || ip=$(ip -4 -o addr show scope global | awk '{sub("/.*", "", $4); print $4; exit}')
  echo "$ip"
}

check() {
  [ "$(id -u)" -eq 0 ] || die "needs root (the kubelet, containerd and kube-proxy do)"
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns; do
    [ -x "$B/$b" ] || die "$B/$b: missing (tests/kube/build.sh builds it)"
  done
  for t in go strip curl containerd ctr containerd-shim-runc-v2 runc iptables-save iptables-restore ip6tables-save ip6tables-restore buildah gcc openssl ip ss /usr/bin/prometheus /usr/bin/promtool /bin/busybox; do
    command -v "$t" >/dev/null 2>&1 || die "$t: not on PATH (Debian: containerd, runc, iptables, buildah, gcc, openssl, iproute2, prometheus, busybox-static)"
  done
  for p in ptp host-local portmap loopback; do
    [ -x "/usr/lib/cni/$p" ] || die "/usr/lib/cni/$p: missing (Debian: containernetworking-plugins)"
  done
  # cgroups: v1 (this VM's hybrid) or v2, mounted and writable.
  local fs; fs=$(stat -fc %T /sys/fs/cgroup)
  case "$fs" in
    tmpfs) [ -w /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/cpu ] && [ -w /sys/fs/cgroup/pids ] \
             || die "cgroup v1 without writable memory, cpu and pids hierarchies" ;;
    cgroup2fs) grep -qw memory /sys/fs/cgroup/cgroup.controllers || die "cgroup v2 without the memory controller" ;;
    *) die "/sys/fs/cgroup is $fs: neither cgroup v1 nor v2" ;;
  esac
  # Capabilities the node needs in the bounding set: SYS_ADMIN (mounts), NET_ADMIN (netns,
  # iptables). SYS_RESOURCE may be missing: containerd's restrict_oom_score_adj is for that.
  local bnd; bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
  (( bnd & (1 << 21) )) || die "CAP_SYS_ADMIN is not in the bounding set"
  (( bnd & (1 << 12) )) || die "CAP_NET_ADMIN is not in the bounding set"
  for port in $PORTS; do
    ! ss -Hltn "sport = :$port" | grep -q . || die "port $port is taken: another cluster runs here?"
  done
  [ ! -e /run/containerd/containerd.sock ] || die "/run/containerd/containerd.sock exists: another containerd runs here"
  [ -n "$(node_ip)" ] || die "no IPv4 address to give the node (this recipe is IPv4)"
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ ! -d "$h" ] || die "$h exists: another kubelet runs, or ran, here"
  done
  # overlayfs, containerd's snapshotter.
  local o; o=$(mktemp -d)
  mkdir -p "$o/l" "$o/u" "$o/w" "$o/m"
  if ! mount -t overlay overlay -o "lowerdir=$o/l,upperdir=$o/u,workdir=$o/w" "$o/m" 2>/dev/null; then
    rm -rf "$o"; die "an overlay mount failed: containerd's overlayfs snapshotter cannot run"
  fi
  umount "$o/m"; rm -rf "$o"
}

# A key and a certificate signed by the CA: NAME SUBJECT [SANS].
cert() {
  local name=$1 subj=$2 sans=${3:-}
  openssl req -new -newkey rsa:2048 -nodes -keyout "$P/$name.key" -subj "$subj" -out "$P/$name.csr" 2>/dev/null
  local ext="$P/$name.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [ -z "$sans" ] || echo "subjectAltName=$sans" >>"$ext"
  openssl x509 -req -in "$P/$name.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
    -days 2 -extfile "$ext" -out "$P/$name.crt" 2>/dev/null
}

kubeconfig() {
  cat >"$W/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$P/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}
contexts:
- name: node
  context: {cluster: node, user: $1}
current-context: node
EOF
}

# Starts NAME in its own session, logging to DIR/log/NAME.log, its pid in DIR/pid/NAME.
start() {
  local name=$1; shift
  setsid "$@" </dev/null >"$W/log/$name.log" 2>&1 &
  echo $! >"$W/pid/$name"
}

wait_for() {
  local what=$1 tries=$2; shift 2
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "timed out waiting for $what (logs: $W/log)"
}

pki() {
  P=$W/pki; mkdir -p "$P"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$P/ca.key" -subj "/CN=cmpoll-node-ca" -days 2 -out "$P/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" "IP:10.96.0.1,IP:127.0.0.1,IP:$NODE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=admin"
  cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kcm "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert node "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
  cert proxy "/CN=system:kube-proxy"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$P/sa.key" 2>/dev/null
  openssl pkey -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  for k in admin kcm scheduler node proxy; do kubeconfig "$k"; done
}

control_plane() {
  # The audit log of the cmpoll namespace's service accounts (tests/cluster/rotation.rs reads
  # which token each hub request carried: its credential-id), each event written before
  # its answer (the log backend's default mode, said here because rotation.rs relies on it).
  printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' 'omitStages: [RequestReceived]' \
    'rules:' '- level: Metadata' '  userGroups: ["system:serviceaccounts:cmpoll"]' '- level: None' \
    > "$W/audit-policy.yaml"
  start etcd "$B/etcd" --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster default=http://127.0.0.1:2380 \
    --unsafe-no-fsync
  start kube-apiserver "$B/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --audit-policy-file="$W/audit-policy.yaml" --audit-log-path="$W/audit.log" --audit-log-maxsize=0 \
    --audit-log-mode=blocking
  wait_for "the apiserver" 240 "$B/kubectl" --kubeconfig "$W/admin.kubeconfig" get --raw /readyz
  start kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$W/kcm.kubeconfig" \
    --authentication-kubeconfig="$W/kcm.kubeconfig" --authorization-kubeconfig="$W/kcm.kubeconfig" \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --use-service-account-credentials --leader-elect=false --service-cluster-ip-range=10.96.0.0/16 \
    --flex-volume-plugin-dir="$W/kcm-plugins" \
    --bind-address=127.0.0.1
  start kube-scheduler "$B/kube-scheduler" --kubeconfig="$W/scheduler.kubeconfig" \
    --authentication-kubeconfig="$W/scheduler.kubeconfig" --authorization-kubeconfig="$W/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1
}

containerd_up() {
  mkdir -p "$W/cni" "$W/containerd"
  cat >"$W/cni/10-$NET.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "$NET", "plugins": [
  {"type": "ptp", "ipMasq": true, "ipam": {"type": "host-local",
   "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  # restrict_oom_score_adj: this machine's root may not lower oom_score_adj (no
  # CAP_SYS_RESOURCE); without it every sandbox fails "can't get final child's PID".
  cat >"$W/containerd.toml" <<EOF
version = 2
root = "$W/containerd/root"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.2"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni"
EOF
  start containerd containerd --config "$W/containerd.toml"
  wait_for containerd 60 ctr --address /run/containerd/containerd.sock version
}

# The pause image from the Kubernetes module's own pause.c, and cmpoll's three.
images() {
  local k8s; k8s=$(cd "$repo/tests/kube" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  img=$W/img; mkdir -p "$img"
  gcc -Os -Wall -Werror -static -DVERSION=v3.10.2-cmpoll -o "$img/pause" "$k8s/build/pause/linux/pause.c"
  strip "$img/pause"
  bah=(buildah --storage-driver vfs --root "$img/root" --runroot "$img/run")
  local c; c=$("${bah[@]}" from scratch)
  "${bah[@]}" copy "$c" "$img/pause" /pause >/dev/null
  "${bah[@]}" config --entrypoint '["/pause"]' --user 65535:65535 --os linux --arch amd64 "$c"
  "${bah[@]}" commit -q --rm "$c" registry.k8s.io/pause:3.10.2 >/dev/null
  "${bah[@]}" push -q registry.k8s.io/pause:3.10.2 "oci-archive:$img/pause.oci.tar:registry.k8s.io/pause:3.10.2"
  "$repo/packaging/image/build.sh" "$BIN" "$img/cmpoll-store" >/dev/null
  alloy_image
  prometheus_image
  coredns_image
  for a in "$img/pause.oci.tar" "$img"/cmpoll-*.oci.tar "$img"/alloy.oci.tar "$img"/prometheus.oci.tar "$img"/coredns.oci.tar; do
    [ ! -e "$a" ] || ctr -n k8s.io images import "$a" >/dev/null
  done
}

# Prometheus's image as k8s/prometheus's pod and k8s/webhook's init container use it:
# Debian's prometheus and promtool (linked against glibc alone: its two files come along),
# busybox as /bin/cp; named as CRI names `prom/prometheus:v2.53.2`, the tag k8s/ pins,
# though Debian's Prometheus is older.
prometheus_image() {
  local c; c=$("${bah[@]}" from scratch)
  for f in /usr/bin/prometheus /usr/bin/promtool; do "${bah[@]}" copy "$c" "$f" "/bin/${f##*/}" >/dev/null; done
  "${bah[@]}" copy "$c" /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libc.so.6 >/dev/null
  "${bah[@]}" copy "$c" /lib64/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2 >/dev/null
  "${bah[@]}" copy "$c" /bin/busybox /bin/cp >/dev/null
  "${bah[@]}" config --entrypoint '["/bin/prometheus"]' --os linux --arch amd64 "$c"
  "${bah[@]}" commit -q --rm "$c" docker.io/prom/prometheus:v2.53.2 >/dev/null
  "${bah[@]}" push -q docker.io/prom/prometheus:v2.53.2 \
    "oci-archive:$img/prometheus.oci.tar:docker.io/prom/prometheus:v2.53.2"
}

# Grafana Alloy's image as k8s/alloy's pods use it: tests/alloy's alloy at /bin/alloy, and
# Debian's static busybox as the /bin/cp and /bin/sh its init containers and scripts run;
# named as CRI names `grafana/alloy:v1.19.2`. Uncompressed: gzip of a 400 MB binary costs
# more CPU than the copy.
alloy_image() {
  local alloy=$repo/tests/alloy/bin/alloy
  if [ ! -x "$alloy" ]; then
    echo "node.sh: $alloy missing (tests/alloy/build.sh): no Alloy image" >&2
    return 0
  fi
  local c; c=$("${bah[@]}" from scratch)
  "${bah[@]}" copy "$c" "$alloy" /bin/alloy >/dev/null
  "${bah[@]}" copy "$c" /bin/busybox /bin/cp >/dev/null
  "${bah[@]}" copy "$c" /bin/busybox /bin/sh >/dev/null
  "${bah[@]}" config --entrypoint '["/bin/alloy"]' --cmd run --os linux --arch amd64 "$c"
  "${bah[@]}" commit -q --disable-compression --rm "$c" docker.io/grafana/alloy:v1.19.2 >/dev/null
  "${bah[@]}" push -q --disable-compression docker.io/grafana/alloy:v1.19.2 \
    "oci-archive:$img/alloy.oci.tar:docker.io/grafana/alloy:v1.19.2"
}

# The CoreDNS version tests/coredns builds, as kubeadm names its image.
coredns_version() {
  (cd "$repo/tests/coredns" && GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' github.com/coredns/coredns)
}

# CoreDNS's image as kubeadm's Deployment runs it: the binary alone, at /coredns (the
# official image's entrypoint), named as kubeadm names it.
coredns_image() {
  local name; name=registry.k8s.io/coredns/coredns:$(coredns_version)
  local c; c=$("${bah[@]}" from scratch)
  "${bah[@]}" copy "$c" "$B/coredns" /coredns >/dev/null
  "${bah[@]}" config --entrypoint '["/coredns"]' --os linux --arch amd64 "$c"
  "${bah[@]}" commit -q --rm "$c" "$name" >/dev/null
  "${bah[@]}" push -q "$name" "oci-archive:$img/coredns.oci.tar:$name"
}

# Cluster DNS as `kubeadm init` installs it: its own manifests, rendered by
# tests/kube/kubeadm-dns, on the kubelet's clusterDNS address; Ready by its own probes.
dns_up() {
  local k=("$B/kubectl" --kubeconfig "$W/admin.kubeconfig")
  (cd "$repo/tests/kube" && GOFLAGS=-mod=readonly go run ./kubeadm-dns \
    "$(GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)" "$(coredns_version)") >"$W/coredns.yaml"
  "${k[@]}" apply -f "$W/coredns.yaml" >/dev/null
  # Every replica Ready (not the Deployment's Available: with maxUnavailable 1 that holds
  # before any is).
  wait_for "CoreDNS Ready" 120 "${k[@]}" -n kube-system rollout status deployment/coredns --timeout=1s
}

node_up() {
  mkdir -p "$W/kubelet"
  cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: "$P/ca.crt"}}
authorization: {mode: Webhook}
tlsCertFile: "$P/node.crt"
tlsPrivateKeyFile: "$P/node.key"
clusterDNS: ["10.96.0.10"]
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
evictionHard: {nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
serializeImagePulls: false
# A pod's volumes (projected tokens, Secrets) are refreshed at its sync: every 10 s, not
# every minute, so that a rotation is seen within seconds of the kubelet's own deadline.
syncFrequency: 10s
EOF
  cat >"$W/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$W/proxy.kubeconfig"}
mode: iptables
clusterCIDR: 10.88.0.0/16
hostnameOverride: $NODE
bindAddress: $NODE_IP
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  sysctl -qw net.ipv4.ip_forward=1
  start kubelet "$B/kubelet" --config="$W/kubelet.yaml" --kubeconfig="$W/node.kubeconfig" \
    --root-dir="$W/kubelet" --volume-plugin-dir="$W/kubelet-plugins" \
    --hostname-override="$NODE" --node-ip="$NODE_IP"
  start kube-proxy "$B/kube-proxy" --config="$W/kube-proxy.yaml"
  local k=("$B/kubectl" --kubeconfig "$W/admin.kubeconfig")
  wait_for "node $NODE Ready" 240 "${k[@]}" wait --for=condition=Ready "node/$NODE" --timeout=1s
  # The default service account the controller manager makes, and kube-proxy's rule for
  # the apiserver's Service: pods need both.
  wait_for "the default service account" 120 "${k[@]}" -n default get serviceaccount default
  wait_for "kube-proxy's rules" 120 curl -sf -m 2 http://127.0.0.1:10256/healthz
}

up() {
  mkdir -p "$W/log" "$W/pid" "$W/before"
  NODE_IP=$(node_ip)
  # What down puts back.
  for fam in iptables ip6tables; do "$fam-save" >"$W/before/$fam"; rules "$fam" >"$W/before/$fam.rules"; done
  for s in $SYSCTLS; do echo "$s=$(sysctl -n "$s")"; done >"$W/before/sysctl"
  for d in /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns /usr/libexec/kubernetes; do [ -e "$d" ] || echo "$d"; done >"$W/before/absent"
  for d in /var/log/pods /var/log/containers; do [ ! -d "$d" ] || ls -A "$d" | sed "s|^|$d/|"; done >"$W/before/logs"
  cni_netns >"$W/before/netns"
  pki
  control_plane
  containerd_up
  images
  node_up
  dns_up
  cp "$W/admin.kubeconfig" "$W/kubeconfig"
  echo "$W/kubeconfig"
}

# The pods' network namespaces, as CNI names them.
cni_netns() {
  ip netns list 2>/dev/null | awk '/^cni-/ {print $1}' | sort
}

# Stops what `start NAME` started: by its pid, while that pid is still NAME run from here
# (its command line names $B/NAME or a file of $W: a reused pid is someone else's).
stop_pid() {
  local f=$W/pid/$1
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if ! tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -e "$B/$1" -e "$W/"; then
    rm -f "$f"; return 0
  fi
  for sig in TERM TERM KILL; do
    kill -"$sig" -- "-$pid" 2>/dev/null || kill -"$sig" "$pid" 2>/dev/null || break
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break 2; sleep 0.25; done
  done
  rm -f "$f"
}

# The rules of one family as they were before `up`: a table that was there is restored
# (iptables-restore replaces it whole), one that was not is flushed and its chains deleted.
restore_rules() {
  local fam=$1 before=$W/before/$1
  [ -f "$before" ] || return 0
  for t in filter nat mangle raw security; do
    if grep -q "^\*$t\$" "$before"; then
      sed -n "/^\*$t\$/,/^COMMIT\$/p" "$before" | "$fam-restore" 2>/dev/null || true
    else
      "$fam" -t "$t" -F 2>/dev/null || true
      "$fam" -t "$t" -X 2>/dev/null || true
    fi
  done
}

# A family's rules and user chains, without counters or comments: what `down` compares.
rules() {
  "$1-save" 2>/dev/null | { grep -E '^(-A |:[^ ]+ - )' || true; } | sed 's/ \[[0-9]*:[0-9]*\]//' | sort
}

# What `up` changed and `down` did not put back, one line each; empty when nothing.
leftovers() {
  local pids; pids=$(cat "$W/pid/"* 2>/dev/null || true)
  for p in $pids; do kill -0 "$p" 2>/dev/null && echo "process $p still runs"; done
  awk -v w="$W/" 'index($2, w) == 1 || index($2, "/run/containerd/") == 1 {print "mount " $2}' /proc/self/mounts
  new_netns | sed 's/^/netns /'
  for fam in iptables ip6tables; do
    [ -f "$W/before/$fam.rules" ] || continue
    diff <(cat "$W/before/$fam.rules") <(rules "$fam") | sed -n "s/^> /$fam rule left: /p"
  done
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [ ! -d "$h" ] || echo "cgroup $h"; done
  if [ -f "$W/before/sysctl" ]; then
    while IFS='=' read -r k v; do
      [ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || echo "sysctl $k is not back to $v"
    done <"$W/before/sysctl"
  fi
  pgrep -f "containerd-shim-runc-v2 -namespace k8s.io .*-address /run/containerd/containerd.sock" | sed 's/^/shim /'
  true
}

# The pods' network namespaces `up` did not find.
new_netns() {
  cni_netns | comm -13 "$W/before/netns" - 2>/dev/null || true
}

down() {
  [ -d "$W" ] || return 0
  W=$(cd "$W" && pwd -P)
  # Only a folder `up` made: whatever else it is, it is not this script's to take down.
  [ -f "$W/.cmpoll-node" ] || die "$W: not a folder node.sh up made (no .cmpoll-node): nothing done"
  stop_pid kubelet
  # Every container the kubelet left, then containerd.
  if [ -S /run/containerd/containerd.sock ]; then
    for id in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  pkill -KILL -f "containerd-shim-runc-v2 -namespace k8s.io .*-address /run/containerd/containerd.sock" 2>/dev/null || true
  stop_pid kube-proxy
  [ ! -x "$B/kube-proxy" ] || "$B/kube-proxy" --cleanup >/dev/null 2>&1 || true
  stop_pid kube-scheduler
  stop_pid kube-controller-manager
  stop_pid kube-apiserver
  stop_pid etcd
  # Mounts: the kubelet's and containerd's, deepest first.
  awk -v w="$W/" 'index($2, w) == 1 || index($2, "/run/containerd/") == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  for ns in $(new_netns); do ip netns delete "$ns" 2>/dev/null || true; done
  restore_rules iptables
  restore_rules ip6tables
  if [ -f "$W/before/sysctl" ]; then
    while IFS= read -r kv; do sysctl -qw "$kv" 2>/dev/null || true; done <"$W/before/sysctl"
  fi
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "/var/lib/cni/networks/$NET" /var/lib/cni/results/"$NET"-*
  if [ -f "$W/before/absent" ]; then
    while IFS= read -r d; do rm -rf "$d"; done <"$W/before/absent"
  fi
  # The pods' logs, where those folders were there before: only what is new.
  for d in /var/log/pods /var/log/containers; do
    [ -d "$d" ] && [ -f "$W/before/logs" ] || continue
    for e in "$d"/*; do [ ! -e "$e" ] || grep -qxF "$e" "$W/before/logs" || rm -rf "$e"; done
  done
  # What the logs said, kept for whoever must find out why.
  mkdir -p "$repo/target/cluster-logs" && cp -r "$W/log" "$repo/target/cluster-logs/$(basename "$W")" 2>/dev/null || true
  local left; left=$(leftovers)
  if [ -n "$left" ]; then
    echo "node.sh: down left behind:" >&2; echo "$left" >&2
    return 1
  fi
  rm -rf "$W"
}

# `up` that fails tears down what it started.
up_failed() {
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "node.sh: up failed; tearing down" >&2; down || true; }
  exit "$rc"
}

case "${1:-}" in
  check) check ;;
  up)
    W=${2:?a folder}; BIN=${3:-$repo/target/release/cmpoll}
    [ -d "$W" ] || die "$W: no such folder"
    W=$(cd "$W" && pwd -P)
    [ "$W" != / ] && [ -z "$(ls -A "$W")" ] || die "$W: not an empty folder"
    check
    # From here on, what fails is torn down: the marker says the folder is ours.
    echo "cmpoll-node" >"$W/.cmpoll-node"
    trap up_failed EXIT
    # OWNER: a pid whose end takes the node down (the test, killed before its own down).
    if [ -n "${4:-}" ]; then
      setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; "$2" down "$3"' _ "$4" "$here/node.sh" "$W" </dev/null >/dev/null 2>&1 &
    fi
    up ;;
  down) W=${2:?a folder}; down ;;
  *) echo "usage: node.sh check | up DIR [BIN [OWNER]] | down DIR" >&2; exit 2 ;;
esac
