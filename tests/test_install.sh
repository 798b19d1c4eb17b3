#!/usr/bin/env bash
# test_install.sh — `cmake --install` into a fresh prefix puts prl, libprl (with its public
# headers), prl.pc, the licences (prl's, and uPlot's that prl report pages carry) and a man page
# per command in place; a C program outside the tree, built with `pkg-config --cflags --libs
# prl`, runs the engine and saves a checkpoint bitwise equal to the installed `prl init`'s.
# Usage: test_install.sh BUILD_DIR SRC_DIR
set -uo pipefail
build=$1 src=$2
. "$src/tests/lib.sh"   # work, ok, bad, expect_fail, expect_ok, summary
prefix=$work/prefix

if cmake --install "$build" --prefix "$prefix" > "$work/install.out" 2>&1; then ok "cmake --install"
else bad "cmake --install: $(tail -5 "$work/install.out")"; summary; fi
for f in bin/prl lib/libprl.so include/prl/engine/engine.h include/prl/engine/model.h \
         lib/pkgconfig/prl.pc share/doc/prl/LICENSE share/doc/prl/uPlot.LICENSE \
         share/man/man1/prl.1 share/man/man1/prl-init.1 share/man/man1/prl-report.1 \
         share/man/man1/prl-tasks-generate.1 share/man/man1/prl-role-controller.1; do
  [ -e "$prefix/$f" ] && ok "installed $f" || bad "missing $f"
done
grep -q '^\.TH PRL-INIT ' "$prefix/share/man/man1/prl-init.1" && grep -q 'initialisation seed' "$prefix/share/man/man1/prl-init.1" \
  && ok "man page from --help" || bad "man page: $(head -3 "$prefix/share/man/man1/prl-init.1")"
nm -D --defined-only "$prefix/lib/libprl.so" | awk '{print $3}' | grep -v '^prl_' | grep -q . \
  && bad "libprl exports names outside prl_*" || ok "libprl exports prl_* only"
expect_ok "installed prl --version" "$prefix/bin/prl" --version

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs prl) && ok "pkg-config prl: $flags" || bad "pkg-config prl"
if cc -std=c11 -O2 "$src/tests/data/engine_client.c" -o "$work/engine_client" $flags 2> "$work/cc.out"; then
  ok "a program built with pkg-config"
else bad "building with pkg-config: $(cat "$work/cc.out")"; fi
cfg=$src/configs/models/micro.json
expect_ok "the program runs the engine" env LD_LIBRARY_PATH="$prefix/lib" "$work/engine_client" "$cfg" 3 "$work/client_ckpt"
grep -Eq "parameters, loss [0-9]+\.[0-9]+" "$work/last.out" && ok "a finite loss" || bad "client: $(cat "$work/last.out")"
expect_ok "installed prl init" "$prefix/bin/prl" init --model "$cfg" --seed 3 --out "$work/prl_ckpt"
cmp -s "$work/client_ckpt/model.safetensors" "$work/prl_ckpt/model.safetensors" \
  && ok "libprl and prl make the same checkpoint" || bad "libprl's checkpoint differs from prl init's"
summary
