#!/bin/sh
# cmpoll's --validate for Alloy modules: the module as cmpoll will write it
# ($CMPOLL_MODULE_FILE: its declare block and the instantiation), checked by Alloy's own
# `alloy validate` beside the platform's root configuration (ALLOY_ROOT), in a folder of
# their own. A syntax error, an unknown component, a required argument the platform does
# not offer, a reference that does not resolve: the module is rejected, alone, and Alloy
# keeps its last good version. ALLOY is the alloy binary (default: alloy on PATH).
set -eu
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
cp "${ALLOY_ROOT:?the platform root configuration}" "$t/root.alloy"
cp "$CMPOLL_MODULE_FILE" "$t/module.alloy"
cd "$t"
"${ALLOY:-alloy}" validate .
