#!/usr/bin/env bash
# The client library's tests on every Python it supports (3.10-3.13), each in a small virtual environment
# with only pyzmq, pytest and the client (client_lib, installed as the `perseusd-client` distribution). The
# daemon those tests start runs on the project's own environment (.venv, Python 3.11+).
#
# Interpreters are found on the PATH (python3.X), under pyenv ($PYENV_ROOT/versions/3.X.*) or by uv, and
# installed with pyenv or uv when missing; one that cannot be had is reported loudly and skipped (set
# PERSEUS_REQUIRE_ALL_PYTHONS=1 to fail instead). Run from scripts/test.sh; alone: scripts/test_client_pythons.sh
set -uo pipefail
cd "$(dirname "$0")/.."
VERSIONS=(${PERSEUS_CLIENT_PYTHONS:-3.10 3.11 3.12 3.13})
TESTS=(
  tests/client/test_fail_open.py
  tests/client/test_client_e2e.py
  tests/client/test_client_errors.py
  tests/client/test_devices.py
  tests/client/test_event_transport.py
  tests/client/test_protocol_versions.py
  tests/client/test_straggler_client.py
)
ENVS=.cache/client-pythons
DAEMON_PYTHON="$PWD/.venv/bin/python"
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"

find_python() {  # prints the path of a Python $1 (e.g. 3.10), or nothing
  local version=$1 candidate
  for candidate in "python$version" "$PYENV_ROOT/versions/$version".*/bin/"python$version"; do
    candidate=$(command -v "$candidate" 2>/dev/null) || continue
    if "$candidate" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$version')" \
      2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  if command -v uv >/dev/null; then uv python find "$version" 2>/dev/null; fi
}

install_python() {  # tries pyenv, then uv (both need their download sites; quiet when they fail)
  local version=$1 latest
  if command -v pyenv >/dev/null || [ -x "$PYENV_ROOT/bin/pyenv" ]; then
    local pyenv; pyenv=$(command -v pyenv || echo "$PYENV_ROOT/bin/pyenv")
    latest=$("$pyenv" install --list 2>/dev/null | tr -d ' ' | grep -E "^$version\.[0-9]+$" | tail -1)
    [ -n "$latest" ] && timeout 900 "$pyenv" install -s "$latest" >/dev/null 2>&1
  fi
  if [ -z "$(find_python "$version")" ] && command -v uv >/dev/null; then
    timeout 300 uv python install "$version" >/dev/null 2>&1
  fi
}

missing=()
failed=()
for version in "${VERSIONS[@]}"; do
  python=$(find_python "$version")
  if [ -z "$python" ]; then
    install_python "$version"
    python=$(find_python "$version")
  fi
  if [ -z "$python" ]; then
    missing+=("$version")
    continue
  fi
  env="$ENVS/py$version"
  if [ ! -x "$env/bin/python" ]; then
    "$python" -m venv "$env" || { failed+=("$version (venv)"); continue; }
  fi
  if ! { "$env/bin/python" -m pip install -q --disable-pip-version-check pyzmq pytest pytest-timeout \
    && "$env/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall ./client_lib
  } >"$env/install.log" 2>&1; then
    cat "$env/install.log" >&2
    failed+=("$version (install)")
    continue
  fi
  echo "== client tests on $("$env/bin/python" -V 2>&1) ($python)"
  if ! PERSEUSD_TEST_DAEMON_PYTHON="$DAEMON_PYTHON" "$env/bin/python" -m pytest -q -p no:cacheprovider \
    "${TESTS[@]}"; then
    failed+=("$version")
  fi
  rm -rf client_lib/build client_lib/*.egg-info
done

if [ "${#missing[@]}" -gt 0 ]; then
  {
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! the client's tests did NOT run on Python ${missing[*]}: no interpreter found (PATH, pyenv, uv)"
    echo "!!! and none could be installed. Install one (pyenv install ${missing[0]}) and run $0 again."
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  } >&2
  [ "${PERSEUS_REQUIRE_ALL_PYTHONS:-0}" = 1 ] && exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "client tests failed on Python ${failed[*]}" >&2
  exit 1
fi
echo "client tests passed on Python $(printf '%s ' "${VERSIONS[@]}" | sed 's/ $//')${missing:+ (not run: ${missing[*]})}"
