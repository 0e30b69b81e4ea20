#!/usr/bin/env bash
# Builds a real Grafana Alloy (v1.19.2, Apache-2.0) into tests/alloy/bin/alloy from the Go
# module proxy: Alloy's own command line (internal/alloycli: run, fmt, validate) with the
# components of components.txt. Alloy's full binary cannot be built here: 81 modules it
# needs are not served by the proxy (OpenTelemetry collector-contrib receivers and
# exporters, DataDog agent packages, Grafana's exporter forks; README.md lists them).
# So Alloy's source is copied from the module cache into build/src with two files
# patched, and built with a replace directive:
#   - internal/component/all/all.go: only the components of components.txt;
#   - internal/converter/converter.go: no converters from other formats (otelcol,
#     prometheus, promtail, static), whose dependencies are among those not served.
# Everything else (the runtime, the loader, declare blocks and custom components, the
# HTTP service with /-/reload and the components API, validate, fmt) is Alloy's code.
# A stamp makes a second run a no-op. Used by .ci/run; `--check` says if bin/ is current.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
# Grafana's forks and a few pseudo-versions are served by the proxy but not listed in
# sum.golang.org; go.sum (committed) pins their hashes.
export GONOSUMDB="github.com/grafana,github.com/hashicorp/go-discover"
version=v1.19.2
stamp="bin/.built-$(cat go.mod go.sum main.go components.txt build.sh | sha256sum | cut -c1-16)"
if [ "${1:-}" = "--check" ]; then
  [ -e "$stamp" ] && [ -x bin/alloy ]
  exit
fi
if [ ! -e "$stamp" ] || [ ! -x bin/alloy ]; then
  src=$(cd / && go mod download -json "github.com/grafana/alloy@$version" \
    | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  rm -rf build/src && mkdir -p build bin
  cp -r "$src" build/src && chmod -R u+w build/src
  python3 - components.txt <<'PY'
import sys
keep = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith('#')]
p = 'build/src/internal/component/all/all.go'
lines = open(p).read().splitlines()
out = [l for l in lines
       if not l.strip().startswith('_ "')
       or any(l.strip().startswith(f'_ "github.com/grafana/alloy/internal/component/{k}"') for k in keep)]
kept = sum(1 for l in out if l.strip().startswith('_ "'))
assert kept == len(keep), f"components.txt names {len(keep)} components, all.go has {kept} of them"
open(p, 'w').write('\n'.join(out) + '\n')
p = 'build/src/internal/converter/converter.go'
s = open(p).read()
for conv in ['otelcolconvert', 'prometheusconvert', 'promtailconvert', 'staticconvert']:
    line = f'\t"github.com/grafana/alloy/internal/converter/internal/{conv}"\n'
    assert line in s, conv
    s = s.replace(line, '')
start = s.index('func Convert(')
end = s.index('\n}\n', start) + 3
s = s[:start] + '''func Convert(in []byte, kind Input, extraArgs []string) ([]byte, diag.Diagnostics) {
	var diags diag.Diagnostics
	diags.Add(diag.SeverityLevelCritical, fmt.Sprintf("converting %q configurations is not in this build (cmpoll tests/alloy)", kind))
	return nil, diags
}
''' + s[end:]
open(p, 'w').write(s)
PY
  go build -trimpath -tags netgo \
    -ldflags "-s -w -X github.com/grafana/alloy/internal/build.Version=$version" \
    -o bin/alloy .
  rm -f bin/.built-*
  touch "$stamp"
fi
bin/alloy --version | sed -n 1p
