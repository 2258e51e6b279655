#!/usr/bin/env bash
# Runs a traced pipeline run and checks its Chrome trace and bubble column.
# Usage: check_trace.sh OUT_DIR RANKS -- command...
set -u
out=$1 ranks=$2
shift 3
"$@" >/dev/null 2>&1 || { echo "FAIL: the traced run exited with $?"; exit 1; }
fail=0
for ((r = 0; r < ranks; r++)); do
  f="$out/trace/rank-$r.json"
  [ -s "$f" ] || { echo "FAIL: missing $f"; fail=1; continue; }
  grep -q "\"pid\":$r," "$out/trace/trace.json" || { echo "FAIL: merged trace lacks rank $r"; fail=1; }
done
for what in '"name":"forward mb0"' '"name":"backward mb3"' '"cat":"p2p"' '"name":"fetch wte v1"' \
            '"name":"push"' '"name":"push layer0"' '"name":"update v1"'; do
  grep -q "$what" "$out/trace/trace.json" || { echo "FAIL: merged trace lacks $what"; fail=1; }
done
# The merged file is one JSON object whose event list closes properly.
head -c 16 "$out/trace/trace.json" | grep -q '{"traceEvents"' || { echo "FAIL: not a trace object"; fail=1; }
tail -n 1 "$out/trace/trace.json" | grep -q '^]}$' || { echo "FAIL: trace not closed"; fail=1; }
# With 2 stages the measured bubble is positive on every step.
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "bubble") c = i }
         NR > 1 && !($c > 0) { bad = 1 } END { exit bad || !c }' "$out/metrics.csv" \
  || { echo "FAIL: bubble column missing or not positive"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: trace of $ranks ranks and bubble column"
exit $fail
