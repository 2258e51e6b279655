# Shared by the emulated-GPU checks that count copies (check_nccl_grad_download.sh,
# check_nccl_baseline_on_device.sh): sourced after `pdtrain=$1 out=$2; shift 3`.
# PDTRAIN_CUDA_EMU_COUNTS makes every process of a run write counts.<pid>.tsv (kind, name, calls,
# threads, flops, bytes) into the run's counts directory $out/TAG/.
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "${out:?}"
mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
# emu_run TAG RANKS ARGS...: pdtrain on RANKS ranks of the emulated GPUs, output in $out/TAG.log,
# counts in $out/TAG/, run.out_dir $out/run-TAG.
emu_run() {
  local tag=$1 ranks=$2
  shift 2
  mkdir -p "$out/$tag"
  PDTRAIN_CUDA_EMU_COUNTS=$out/$tag timeout --kill-after=5 600 \
    "$src/scripts/mpirun-local" -np "$ranks" "$pdtrain" "$@" --set compute.device=cuda \
    --set run.out_dir="$out/run-$tag" > "$out/$tag.log" 2>&1 ||
    { tail -30 "$out/$tag.log"; fail "the $tag run failed"; }
}
# copy_bytes TAG ROUTE_REGEX: the bytes of run TAG's copies whose route matches, all processes.
copy_bytes() {
  awk -F'\t' -v r="$2" '$1 == "copy" && $2 ~ r { b += $6 } END { print b + 0 }' \
    "$out/$1"/counts.*.tsv
}
# final TAG: the run's final line (step, loss, params_crc32c).
final() { grep -m1 -oE "final step=[0-9]+ loss=[^ ]+ params_crc32c=[0-9a-f]+" "$out/$1.log"; }
