#!/usr/bin/env bash
# install-deps.sh — install the Debian packages prl needs (skips what is already there), then
# the npm packages of the tests in tests/js (install-npm.sh): the tokenizer cross-check's, the
# gateway's client test's and the `prl report` page test's. chromium: that test's headless browser.
# libopenmpi-dev, openmpi-bin: the data-parallel trainer (trainer.ranks; mpirun).
# Needs root (or sudo) the first time; safe to run again.
set -euo pipefail
packages=(build-essential cmake pkg-config libzmq3-dev libjansson-dev libsqlite3-dev
          libopenblas-dev check libseccomp-dev python3-torch python3-numpy sqlite3
          clang-format clang libclang-rt-dev libpcre2-dev libutf8proc-dev help2man chromium
          libmicrohttpd-dev tcpdump iproute2 libopenmpi-dev openmpi-bin libpython3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# the tokenizer cross-check's npm packages (and nodejs when node is missing)
"$(dirname "$0")/install-npm.sh"
