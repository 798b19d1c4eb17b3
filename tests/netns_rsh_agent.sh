#!/bin/sh
# netns_rsh_agent.sh — mpirun's rsh agent for tests/test_multihost.sh, where the hosts are
# network namespaces (OMPI_MCA_plm_rsh_agent=this file). mpirun calls it as ssh:
# `AGENT HOST COMMAND...`, COMMAND being the orted that starts the ranks on HOST. HOST is an
# address that PRL_NETNS_HOSTS maps to its namespace ("10.0.0.2=nsB ..."); there COMMAND
# runs in a mount namespace of its own where PRL_NETNS_HIDE (host A's folder) is an empty
# tmpfs, as on a host that shares no directory with A. Each call is appended to
# PRL_NETNS_LOG, if set.
set -eu
host=$1
shift
ns=$(printf '%s\n' ${PRL_NETNS_HOSTS:-} | sed -n "s/^$host=//p")
[ -n "$ns" ] || { echo "netns_rsh_agent: no namespace for host $host (PRL_NETNS_HOSTS)" >&2; exit 255; }
[ -z "${PRL_NETNS_LOG:-}" ] || echo "$host -> $ns: $*" >> "$PRL_NETNS_LOG"
exec ip netns exec "$ns" unshare -m --propagation private sh -c \
  'mount -t tmpfs none "$0" && exec sh -c "$1"' "${PRL_NETNS_HIDE:?}" "$*"
