# Sourced by scripts that start Redis servers of their own (scripts/chaos,
# scripts/edge-stack.sh); not a command.
#
# redis_server_on DIR LOG PORT [ARGS…]: starts redis-server on loopback PORT
# with nothing on disk (working folder DIR, output LOG) and sets REDIS_PID,
# even when it fails, so the caller can record and stop it. Returns 0 only
# once the server answering on PORT is this child: a port picked free a
# moment ago may have been taken since by another process (two stacks start
# side by side in scripts/test), and a Redis that is not ours must never be
# the one a test pauses or flushes.
redis_server_on() {
  local dir=$1 log=$2 port=$3
  shift 3
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" "$@" >"$log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    if [[ "$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | awk -F: '/^process_id:/{print $2}')" == "$REDIS_PID" ]]; then
      return 0
    fi
    kill -0 "$REDIS_PID" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}
