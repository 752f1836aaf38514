#!/usr/bin/env bash
# What a reservation costs in CPU, each component against a baseline
# measured in the same run (issue 48). CPU is read from the processes' own
# counters (/proc/<pid>/stat, Redis's INFO cpu), never from wall time.
#
#   1. origin CPU per reservation ÷ its CPU per GET /healthz, the same
#      client on the same connections: at a fixed rate (`loadgen
#      bench-origin`, 32 connections) and at saturation (wrk -t2 -c16);
#      split into the request threads and the workers' thread (settlement,
#      relay, expiry)
#   2. Redis CPU per reservation ÷ raw EVALSHA of lua/reserve.lua per call
#   3. Postgres CPU per settled hold ÷ a bare batch insert's per row (200
#      rows a statement into a table with a primary key alone)
#   4. the three together per reservation ÷ raw EVALSHA's Redis CPU per call
#   and, with COST_PERF=1, where the origin's CPU goes at saturation (perf).
#
#   scripts/bench.d/cost.sh [--md FILE]    appends a markdown table to FILE
#   COST_RATE=4000      the fixed rate (requests/s) of part 1
#   COST_SECONDS=10     each run's length
#   COST_STORES=apart   Redis and Postgres of the run's own, on CPU 0, the
#                       origin and the clients on CPU 1 (taskset); default:
#                       the machine's Redis and Postgres, every process on
#                       every core
#   COST_PERF=1         also profile the origin at saturation (perf record)
#   COST_TAIL=0         skip the tail (p99 at half the peak ÷ /healthz's)
#   COST_ORIGIN=path    another origin binary (an A/B against an older build)
#
# Uses target/release/{origin,loadgen} (scripts/bench builds them).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
source scripts/env.sh
md=""
[[ "${1:-}" == --md ]] && md="$2"
RATE="${COST_RATE:-4000}"
SECS="${COST_SECONDS:-10}"
STORES="${COST_STORES:-shared}"
ORIGIN="${COST_ORIGIN:-$ROOT/target/release/origin}"
LOADGEN="$ROOT/target/release/loadgen"
[[ -x "$ORIGIN" && -x "$LOADGEN" ]] || cargo build --release -q -p origin -p loadgen
command -v wrk >/dev/null || { echo "cost: wrk missing (scripts/bench installs it)" >&2; exit 1; }

run="$(date +%s)"
work="$(mktemp -d)"
pids=()
pg_data=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n "$pg_data" ]]; then as_pg "$PG_BIN/pg_ctl" -D "$pg_data" -m immediate stop >/dev/null 2>&1 || true; fi
  if [[ $STORES == shared ]]; then
    rcli --scan --pattern "cost$run*" | xargs -r -n 500 redis-cli -p "$REDIS_PORT" del >/dev/null || true
    dropdb -h 127.0.0.1 -p "$PG_PORT" -U postgres --if-exists "$db" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
as_pg() { if [[ $EUID == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"

# Where the stores run, and on which cores everything runs.
on_stores=()
on_app=()
REDIS_PORT=6379
PG_PORT=5432
if [[ $STORES == apart ]]; then
  (($(nproc) >= 2)) || { echo "cost: COST_STORES=apart needs 2 cores" >&2; exit 1; }
  on_stores=(taskset -c 0)
  on_app=(taskset -c 1)
  REDIS_PORT="$(free_port)"
  "${on_stores[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no >"$work/redis.log" 2>&1 &
  pids+=($!)
  mkdir -p "$work/pg" && chmod 755 "$work"
  [[ $EUID == 0 ]] && chown postgres:postgres "$work/pg"
  pg_data="$work/pg/data"
  as_pg "$PG_BIN/initdb" -D "$pg_data" -A trust -U postgres >"$work/initdb.log" 2>&1
  PG_PORT="$(free_port)"
  # The machine's Postgres settings that matter here are the defaults too.
  as_pg "${on_stores[@]}" "$PG_BIN/pg_ctl" -D "$pg_data" -l "$work/pg/log" -w -t 60 \
    -o "-p $PG_PORT -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
db="fs_cost_$run"
key() { echo "$1:$(head -c 32 /dev/urandom | base64 -w0)"; }
export USER_TOKEN_KEYS="$(key ub)" ADMISSION_TOKEN_KEYS="$(key ab)" PAYMENT_WEBHOOK_SECRET=whsec_bench
export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$db" REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export REDIS_KEY_PREFIX="cost$run" RUST_LOG=warn ORIGIN_MAX_IN_FLIGHT=100000
export ORIGIN_ADDR="127.0.0.1:$(free_port)"
createdb -h 127.0.0.1 -p "$PG_PORT" -U postgres "$db"
"$ORIGIN" migrate >/dev/null
psql_q() { psql -qtA -h 127.0.0.1 -p "$PG_PORT" -U postgres "$db" -c "$1"; }
pg_dir="$(psql_q 'SHOW data_directory')"

# --- CPU counters (clock ticks; µs per tick from CLK_TCK)
TICK_US=$((1000000 / $(getconf CLK_TCK)))
# utime+stime of one process (every thread), or of its threads whose name
# matches $2 (an ERE on /proc/<pid>/task/*/comm).
ticks() {
  local pid=$1 only=${2:-} t n=0 f
  if [[ -z "$only" ]]; then
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat"
    return
  fi
  for t in /proc/"$pid"/task/*; do
    grep -qE "$only" "$t/comm" 2>/dev/null || continue
    f=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "$t/stat" 2>/dev/null) || continue
    n=$((n + f))
  done
  echo "$n"
}
# Every process of the Postgres serving $PG_PORT: the postmaster's own and
# its reaped children's ticks (cutime, cstime) and every live child's.
pg_ticks() {
  local pm n c
  pm=$(head -1 "$pg_dir/postmaster.pid")
  n=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$pm/stat")
  for c in $(pgrep -P "$pm"); do
    n=$((n + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$c/stat" 2>/dev/null || echo 0)))
  done
  echo "$n"
}
# Redis's own CPU in µs (INFO cpu: the whole server, every thread).
redis_us() { rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%d", s * 1000000 }'; }
per() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
json() { node -e 'const v=require(process.argv[1]);console.log(process.argv[2].split(".").reduce((o,k)=>o[k],v))' "$1" "$2"; }

# --- Baseline: raw EVALSHA of reserve.lua, Redis CPU per call
cat lua/_lib.lua <(echo) lua/reserve.lua >"$work/reserve.lua"
sha="$(rcli SCRIPT LOAD "$(cat "$work/reserve.lua")")"
b="cost$run-rb:{cost$run/s/0}"
rcli set "$b:stock" 1000000000 >/dev/null
calls=200000
r0=$(redis_us)
"${on_app[@]}" redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 50 -n "$calls" -r 1000000000 -P 1 -q \
  EVALSHA "$sha" 8 "$b:stock" "$b:holds" "$b:exp" "$b:users" "$b:quota" "$b:stream" "$b:unquota" "$b:idem:__rand_int__" \
  "acct:__rand_int__" 1 1000000000 3600000 "cost$run.0.__rand_int__" 0 s 86400 64 1 __rand_int__ >/dev/null 2>&1
evalsha_us=$(per $(($(redis_us) - r0)) "$calls")
rcli --scan --pattern "cost$run-rb*" | xargs -r -n 500 redis-cli -p "$REDIS_PORT" del >/dev/null
echo "cost: raw EVALSHA reserve.lua: Redis $evalsha_us µs per call ($calls calls, 50 clients)"

# --- Baseline: a bare batch insert, Postgres CPU per row
psql_q "CREATE TABLE bare (id text PRIMARY KEY, sale_id text NOT NULL, account text NOT NULL,
  qty int NOT NULL, created_at timestamptz NOT NULL)"
cat >"$work/bare.sql" <<'SQL'
INSERT INTO bare SELECT 'b' || :client_id || '-' || (random() * 1e15)::bigint || '-' || g,
  'bench', 'acct-' || g, 1, now() FROM generate_series(1, 200) g;
SQL
p0=$(pg_ticks)
"${on_app[@]}" pgbench -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -c 4 -j 2 -t 500 -f "$work/bare.sql" "$db" >/dev/null 2>&1
rows=$(psql_q 'SELECT count(*) FROM bare')
bare_us=$(per $((($(pg_ticks) - p0) * TICK_US)) "$rows")
psql_q 'DROP TABLE bare' >/dev/null
echo "cost: bare batch insert: Postgres $bare_us µs per row ($rows rows, 200 a statement)"

# --- The origin
"${on_app[@]}" "$ORIGIN" serve >"$work/origin.log" 2>&1 &
opid=$!
pids+=("$opid")
for _ in $(seq 300); do curl -fsS -o /dev/null "http://$ORIGIN_ADDR/healthz" 2>/dev/null && break; sleep 0.1; done
"$ORIGIN" sale create --sale bench --name bench --units 10000000 --per-user-limit 1000000 --shards 4 \
  --starts-at now --hold-seconds 3600 >/dev/null
"$LOADGEN" tokens --sale bench --count 10000 >"$work/tokens"
export BENCH_TOKENS="$work/tokens" BENCH_RUN="$run"
streams="$(rcli --scan --pattern "cost$run:*:stream")"
drained() {
  local n
  for _ in $(seq 1200); do
    n=0
    for k in $streams; do n=$((n + $(rcli xlen "$k"))); done
    [[ $n == 0 ]] && return 0
    sleep 0.1
  done
  echo "cost: settlement did not drain in 120 s" >&2
  exit 1
}
settled() { psql_q 'SELECT count(*) FROM reservations'; }
url="http://$ORIGIN_ADDR/api/sales/bench/reservations"
# Warm-up: connections, the sale's config, Redis's script cache.
"${on_app[@]}" "$LOADGEN" bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate 1000 --seconds 3 >/dev/null
drained

# One measured run: $1 label, then the command. Prints "requests origin_ticks
# request_thread_ticks worker_ticks redis_us pg_ticks settled" for the run and
# the drain after it (settlement's work for the run's holds is in its cost).
measure() {
  local label=$1
  shift
  local o0 w0 r0 p0 s0 out n
  o0=$(ticks "$opid"); w0=$(ticks "$opid" '^origin-workers'); r0=$(redis_us); p0=$(pg_ticks); s0=$(settled)
  out=$("${on_app[@]}" "$@")
  drained
  sleep 0.5
  n=$(count_of "$out")
  local o w
  o=$(($(ticks "$opid") - o0)); w=$(($(ticks "$opid" '^origin-workers') - w0))
  echo "$label $n $o $((o - w)) $w $(($(redis_us) - r0)) $(($(pg_ticks) - p0)) $(($(settled) - s0))"
}
count_of() { # loadgen JSON or wrk text → requests answered
  if [[ "$1" == '{'* ]]; then node -e 'console.log(JSON.parse(process.argv[1]).answered)' "$1"
  else grep -oE '^ *[0-9]+ requests in' <<<"$1" | awk '{print $1}'; fi
}
report() { # a measure line → "µs per request: origin (request threads, workers), Redis, Postgres"
  read -r label n o req w r p s <<<"$1"
  echo "cost: $label: $n answered; origin $(per $((o * TICK_US)) "$n") µs per request" \
    "(request threads $(per $((req * TICK_US)) "$n"), workers $(per $((w * TICK_US)) "$n")), Redis $(per "$r" "$n")," \
    "Postgres $(per $((p * TICK_US)) "$n"); $s settled" >&2
}
res_fixed=$(measure reservations-fixed "$LOADGEN" bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate "$RATE" --seconds "$SECS")
report "$res_fixed"
hz_fixed=$(measure healthz-fixed "$LOADGEN" bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate "$RATE" --seconds "$SECS" --probe /healthz)
report "$hz_fixed"
cmdstats() { rcli info commandstats | tr -d '\r' | sed -nE 's/^cmdstat_([a-z|]+):calls=([0-9]+),usec=([0-9]+).*/\1 \2 \3/p' | sort; }
cmdstats >"$work/cmd0"
res_sat=$(measure reservations-saturation wrk -t2 -c16 -d"${SECS}s" -s scripts/bench.d/reserve.wrk.lua "$url")
report "$res_sat"
cmdstats >"$work/cmd1"
# Redis's commands per reservation in that run and its drain (INFO
# commandstats; a script's own calls are counted too). Its usec figures are
# wall time, preemption included on shared cores: not shown.
redis_cmds=$(join -a2 -e0 -o '2.1,2.2,2.3,1.2,1.3' "$work/cmd0" "$work/cmd1" \
  | awk -v n="$(awk '{print $2}' <<<"$res_sat")" '($2 - $4) / n >= 0.005 { printf "%s%s %.2f", sep, $1, ($2 - $4) / n; sep = ", " }')
echo "cost: Redis commands per reservation at saturation: $redis_cmds" >&2
hz_sat=$(measure healthz-saturation wrk -t2 -c16 -d"${SECS}s" "http://$ORIGIN_ADDR/healthz")
report "$hz_sat"

field() { awk -v i="$2" '{print $i}' <<<"$1"; }
us() { per $(($(field "$1" "$2") * ${3:-$TICK_US})) "$(field "$1" 2)"; }
o_res_fixed=$(us "$res_fixed" 3); o_hz_fixed=$(us "$hz_fixed" 3)
o_res_sat=$(us "$res_sat" 3); o_hz_sat=$(us "$hz_sat" 3)
oq_res_fixed=$(us "$res_fixed" 4); oq_res_sat=$(us "$res_sat" 4)
ow_res_fixed=$(us "$res_fixed" 5)
r_res_fixed=$(us "$res_fixed" 6 1); r_res_sat=$(us "$res_sat" 6 1)
# Postgres per settled hold (the fixed-rate run and its drain).
pg_hold=$(per $(($(field "$res_fixed" 7) * TICK_US)) "$(field "$res_fixed" 8)")
whole=$(awk -v a="$o_res_fixed" -v b="$r_res_fixed" -v c="$pg_hold" 'BEGIN { printf "%.1f", a + b + c }')
echo "cost: origin CPU per reservation ÷ per /healthz: fixed $RATE/s $o_res_fixed ÷ $o_hz_fixed = $(ratio "$o_res_fixed" "$o_hz_fixed");" \
  "saturation (wrk -c16) $o_res_sat ÷ $o_hz_sat = $(ratio "$o_res_sat" "$o_hz_sat") (target ≤ 2)"
echo "cost: Redis CPU per reservation ÷ raw EVALSHA per call: $r_res_fixed ÷ $evalsha_us = $(ratio "$r_res_fixed" "$evalsha_us")"
echo "cost: Postgres CPU per settled hold ÷ bare insert per row: $pg_hold ÷ $bare_us = $(ratio "$pg_hold" "$bare_us") (target ≤ 2)"
echo "cost: origin + Redis + Postgres per reservation ÷ raw EVALSHA per call: $whole ÷ $evalsha_us = $(ratio "$whole" "$evalsha_us") (held, not yet paid: see BENCHMARKS.md)"

# --- The tail: p99 at half the peak ÷ /healthz p99 at the same rate, the
# same client, settlement running (issue 48's target for COST_STORES=apart).
tail_md=""
if [[ "${COST_TAIL:-1}" == 1 ]]; then
  "${on_app[@]}" wrk -t2 -c64 -d"${SECS}s" -s scripts/bench.d/reserve.wrk.lua "$url" >"$work/peak.txt"
  peak=$(grep -oE 'Requests/sec:\s+[0-9.]+' "$work/peak.txt" | awk '{print int($2)}')
  drained
  half=$((peak / 2))
  p99s=() hz99s=()
  for i in 1 2 3; do
    "${on_app[@]}" "$LOADGEN" bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate "$half" --seconds "$SECS" >"$work/half-$i.json"
    drained
    "${on_app[@]}" "$LOADGEN" bench-origin --origin "http://$ORIGIN_ADDR" --sale bench --rate "$half" --seconds "$SECS" --probe /healthz >"$work/hz-$i.json"
    p99s+=("$(json "$work/half-$i.json" p99_ms)") hz99s+=("$(json "$work/hz-$i.json" p99_ms)")
  done
  med() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
  p99=$(med "${p99s[@]}") hz99=$(med "${hz99s[@]}")
  echo "cost: tail ($STORES stores): peak $peak/s (wrk -c64); at $half/s p99 $p99 ms (runs ${p99s[*]}), /healthz p99 $hz99 ms (runs ${hz99s[*]}): $(ratio "$p99" "$hz99")"
  tail_md="| reservation p99 ÷ \`/healthz\` p99 at half the peak ($half/s of $peak/s), settlement running, $STORES stores | $p99 ms (runs ${p99s[*]}) | $hz99 ms (runs ${hz99s[*]}) | **$(ratio "$p99" "$hz99")** | ≤ 2 (stores apart) |"
fi

if [[ "${COST_PERF:-0}" == 1 ]]; then
  # Where the origin's CPU goes at saturation: samples by symbol, grouped.
  "${on_app[@]}" wrk -t2 -c16 -d"$((SECS + 2))s" -s scripts/bench.d/reserve.wrk.lua "$url" >/dev/null &
  wpid=$!
  sleep 1
  perf record -q -F 499 --call-graph dwarf,16384 -p "$opid" -o "$work/perf.data" -- sleep "$SECS" >/dev/null 2>"$work/perf.err" \
    || { echo "cost: perf record failed: $(tail -3 "$work/perf.err")" >&2; exit 1; }
  wait "$wpid" || true
  cp "$work/perf.data" "${COST_PERF_OUT:-/tmp/cost-perf.data}"
  echo "cost: where the origin's CPU goes at saturation (perf, $SECS s; the data in ${COST_PERF_OUT:-/tmp/cost-perf.data}):"
  perf script -i "$work/perf.data" 2>/dev/null | node scripts/bench.d/perf-parts.mjs | tee "$work/perf.md"
fi

if [[ -n "$md" ]]; then
  cat >>"$md" <<EOF
| cost (CPU per operation, $STORES stores) | measured | baseline (same run) | ratio | target |
|---|---:|---:|---:|---|
| origin per reservation ÷ per \`/healthz\`, $RATE/s fixed, 32 connections | $o_res_fixed µs (request threads $oq_res_fixed, workers $ow_res_fixed) | $o_hz_fixed µs | **$(ratio "$o_res_fixed" "$o_hz_fixed")** | ≤ 2 |
| origin per reservation ÷ per \`/healthz\`, saturation (wrk -t2 -c16) | $o_res_sat µs (request threads $oq_res_sat) | $o_hz_sat µs | **$(ratio "$o_res_sat" "$o_hz_sat")** | ≤ 2 |
| Redis per reservation ÷ raw EVALSHA per call | $r_res_fixed µs (saturation $r_res_sat) | $evalsha_us µs | $(ratio "$r_res_fixed" "$evalsha_us") (saturation $(ratio "$r_res_sat" "$evalsha_us")) | |
| Postgres per settled hold ÷ bare batch insert per row | $pg_hold µs | $bare_us µs | **$(ratio "$pg_hold" "$bare_us")** | ≤ 2 |
| origin + Redis + Postgres per reservation (held) ÷ raw EVALSHA per call | $whole µs | $evalsha_us µs | **$(ratio "$whole" "$evalsha_us")** | ≤ 4 (paid) |
${tail_md}
EOF
  echo "Redis commands per reservation at saturation (INFO commandstats, the script's own calls included): $redis_cmds" >>"$md"
  if [[ -f "$work/perf.md" ]]; then
    echo
    echo "Where the origin's CPU goes with reservations at saturation (\`perf record --call-graph dwarf\`, $SECS s, \`scripts/bench.d/perf-parts.mjs\`):"
    echo
    cat "$work/perf.md"
  fi >>"$md"
fi
