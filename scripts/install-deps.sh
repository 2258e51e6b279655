#!/usr/bin/env bash
# Installs the Debian 12 packages pdtrain needs to build, run and test.
# Idempotent and quiet when everything is already present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev
  libopenblas-dev
  libtrilinos-kokkos-dev
  libhdf5-openmpi-dev hdf5-tools
  libzstd-dev liblz4-dev
  libtoml11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev
  libisal-dev
  libboost-context-dev  # the emulated CUDA target's fibers (tests only)
)

# --slurm: also Slurm and munge, for the test that runs pdtrain under a real Slurm.
if [ "${1:-}" = "--slurm" ]; then
  PACKAGES+=(slurmctld slurmd slurm-client munge)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
