// Alloy's command line, as Alloy's own main builds it (collector/main_alloy.go:
// flowcmd.RootCommand), without the experimental collector-engine subcommand, whose
// module (github.com/grafana/alloy/otel_engine, Alloy's collector/ folder) the module
// proxy cannot serve: its path does not match its folder.
package main

import (
	"os"

	"github.com/grafana/alloy/flowcmd"
)

func main() {
	if err := flowcmd.RootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
