// Alloy's command line, as Alloy's own main (flowcmd.RootCommand) builds it, without the
// collector-engine subcommand and the static-mode integrations (their dependencies are
// not served by the module proxy here).
package main

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grafana/alloy/internal/alloycli"
	"github.com/grafana/alloy/internal/build"
)

func main() {
	if build.Version == "" || build.Version == "v0.0.0" {
		build.Version = "v1.19.2"
	}
	// As flowcmd's init: alloy_build_info.
	prometheus.MustRegister(build.NewCollector("alloy"))
	if err := alloycli.Command().Execute(); err != nil {
		os.Exit(1)
	}
}
