// CoreDNS v1.14.6, the version kubeadm v1.37 installs (its constants.CoreDNSVersion), for
// the real node of tests/cluster: coremain as CoreDNS's own main runs it, with the plugins
// kubeadm's default Corefile names (errors, health, ready, kubernetes, prometheus, forward,
// cache, loop, reload, loadbalance) instead of all of core/plugin — CoreDNS's documented
// way to build with a chosen plugin set, and a third of the build.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
