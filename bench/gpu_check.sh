#!/usr/bin/env bash
# `make gpu-check OUT=DIR`: bench.gpu_check with the machine's own torch, installing nothing
# from the network.
#
# The interpreter: python3 when its torch sees a CUDA device (a GPU host's own build, torch
# 2.11+cu130 on the H100 host: the project's venv and its 2.13 pin would replace it with a CPU
# build); else the project's venv when there is one (the CPU dry run, the "no CUDA" status);
# else python3. GPU_CHECK_PYTHON overrides the choice.
# The web stack: when that interpreter cannot import it and `.whl/` holds wheels
# (bench/gpu_wheels.sh: the venv's versions), they are installed offline into .whl/site, inside the
# checkout (a worker's sandbox has a private /tmp), and put on PYTHONPATH.
set -euo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR [bench.gpu_check options]}
shift
cd "$(dirname "$0")/.."
py=${GPU_CHECK_PYTHON:-}
if [ -z "$py" ]; then
  if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py=python3
  elif [ -x .venv/bin/python ]; then
    py=.venv/bin/python
  else
    py=python3
  fi
fi
site=
if ! "$py" -c 'import fastapi, sqlalchemy, uvicorn, alembic, pydantic_settings' 2>/dev/null \
   && compgen -G '.whl/*.whl' >/dev/null; then
  site=$PWD/.whl/site
  "$py" -m pip install -q --no-index --no-deps --upgrade --target "$site" .whl/*.whl
fi
export PYTHONPATH=$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}
echo "gpu-check: $("$py" -c 'import sys; print(sys.executable)') ${site:+(wheels from .whl)}"
exec "$py" -m bench.gpu_check --out "$out" "$@"
