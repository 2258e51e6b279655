#!/usr/bin/env bash
# gpu-check: build pdtrain here, carry one archive to a GPU machine that has no MPI, HDF5, BLAS
# or any of pdtrain's other libraries, and check it there unattended.
#
#   scripts/gpu-check.sh bundle [BUILD_DIR] [--no-build] [-o ARCHIVE]     (on a build machine)
#   scripts/gpu-check.sh run [ARCHIVE]                                     (on the GPU machine)
#   scripts/gpu-check.sh exec [ARCHIVE] -- CMD...                          (one command in it)
#
# bundle: configures and builds BUILD_DIR (default build-cuda, or $BUILD_DIR) through
#   scripts/build.sh with CMAKE_ARGS="-DPDTRAIN_CUDA=ON -DPDTRAIN_GEMM_BACKEND=blas $CMAKE_ARGS"
#   (--no-build: bundle that build as it is), then writes ARCHIVE (default
#   gpu-bundle/pdtrain-gpu.tar.xz, git-ignored), one xz tarball holding:
#     build/          the executables listed in scripts/gpu-check.bins (pdtrain, tests, perf),
#                     at their paths in the build tree, and build/hdf5-plugins
#     lib/            their shared-library closure (ldd), without glibc's own libraries and the
#                     CUDA driver/toolkit libraries (libcuda, libcublas*, libcudart, libnccl,
#                     libcudnn*, ...: the GPU machine's are used); lib/compat: libstdc++, libgcc_s
#     ompi/, pmix/    Open MPI's runtime (orterun/mpirun, orted, ompi_info, the MCA components
#                     without the ucx/ofi/openib/psm and OpenSHMEM ones, help files,
#                     openmpi-mca-params.conf) and PMIx's components and help files
#     src/            the source tree (git ls-files: decks, docs, perf scripts, test inputs,
#                     data/tinyshakespeare.txt)
#     bundle.env      what was built, from which commit, and what the binaries need
#   and prints its size; it fails above GPU_BUNDLE_MAX_MB (default 60), and when a ctest test
#   labelled `gpu` (GPU_CHECK_LABEL, a regex) runs an executable of the build not bundled.
#
# run: unpacks ARCHIVE into a temporary prefix, sets PATH, LD_LIBRARY_PATH (bundle first, then
#   /usr/local/cuda/lib64, then the nvidia-* Python wheels' lib directories), OPAL_* and PMIX_*
#   (relocated Open MPI 4.1 and PMIx), HDF5_PLUGIN_PATH, OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM),
#   oversubscription and yield-when-idle, then runs the steps of scripts/gpu-check.steps
#   (NAME|TIMEOUT|COMMAND), each under `timeout`, continuing after failures. Everything goes to
#   $OUT/gpu-check.log (./gpu-check-out/ when $OUT is unset), a PASS/FAIL/SKIP line per step to
#   gpu-check-summary.txt and to stdout; on stdout each failed step also shows its last lines.
#   Exit status 1 if any step failed (the summary names it), 0 otherwise. SKIP means no GPU or
#   no PyTorch. Needs bash, coreutils, xz (or python3), tar, ldd; no Python otherwise.
#   Knobs: GPU_CHECK_REQUIRE_GPU=1 (a missing GPU FAILs instead of SKIPping: use it on the GPU
#   machine, so that a broken driver cannot pass as a skip), GPU_CHECK_ONLY=REGEX (steps whose name matches), GPU_CHECK_STEPS=FILE,
#   GPU_CHECK_KEEP=1 (keep the unpacked prefix), GPU_CHECK_VERBOSE=1 (stream step output),
#   GPU_CHECK_LIBSTDCXX=auto|bundle|system (auto: the machine's libstdc++ when it has every
#   GLIBCXX/CXXABI version the binaries need, else the bundle's).
#
#   The test executables have the build's source directory compiled in (they read
#   input/default.toml, docs/deck.md and data/ from it). If that path does not exist
#   on the GPU machine, `run` points it at the bundle's src/ with a symbolic link (root only)
#   and removes the link when it ends.
#
# With the device tool of a session (the GPU machine has no MPI and no network):
#   here:   bash scripts/gpu-check.sh bundle        # ~18 MiB today; the carry limit is 64 MiB
#           sudo scripts/gpu-check-chroot.sh          # the same run on a bare Debian, no GPU
#   device: a session has 15 minutes of device time in all, so two calls, each a fresh plan:
#     1. the GPU tests: command
#          GPU_CHECK_REQUIRE_GPU=1 GPU_CHECK_ONLY='^(gpu-info|bundle-libs|backend-cuda|gpu-training|gpu-nccl|sanitizer)' bash scripts/gpu-check.sh run
#        carry ["gpu-bundle"], timeout_s 600 (worst case ~8 minutes; typical far less);
#     2. the benchmarks, if time is left: GPU_CHECK_ONLY='^perf-(attention|gemm-cuda|gpu|pytorch)'
#        (budgets cap it near 6 minutes); then give the machine back.
#   The CPU steps (cpu-smoke, unit-tests, mpi-tests, the CPU perf checks) prove the bundle on
#   a bare machine and need no GPU: run them in the chroot here, not on device time.
#   $OUT/gpu-check.log and $OUT/gpu-check-summary.txt come back, the summary is also the end of
#   output_tail. Only the latest run's files come back: one run per call.
# A person with a GPU node: copy the checkout (or just this script, its gpu-check* siblings
# and the archive) there and run `bash scripts/gpu-check.sh run path/to/pdtrain-gpu.tar.xz`.
set -euo pipefail

SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPTS/.." && pwd)
DEFAULT_ARCHIVE=$REPO/gpu-bundle/pdtrain-gpu.tar.xz
TOP=pdtrain-gpu   # the archive's top directory

# glibc's own libraries and the CUDA driver/toolkit libraries: never bundled.
GLIBC_LIB_RE='^(ld-linux-x86-64\.so\.2|linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libBrokenLocale\.so\.1|libthread_db\.so\.1)$'
CUDA_LIB_RE='^lib(cuda|cudart|cublas|cublasLt|nccl|cudnn[a-z_]*|nvidia-[a-z-]+|nvrtc[a-z-]*|nvJitLink|cusparse[a-zA-Z]*|cusolver[a-zA-Z]*|curand|cufft[a-z]*|cupti|nvToolsExt|nvperf_[a-z]+)\.so(\..*)?$'
# MCA components not carried: network fabrics (their libraries) and OpenSHMEM.
OMPI_SKIP_RE='^mca_[a-z]+_(ucx|ofi|openib|psm|psm2|usnic|portals4)\.so$|^mca_(atomic|memheap|scoll|spml|sshmem)_'

LOG=""
die() {
  echo "gpu-check: $*" >&2
  [[ -n $LOG ]] && echo "gpu-check: $*" >> "$LOG"
  exit 1
}
human() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# ---------------------------------------------------------------------------------- bundle --
# Every executable of the build that a test labelled `gpu` runs must be in the bundle.
check_gpu_label() {
  local B=$1 bundled=$2 json exes f missing=() label=${GPU_CHECK_LABEL:-^gpu\$}
  command -v ctest > /dev/null 2>&1 || { echo "gpu-check: warning: no ctest: cannot check the 'gpu' label"; return 0; }
  command -v python3 > /dev/null 2>&1 || { echo "gpu-check: warning: no python3: cannot check the 'gpu' label"; return 0; }
  json=$(ctest --test-dir "$B" -L "$label" --show-only=json-v1 2>/dev/null) ||
    die "bundle: ctest --show-only failed in $B"
  exes=$(python3 -c '
import json, os, sys
build = sys.argv[1]
for t in json.loads(sys.stdin.read()).get("tests", []):
    for a in t.get("command", []):
        if a.startswith(build + "/") and os.path.isfile(a) and os.access(a, os.X_OK):
            print(os.path.relpath(a, build))
' "$B" <<< "$json" | sort -u)
  if [[ -z $exes ]]; then echo "gpu-check: no ctest test has a label matching $label yet"; return 0; fi
  for f in $exes; do [[ -f $bundled/$f ]] || missing+=("$f"); done
  (( ${#missing[@]} == 0 )) ||
    die "bundle: ctest tests labelled $label run ${missing[*]}, which scripts/gpu-check.bins does not list"
  echo "gpu-check: the executables of the ctest tests labelled $label are all bundled: $(echo $exes)"
}

bundle() {
  local build_dir=${BUILD_DIR:-build-cuda} archive=${GPU_BUNDLE:-$DEFAULT_ARCHIVE} do_build=1
  while (( $# > 0 )); do
    case $1 in
      --no-build) do_build=0; shift ;;
      -o) archive=$2; shift 2 ;;
      -*) die "bundle: unknown option $1" ;;
      *) build_dir=$1; shift ;;
    esac
  done
  cd "$REPO"
  [[ $archive == /* ]] || archive=$PWD/$archive
  if (( do_build )); then
    echo "gpu-check: building $build_dir (CUDA on, BLAS GEMM backend)"
    BUILD_DIR=$build_dir CMAKE_ARGS="-DPDTRAIN_CUDA=ON -DPDTRAIN_GEMM_BACKEND=blas ${CMAKE_ARGS:-}" \
      bash scripts/build.sh || die "bundle: scripts/build.sh failed for $build_dir"
    # scripts/build.sh only checks pdtrain; a test or benchmark that failed to build fails here.
    cmake --build "$build_dir" -j2 > "$build_dir/gpu-check-build.log" 2>&1 ||
      { tail -40 "$build_dir/gpu-check-build.log"; die "bundle: the build of $build_dir failed (log: $build_dir/gpu-check-build.log)"; }
  fi
  local B
  B=$(cd "$build_dir" 2>/dev/null && pwd) || die "bundle: no build directory $build_dir"
  [[ -f $B/CMakeCache.txt && -x $B/pdtrain ]] || die "bundle: $B is not a pdtrain build (no CMakeCache.txt or pdtrain)"
  cache() { sed -n "s/^$1:[A-Z]*=//p" "$B/CMakeCache.txt" | head -1; }
  local src_dir gemm cuda
  src_dir=$(cache pdtrain_SOURCE_DIR); gemm=$(cache PDTRAIN_GEMM_BACKEND); cuda=$(cache PDTRAIN_CUDA)
  [[ $gemm == blas ]] || echo "gpu-check: warning: $B uses the '$gemm' GEMM backend (libdnnl is large; the GPU bundle is meant for blas)"

  local stage
  stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")
  trap "rm -rf '$stage'" EXIT
  local P=$stage/$TOP
  mkdir -p "$P"/{build,lib/compat,bin,ompi/bin,ompi/lib,ompi/share,ompi/etc,pmix/lib/pmix,pmix/share/pmix,pmix/etc,src}

  # Executables from the list, at their paths in the build tree.
  local elves=() line glob f n rel
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line%%#*}; line=$(echo "$line" | xargs)
    [[ -z $line ]] && continue
    local optional=0; [[ $line == \?* ]] && { optional=1; line=${line#\?}; }
    n=0
    for f in "$B"/$line; do
      [[ -f $f && -x $f ]] || continue
      head -c 4 "$f" | grep -q $'\x7fELF' || continue
      rel=${f#$B/}
      mkdir -p "$P/build/$(dirname "$rel")"
      cp -p "$f" "$P/build/$rel"
      elves+=("$P/build/$rel"); n=$((n + 1))
    done
    (( n > 0 || optional )) || die "bundle: '$line' (scripts/gpu-check.bins) matches no executable in $B"
  done < "$SCRIPTS/gpu-check.bins"
  check_gpu_label "$B" "$P/build"
  [[ -d $B/hdf5-plugins ]] || die "bundle: $B/hdf5-plugins is missing"
  cp -rp "$B/hdf5-plugins" "$P/build/"
  for f in "$P"/build/hdf5-plugins/*.so; do elves+=("$f"); done

  # Open MPI: where Debian (or any install) put it, from ompi_info.
  local ompi_info_bin orterun
  orterun=$(command -v orterun || command -v mpirun) || die "bundle: no mpirun/orterun on PATH"
  orterun=$(readlink -f "$orterun")
  ompi_info_bin=$(command -v ompi_info) || die "bundle: no ompi_info on PATH"
  opath() { "$ompi_info_bin" --parsable --path "$1" | sed -n "s/^path:$1://p"; }
  local o_bindir o_pkglibdir o_pkgdatadir o_sysconfdir
  o_bindir=$(opath bindir); o_pkglibdir=$(opath pkglibdir); o_pkgdatadir=$(opath pkgdatadir); o_sysconfdir=$(opath sysconfdir)
  [[ -d $o_pkglibdir && -d $o_pkgdatadir ]] || die "bundle: Open MPI's pkglibdir/pkgdatadir ($o_pkglibdir, $o_pkgdatadir) not found"
  cp -p "$orterun" "$P/ompi/bin/orterun"
  ln -s orterun "$P/ompi/bin/mpirun"; ln -s orterun "$P/ompi/bin/mpiexec"
  cp -p "$(readlink -f "$o_bindir/orted")" "$P/ompi/bin/orted"
  cp -p "$(readlink -f "$ompi_info_bin")" "$P/ompi/bin/ompi_info"
  elves+=("$P/ompi/bin/orterun" "$P/ompi/bin/orted" "$P/ompi/bin/ompi_info")
  mkdir -p "$P/ompi/lib/openmpi3"
  local comps=0 skipped_comps=()
  for f in "$o_pkglibdir"/*.so; do
    if [[ $(basename "$f") =~ $OMPI_SKIP_RE ]]; then skipped_comps+=("$(basename "$f" .so)"); continue; fi
    cp -p "$f" "$P/ompi/lib/openmpi3/"; elves+=("$P/ompi/lib/openmpi3/$(basename "$f")"); comps=$((comps + 1))
  done
  cp -rp "$o_pkgdatadir" "$P/ompi/share/openmpi"
  for f in openmpi-mca-params.conf openmpi-default-hostfile; do
    [[ -f $o_sysconfdir/$f ]] && cp -p "$o_sysconfdir/$f" "$P/ompi/etc/"
  done

  # PMIx (Open MPI's external PMIx): its components and help files. Its own
  # pmix-mca-params.conf names an absolute component path; run sets PMIX_MCA_* instead.
  local pmix_lib pmix_prefix
  pmix_lib=$(ldd "$o_pkglibdir"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ {print $3; exit}')
  if [[ -n $pmix_lib ]]; then
    pmix_prefix=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
    if [[ -d $pmix_prefix/lib/pmix ]]; then
      cp -p "$pmix_prefix"/lib/pmix/*.so "$P/pmix/lib/pmix/"
      for f in "$P"/pmix/lib/pmix/*.so; do elves+=("$f"); done
    fi
    [[ -d $pmix_prefix/share/pmix ]] && cp -rp "$pmix_prefix/share/pmix/." "$P/pmix/share/pmix/"
    echo "# pdtrain gpu-check: the component path comes from PMIX_MCA_mca_base_component_path" > "$P/pmix/etc/pmix-mca-params.conf"
  fi

  # The shared-library closure, without glibc and CUDA.
  local closure cuda_libs=() name path
  closure=$(mktemp)
  for f in "${elves[@]}"; do
    ldd "$f" 2>&1 | while read -r name arrow path _; do
      [[ $arrow == "=>" ]] || continue
      if [[ $name =~ $CUDA_LIB_RE ]]; then echo "cuda $name"; continue; fi
      [[ $name =~ $GLIBC_LIB_RE ]] && continue
      [[ $path == not ]] && { echo "missing $name ${f#$P/}"; continue; }
      echo "lib $name $path"
    done
  done | sort -u > "$closure"
  if grep -q '^missing ' "$closure"; then
    grep '^missing ' "$closure" >&2; die "bundle: libraries not found on this machine (above)"
  fi
  while read -r _ name path; do
    case $name in
      libstdc++.so.6|libgcc_s.so.1) cp -L "$path" "$P/lib/compat/$name" ;;
      *) cp -L "$path" "$P/lib/$name" ;;
    esac
  done < <(grep '^lib ' "$closure")
  mapfile -t cuda_libs < <(awk '$1 == "cuda" {print $2}' "$closure" | sort -u)
  rm -f "$closure"

  # libstdc++/libgcc_s symbol versions the carried ELF files need (run compares the machine's).
  local need_cxx
  need_cxx=$(for f in "${elves[@]}" "$P"/lib/*.so*; do readelf -V "$f" 2>/dev/null; done |
    awk '/File: libstdc\+\+\.so\.6|File: libgcc_s\.so\.1/ {on = 1; next} /File:/ {on = 0}
         on && $2 == "Name:" && $3 ~ /^(GLIBCXX|CXXABI|GCC)_/ {print $3}' | sort -uV | tr '\n' ' ')
  local need_glibc
  need_glibc=$(for f in "${elves[@]}" "$P"/lib/*.so* "$P"/lib/compat/*; do readelf -V "$f" 2>/dev/null; done |
    grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1)

  # The source tree (tracked and untracked-but-not-ignored files, as the device tool carries
  # them), the build directory's place in it, the text corpus, and bin/ for PATH.
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$REPO" && while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done) |
    (cd "$REPO" && tar -cf - --null -T -) | tar -xf - -C "$P/src"
  if [[ -n $src_dir && $B == "$src_dir"/* ]]; then
    rel=${B#$src_dir/}
    local up="" part
    IFS=/ read -ra part <<< "$rel"
    for _ in "${part[@]}"; do up+=../; done
    mkdir -p "$P/src/$(dirname "$rel")"
    ln -sfn "${up}build" "$P/src/$rel"
  fi
  ln -s ../src/scripts/mpirun-local "$P/bin/mpirun-local"

  {
    printf 'BUNDLE_GIT=%q\n' "$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)"
    printf 'BUNDLE_DATE=%q\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf 'BUNDLE_HOST=%q\n' "$(uname -n) ($(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"))"
    printf 'BUNDLE_BUILD_DIR=%q\n' "$B"
    printf 'BUNDLE_SOURCE_DIR=%q\n' "$src_dir"
    printf 'BUNDLE_GEMM_BACKEND=%q\n' "$gemm"
    printf 'BUNDLE_CUDA=%q\n' "${cuda:-OFF}"
    printf 'BUNDLE_NEED_CXX=%q\n' "$need_cxx"
    printf 'BUNDLE_NEED_GLIBC=%q\n' "$need_glibc"
    printf 'BUNDLE_CUDA_LIBS=%q\n' "${cuda_libs[*]}"
    printf 'BUNDLE_OMPI_VERSION=%q\n' "$("$ompi_info_bin" --version 2>/dev/null | awk 'NR == 1 {print $NF}')"
  } > "$P/bundle.env"

  local raw
  raw=$(du -sb "$P" | cut -f1)
  echo "gpu-check: $(( ${#elves[@]} )) ELF files carried ($comps Open MPI components; left out: ${skipped_comps[*]:-none})," \
       "$(ls "$P/lib" | grep -c '\.so') libraries + $(ls "$P/lib/compat" | wc -l) in lib/compat"
  [[ ${#cuda_libs[@]} -gt 0 ]] && echo "gpu-check: CUDA libraries left to the GPU machine: ${cuda_libs[*]}"
  echo "gpu-check: compressing $(human "$raw") with xz"
  mkdir -p "$(dirname "$archive")"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner -cf - "$TOP" | xz -T2 -9 > "$archive.tmp"
  xz -t "$archive.tmp" || die "bundle: $archive.tmp does not decompress"
  mv "$archive.tmp" "$archive"
  local size max_mb=${GPU_BUNDLE_MAX_MB:-60}
  size=$(stat -c %s "$archive")
  echo "gpu-check: wrote $archive: $(human "$size") ($size bytes; $(human "$raw") unpacked; git $(sed -n 's/^BUNDLE_GIT=//p' "$P/bundle.env"))"
  local dir_size
  dir_size=$(find "$(dirname "$archive")" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
  (( dir_size == size )) || echo "gpu-check: note: $(dirname "$archive") holds $(human "$dir_size") in all (the device tool carries the whole directory)"
  (( size <= max_mb * 1048576 )) || die "bundle: $archive is $(human "$size"), above GPU_BUNDLE_MAX_MB=$max_mb"
}

# ------------------------------------------------------------------------------ run, exec --
# Unpacks the archive into $PREFIX (global) and sets the environment.
PREFIX="" UNPACK_DIR=""
CREATED_LINKS=()
CREATED_DIRS=()
cleanup() {
  local i
  for (( i = ${#CREATED_LINKS[@]} - 1; i >= 0; i-- )); do rm -f "${CREATED_LINKS[i]}"; done
  for (( i = ${#CREATED_DIRS[@]} - 1; i >= 0; i-- )); do rmdir "${CREATED_DIRS[i]}" 2>/dev/null || true; done
  if [[ -n $UNPACK_DIR && -d $UNPACK_DIR ]]; then
    if [[ ${GPU_CHECK_KEEP:-0} == 1 ]]; then echo "gpu-check: kept $PREFIX" >&2; else rm -rf "$UNPACK_DIR"; fi
  fi
}

unpack() {
  local archive=$1
  [[ -f $archive ]] || die "no bundle at $archive (make it with: scripts/gpu-check.sh bundle; on the device tool carry gpu-bundle)"
  UNPACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/pdtrain-gpu.XXXXXX")
  trap cleanup EXIT
  if command -v xz > /dev/null 2>&1; then
    xz -dc "$archive" | tar -xf - -C "$UNPACK_DIR" || die "cannot unpack $archive"
  elif command -v python3 > /dev/null 2>&1; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$archive" "$UNPACK_DIR" ||
      die "cannot unpack $archive with python3"
  else
    die "cannot unpack $archive: neither xz nor python3 is installed"
  fi
  PREFIX=$UNPACK_DIR/$TOP
  [[ -f $PREFIX/bundle.env ]] || die "$archive has no $TOP/bundle.env: not a gpu-check bundle"
}

# Prints what it decided; sets GPU_CHECK_LIBSTDCXX_USED.
setup_env() {
  local P=$PREFIX
  # shellcheck disable=SC1091
  source "$P/bundle.env"
  export GPU_CHECK_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

  # glibc: the bundle's binaries were linked on BUNDLE_HOST.
  local have_glibc
  have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [[ -n $BUNDLE_NEED_GLIBC && -n $have_glibc ]] &&
     [[ $(printf '%s\n%s\n' "${BUNDLE_NEED_GLIBC#GLIBC_}" "$have_glibc" | sort -V | head -1) != "${BUNDLE_NEED_GLIBC#GLIBC_}" ]]; then
    die "this machine has glibc $have_glibc; the bundle needs $BUNDLE_NEED_GLIBC (build it on an older system)"
  fi

  # libstdc++/libgcc_s: the machine's when it defines every version the binaries need (host
  # tools such as ncu then keep theirs), else the bundle's.
  local policy=${GPU_CHECK_LIBSTDCXX:-auto} sys_cxx="" missing=""
  sys_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ {print $NF; exit}')
  if [[ $policy == auto ]]; then
    if [[ -n $sys_cxx && -r $sys_cxx ]]; then
      local defined
      defined=$(tr '\0' '\n' < "$sys_cxx" | grep -E '^(GLIBCXX|CXXABI)_[0-9.]+$' | sort -u)
      for v in $BUNDLE_NEED_CXX; do
        [[ $v == GCC_* ]] && continue
        grep -qxF "$v" <<< "$defined" || missing+=" $v"
      done
      if [[ -z $missing ]]; then policy=system; else policy=bundle; fi
    else
      policy=bundle; missing=" (no libstdc++.so.6 in ldconfig)"
    fi
  fi
  [[ $policy == system || $policy == bundle ]] || die "GPU_CHECK_LIBSTDCXX must be auto, bundle or system"
  export GPU_CHECK_LIBSTDCXX_USED=$policy
  echo "libstdc++: ${policy}'s${sys_cxx:+ (machine: $sys_cxx)}${missing:+; machine lacks$missing}"

  local ld=$P/lib
  [[ $policy == bundle ]] && ld+=:$P/lib/compat
  if [[ -d /usr/local/cuda/lib64 ]]; then ld+=:/usr/local/cuda/lib64; fi
  # cuBLAS & co. from PyTorch's nvidia-* wheels, as a fallback for a machine without a toolkit.
  if command -v python3 > /dev/null 2>&1; then
    local wheel_dirs
    wheel_dirs=$(env -u LD_LIBRARY_PATH timeout 30 python3 - 2>/dev/null <<'EOF' || true
import importlib, os
for m in ("cublas", "cuda_runtime", "cuda_nvrtc", "nvjitlink", "nccl", "cudnn"):
    try:
        mod = importlib.import_module("nvidia." + m)
    except Exception:
        continue
    for base in list(getattr(mod, "__path__", [])):
        d = os.path.join(base, "lib")
        if os.path.isdir(d):
            print(d)
EOF
)
    local d
    for d in $wheel_dirs; do ld+=:$d; done
  fi
  [[ -n $GPU_CHECK_ORIG_LD_LIBRARY_PATH ]] && ld+=:$GPU_CHECK_ORIG_LD_LIBRARY_PATH
  export LD_LIBRARY_PATH=$ld

  local path=$P/bin:$P/build:$P/build/tests:$P/build/perf:$P/ompi/bin
  [[ -d /usr/local/cuda/bin ]] && path+=:/usr/local/cuda/bin
  export PATH=$path:$PATH

  # Open MPI 4.1, relocated: every install directory it derives from its configure prefix.
  export OPAL_PREFIX=$P/ompi OPAL_EXEC_PREFIX=$P/ompi OPAL_BINDIR=$P/ompi/bin OPAL_SBINDIR=$P/ompi/bin \
         OPAL_LIBEXECDIR=$P/ompi/bin OPAL_LIBDIR=$P/lib OPAL_PKGLIBDIR=$P/ompi/lib/openmpi3 \
         OPAL_DATAROOTDIR=$P/ompi/share OPAL_DATADIR=$P/ompi/share OPAL_PKGDATADIR=$P/ompi/share/openmpi \
         OPAL_SYSCONFDIR=$P/ompi/etc OPAL_INCLUDEDIR=$P/ompi/include OPAL_PKGINCLUDEDIR=$P/ompi/include
  # PMIx likewise (PMIX_PREFIX is what PMIx 4 reads; PMIX_INSTALL_PREFIX older releases).
  export PMIX_PREFIX=$P/pmix PMIX_INSTALL_PREFIX=$P/pmix PMIX_EXEC_PREFIX=$P/pmix PMIX_LIBDIR=$P/pmix/lib \
         PMIX_PKGLIBDIR=$P/pmix/lib/pmix PMIX_DATAROOTDIR=$P/pmix/share PMIX_DATADIR=$P/pmix/share \
         PMIX_PKGDATADIR=$P/pmix/share/pmix PMIX_SYSCONFDIR=$P/pmix/etc \
         PMIX_MCA_mca_base_component_path=$P/pmix/lib/pmix
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # As mpirun-local (--oversubscribe --bind-to none --mca mpi_yield_when_idle 1), for a plain
  # mpirun too. No single-copy (CMA) transfers: containers often forbid process_vm_readv.
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 \
         OMPI_MCA_hwloc_base_binding_policy=none
  # One node, no ssh: the rsh launcher refuses to start without an ssh/rsh on PATH, even for
  # local ranks (and singletons, which start an orted); `isolated` launches locally only.
  export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  export HDF5_PLUGIN_PATH=$P/build/hdf5-plugins
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

  export GPU_CHECK_PREFIX=$P GPU_CHECK_REPO=$REPO GPU_CHECK_SCRIPTS=$SCRIPTS
  export GPU_CHECK_GLIBC_LIB_RE=$GLIBC_LIB_RE GPU_CHECK_CUDA_LIB_RE=$CUDA_LIB_RE
  export GPU_CHECK_WORK=$P/work
  mkdir -p "$GPU_CHECK_WORK"

  # The tests read files under the build's source directory (compiled in): point it at src/.
  local s=$BUNDLE_SOURCE_DIR
  if [[ -n $s && ! -e $s && ! -L $s ]]; then
    local d=$s parents=()
    while [[ ! -e $(dirname "$d") ]]; do d=$(dirname "$d"); parents=("$d" "${parents[@]}"); done
    local ok=1
    for d in "${parents[@]}"; do
      if mkdir "$d" 2>/dev/null; then CREATED_DIRS+=("$d"); else ok=0; break; fi
    done
    if (( ok )) && ln -s "$P/src" "$s" 2>/dev/null; then
      CREATED_LINKS+=("$s")
      echo "source dir: $s -> $P/src (a link for this run; removed at the end)"
    else
      echo "source dir: cannot create $s (not root?): tests reading input/, docs/ or data/ will fail"
    fi
  elif [[ -n $s ]]; then
    echo "source dir: $s exists on this machine; the tests read it"
  fi
}

print_header() {
  echo "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(uname -sr), $(nproc) cores," \
       "$(getconf GNU_LIBC_VERSION 2>/dev/null), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "bundle: git $BUNDLE_GIT, built $BUNDLE_DATE on $BUNDLE_HOST; CUDA=$BUNDLE_CUDA gemm=$BUNDLE_GEMM_BACKEND; Open MPI $BUNDLE_OMPI_VERSION"
  echo "bundle: needs from the machine: ${BUNDLE_CUDA_LIBS:-no CUDA libraries}"
  echo "prefix: $PREFIX"
  local gpu="none (nvidia-smi not found)"
  if command -v nvidia-smi > /dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)
  fi
  echo "GPU: $gpu"
  echo "PATH=$PATH"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  env | grep -E '^(OPAL_PREFIX|PMIX_PREFIX|OMPI_MCA_[a-z_]+|HDF5_PLUGIN_PATH|OPENBLAS_NUM_THREADS)=' | sort
}

run_steps() {
  local steps_file=${GPU_CHECK_STEPS:-$SCRIPTS/gpu-check.steps} only=${GPU_CHECK_ONLY:-}
  [[ -f $steps_file ]] || die "no step list $steps_file"
  local log=$LOG summary=$GPU_CHECK_OUT/gpu-check-summary.txt
  { setup_env; print_header; } > "$PREFIX/setup.txt"
  tee -a "$log" < "$PREFIX/setup.txt"

  local names=() timeouts=() cmds=() line name t cmd
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    IFS='|' read -r name t cmd <<< "$line"
    [[ -n $name && $t =~ ^[0-9]+$ && -n $cmd ]] || die "$steps_file: bad line (NAME|TIMEOUT|COMMAND): $line"
    [[ -n $only && ! $name =~ $only ]] && continue
    names+=("$name"); timeouts+=("$t"); cmds+=("$cmd")
  done < "$steps_file"
  (( ${#names[@]} > 0 )) || die "no steps to run (GPU_CHECK_ONLY='$only')"

  local i rc status secs start failed=() results=() off
  for i in "${!names[@]}"; do
    name=${names[i]}; t=${timeouts[i]}; cmd=${cmds[i]}
    echo "===== [$((i + 1))/${#names[@]}] $name (timeout ${t}s): $cmd" | tee -a "$log"
    off=$(stat -c %s "$log")
    start=$(date +%s)
    set +e
    # Straight into the log, so that it keeps what a step printed even if the whole run is killed.
    if [[ ${GPU_CHECK_VERBOSE:-0} == 1 ]]; then
      (cd "$PREFIX/src" && timeout -k 30 "$t" bash -c 'source "$GPU_CHECK_SCRIPTS/gpu-check-lib.sh"; eval "$1"' "step:$name" "$cmd") 2>&1 < /dev/null | tee -a "$log"
      rc=${PIPESTATUS[0]}
    else
      (cd "$PREFIX/src" && timeout -k 30 "$t" bash -c 'source "$GPU_CHECK_SCRIPTS/gpu-check-lib.sh"; eval "$1"' "step:$name" "$cmd") >> "$log" 2>&1 < /dev/null
      rc=$?
    fi
    set -e
    secs=$(( $(date +%s) - start ))
    case $rc in
      0) status=PASS ;;
      77) status=SKIP ;;
      124|137) status=FAIL; rc="$rc: timed out after ${t}s" ;;
      *) status=FAIL ;;
    esac
    if [[ $status == FAIL ]]; then
      failed+=("$name")
      [[ ${GPU_CHECK_VERBOSE:-0} == 1 ]] || { echo "----- last lines of $name:"; tail -c +$((off + 1)) "$log" | tail -25; }
    fi
    local why=""
    [[ $status == SKIP ]] && why="  ($(tail -c +$((off + 1)) "$log" | grep -m1 -o 'SKIP: .*' | cut -c7- | cut -c1-100))"
    results+=("$(printf '%-4s %-24s %5ss  exit %s' "$status" "$name" "$secs" "$rc")$why")
    echo "===== $name: $status (exit $rc, ${secs}s)" | tee -a "$log"
  done

  {
    echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), bundle git $BUNDLE_GIT, GPU: $(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo none)):"
    printf '  %s\n' "${results[@]}"
    if (( ${#failed[@]} > 0 )); then
      echo "gpu-check: FAILED: ${failed[*]} (${#failed[@]} of ${#names[@]} steps; log: $log)"
    else
      echo "gpu-check: ok (${#names[@]} steps; log: $log)"
    fi
  } | tee "$summary" | tee -a "$log"
  (( ${#failed[@]} == 0 ))
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  bundle) bundle "$@" ;;
  run)
    archive=${1:-${GPU_BUNDLE:-$DEFAULT_ARCHIVE}}
    GPU_CHECK_OUT=${OUT:-$REPO/gpu-check-out}
    mkdir -p "$GPU_CHECK_OUT"
    GPU_CHECK_OUT=$(cd "$GPU_CHECK_OUT" && pwd)
    export GPU_CHECK_OUT
    LOG=$GPU_CHECK_OUT/gpu-check.log
    : > "$LOG"
    unpack "$archive"
    run_steps ;;
  exec)
    archive=${GPU_BUNDLE:-$DEFAULT_ARCHIVE}
    if [[ ${1:-} != -- && $# -gt 0 ]]; then archive=$1; shift; fi
    [[ ${1:-} == -- ]] && shift
    (( $# > 0 )) || die "usage: scripts/gpu-check.sh exec [ARCHIVE] -- CMD..."
    unpack "$archive"
    setup_env >&2
    (cd "$PREFIX/src" && source "$SCRIPTS/gpu-check-lib.sh" && "$@") ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    [[ $cmd == help || $cmd == -h || $cmd == --help ]] || exit 2 ;;
esac
