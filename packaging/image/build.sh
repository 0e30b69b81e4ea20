#!/usr/bin/env bash
# cmpoll's images, built here from what this machine has: no base image is pulled. The
# file tree of the Dockerfile's `runtime` stage (distroless/cc's, as far as cmpoll uses
# it): the binary at /usr/local/bin/cmpoll, exactly the shared libraries it links (ldd),
# Debian's CA bundle, /etc/passwd and /etc/group with distroless's nonroot (65532), /tmp
# (1777) and nonroot's home; no shell. Assembled with buildah from scratch (vfs storage),
# configured as the Dockerfile configures it (numeric user, entrypoint, OCI labels), with
# every timestamp at SOURCE_DATE_EPOCH so that the same inputs give the same image.
#
#   packaging/image/build.sh [BINARY [STORE]]
#
# BINARY: default target/release/cmpoll. STORE: buildah's storage (default
# target/image/store), where podman finds the images too (--root STORE/root --runroot
# STORE/run --storage-driver vfs). Makes three images, named as k8s/ names them:
#   ghcr.io/cmpoll/cmpoll:VERSION          CMD ["run"]      (the Dockerfile's default target)
#   ghcr.io/cmpoll/cmpoll:VERSION-sidecar  CMD ["sidecar"]  (its `sidecar` target)
#   ghcr.io/cmpoll/cmpoll:VERSION-webhook  CMD ["webhook"]  (its `webhook` target: with
#     /bin/sh and the tools validators use — Debian's static busybox — and curl; the
#     Dockerfile builds it on debian:bookworm-slim instead)
# and writes each as an OCI archive beside STORE (cmpoll-VERSION[-sidecar].oci.tar), the
# form `skopeo copy oci-archive:…` or `podman load` take. Needs buildah (Debian 12: 1.28),
# busybox-static and curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/cmpoll}
store=${2:-target/image/store}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
[ -x "$bin" ] || { echo "build.sh: $bin: no such executable (cargo build --release)" >&2; exit 2; }
mkdir -p "$store"
store=$(cd "$store" && pwd)
b() { buildah --storage-driver vfs --root "$store/root" --runroot "$store/run" "$@"; }

# Installs PROGRAM and the libraries it links (at the paths the loader looks in: ldd's
# own) into the tree ROOT, as DEST.
with_libraries() { # ROOT PROGRAM DEST
    install -D -m 0755 "$2" "$1$3"
    ldd "$2" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do
        [ -e "$1$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$1$lib"
    done
}

# The root file system: distroless/cc's, as far as cmpoll uses it.
runtime=$(mktemp -d)
webhook=$(mktemp -d)
trees=$(mktemp -d)
trap 'rm -rf "$runtime" "$webhook" "$trees"' EXIT
chmod 0755 "$runtime" "$webhook"
with_libraries "$runtime" "$bin" /usr/local/bin/cmpoll
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$runtime/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$runtime/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$runtime/etc/group"
chmod 0644 "$runtime/etc/passwd" "$runtime/etc/group"
install -d -m 1777 "$runtime/tmp"
install -d -m 0700 "$runtime/home/nonroot"
chown 65532:65532 "$runtime/home/nonroot"

# The -webhook image's: the same, with a POSIX shell and the tools --validate and
# --confirm scripts use (Debian's static busybox: sh, sed, awk, mktemp…), and Debian's
# curl with its libraries (k8s/alloy's confirm-modules.sh asks Alloy's API).
cp -a "$runtime/." "$webhook/"
busybox=$(command -v busybox || echo /bin/busybox)
[ -x "$busybox" ] || { echo "build.sh: busybox (Debian: busybox-static) is needed for the -webhook image" >&2; exit 2; }
ldd "$busybox" >/dev/null 2>&1 && { echo "build.sh: $busybox is not static (Debian: busybox-static)" >&2; exit 2; }
install -D -m 0755 "$busybox" "$webhook/bin/busybox"
for applet in sh cp mv rm ln mkdir rmdir mktemp cat sed awk tr printf sleep ls grep head \
    tail env test [ echo true false wc sort cut find xargs basename dirname date id chmod \
    touch tee uniq timeout readlink realpath stat; do
    ln -s busybox "$webhook/bin/$applet"
done
with_libraries "$webhook" "$(command -v curl)" /usr/bin/curl

for t in runtime webhook; do
    find "${!t}" -exec touch -h -d "@$epoch" {} +
    tar -C "${!t}" --sort=name --numeric-owner --mtime="@$epoch" -cf "$trees/$t.tar" .
done

labels=(
    --label "org.opencontainers.image.title=cmpoll"
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.licenses=Apache-2.0"
    --label "org.opencontainers.image.source=https://github.com/cmpoll/cmpoll"
)
image() { # NAME CMD DESCRIPTION ARCHIVE TREE
    local c
    c=$(b from --name "cmpoll-build-$$" scratch)
    # As a tar, so that owners stay what they are (copy would make them root's).
    b add --quiet "$c" "$trees/$5.tar" /
    b config --user 65532:65532 --entrypoint '["/usr/local/bin/cmpoll"]' --cmd "$2" \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --os linux --arch "$(go env GOARCH 2>/dev/null || dpkg --print-architecture)" \
        "${labels[@]}" --label "org.opencontainers.image.description=$3" "$c"
    b commit --quiet --timestamp "$epoch" --rm "$c" "$1" >/dev/null
    rm -f "$store/../$4.oci.tar"
    b push --quiet "$1" "oci-archive:$store/../$4.oci.tar:$1"
    echo "$1 $(b inspect --format '{{.FromImageID}}' "$1")"
}
image "ghcr.io/cmpoll/cmpoll:$version" run \
    "Labelled Kubernetes ConfigMaps as atomic files, a supervised agent, a reload URL or JSON events" \
    "cmpoll-$version" runtime
image "ghcr.io/cmpoll/cmpoll:$version-sidecar" sidecar \
    "A drop-in for kiwigrid/k8s-sidecar: its variables, cmpoll's polling and atomic, confined writes" \
    "cmpoll-$version-sidecar" runtime
image "ghcr.io/cmpoll/cmpoll:$version-webhook" webhook \
    "cmpoll with /bin/sh, for --validate: the admission webhook and validating daemons" \
    "cmpoll-$version-webhook" webhook
# What an earlier build left untagged.
b rmi --prune >/dev/null 2>&1 || true
