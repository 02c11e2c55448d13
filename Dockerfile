# One image for the service and the workers. CPU torch by default; the GPU worker builds with
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (see docker-compose.yml).
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 FXTUNE_DATA_DIR=/data

WORKDIR /app
# bubblewrap isolates tuning children where the container may create namespaces (it needs a
# seccomp profile that allows them); elsewhere workers fall back to resource limits.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0
COPY . .
# Editable, so the service finds migrations/ next to its package.
RUN pip install -c constraints.txt -e . && useradd --create-home fxtune \
    && mkdir -p /data && chown fxtune /data
USER fxtune
EXPOSE 8000
CMD ["fxtune", "serve", "--host", "0.0.0.0", "--port", "8000"]
