# swarmhub server image: the FastAPI app and its per-experiment hivemind peers, CPU torch.
#
#   docker build -t swarmhub .
#   docker compose up -d            (see docs/deployment.md)
#
# GPU workers: build with a CUDA torch instead, e.g.
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 -t swarmhub:cuda .

# --- web assets --------------------------------------------------------------------------------------------
# Node/npm exist only in this stage: `npm ci` vendors uPlot into web/node_modules, and the final stage copies
# just the files it serves.
FROM node:22-slim AS web
WORKDIR /src
COPY web/package.json web/package-lock.json web/
RUN npm ci --prefix web --no-audit --no-fund --loglevel=error

# --- the server --------------------------------------------------------------------------------------------
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The unprivileged user the server runs as (USER below). /data holds the SQLite file (when no database URL is
# set) and the swarm peers' identities: mount a volume there.
RUN groupadd --gid 10001 swarmhub \
    && useradd --uid 10001 --gid swarmhub --create-home --home-dir /home/swarmhub --shell /usr/sbin/nologin swarmhub \
    && mkdir -p /data \
    && chown swarmhub:swarmhub /data

# torch first, from PyTorch's CPU index: `pip install .[server]` then finds `torch>=2.1` satisfied and keeps
# this build instead of pulling the multi-GB CUDA wheels from PyPI. Same pin as the Makefile's TORCH_SPEC.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"

# A regular (not editable) install. server/app.py serves uPlot from files("swarmhub.web") / "node_modules",
# i.e. from site-packages, and pyproject's package-data lists node_modules/uplot/dist/uPlot.iife.min.js and
# uPlot.min.css under swarmhub.web: so the vendored files must be in web/node_modules/uplot/dist/ *before*
# the wheel is built, and they then land in site-packages/swarmhub/web/node_modules/uplot/dist/ where the app
# looks. (.dockerignore keeps a local web/node_modules out of the context: the copy below is the only one.)
# The source tree is removed afterwards: its top-level swarmhub/ folder would shadow the installed package
# for `python -m swarmhub...` (how the server starts its swarm peers) in any process whose cwd is the tree.
WORKDIR /src
COPY . .
COPY --from=web /src/web/node_modules/uplot/dist/ web/node_modules/uplot/dist/
# The worker wheel the hub serves volunteers (GET /api/worker), built from the same sources.
RUN pip wheel --no-deps --wheel-dir /opt/swarmhub-wheel . \
    && pip install ".[server]" \
    && cd / && rm -rf /src

# Non-root, numeric so that orchestrators can verify it (Kubernetes runAsNonRoot): the swarmhub user above.
USER 10001:10001
WORKDIR /home/swarmhub

# In a container the swarm peers must listen on every interface: 127.0.0.1 would reach nobody. Their TCP
# ports are picked at random (the server has no setting for them yet), so they cannot be published with -p;
# see docs/deployment.md for volunteers outside this host.
ENV SWARMHUB_DATA_DIR=/data \
    SWARMHUB_SWARM_HOST=0.0.0.0 \
    SWARMHUB_WORKER_WHEEL_DIR=/opt/swarmhub-wheel

EXPOSE 8000

# python, not curl: the slim image has no curl. Any error or non-2xx answer (healthz fails when the database
# does) raises, and the exit status is 1: unhealthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["swarmhub", "server", "--host", "0.0.0.0", "--port", "8000"]
