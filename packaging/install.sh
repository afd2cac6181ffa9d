#!/usr/bin/env bash
# Install perseusd as a systemd service from this source tree (run as root; safe to run again).
#
#   packaging/install.sh [--prefix DIR] [--system-site-packages] [--cluster] [--metrics-http]
#                        [--metrics-textfile] [--no-start]
#   packaging/install.sh --uninstall [--prefix DIR] [--purge]
#
# Installs:
#   DIR (default /opt/perseusd)                     a virtual environment with perseusd (and nvidia-ml-py)
#   /usr/local/bin/perseusd, perseusctl              links into it
#   /etc/systemd/system/perseusd.service             the unit (plus a drop-in when DIR is not the default)
#   /etc/systemd/system/perseusd.service.d/perseusd-cluster.conf   with --cluster: TCP for the cluster's etcd
#   .../perseusd-metrics-http.conf, .../perseusd-metrics-textfile.conf   with --metrics-http / --metrics-textfile:
#                                                    what the Prometheus exposures need (docs/metrics.md)
#   /etc/sysusers.d/perseusd.conf                    groups perseus and perseus-admin (created now)
#   /etc/perseusd/perseusd.toml                      the commented example configuration, only if absent
# and enables and starts perseusd.service when systemd runs (not with --no-start).
# --uninstall stops and removes all of that; the configuration, /var/lib/perseusd and the groups stay unless
# --purge is given (the groups always stay: files may still belong to them).
set -euo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
DEFAULT_PREFIX=/opt/perseusd
PREFIX="$DEFAULT_PREFIX"
UNIT_DIR=/etc/systemd/system
UNIT="$UNIT_DIR/perseusd.service"
DROPIN_DIR="$UNIT_DIR/perseusd.service.d"
SYSUSERS=/etc/sysusers.d/perseusd.conf
CONFIG_DIR=/etc/perseusd
BIN_DIR=/usr/local/bin
action=install
site_packages=0
cluster=0
metrics_dropins=()
start=1
purge=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
log() { echo "install.sh: $*"; }
systemd_running() { [ -d /run/systemd/system ]; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX="${2:?--prefix needs a directory}"; shift ;;
    --system-site-packages) site_packages=1 ;;
    --cluster) cluster=1 ;;
    --metrics-http) metrics_dropins+=(perseusd-metrics-http.conf) ;;
    --metrics-textfile) metrics_dropins+=(perseusd-metrics-textfile.conf) ;;
    --no-start) start=0 ;;
    --uninstall) action=uninstall ;;
    --purge) purge=1 ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage 2 ;;
  esac
  shift
done
case "$PREFIX" in /*) ;; *) echo "install.sh: --prefix must be an absolute path" >&2; exit 2 ;; esac
if [ "$(id -u)" != 0 ]; then
  echo "install.sh: run as root (it installs a system service)" >&2
  exit 1
fi

install_venv() {
  if [ ! -x "$PREFIX/bin/python" ]; then
    local opts=()
    [ "$site_packages" = 1 ] && opts+=(--system-site-packages)
    log "creating the virtual environment $PREFIX"
    python3 -m venv "${opts[@]}" "$PREFIX"
  fi
  log "installing perseusd from $SRC into $PREFIX"
  "$PREFIX/bin/python" -m pip install -q --upgrade pip
  "$PREFIX/bin/python" -m pip install -q --upgrade "$SRC/client_lib" "$SRC[nvml]"
  # Journal logging and sd_notify through systemd-python where it builds; perseusd works without it.
  "$PREFIX/bin/python" -m pip install -q systemd-python 2>/dev/null \
    || log "systemd-python not installed (needs libsystemd-dev and pkg-config); using the built-in notify"
  for tool in perseusd perseusctl; do
    ln -sfn "$PREFIX/bin/$tool" "$BIN_DIR/$tool"
  done
}

install_unit() {
  install -D -m 0644 "$SRC/systemd/perseusd.service" "$UNIT"
  local prefix_dropin="$DROPIN_DIR/10-prefix.conf"
  if [ "$PREFIX" != "$DEFAULT_PREFIX" ]; then
    install -d -m 0755 "$DROPIN_DIR"
    printf '[Service]\nExecStart=\nExecStart=%s/bin/perseusd\nExecStopPost=\nExecStopPost=%s/bin/perseusd reset\n' \
      "$PREFIX" "$PREFIX" >"$prefix_dropin"
  else
    rm -f "$prefix_dropin"
  fi
  if [ "$cluster" = 1 ]; then
    install -D -m 0644 "$SRC/systemd/perseusd-cluster.conf" "$DROPIN_DIR/perseusd-cluster.conf"
  fi
  for dropin in "${metrics_dropins[@]}"; do
    install -D -m 0644 "$SRC/systemd/$dropin" "$DROPIN_DIR/$dropin"
  done
  install -D -m 0644 "$SRC/packaging/sysusers.d/perseusd.conf" "$SYSUSERS"
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$SYSUSERS"
  else
    getent group perseus >/dev/null || groupadd --system perseus
    getent group perseus-admin >/dev/null || groupadd --system perseus-admin
  fi
  install -d -m 0755 "$CONFIG_DIR"
  if [ ! -e "$CONFIG_DIR/perseusd.toml" ]; then
    install -m 0644 "$SRC/packaging/perseusd.toml" "$CONFIG_DIR/perseusd.toml"
  else
    log "keeping the existing $CONFIG_DIR/perseusd.toml"
  fi
}

start_service() {
  "$PREFIX/bin/perseusd" --check-config >/dev/null
  if ! systemd_running; then
    log "systemd is not running here: start perseusd.service later (systemctl enable --now perseusd)"
    return
  fi
  systemctl daemon-reload
  if [ "$start" = 1 ]; then
    systemctl enable perseusd.service
    systemctl restart perseusd.service
    log "perseusd.service is $(systemctl is-active perseusd.service)"
  fi
}

uninstall() {
  if systemd_running; then
    systemctl disable --now perseusd.service 2>/dev/null || true
  fi
  rm -f "$UNIT" "$DROPIN_DIR/10-prefix.conf" "$DROPIN_DIR/perseusd-cluster.conf" "$SYSUSERS" \
    "$DROPIN_DIR/perseusd-metrics-http.conf" "$DROPIN_DIR/perseusd-metrics-textfile.conf"
  rmdir "$DROPIN_DIR" 2>/dev/null || true
  for tool in perseusd perseusctl; do
    if [ "$(readlink "$BIN_DIR/$tool" 2>/dev/null)" = "$PREFIX/bin/$tool" ]; then
      rm -f "$BIN_DIR/$tool"
    fi
  done
  if [ -x "$PREFIX/bin/python" ] && [ -f "$PREFIX/pyvenv.cfg" ]; then
    rm -rf "$PREFIX"
  fi
  if [ "$purge" = 1 ]; then
    rm -rf "$CONFIG_DIR" /var/lib/perseusd
  fi
  if systemd_running; then
    systemctl daemon-reload
  fi
  log "perseusd uninstalled"
}

if [ "$action" = uninstall ]; then
  uninstall
else
  install_venv
  install_unit
  start_service
  log "done: $UNIT, $CONFIG_DIR/perseusd.toml, $PREFIX"
fi
