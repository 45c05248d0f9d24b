#!/usr/bin/env bash
# Installs the Debian parts of the real single-node cluster (make cluster, make test-cluster):
# containerd and runc (the container runtime), the CNI plugins (bridge, host-local, loopback,
# portmap) and nftables (the `nft` command kube-proxy's nftables mode runs). Idempotent: it
# asks apt only for what is missing, and does nothing when all of it is installed.
set -euo pipefail

# package:command-or-file that shows it is installed
want=(
  containerd:/usr/bin/containerd
  runc:/usr/sbin/runc
  containernetworking-plugins:/usr/lib/cni/bridge
  nftables:/usr/sbin/nft
)
missing=()
for w in "${want[@]}"; do
  pkg="${w%%:*}" path="${w#*:}"
  if [[ ! -x "${path}" ]] || ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("${pkg}")
  fi
done
[[ ${#missing[@]} -gt 0 ]] || exit 0

if [[ $(id -u) != 0 ]]; then
  echo "the real cluster needs root to install ${missing[*]} (and to run)" >&2
  exit 1
fi
echo "==> apt-get install -y ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Only the packages: no service is started (a policy-rc.d that refuses every start keeps
# containerd's own service off; the cluster runs its own containerd inside its namespaces).
policy=/usr/sbin/policy-rc.d
had_policy=0
[[ -e ${policy} ]] && had_policy=1
if [[ ${had_policy} == 0 ]]; then
  printf '#!/bin/sh\nexit 101\n' >"${policy}"
  chmod 755 "${policy}"
  trap 'rm -f "${policy}"' EXIT
fi
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
  { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
