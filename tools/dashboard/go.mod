// cmpoll's Grafana dashboard, made with Grafana's grafana-foundation-sdk (Apache-2.0): its
// typed builders are Grafana's own dashboard schema, so what this program prints is a
// dashboard Grafana imports as it is (k8s/monitoring/cmpoll-dashboard.json).
module cmpoll.test/dashboard

go 1.26.8

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
