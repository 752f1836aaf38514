#!/usr/bin/env bash
# What one reconciler round costs on a sale with many live holds (issue 16),
# for two origin binaries side by side (e.g. a build of an earlier commit
# against the current one): the sale is filled by ROUNDS wrk runs of 10 s
# (default 4), then `reconcile --once` is timed twice per binary on the quiet
# sale (wall, Redis CPU from /proc/<pid>/schedstat, the reconciler's own CPU)
# and once per binary during 10 s of open-loop reservations at RATE (default
# 9000), beside a run without it. Uses the local Redis and Postgres.
#
#   OLD=path/to/origin NEW=target/release/origin scripts/bench.d/reconcile-cost.sh
#
# (Postgres CPU is not reported: the reconciler's backend exits with it.)
set -uo pipefail
source "$(dirname "$0")/../env.sh"
cd "$ROOT"
run=$(date +%s); tmp=$(mktemp -d)
key() { echo "$1:$(head -c 32 /dev/urandom | base64 -w0)"; }
export USER_TOKEN_KEYS="$(key ub)" ADMISSION_TOKEN_KEYS="$(key ab)" PAYMENT_WEBHOOK_SECRET=whsec_bench
export REDIS_URL=redis://127.0.0.1:6379 RUST_LOG=warn ORIGIN_MAX_IN_FLIGHT=100000
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
export ORIGIN_ADDR="127.0.0.1:$port"
: "${OLD:?OLD=path of the first origin binary}" "${NEW:=target/release/origin}"
bin=$NEW
db="fs_rc_$run"; export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" REDIS_KEY_PREFIX="rc$run"
createdb -h 127.0.0.1 -U postgres "$db"; "$bin" migrate >/dev/null
$bin serve --no-reconcile >"$tmp/origin.log" 2>&1 & pid=$!
for _ in $(seq 100); do curl -fsS -o /dev/null "http://$ORIGIN_ADDR/healthz" 2>/dev/null && break; sleep 0.1; done
"$bin" sale create --sale bench --name bench --units 10000000 --per-user-limit 1000000 --shards 4 --starts-at now --hold-seconds 3600 >/dev/null
streams="$(redis-cli --scan --pattern "rc$run:*:stream")"
drained() { for _ in $(seq 1200); do n=0; for k in $streams; do n=$((n + $(redis-cli xlen "$k"))); done; [[ $n == 0 ]] && return 0; sleep 0.1; done; }
target/release/loadgen tokens --sale bench --count 1000 >"$tmp/tokens"
export BENCH_TOKENS="$tmp/tokens" BENCH_RUN="$run"
for i in $(seq ${ROUNDS:-4}); do wrk -t2 -c64 -d10s -s scripts/bench.d/reserve.wrk.lua "http://$ORIGIN_ADDR/api/sales/bench/reservations" | grep Requests/sec; drained; done
echo "live holds: $(for k in $streams; do redis-cli hlen "${k%:stream}:holds"; done | awk '{s+=$1} END {print s+0}')"
cpu() { awk '{print $1}' /proc/"$(pgrep -f "redis-server 127.0.0.1:6379" | head -1)"/schedstat; } # Redis's CPU, ns
quiet() { # label bin
  r0=$(cpu); local t0=$(date +%s%N)
  /usr/bin/time -f "%U %S" -o $tmp/time "$2" reconcile --once > $tmp/report 2>/dev/null
  local t1=$(date +%s%N); r1=$(cpu)
  echo "  quiet, $1: wall $(( (t1-t0)/1000000 )) ms, redis $(( (r1-r0)/1000000 )) ms, reconciler cpu $(awk '{print ($1+$2)*1000}' $tmp/time) ms; scanned $(grep -o '"hold_records_scanned": [0-9]*' $tmp/report | head -1)"
}
loaded() { # label bin|none
  target/release/loadgen bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate ${RATE:-9000} --seconds 10 > $tmp/lg & local lg=$!
  sleep 2; local t0=$(date +%s%N)
  [[ $2 != none ]] && "$2" reconcile --once >/dev/null 2>&1
  local t1=$(date +%s%N); wait $lg
  echo "  under ${RATE:-9000}/s, $1: reconcile wall $(( (t1-t0)/1000000 )) ms; $(node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(`p50 ${r.p50_ms} p99 ${r.p99_ms} p999 ${r.p999_ms} achieved ${r.achieved_rate}`)' $tmp/lg)"
  drained
}
for b in old new old new; do if [[ $b == old ]]; then quiet old "$OLD"; else quiet new "$NEW"; fi; done
for r in 1 2; do loaded "no reconciler" none; loaded old "$OLD"; loaded new "$NEW"; done
kill $pid; wait $pid 2>/dev/null
dropdb -h 127.0.0.1 -U postgres "$db"
redis-cli --scan --pattern "rc$run*" | xargs -r -n 1000 redis-cli unlink >/dev/null
rm -rf $tmp
