#!/usr/bin/env bash
# Builds the real kube-apiserver, kubectl and etcd of go.mod into tests/kube/bin (git-ignored),
# the rest of a node for tests/cluster (kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy) with the CoreDNS kubeadm installs (../coredns), and the fleet benchmark's client-go informer (informer/) and short-watch
# poller (shortwatch/):
# from the Go module proxy, with Go's own module and build caches, so a second run is a link
# step or nothing. Prints the versions it built. Used by .ci/run and by the tests' README
# command; `tests/kube/build.sh --check` only says whether the binaries are up to date.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
mkdir -p bin
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s" | cut -d. -f2)
ld="-s -w"
# What k8s release builds stamp (hack/lib/version.sh): without it /version says v0.0.0.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
stamp="bin/.built-$(sha256sum go.mod go.sum build.sh informer/main.go shortwatch/main.go ../coredns/go.mod ../coredns/go.sum ../coredns/main.go | sha256sum | cut -c1-16)"
kube="kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy"
built() {
  [ -e "$stamp" ] && [ -x bin/etcd ] && [ -x bin/informer ] && [ -x bin/shortwatch ] && [ -x bin/coredns ] || return 1
  for b in $kube; do [ -x "bin/$b" ] || return 1; done
}
if [ "${1:-}" = "--check" ]; then
  built
  exit
fi
if ! built; then
  tags=selinux,notest,grpcnotrace
  for b in $kube; do
    go build -trimpath -tags "$tags" -ldflags "$ld" -o "bin/$b" "k8s.io/kubernetes/cmd/$b"
  done
  go build -trimpath -ldflags "-s -w" -o bin/etcd go.etcd.io/etcd/server/v3
  # The fleet benchmark's client-go informer (informer/main.go).
  go build -trimpath -ldflags "-s -w" -o bin/informer ./informer
  # Its candidate poller: a short watch from the last resourceVersion per poll (issue 31).
  go build -trimpath -ldflags "-s -w" -o bin/shortwatch ./shortwatch
  # The node's cluster DNS: CoreDNS at kubeadm's version, its own module (../coredns).
  (cd ../coredns && go build -trimpath -ldflags "-s -w" -o ../kube/bin/coredns .)
  rm -f bin/.built-*
  touch "$stamp"
fi
bin/kube-apiserver --version
bin/kubectl version --client 2>/dev/null | sed -n 1p
bin/etcd --version | sed -n 1p
bin/coredns -version | sed -n 1p
