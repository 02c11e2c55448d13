# One image for the service and the workers, built from fxtune's wheel: it holds what
# `pip install 'fxtune[service,postgres,openvino,onnxruntime]'` installs and no source tree (the
# runtimes: workers tune under them, the service checks their artifacts). CPU torch by default; the
# GPU worker builds with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (see
# docker-compose.yml).

# Stage 1: the wheel (and nothing else leaves this stage).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# Stage 2: the runtime.
FROM python:3.11-slim
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FXTUNE_DATA_DIR=/data
# bubblewrap isolates tuning children: workers refuse to run without it (docker-compose.yml runs
# them with the seccomp and AppArmor settings it needs).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# torch first, from the index that has the wanted build (CPU or CUDA), at the version the
# project tests (constraints.txt); the wheel's install below keeps it.
COPY constraints.txt /tmp/constraints.txt
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install -c /tmp/constraints.txt \
        "$(ls /tmp/dist/fxtune-*.whl)[service,postgres,openvino,onnxruntime]" \
    && rm -rf /tmp/dist /tmp/constraints.txt \
    && useradd --create-home --uid 10001 fxtune \
    && mkdir -p /data && chown fxtune /data
USER fxtune
WORKDIR /home/fxtune
EXPOSE 8000
CMD ["fxtune", "serve", "--host", "0.0.0.0", "--port", "8000"]
