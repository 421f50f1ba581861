# A fresh bullseye runtime for the 1.7.1 wheel (Python 3.9 and the bullseye libraries a
# USE_SYSTEM_LIBS=1 build links against); as ../../torch-1.13.1-cpu/repeat/runtime.Dockerfile.
ARG BASE=patcher-test/debian:bullseye-minbase
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip python3-numpy \
      libgomp1 libcpuinfo0 libnuma1 libonnx1 libopenblas0-pthread libprotobuf23 libsleef3 \
 && rm -rf /var/lib/apt/lists/*
LABEL org.patcher.run="torch-1.7.1-cpu-runtime"
