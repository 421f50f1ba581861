# A fresh bullseye runtime for the wheel: Python 3.9 with venv, and the shared libraries of
# Debian bullseye that the wheel links against (it is built with USE_SYSTEM_LIBS=1, so it is a
# wheel for Debian bullseye, not a manylinux one).  Nothing of the build is in here.
ARG BASE=patcher-test/debian:bullseye-minbase
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip \
      libgomp1 libcpuinfo0 libnuma1 libonnx1 libopenblas0-pthread libprotobuf23 libsleef3 \
 && rm -rf /var/lib/apt/lists/*
LABEL org.patcher.run="torch-1.13.1-cpu-runtime"
