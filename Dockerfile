# Images for the local stack (docker-compose.yml). One file, three targets:
#   sidecar     - no torch: the sidecar imports none (small image)
#   engine      - CPU torch from the PyTorch CPU index, pinned by constraints.txt (gloo, TP on CPU)
#   engine-gpu  - CUDA torch from PyPI (its wheels carry the CUDA runtime; the host provides the driver), NCCL
FROM python:3.11.11-slim-bookworm AS sidecar
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml setup.py constraints.txt README.md ./
COPY gatherwise gatherwise
COPY engine_hooks engine_hooks
COPY sidecar sidecar
COPY tp_engine tp_engine
COPY gatherwise_bench gatherwise_bench
COPY dashboards dashboards
COPY config config
RUN pip install -c constraints.txt ".[sidecar]" \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin gatherwise
USER gatherwise
EXPOSE 9400
CMD ["gatherwise", "sidecar", "--host", "0.0.0.0", "--port", "9400"]

FROM sidecar AS engine
USER root
RUN pip install -c constraints.txt --index-url https://download.pytorch.org/whl/cpu torch \
    && pip install -c constraints.txt ".[engine]"
USER gatherwise
CMD ["gatherwise", "engine", "--tp", "2", "--workload", "mixed"]

FROM sidecar AS engine-gpu
USER root
RUN pip install -c constraints.txt ".[engine]"
USER gatherwise
CMD ["gatherwise", "engine", "--tp", "2", "--workload", "mixed", "--device", "cuda"]
