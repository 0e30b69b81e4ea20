// Command dashboard prints cmpoll's Grafana dashboard (k8s/monitoring/cmpoll-dashboard.json)
// from Grafana's own typed dashboard model (grafana-foundation-sdk). tests/dashboard.rs
// checks that the committed file is what this prints, that every expression parses
// (promtool), and that every metric an expression names is one a running cmpoll exports.
//
//	go run . > ../../k8s/monitoring/cmpoll-dashboard.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// sel narrows every query to the chosen job and instances.
const sel = `job=~"$job", instance=~"$instance"`

var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(ds).Expr(expr).LegendFormat(legend)
}

func graph(title, description, unit string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Unit(unit).
		Min(0).
		Height(8).
		Span(12)
	for _, q := range queries {
		p = p.WithTarget(q)
	}
	return p
}

// single is a stat panel whose value turns red from `red` up (green below).
func single(title, description, expr, unit string, red float64) *stat.PanelBuilder {
	steps := []dashboard.Threshold{
		{Color: "green", Value: nil},
		{Color: "red", Value: cog.ToPtr(red)},
	}
	return stat.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Unit(unit).
		Height(4).
		Span(4).
		ColorMode(common.BigValueColorModeBackground).
		GraphMode(common.BigValueGraphModeNone).
		Thresholds(dashboard.NewThresholdsConfigBuilder().
			Mode(dashboard.ThresholdsModeAbsolute).
			Steps(steps)).
		WithTarget(query(expr, "{{instance}}").Instant())
}

func build() (dashboard.Dashboard, error) {
	return dashboard.NewDashboardBuilder("cmpoll").
		Uid("cmpoll").
		Description("cmpoll: polls, modules, events, rejections, reloads, the apiserver's answers, agent restarts and write failures").
		Tags([]string{"cmpoll", "kubernetes"}).
		Refresh("1m").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("job").
			Label("Job").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr(`label_values(cmpoll_build_info, job)`)}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Multi(true).
			IncludeAll(true).
			AllValue(".*")).
		WithVariable(dashboard.NewQueryVariableBuilder("instance").
			Label("Instance").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr(`label_values(cmpoll_build_info{job=~"$job"}, instance)`)}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Multi(true).
			IncludeAll(true).
			AllValue(".*")).
		WithRow(dashboard.NewRowBuilder("Now")).
		WithPanel(single("Since the last successful poll",
			"Seconds since each instance's last complete poll (the PrometheusRule warns after 5 minutes).",
			`max(time() - cmpoll_last_success_timestamp_seconds{`+sel+`})`, "s", 300)).
		WithPanel(single("Modules rejected",
			"Modules --validate (or a flat-layout name clash, or a failed .url fetch) rejects: the agent keeps their last good version. `cmpoll status` says why.",
			`sum(cmpoll_rejected_modules{`+sel+`})`, "none", 1)).
		WithPanel(single("Modules not written",
			"Modules the output folder could not write in the last batch; the next poll tries again.",
			`sum(cmpoll_module_write_failures{`+sel+`})`, "none", 1)).
		WithRow(dashboard.NewRowBuilder("Polls")).
		WithPanel(graph("Polls by result",
			"Polls per second, successful and failed. A failed poll changes nothing.",
			"reqps",
			query(`sum by (result) (rate(cmpoll_polls_total{`+sel+`}[$__rate_interval]))`, "{{result}}"))).
		WithPanel(graph("Poll duration",
			"Time to list, decode and hash one poll: median and 99th percentile.",
			"s",
			query(`histogram_quantile(0.5, sum by (le) (rate(cmpoll_poll_duration_seconds_bucket{`+sel+`}[$__rate_interval])))`, "p50"),
			query(`histogram_quantile(0.99, sum by (le) (rate(cmpoll_poll_duration_seconds_bucket{`+sel+`}[$__rate_interval])))`, "p99"))).
		WithPanel(graph("Modules",
			"Modules in the last complete poll, and selected objects that are not modules (invalid names or keys).",
			"none",
			query(`sum by (instance) (cmpoll_modules{`+sel+`})`, "modules {{instance}}"),
			query(`sum by (instance) (cmpoll_rejected_configmaps{`+sel+`})`, "not modules {{instance}}"))).
		WithPanel(graph("Events by type",
			"added, updated, removed and rejected events per second: what the agent heard.",
			"ops",
			query(`sum by (type) (rate(cmpoll_events_total{`+sel+`}[$__rate_interval]))`, "{{type}}"))).
		WithRow(dashboard.NewRowBuilder("Delivery")).
		WithPanel(graph("Rejected modules and validations",
			"Modules rejected, and --validate runs by result (fail: the module was refused; error: the validator could not run).",
			"none",
			query(`sum(cmpoll_rejected_modules{`+sel+`})`, "rejected"),
			query(`sum by (result) (increase(cmpoll_validations_total{`+sel+`}[$__rate_interval]))`, "validations {{result}}"))).
		WithPanel(graph("Reloads by result",
			"Signal deliveries, --on-change commands and reload URL calls, by result.",
			"none",
			query(`sum by (result) (increase(cmpoll_reloads_total{`+sel+`}[$__rate_interval]))`, "{{result}}"))).
		WithPanel(graph("Agent restarts and write failures",
			"Restarts of the supervised agent, and modules the output folder could not write.",
			"none",
			query(`sum(increase(cmpoll_child_restarts_total{`+sel+`}[$__rate_interval]))`, "agent restarts"),
			query(`sum(cmpoll_module_write_failures{`+sel+`})`, "modules not written"))).
		WithPanel(graph("Events recorded on objects",
			"--report-events: Kubernetes Events cmpoll recorded on ConfigMaps and Secrets (API calls), by result.",
			"none",
			query(`sum by (result) (increase(cmpoll_event_reports_total{`+sel+`}[$__rate_interval]))`, "{{result}}"))).
		WithRow(dashboard.NewRowBuilder("Apiserver")).
		WithPanel(graph("Apiserver requests by code",
			"Requests cmpoll made, by HTTP status code (error: no answer).",
			"reqps",
			query(`sum by (code) (rate(cmpoll_apiserver_requests_total{`+sel+`}[$__rate_interval]))`, "{{code}}"))).
		WithPanel(graph("Apiserver bytes read",
			"Body bytes read from the apiserver per second, after gzip decoding.",
			"Bps",
			query(`sum by (instance) (rate(cmpoll_apiserver_response_bytes_total{`+sel+`}[$__rate_interval]))`, "{{instance}}"))).
		Build()
}

func main() {
	d, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
