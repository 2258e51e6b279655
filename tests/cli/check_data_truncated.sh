#!/usr/bin/env bash
# A training file truncated while the job runs ends the whole job with status 4 and a message
# naming the file, not SIGBUS on the ranks that read it. Deterministic: the file is truncated
# once metrics.csv shows step 3, while the run has 100000 steps to go, and every sequence read
# after that checks the file first.
# Usage: check_data_truncated.sh CORPUS OUT_DIR -- mpirun-prefix... pdtrain
set -u
corpus=$1 out=$2
shift 3
rm -rf "$out"
mkdir -p "$out"
data="$out/corpus.txt"
cp "$corpus" "$data"
log="$out/log.txt"
"$@" --set data.source=text --set data.path="$data" --set model.vocab_size=128 \
  --set run.steps=100000 --set run.log_every=1 --set train.eval_every=0 \
  --set run.out_dir="$out/run" >"$log" 2>&1 &
job=$!
for _ in $(seq 1 300); do
  grep -q "^3," "$out/run/metrics.csv" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
fail=0
grep -q "^3," "$out/run/metrics.csv" 2>/dev/null || { echo "FAIL: step 3 never reached"; fail=1; }
truncate -s 1000 "$data"
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: still running 30 s after the truncation"; kill -9 "$job"; fail=1
fi
wait "$job"
rc=$?
[ $rc -eq 4 ] || { echo "FAIL: exit status $rc, expected 4"; fail=1; }
grep -qE "$data: the data file changed while the job was running \(it was [0-9]+ bytes, now 1000 bytes" "$log" \
  || { echo "FAIL: no message naming the file and its change"; fail=1; }
if grep -qiE "bus error|signal [0-9]+|SIGBUS" "$log"; then echo "FAIL: a rank died of a signal"; fail=1; fi
[ $fail -eq 0 ] && echo "PASS: truncated data file -> status 4 naming $data" || cat "$log"
exit $fail
