# Sourced by scripts/test-edge and scripts/bench-edge: builds and starts a
# private stack on free loopback ports — `origin serve` on a fresh Postgres
# database and Redis key prefix, and `wrangler dev` from its own config
# folder (own .dev.vars and Durable Object state) — and stops all of it on
# exit. Exports EDGE_URL, ORIGIN_URL, ORIGIN_BIN, ORIGIN_PID, RUN_DIR, the
# token keys, ADMIN_KEYS (two admin keys, as during a rotation: the edge's
# per-sale metrics answer either) and the origin's environment for the CLI.
#
#   ORIGIN_BIN=path   use this origin binary instead of building it
#   EDGE_E2E_KEEP=1   keep the run folder (logs) under test-output/
#   EDGE_LOG_LEVEL=l  wrangler's --log-level (default warn); `log` also shows
#                     the Worker's console lines (one per forwarded request)
#   EDGE_ADMISSION_CONTROL=fixed|adaptive  the Worker's ADMISSION_CONTROL
#                     (unset: the default, adaptive)
#   EDGE_REDIS_URL=u  use this Redis instead of starting a private one
#
# Each stack has a Redis server of its own (loopback, free port, nothing on
# disk): the e2e tests pause and slow it (CLIENT PAUSE), which would pause
# every other stack sharing the server — two passes run side by side in
# scripts/test.
#
# Logs: $RUN_DIR/origin.log (origin, one access line per request) and
# $RUN_DIR/wrangler.log (wrangler dev and the Worker's console).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
# A free port below the kernel's ephemeral range, for a port that is picked
# now and listened on much later (the Turnstile stand-in, minutes into the
# run): a port from `free_port` may meanwhile be handed to the other e2e pass
# running side by side (CI: EADDRINUSE, its edge had taken it); the kernel
# never hands out these.
quiet_port() {
  node -e '
    const lo = 20000, hi = Math.min(32768, Number(require("fs").readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").split(/\s+/)[0]) || 32768);
    const net = require("net");
    const tryOne = (n) => {
      if (n === 0) { console.error("no quiet port"); process.exit(1); }
      const p = lo + Math.floor(Math.random() * (hi - lo));
      const s = net.createServer().once("error", () => tryOne(n - 1)).listen(p, "127.0.0.1", () => { console.log(p); s.close(); });
    };
    tryOne(50);'
}
# A quiet port reserved for this stack until it exits: two stacks started
# side by side (scripts/test) could otherwise pick the same port, each
# checking it free before either listens (CI has seen EADDRINUSE). The
# reservation is a directory (mkdir is atomic) holding the owner's pid; a
# reservation whose owner is gone is taken over.
PORT_LOCKS="${TMPDIR:-/tmp}/flashsale-e2e-ports"
mkdir -p "$PORT_LOCKS"
reserved_ports=()
reserve_port() { # prints nothing; sets RESERVED
  local p owner
  for _ in $(seq 50); do
    p="$(quiet_port)"
    if mkdir "$PORT_LOCKS/$p" 2>/dev/null; then
      echo $$ >"$PORT_LOCKS/$p/pid"
      reserved_ports+=("$p")
      RESERVED=$p
      return 0
    fi
    owner="$(cat "$PORT_LOCKS/$p/pid" 2>/dev/null || true)"
    if [[ -n $owner ]] && ! kill -0 "$owner" 2>/dev/null; then
      rm -rf "$PORT_LOCKS/$p"
    fi
  done
  echo "edge-stack: no port could be reserved" >&2
  return 1
}
wait_http() { # url seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "edge-stack: $1 did not answer within $2 s" >&2
  return 1
}

echo "== ${STACK_NAME:-edge-stack}: building origin and edge" >&2
if [[ -z "${ORIGIN_BIN:-}" ]]; then
  cargo build -q -p origin
  target_dir="$(cargo metadata --format-version 1 --no-deps | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).target_directory))')"
  ORIGIN_BIN="$target_dir/debug/origin"
fi
scripts/edge-build >/dev/null 2>&1 || scripts/edge-build

run_id="$(date +%s)_$RANDOM"
RUN_DIR="$ROOT/test-output/${STACK_NAME:-edge-stack}-$run_id"
mkdir -p "$RUN_DIR"
stack_pids=()
stack_db="fs_edge_$run_id"
stack_cleanup() {
  local code=$?
  local pid
  for pid in "${stack_pids[@]}"; do
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${stack_pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  dropdb -h 127.0.0.1 -U postgres --if-exists "$stack_db" 2>/dev/null || true
  for p in "${reserved_ports[@]}"; do rm -rf "${PORT_LOCKS:?}/$p"; done
  if [[ $code != 0 ]]; then
    echo "${STACK_NAME:-edge-stack}: failed; logs in $RUN_DIR" >&2
    tail -n 30 "$RUN_DIR"/*.log >&2 || true
  elif [[ "${EDGE_E2E_KEEP:-0}" != 1 ]]; then
    rm -rf "$RUN_DIR"
  fi
  exit $code
}
trap stack_cleanup EXIT INT TERM

key() { echo "$1:$(head -c 32 /dev/urandom | base64 -w0)"; }
export USER_TOKEN_KEYS ADMISSION_TOKEN_KEYS PAYMENT_WEBHOOK_SECRET
USER_TOKEN_KEYS="$(key "u$RANDOM")"
ADMISSION_TOKEN_KEYS="$(key "a$RANDOM"),$(key "a$RANDOM")"
PAYMENT_WEBHOOK_SECRET="$(head -c 24 /dev/urandom | base64 -w0)"
export ADMIN_KEYS
admin_secret() { head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '='; }
# The first key may write (the origin's admin API: issue 47), the second
# only read, in the edge's older unscoped form.
ADMIN_KEYS="ops-e2e:write:$(admin_secret),old-e2e:$(admin_secret)"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$stack_db"
if [[ -n "${EDGE_REDIS_URL:-}" ]]; then
  export REDIS_URL="$EDGE_REDIS_URL"
else
  source "$ROOT/scripts/redis-server.sh"
  REDIS_PORT=""
  for _ in 1 2 3; do
    port="$(free_port)"
    if redis_server_on "$RUN_DIR/redis" "$RUN_DIR/redis.log" "$port"; then
      stack_pids+=("$REDIS_PID")
      REDIS_PORT=$port
      break
    fi
    kill -KILL "$REDIS_PID" 2>/dev/null || true
  done
  if [[ -z "$REDIS_PORT" ]]; then
    echo "edge-stack: redis-server did not start (see $RUN_DIR/redis.log)" >&2
    exit 1
  fi
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
fi
export REDIS_KEY_PREFIX="fs_edge_$run_id"
export ORIGIN_DEV_MODE=1
reserve_port; ORIGIN_PORT=$RESERVED
reserve_port; EDGE_PORT=$RESERVED
reserve_port; ADMIN_PORT=$RESERVED
reserve_port; INSPECTOR_PORT=$RESERVED
# The e2e Turnstile test serves a stand-in siteverify on this port.
reserve_port; TURNSTILE_PORT=$RESERVED
export TURNSTILE_PORT
export ORIGIN_ADDR="127.0.0.1:$ORIGIN_PORT"
# The origin's admin API, and where it reads the edge's queue figures.
export ADMIN_ADDR="127.0.0.1:$ADMIN_PORT" ADMIN_URL="http://127.0.0.1:$ADMIN_PORT"
export ADMIN_EDGE_URL="http://127.0.0.1:$EDGE_PORT"

createdb -h 127.0.0.1 -U postgres "$stack_db"
"$ORIGIN_BIN" migrate >"$RUN_DIR/migrate.log" 2>&1
"$ORIGIN_BIN" serve >"$RUN_DIR/origin.log" 2>&1 &
stack_pids+=($!)
ORIGIN_PID=$!

EDGE_DIR="$RUN_DIR/edge"
mkdir -p "$EDGE_DIR"
sed -e "s#^main = \"#main = \"$ROOT/#" \
    -e "s#^command = \"#command = \"$ROOT/#" \
    -e "s#^watch_dir = \"#watch_dir = \"$ROOT/#" \
    -e "s#^directory = \"#directory = \"$ROOT/#" \
    -e "s#^ORIGIN_URL = .*#ORIGIN_URL = \"http://127.0.0.1:$ORIGIN_PORT\"#" \
    wrangler.toml >"$EDGE_DIR/wrangler.toml"
{
  echo "USER_TOKEN_KEYS=$USER_TOKEN_KEYS"
  echo "ADMISSION_TOKEN_KEYS=$ADMISSION_TOKEN_KEYS"
  echo "ADMIN_KEYS=$ADMIN_KEYS"
  echo "DEV_MODE=${EDGE_DEV_MODE:-0}"
  echo "TURNSTILE_SITEVERIFY_URL=http://127.0.0.1:$TURNSTILE_PORT/siteverify"
  echo "TURNSTILE_SECRET_KEY=e2e-turnstile-secret"
  [[ -z "${EDGE_ADMISSION_CONTROL:-}" ]] || echo "ADMISSION_CONTROL=$EDGE_ADMISSION_CONTROL"
  [[ -z "${EDGE_DRAW_BEACON_WAIT_SECS:-}" ]] || echo "DRAW_BEACON_WAIT_SECS=$EDGE_DRAW_BEACON_WAIT_SECS"
} >"$EDGE_DIR/.dev.vars"
(cd "$EDGE_DIR" && EDGE_SKIP_BUILD=1 exec wrangler dev --config "$EDGE_DIR/wrangler.toml" \
  --port "$EDGE_PORT" --ip 127.0.0.1 --inspector-port "$INSPECTOR_PORT" \
  --persist-to "$EDGE_DIR/state" --show-interactive-dev-session=false \
  --log-level "${EDGE_LOG_LEVEL:-warn}" >"$RUN_DIR/wrangler.log" 2>&1) &
stack_pids+=($!)

wait_http "http://127.0.0.1:$ORIGIN_PORT/healthz" 30
wait_http "http://127.0.0.1:$EDGE_PORT/api/health" 90

export EDGE_URL="http://127.0.0.1:$EDGE_PORT"
export ORIGIN_URL="http://127.0.0.1:$ORIGIN_PORT"
export ORIGIN_BIN ORIGIN_PID RUN_DIR
echo "== ${STACK_NAME:-edge-stack}: origin $ORIGIN_URL, edge $EDGE_URL, run $run_id" >&2
