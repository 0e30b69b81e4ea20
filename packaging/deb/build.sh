#!/usr/bin/env bash
# Builds cmpoll's Debian package for the systemd shape with dpkg-deb (Debian's own tool):
#   packaging/deb/build.sh [BINARY] [OUT_DIR]     (default: target/release/cmpoll, target/debian)
# prints the path of the .deb. The package holds the binary (/usr/bin/cmpoll), the unit,
# the sysusers and tmpfiles entries, a default environment file (a conffile), and the
# agent drop-in example; maintainer scripts create the user and folders on install, stop
# the service on removal, and on purge remove what dpkg does not (nothing of
# /var/lib/cmpoll: the modules the agent reads are the operator's data).
# tests/deb.rs builds it, checks it with lintian, installs, verifies and purges it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${1:-$repo/target/release/cmpoll}"
out="${2:-$repo/target/debian}"
[ -x "$bin" ] || { echo "build.sh: no binary at $bin (cargo build --release)" >&2; exit 2; }
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)"
arch="$(dpkg --print-architecture)"
head -n 1 "$here/changelog" | grep -q "^cmpoll ($version-1) " ||
  { echo "build.sh: packaging/deb/changelog does not start with version $version-1 (Cargo.toml)" >&2; exit 2; }
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT

install -D -m 0755 "$bin" "$root/usr/bin/cmpoll"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/cmpoll" 2>/dev/null || true
# The unit as systemd/ ships it, with the packaged binary's path.
install -d "$root/usr/lib/systemd/system"
sed 's|^ExecStart=/usr/local/bin/cmpoll |ExecStart=/usr/bin/cmpoll |' "$repo/systemd/cmpoll.service" \
  > "$root/usr/lib/systemd/system/cmpoll.service"
grep -q '^ExecStart=/usr/bin/cmpoll ' "$root/usr/lib/systemd/system/cmpoll.service"
chmod 0644 "$root/usr/lib/systemd/system/cmpoll.service"
install -D -m 0644 "$repo/systemd/cmpoll.sysusers" "$root/usr/lib/sysusers.d/cmpoll.conf"
install -D -m 0644 "$here/cmpoll.tmpfiles" "$root/usr/lib/tmpfiles.d/cmpoll.conf"
install -D -m 0644 "$repo/systemd/cmpoll.env" "$root/etc/cmpoll/cmpoll.env"
doc="$root/usr/share/doc/cmpoll"
install -D -m 0644 "$here/agent-dropin.conf" "$doc/examples/agent-dropin.conf"
install -m 0644 "$here/copyright" "$doc/copyright"
install -D -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/cmpoll"
gzip -9n -c "$here/changelog" > "$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

install -d "$root/DEBIAN"
for s in postinst prerm postrm; do install -m 0755 "$here/$s" "$root/DEBIAN/$s"; done
echo /etc/cmpoll/cmpoll.env > "$root/DEBIAN/conffiles"
size="$(du -k -s --exclude=DEBIAN "$root" | cut -f1)"
cat > "$root/DEBIAN/control" <<CONTROL
Package: cmpoll
Version: $version-1
Architecture: $arch
Maintainer: cmpoll maintainers <cmpoll@example.org>
Installed-Size: $size
Depends: libc6 (>= 2.34), libgcc-s1, systemd, init-system-helpers (>= 1.54~)
Section: admin
Priority: optional
Homepage: https://example.org/cmpoll
Description: labelled Kubernetes ConfigMaps as files for a local agent
 cmpoll lists the Kubernetes ConfigMaps (or Secrets) that match a label
 selector through the apiserver's REST API on an interval, and hands each one
 to an agent (Grafana Alloy, Prometheus, nginx, anything with a config folder)
 as atomically written files, with a reload signal, URL or command; with a
 validator, only the last good version reaches the agent.
 .
 This package runs it as a systemd service (the user cmpoll, /var/lib/cmpoll):
 set the apiserver and selection in /etc/cmpoll/cmpoll.env, put the token in
 /etc/cmpoll/token, then systemctl enable --now cmpoll.
CONTROL
mkdir -p "$out"
deb="$out/cmpoll_${version}-1_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
