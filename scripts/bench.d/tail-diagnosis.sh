#!/usr/bin/env bash
# Where the reservation tail comes from (issue 16): the release origin with
# settlement in-process and with `serve --no-settle`, each on a fresh
# database and key prefix; at each rate, reservation p99 beside /healthz
# p99 with the same open-loop client (loadgen bench-origin, 6 s each,
# after a 3 s warm-up). Uses target/release/{origin,loadgen} (scripts/bench
# builds them) and the local Redis and Postgres.
#
#   scripts/bench.d/tail-diagnosis.sh [RATE ...]   (default 4000 6000)
#   ORIGIN=path      another origin binary (e.g. a copy of an earlier build)
#   MODES="settle"   only some of the modes (default "settle no-settle")
#   (other origin settings, e.g. ORIGIN_WORKERS_NICE, pass through)
set -euo pipefail
source "$(dirname "$0")/../env.sh"
cd "$ROOT"
rates=("${@:-4000}")
[[ $# -gt 0 ]] || rates=(4000 6000)
run=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
key() { echo "$1:$(head -c 32 /dev/urandom | base64 -w0)"; }
export USER_TOKEN_KEYS="$(key ub)" ADMISSION_TOKEN_KEYS="$(key ab)" PAYMENT_WEBHOOK_SECRET=whsec_bench
export REDIS_URL=redis://127.0.0.1:6379 RUST_LOG=warn ORIGIN_MAX_IN_FLIGHT=100000
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
export ORIGIN_ADDR="127.0.0.1:$port"
bin="${ORIGIN:-target/release/origin}"
for mode in ${MODES:-settle no-settle}; do
  db="fs_diag_${run}_${mode//-/_}"; export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" REDIS_KEY_PREFIX="dg$run$mode"
  createdb -h 127.0.0.1 -U postgres "$db"; "$bin" migrate >/dev/null
  flags=(); [[ $mode == no-settle ]] && flags=(--no-settle)
  "$bin" serve "${flags[@]}" >"$tmp/origin-$mode.log" 2>&1 & pid=$!
  for _ in $(seq 100); do curl -fsS -o /dev/null "http://$ORIGIN_ADDR/healthz" 2>/dev/null && break; sleep 0.1; done
  "$bin" sale create --sale bench --name bench --units 10000000 --per-user-limit 1000000 --shards 4 --starts-at now --hold-seconds 3600 >/dev/null
  target/release/loadgen tokens --sale bench --count 1000 >"$tmp/tokens"
  export BENCH_TOKENS="$tmp/tokens" BENCH_RUN="$run"
  target/release/loadgen bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate 1000 --seconds 3 >/dev/null
  for rate in "${rates[@]}"; do
    r=$(target/release/loadgen bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate $rate --seconds 6)
    h=$(target/release/loadgen bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate $rate --seconds 6 --probe /healthz)
    node -e 'const r=JSON.parse(process.argv[1]),h=JSON.parse(process.argv[2]);console.log(`${process.argv[3]} ${process.argv[4]}/s: achieved ${r.achieved_rate}, p50 ${r.p50_ms}, p99 ${r.p99_ms}, healthz p99 ${h.p99_ms}, ratio ${(r.p99_ms/h.p99_ms).toFixed(2)}`)' "$r" "$h" $mode $rate
  done
  kill $pid; wait $pid 2>/dev/null || true
  dropdb -h 127.0.0.1 -U postgres "$db"
  redis-cli --scan --pattern "dg$run*" | xargs -r -n 500 redis-cli del >/dev/null
done
