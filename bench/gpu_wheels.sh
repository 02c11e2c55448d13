#!/usr/bin/env bash
# Downloads into .whl/ (ignored by git) the wheels a GPU host lacks for running fxtune with its
# own torch: the web stack and the CLI stack, at the versions this project's venv runs, so the
# GPU host imports what the suite was run with. A GPU image's own versions differ: its typer
# registered no `--device` option of `fxtune tune` and a newer FastAPI needs opentelemetry.
# Run from the project root with the venv built (`make venv`); then carry `.whl` to the GPU
# host, where bench/gpu_check.sh installs them offline into .whl/site.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
names=(fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv sqlalchemy
  greenlet alembic mako python-multipart uvicorn typing-inspection annotated-types annotated-doc
  opentelemetry-api typer click rich shellingham h11 anyio httpx httpcore)
pins=$(.venv/bin/python - "${names[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"{name} is not in .venv: run `make venv` first")
EOF
)
rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086  # one pin per word
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl $pins "$@"
ls .whl | wc -l | xargs echo "wheels in .whl:"
