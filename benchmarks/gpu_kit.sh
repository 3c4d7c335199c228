#!/usr/bin/env bash
# GPU kit: install what the run needs from this repository's own files, then run
# benchmarks/gpu_kit.py under an 8-minute limit. One JSON + one markdown report land in the
# output directory (default: $OUT, else runs/gpu_kit).
#
#   bash benchmarks/gpu_kit.sh              # on the GPU machine: every row
#   bash benchmarks/gpu_kit.sh --dry-run    # on CPU: interpret-mode correctness + report skeleton
#   bash benchmarks/gpu_kit.sh --out DIR [--skip-model] [--tokens 512,2048,8192]
#
# Environment (the lent H200 has no network; its python3 already holds a CUDA jax, flax, optax,
# orbax, tensorstore; KINDS.md of the device tool): the repository is put on PYTHONPATH, nothing
# is installed when the imports work. Only when they fail does the script try the registry:
# `pip install -e .` (kernels_pallas / c2jax missing) and, for a GPU run where nvidia-smi sees a
# GPU but jax does not, `pip install "jax[cuda13]==<jax version>"` then `jax[cuda12]`. A failure
# that stops the kit is written to the report directory (install.log, and gpu_kit.json with
# status "error: ...") and the script exits 2. Missing c2jax-only packages (e.g. ml_collections)
# do not stop it: the model rows then say "error: ModuleNotFoundError ...". The whole script,
# install included, stays under GPU_KIT_LIMIT_S (default 480 s).
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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LIMIT="${GPU_KIT_LIMIT_S:-480}"

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
if ! "$PY" -c "import jax, kernels_pallas" >>"$LOG" 2>&1; then
  echo "[gpu_kit.sh] jax / kernels_pallas not importable: pip install -e ." | tee -a "$LOG"
  "$PY" -m pip install -q --timeout 10 --retries 0 -e . >>"$LOG" 2>&1 || fail "pip install -e ." "jax or kernels_pallas missing and pip could not install the repository"
fi
if ! "$PY" -c "import c2jax.model, c2jax.sampling" >>"$LOG" 2>&1; then
  echo "[gpu_kit.sh] c2jax imports fail (see log): trying pip install -e . (model rows need it)" | tee -a "$LOG"
  "$PY" -m pip install -q --timeout 10 --retries 0 -e . >>"$LOG" 2>&1 || echo "[gpu_kit.sh] pip failed: model rows will report the error" | tee -a "$LOG"
fi
if [ "$DRY" = 0 ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >>"$LOG" 2>&1; then
    if ! "$PY" -c "import jax, sys; sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)" >>"$LOG" 2>&1; then
      JV="$("$PY" -c 'import jax; print(jax.__version__)')"
      echo "[gpu_kit.sh] jax sees no GPU: pip install jax[cuda13]==$JV (then cuda12)" | tee -a "$LOG"
      "$PY" -m pip install -q --timeout 10 --retries 0 "jax[cuda13]==$JV" >>"$LOG" 2>&1 || "$PY" -m pip install -q --timeout 10 --retries 0 "jax[cuda12]==$JV" >>"$LOG" 2>&1 \
        || fail "pip install jax[cuda13|cuda12]==$JV" "no CUDA jaxlib (registry unreachable or no wheel)"
      "$PY" -c "import jax, sys; print(jax.devices()); sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)" >>"$LOG" 2>&1 \
        || fail "jax GPU backend" "jax still sees no GPU after installing the CUDA plugin"
    fi
  else
    echo "[gpu_kit.sh] no GPU visible (nvidia-smi absent or failing): running the CPU part only" | tee -a "$LOG"
    ARGS+=("--dry-run")
    DRY=1
  fi
fi
export JAX_PLATFORMS="${JAX_PLATFORMS:-}"
if [ "$DRY" = 1 ]; then export JAX_PLATFORMS=cpu; fi
REMAIN=$(( LIMIT - SECONDS ))
[ "$REMAIN" -lt 60 ] && REMAIN=60
echo "[gpu_kit.sh] running benchmarks/gpu_kit.py (limit ${REMAIN} s)" | tee -a "$LOG"
PYTHONUNBUFFERED=1 timeout "$REMAIN" "$PY" benchmarks/gpu_kit.py --out "$OUT_DIR" ${ARGS[@]+"${ARGS[@]}"}
RC=$?
[ $RC = 124 ] && echo "[gpu_kit.sh] gpu_kit.py hit the time limit; gpu_kit.json holds the sections done (meta.complete=false)" >&2
exit $RC
