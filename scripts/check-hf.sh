#!/usr/bin/env bash
# Optional tooling (not part of the test suite): checks an export against Hugging Face
# transformers itself. Trains a small byte-level model on tinyshakespeare (or takes CKPT),
# exports it with `pdtrain export --format hf`, loads it with GPT2LMHeadModel.from_pretrained
# and checks that
#   1. its mean loss on the first B x T windows of the text equals `pdtrain eval` on the same
#      windows within 1e-4, and
#   2. `pdtrain sample --temperature 0` continues a prompt with the same bytes as transformers'
#      greedy generate().
# Needs PyPI (torch, transformers, safetensors) for a virtual environment in $VENV
# (default build/hf-venv); set PIP_INDEX_URL / TORCH_INDEX (e.g.
# https://download.pytorch.org/whl/cpu) to choose where torch comes from.
# Usage: scripts/check-hf.sh [CKPT.h5]   (run from the repository root after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-build/hf-venv}
WORK=${WORK:-build/check-hf}
TEXT=data/tinyshakespeare.txt
B=4 T=64 NEW=48 PROMPT="ROMEO:"
run() { scripts/mpirun-local -np "$1" build/pdtrain "${@:2}"; }

if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} torch
  "$VENV/bin/pip" install -q transformers safetensors
fi
rm -rf "$WORK" && mkdir -p "$WORK"
ckpt=${1:-}
if [[ -z $ckpt ]]; then
  run 1 tests/decks/shakespeare_small.toml --set parallel.holders=0 --set run.steps=60 \
      --set run.out_dir="$WORK/run" >"$WORK/train.log"
  ckpt=$WORK/run/checkpoints/ckpt-00000060.h5
fi
run 1 export "$ckpt" --format hf "$WORK/hf" >/dev/null
ours_loss=$(run 1 eval tests/decks/shakespeare_small.toml --batches 1 --set model.init="hf:$WORK/hf" \
                --set train.batch_size=$B --set model.seq_len=$T | sed -n 's/^eval .* loss=\([0-9.]*\).*/\1/p')
ours_text=$(run 1 sample "$ckpt" --prompt "$PROMPT" --tokens $NEW --temperature 0)
OURS_LOSS=$ours_loss OURS_TEXT=$ours_text "$VENV/bin/python" - "$WORK/hf" "$TEXT" $B $T $NEW "$PROMPT" <<'PY'
import os, sys, torch
from transformers import GPT2LMHeadModel
hf, text, B, T, new, prompt = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
model = GPT2LMHeadModel.from_pretrained(hf).eval()
data = open(text, "rb").read()[: B * T + 1]
x = torch.tensor(list(data[:-1])).view(B, T)
y = torch.tensor(list(data[1:])).view(B, T)
with torch.no_grad():
    logits = model(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()
    ids = torch.tensor([list(prompt.encode())])
    out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
theirs_text = bytes(out[0].tolist()).decode("latin-1")
ours_loss, ours_text = float(os.environ["OURS_LOSS"]), os.environ["OURS_TEXT"]
print(f"loss: pdtrain eval {ours_loss:.6f}, transformers {loss:.6f}, difference {abs(ours_loss - loss):.2e}")
print(f"greedy: pdtrain   {ours_text!r}\n        transformers {theirs_text!r}")
ok = abs(ours_loss - loss) <= 1e-4 and ours_text == theirs_text
print("check-hf: " + ("OK" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
