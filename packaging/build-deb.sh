#!/usr/bin/env bash
# Build the Debian package of perseusd from this source tree with dpkg-deb (no root needed).
#
#   packaging/build-deb.sh [--version VERSION] [--out DIR]
#
# The package installs
#   /opt/perseusd/lib/python        perseusd, the client library it depends on (perseus_client, from
#                                   client_lib/) and their Python dependencies (numpy, scipy, scikit-learn,
#                                   pyzmq, prometheus-client, nvidia-ml-py), for Debian's python3 (3.11)
#   /opt/perseusd/bin/perseusd, perseusctl   entry points (the unit's ExecStart= path), linked from /usr/bin
#   /lib/systemd/system/perseusd.service     the unit, unchanged
#   /usr/share/perseusd/systemd/*.conf       the optional drop-ins (cluster, metrics over HTTP or textfile,
#                                            containers)
#   /usr/lib/sysusers.d/perseusd.conf, /usr/lib/tmpfiles.d/perseusd.conf
#   /etc/perseusd/perseusd.toml              the commented example configuration (a conffile)
# Its maintainer scripts create the groups, enable and start the service, and on removal stop (which
# restores every GPU) and disable it. Needs dpkg-deb and a Python 3.11 with pip ($PYTHON, default python3);
# the dependencies come from PyPI (or pip's cache, or $PIP_FIND_LINKS).
set -euo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VERSION=""
OUT="$SRC/dist"

while [ $# -gt 0 ]; do
  case "$1" in
    --version) VERSION="${2:?--version needs a value}"; shift ;;
    --out) OUT="${2:?--out needs a directory}"; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-deb.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

command -v dpkg-deb >/dev/null || { echo "build-deb.sh: dpkg-deb is missing (Debian package dpkg)" >&2; exit 1; }
py_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$py_version" != 3.11 ]; then
  echo "build-deb.sh: $PYTHON is Python $py_version; the package targets Debian 12's Python 3.11" >&2
  exit 1
fi
[ -n "$VERSION" ] || VERSION="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("'"$SRC"'/pyproject.toml", "rb"))["project"]["version"])')"
ARCH="$(dpkg --print-architecture)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
lib="$root/opt/perseusd/lib/python"
mkdir -p "$lib" "$root/opt/perseusd/bin" "$root/usr/bin" "$root/DEBIAN"

echo "build-deb.sh: installing perseusd $VERSION and its dependencies into /opt/perseusd/lib/python"
# A copy of the tracked source (no .venv, caches or build outputs of this checkout).
mkdir "$work/src"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$SRC" ls-files -z --cached --others --exclude-standard | (cd "$SRC" && xargs -0 cp --parents -t "$work/src")
else  # an unpacked source tarball
  tar -C "$SRC" --exclude=.venv --exclude=.cache --exclude=build --exclude=dist --exclude=out -cf - . | tar -C "$work/src" -xf -
fi
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile --target "$lib" \
  "$work/src/client_lib" "$work/src[nvml]"
rm -rf "$lib/bin"
# Test suites of the dependencies are not needed at run time (a third of scipy's size).
find "$lib" -depth -type d \( -name tests -o -name testing -o -name __pycache__ \) -path "*/scipy/*" -exec rm -rf {} +
find "$lib" -depth -type d -name tests -path "*/numpy/*" -exec rm -rf {} +

for tool in perseusd:perseusd.daemon.main perseusctl:perseusd.ctl.main; do
  name="${tool%%:*}"
  module="${tool#*:}"
  # -s -E: no user site directory, no PYTHON* variables; the path is set here, not in the environment, so
  # commands that perseusctl runs (perseusctl measure) do not inherit it.
  cat >"$root/opt/perseusd/bin/$name" <<SCRIPT
#!/usr/bin/python3 -sE
import sys
sys.path.insert(0, "/opt/perseusd/lib/python")
from $module import main
if __name__ == "__main__":  # the solver's forkserver imports this file as __mp_main__: never a second daemon
    sys.exit(main())
SCRIPT
  chmod 0755 "$root/opt/perseusd/bin/$name"
  ln -s "/opt/perseusd/bin/$name" "$root/usr/bin/$name"
done

install -D -m 0644 "$SRC/systemd/perseusd.service" "$root/lib/systemd/system/perseusd.service"
for dropin in perseusd-cluster.conf perseusd-metrics-http.conf perseusd-metrics-textfile.conf perseusd-containers.conf; do
  install -D -m 0644 "$SRC/systemd/$dropin" "$root/usr/share/perseusd/systemd/$dropin"
done
install -D -m 0644 "$SRC/packaging/perseusd-grafana.json" "$root/usr/share/perseusd/grafana/perseusd.json"
install -D -m 0644 "$SRC/packaging/sysusers.d/perseusd.conf" "$root/usr/lib/sysusers.d/perseusd.conf"
install -D -m 0644 "$SRC/packaging/tmpfiles.d/perseusd.conf" "$root/usr/lib/tmpfiles.d/perseusd.conf"
install -D -m 0644 "$SRC/packaging/perseusd.toml" "$root/etc/perseusd/perseusd.toml"
install -D -m 0644 "$SRC/README.md" "$root/usr/share/doc/perseusd/README.md"

size_kb="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE_KB@/$size_kb/" \
  "$SRC/packaging/debian/control.in" >"$root/DEBIAN/control"
echo /etc/perseusd/perseusd.toml >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  install -m 0755 "$SRC/packaging/debian/$script" "$root/DEBIAN/$script"
done

mkdir -p "$OUT"
deb="$OUT/perseusd_${VERSION}_${ARCH}.deb"
# gzip -1: a few seconds instead of a minute for xz, at a larger file.
dpkg-deb --root-owner-group -Zgzip -z1 --build "$root" "$deb" >/dev/null
echo "$deb"
