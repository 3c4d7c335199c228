#!/usr/bin/env bash
# GPU kit: install what the run needs from this repository's own files, then run
# benchmarks/gpu_kit.py under an 8-minute limit. One JSON + one markdown report land in the
# output directory (default: $OUT, else runs/gpu_kit).
#
#   bash benchmarks/gpu_kit.sh              # on the GPU machine: every row
#   bash benchmarks/gpu_kit.sh --dry-run    # on CPU: interpret-mode correctness + report skeleton
#   bash benchmarks/gpu_kit.sh --out DIR [--skip-model] [--tokens 512,2048,8192]
#
# Installs: if the interpreter cannot import c2jax, `pip install -e .` (registry reachable);
# for a GPU run, if jax sees no GPU but nvidia-smi does, `pip install "jax[cuda12]==<jax version>"`
# (the CUDA jaxlib plugin matching the installed jax). Any failure is written to the report
# directory as install.log + gpu_kit.json with status "error: ..." and the script exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUT_DIR="${OUT:-runs/gpu_kit}"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; ARGS+=("--dry-run") ;;
    --out) OUT_DIR="$2"; shift ;;
    --out=*) OUT_DIR="${1#--out=}" ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/install.log"
: > "$LOG"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY="$(command -v python3 || command -v python)"; fi

fail() {  # fail STEP MESSAGE: a report that says what broke, then exit 2
  echo "[gpu_kit.sh] $1 failed: $2 (see $LOG)" >&2
  "$PY" - "$OUT_DIR" "$1" "$2" <<'PYEOF' || true
import json, sys
out, step, msg = sys.argv[1:4]
json.dump({"meta": {"dry_run": None, "failed_step": step}, "device": {},
           "rows": [{"section": "setup", "name": step, "status": f"error: {msg}", "value": None,
                     "unit": "", "detail": f"see {out}/install.log"}]},
          open(f"{out}/gpu_kit.json", "w"), indent=2)
open(f"{out}/gpu_kit.md", "w").write(f"# GPU kit report\n\nsetup step `{step}` failed: {msg}\n")
PYEOF
  exit 2
}

echo "[gpu_kit.sh] python: $PY ($("$PY" --version 2>&1))" | tee -a "$LOG"
if ! "$PY" -c "import c2jax, kernels_pallas, jax" >>"$LOG" 2>&1; then
  echo "[gpu_kit.sh] installing the repository (pip install -e .)" | tee -a "$LOG"
  "$PY" -m pip install -q -e . >>"$LOG" 2>&1 || fail "pip install -e ." "pip could not install the repository"
fi
if [ "$DRY" = 0 ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >>"$LOG" 2>&1; then
    if ! "$PY" -c "import jax, sys; sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)" >>"$LOG" 2>&1; then
      JV="$("$PY" -c 'import jax; print(jax.__version__)')"
      echo "[gpu_kit.sh] jaxlib is CPU-only: pip install jax[cuda12]==$JV" | tee -a "$LOG"
      "$PY" -m pip install -q "jax[cuda12]==$JV" >>"$LOG" 2>&1 || fail "pip install jax[cuda12]==$JV" "no CUDA jaxlib from the registry"
      "$PY" -c "import jax, sys; print(jax.devices()); sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)" >>"$LOG" 2>&1 \
        || fail "jax GPU backend" "jax still sees no GPU after installing jax[cuda12]"
    fi
  else
    echo "[gpu_kit.sh] no GPU visible (nvidia-smi absent or failing): running the CPU part only" | tee -a "$LOG"
    ARGS+=("--dry-run")
  fi
fi
export JAX_PLATFORMS="${JAX_PLATFORMS:-}"
[ "$DRY" = 1 ] && export JAX_PLATFORMS=cpu
timeout 480 "$PY" benchmarks/gpu_kit.py --out "$OUT_DIR" "${ARGS[@]}"
RC=$?
[ $RC = 124 ] && echo "[gpu_kit.sh] gpu_kit.py hit the 8-minute limit; the report may be missing" >&2
exit $RC
