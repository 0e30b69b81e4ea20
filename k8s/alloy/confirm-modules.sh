#!/bin/sh
# cmpoll's --confirm for Alloy modules: after cmpoll has written a batch, ask Alloy
# itself which of the modules it delivered ($CMPOLL_MODULES, one namespace/name per line)
# it refused. Alloy reloads the folder (POST /-/reload: a component that fails to build
# leaves the others running and is reported, with a 400), then its API says, per module,
# whether the module's declare block was built and evaluated
# (/api/v0/web/components: the root-level instance IDENT.module, healthy or not). Each
# module that is unhealthy or missing (the reload's error, when it names the module's
# file, says why) is printed as
# "namespace/name reason": cmpoll puts back its last good version (or removes it) and
# calls this again, so the folder never keeps a module that would stop Alloy starting.
# Exit 0: Alloy answered. Exit 1: Alloy could not be asked: cmpoll puts back what Alloy
# had before the batch (an Alloy that cannot start because of the batch starts again on
# the folder without it) and the batch comes again with the next poll.
# ALLOY_URL: Alloy's HTTP server (default http://127.0.0.1:12345); ALLOY_WAIT: how long to
# wait for it to be ready, in seconds (default 20; keep it under cmpoll's
# --validate-timeout). Needs curl, sed and awk.
set -u
url=${ALLOY_URL:-http://127.0.0.1:12345}
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
# Alloy starting beside cmpoll: wait for its server.
i=0
until curl -fsS -m 5 -o /dev/null "$url/-/ready" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -ge "${ALLOY_WAIT:-20}" ]; then
        echo "confirm-modules: Alloy at $url is not ready" >&2
        exit 1
    fi
    sleep 1
done
code=$(curl -sS -m 60 -o "$t/reload" -w '%{http_code}' -X POST "$url/-/reload") || {
    echo "confirm-modules: POST $url/-/reload failed" >&2
    exit 1
}
curl -fsS -m 30 -o "$t/components" "$url/api/v0/web/components" || {
    echo "confirm-modules: GET $url/api/v0/web/components failed" >&2
    exit 1
}
# One line per root-level module instance: IDENT STATE MESSAGE.
sed 's/{"name":"/\n&/g' "$t/components" |
    sed -n 's/.*"localID":"\([A-Za-z0-9_]*\)\.module","moduleID":""[^{]*"health":{"state":"\([a-z]*\)","message":"\(\([^"\\]\|\\.\)*\)".*/\1 \2 \3/p' \
        >"$t/health"
if [ "$code" = 200 ]; then : >"$t/reload"; fi
tr '\n' ' ' <"$t/reload" >"$t/reload1"
# Each module, with the identifier module.tmpl gives it (cmpoll's ident).
printf '%s' "${CMPOLL_MODULES:-}" | awk -v health="$t/health" -v reload="$t/reload1" '
function ident(id,   s) {
    s = id
    gsub(/-/, "_", s); gsub(/\./, "_D_", s); gsub(/\//, "_S_", s)
    if (s ~ /^[0-9]/) s = "N" s
    return s
}
BEGIN {
    while ((getline line < health) > 0) {
        split(line, f, " ")
        state[f[1]] = f[2]
        msg[f[1]] = substr(line, length(f[1]) + length(f[2]) + 3)
    }
    getline failed < reload
}
NF == 1 {
    id = $1; n = ident(id)
    file = id; sub(/\//, ".", file); file = "/" file ".alloy:"
    # The health Alloy gives this module decides. The reload error only explains a
    # module Alloy did not load at all: an error of another module may quote any text,
    # the name of this module file too, so it never refuses a module Alloy built.
    if (n in state) {
        if (state[n] != "healthy") {
            m = msg[n]; gsub(/\\"/, "\"", m)
            print id, "alloy: " n ".module " state[n] ": " m
        }
    } else if (failed != "" && (at = index(failed, file)) > 0) {
        print id, "alloy did not load " n ".module: " substr(failed, at + 1)
    } else {
        print id, "alloy did not load " n ".module" (failed != "" ? " (its reload failed)" : "")
    }
}'
