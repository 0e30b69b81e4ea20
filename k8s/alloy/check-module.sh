#!/bin/sh
# cmpoll's --validate for Alloy modules, in two steps, each Alloy's own:
# 1. each of the module's files as the app team wrote it ($CMPOLL_MODULE_DIR, the working
#    directory) must be one body in Alloy's grammar (`alloy fmt`): text that closes the
#    declare block it will be put in (a `}` game to reach the root) is refused here, in
#    Alloy's words (cmpoll refuses it too, by construction);
# 2. the module as cmpoll will write it ($CMPOLL_MODULE_FILE: its declare block and the
#    instantiation), checked by `alloy validate` beside the platform's root configuration
#    (ALLOY_ROOT), in a folder of their own. A syntax error, an unknown component or
#    attribute, a required argument the platform does not offer, a reference that does not
#    resolve (a root component is out of a declare block's scope): the module is rejected,
#    alone, and Alloy keeps its last good version.
# What `alloy validate` cannot see (a component that fails when it is built) is refused
# after delivery by confirm-modules.sh. ALLOY is the alloy binary (default: alloy on PATH).
set -eu
alloy=${ALLOY:-alloy}
for f in *; do
    [ -f "$f" ] || continue
    "$alloy" fmt "$f" >/dev/null
done
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
cp "${ALLOY_ROOT:?the platform root configuration}" "$t/root.alloy"
cp "$CMPOLL_MODULE_FILE" "$t/module.alloy"
cd "$t"
"$alloy" validate .
