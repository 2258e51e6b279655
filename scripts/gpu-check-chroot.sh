#!/usr/bin/env bash
# Checks a gpu-check bundle on a bare system before it travels: runs `scripts/gpu-check.sh run`
# (or another gpu-check.sh command) inside a minimal Debian 12 root that has none of
# pdtrain's packages (no Open MPI, HDF5, BLAS, ...), so everything must come from the bundle.
# Needs root (debootstrap, chroot, mounts). No GPU: the GPU steps report SKIP.
#
#   scripts/gpu-check-chroot.sh [ROOT] [-- gpu-check.sh ARGS...]   (default: /srv/gpucheck-root, run)
#
# Makes ROOT with `debootstrap --variant=minbase bookworm` when it is missing (plus xz-utils,
# which `run` needs to unpack), copies the working tree (git ls-files, as the device tool
# does) and gpu-bundle/ to ROOT/root/pdtrain (deliberately not the build's source path),
# refuses a root that has any of pdtrain's runtime packages, and runs the command in a private
# mount namespace (proc, sys, dev, a tmpfs on /dev/shm and /tmp, and this machine's
# /usr/local/cuda read-only, as a GPU machine has a toolkit), so every mount goes when it ends.
# GPU_CHECK_* variables pass through (e.g. GPU_CHECK_ONLY, GPU_CHECK_LIBSTDCXX=bundle).
# The log comes back to ./gpu-check-out/ (chroot-gpu-check.log, chroot-gpu-check-summary.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=/srv/gpucheck-root
if [[ $# -gt 0 && $1 != -- ]]; then ROOT=$1; shift; fi
[[ ${1:-} == -- ]] && shift
args=("$@"); [[ ${#args[@]} -gt 0 ]] || args=(run)
[[ $(id -u) == 0 ]] || { echo "gpu-check-chroot: needs root" >&2; exit 1; }
[[ -f gpu-bundle/pdtrain-gpu.tar.xz ]] || { echo "gpu-check-chroot: no gpu-bundle/pdtrain-gpu.tar.xz (scripts/gpu-check.sh bundle)" >&2; exit 1; }

if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
  command -v debootstrap > /dev/null || apt-get install -y -qq debootstrap > /dev/null
  # (a machine may have no /etc/apt/sources.list: grep's status 2 must not end the script)
  mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
           awk '{print $2}' | head -1 || true)
  echo "gpu-check-chroot: debootstrap --variant=minbase bookworm $ROOT ${mirror:-http://deb.debian.org/debian}"
  debootstrap --variant=minbase bookworm "$ROOT" "${mirror:-http://deb.debian.org/debian}" > /dev/null
fi
if [[ ! -x $ROOT/usr/bin/xz ]]; then
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  chroot "$ROOT" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends xz-utils' > /dev/null
fi
leaks=$(chroot "$ROOT" dpkg-query -W -f '${Package}\n' 2>/dev/null |
        grep -E 'openmpi|pmix|hwloc|hdf5|openblas|libblas|dnnl|kokkos|trilinos|zstd-dev|liblz4-dev|isal|toml11|gtest|libevent|python3' || true)
[[ -z $leaks ]] || { echo "gpu-check-chroot: $ROOT has packages the bundle must bring itself: $leaks" >&2; exit 1; }

dest=$ROOT/root/pdtrain
rm -rf "$dest"; mkdir -p "$dest/gpu-bundle"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
  tar -cf - --null -T - | tar -xf - -C "$dest"
cp gpu-bundle/pdtrain-gpu.tar.xz "$dest/gpu-bundle/"
echo "gpu-check-chroot: $dest: $(du -sh "$dest" | cut -f1); packages in $ROOT: $(chroot "$ROOT" dpkg-query -W | wc -l)," \
     "none of pdtrain's; python3: $(chroot "$ROOT" sh -c 'command -v python3 || echo none')"

rm -rf "$ROOT/root/out"; mkdir -p "$ROOT/root/out"
passenv=(); while IFS= read -r v; do passenv+=("$v"); done < <(env | grep -E '^GPU_CHECK_[A-Z_]+=' || true)
set +e
unshare --mount --propagation private bash -c '
  set -e
  R=$1; n=$2; shift 2
  envs=("${@:1:n}"); shift "$n"
  mount -t proc proc "$R/proc"
  mount -t sysfs -o ro sysfs "$R/sys"
  mount --bind /dev "$R/dev"
  mount -t tmpfs -o size=2g,mode=1777 tmpfs "$R/dev/shm"
  mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
  # The CUDA toolkit, read-only, as the GPU machine has it (the bundle leaves CUDA libraries out).
  if [ -d /usr/local/cuda/lib64 ]; then
    mkdir -p "$R/usr/local/cuda"
    mount --bind -o ro "$(readlink -f /usr/local/cuda)" "$R/usr/local/cuda"
  fi
  exec chroot "$R" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TERM=dumb OUT=/root/out "${envs[@]}" bash -c "cd /root/pdtrain && bash scripts/gpu-check.sh \"\$@\"" gpu-check "$@"
' unshare "$ROOT" "${#passenv[@]}" "${passenv[@]}" "${args[@]}"
rc=$?
set -e
mkdir -p gpu-check-out
for f in "$ROOT"/root/out/*; do [[ -f $f ]] && cp "$f" "gpu-check-out/chroot-$(basename "$f")"; done
if grep -q " $ROOT/" /proc/mounts; then echo "gpu-check-chroot: mounts left under $ROOT:"; grep " $ROOT/" /proc/mounts; rc=1; fi
echo "gpu-check-chroot: exit $rc (log: gpu-check-out/chroot-gpu-check.log)"
exit $rc
