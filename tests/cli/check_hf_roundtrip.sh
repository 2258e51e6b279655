#!/usr/bin/env bash
# A checkpoint exported with `pdtrain export --format hf` is the model: starting from it
# (model.init = "hf:DIR", the default deck, no model keys repeated) gives the trained run's
# params_crc32c, and `pdtrain eval` on one process gives the same loss as from the llm.c export.
# Then damaged copies of the directory (a non-GPT-2 config.json, a missing tensor, a tensor in
# the wrong orientation, an unsupported dtype, a truncated file, a header longer than the file)
# each end the whole job with status 4 naming the file and the tensor.
# Usage: check_hf_roundtrip.sh EXPECT_EXIT OUT_DIR -- mpirun-prefix... (without -np) pdtrain
set -u
expect=$1 out=$2
shift 3
bin=${*: -1}
mpirun=("${@:1:$#-1}")
run() { local n=$1; shift; "${mpirun[@]}" -np "$n" "$bin" "$@"; }
rm -rf "$out"
mkdir -p "$out"
log="$out/log"
run 3 --set run.steps=3 --set run.out_dir="$out/run" >"$log" 2>&1 \
  || { echo "FAIL: the training run failed"; cat "$log"; exit 1; }
crc=$(sed -n 's/^final .*params_crc32c=\([0-9a-f]*\).*/\1/p' "$log")
ckpt="$out/run/checkpoints/ckpt-00000003.h5"
run 1 export "$ckpt" --format hf "$out/hf" >"$log" 2>&1 || { echo "FAIL: export hf"; cat "$log"; exit 1; }
run 1 export "$ckpt" --format llmc "$out/model.bin" >"$log" 2>&1 || { echo "FAIL: export llmc"; cat "$log"; exit 1; }
fail=0
eval_line() {  # the eval line of one process starting from model.init = $1
  run 1 eval --batches 2 --set model.init="$1" 2>&1 | grep '^eval '
}
from_hf=$(eval_line "hf:$out/hf")
from_llmc=$(eval_line "llmc:$out/model.bin")
case "$from_hf" in
  *"params_crc32c=$crc"*) ;;
  *) echo "FAIL: from the hf export: '$from_hf', the trained run's params_crc32c is $crc"; fail=1 ;;
esac
[ -n "$from_hf" ] && [ "$from_hf" = "$from_llmc" ] \
  || { echo "FAIL: eval from hf '$from_hf' differs from eval from llm.c '$from_llmc'"; fail=1; }

# damaged COPY SED-EXPRESSION FILE: a copy of the export with FILE edited by sed (same length).
damaged() {
  rm -rf "$out/$1"; cp -r "$out/hf" "$out/$1"
  LC_ALL=C sed -i "$2" "$out/$1/$3"
}
bad() {  # bad COPY PATTERN: eval from it ends the 3-rank job with status 4 and the message
  "$expect" 4 30 "$2" -- "${mpirun[@]}" -np 3 "$bin" eval --batches 1 \
    --set model.init="hf:$out/$1" || fail=1
}
damaged bert 's/"model_type": "gpt2"/"model_type": "bert"/' config.json
bad bert "$out/bert/config.json: model_type = \"bert\", not a GPT-2 config"
damaged missing 's/"transformer.h.1.mlp.c_fc.weight"/"transformer.h.1.mlp.c_fc.weighX"/' model.safetensors
bad missing "$out/missing/model.safetensors: tensor 'transformer.h.1.mlp.c_fc.weight' is missing"
damaged transposed 's/"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":\[64,192\]/"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":[192,64]/' model.safetensors
bad transposed "$out/transposed/model.safetensors: tensor 'transformer.h.0.attn.c_attn.weight' has shape \[192,64\] but GPT-2 of this config needs \[64,192\]"
damaged int32 's/"transformer.wpe.weight":{"dtype":"F32"/"transformer.wpe.weight":{"dtype":"I32"/' model.safetensors
bad int32 "$out/int32/model.safetensors: tensor 'transformer.wpe.weight' has dtype I32; pdtrain reads F32, BF16 and F16"
rm -rf "$out/truncated"; cp -r "$out/hf" "$out/truncated"
truncate -s -100 "$out/truncated/model.safetensors"
bad truncated "$out/truncated/model.safetensors: tensor 'transformer.ln_f.bias': data_offsets \[[0-9]+,[0-9]+\] reach past the end of the file"
rm -rf "$out/long_header"; cp -r "$out/hf" "$out/long_header"
size=$(stat -c %s "$out/long_header/model.safetensors")
printf "$(printf '\\%03o' $((size & 255)) $((size >> 8 & 255)) $((size >> 16 & 255)) $((size >> 24 & 255)) 0 0 0 0)" |
  dd of="$out/long_header/model.safetensors" bs=1 conv=notrunc status=none
bad long_header "$out/long_header/model.safetensors: the header claims $size bytes but the file has only $((size - 8))"
exit $fail
