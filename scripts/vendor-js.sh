#!/usr/bin/env bash
# vendor-js.sh — fetch the plotting library of `prl report` (uPlot, MIT) from npm at a pinned
# version and copy its minified build, its stylesheet and its LICENSE into report/vendor/,
# where they are committed: the build embeds them into the prl binary, so `prl report` needs
# neither the network nor node at run time. Run it only to change the version (then commit
# report/vendor/); the build never runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
name=uplot version=1.6.32
# the registry's sha512 of the tarball at that version: npm pack checks it, and so do we
integrity=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
npm pack --silent --pack-destination "$tmp" "$name@$version" >/dev/null
tgz="$tmp/$name-$version.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
[ "$got" = "$integrity" ] || { echo "vendor-js: $tgz has $got, expected $integrity" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp" package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE
out=report/vendor
mkdir -p "$out"
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$out/"
cp "$tmp/package/LICENSE" "$out/uPlot.LICENSE"
echo "$name $version $integrity" > "$out/VERSION"
echo "vendor-js: $name $version in $out/"
