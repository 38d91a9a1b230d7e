# The image that examples/kubernetes/*.yaml name: this repository installed with TensorFlow's CUDA libraries,
# for nodes with NVIDIA GPUs (the driver comes from the node). Build it at the repository's root, then push it
# where the cluster pulls images from (and name it so in the manifests):
#   docker build -t trainer:latest .
FROM python:3.11-slim

WORKDIR /app
# The package first, so that editing an example does not reinstall TensorFlow.
COPY setup.cfg pyproject.toml README.md LICENSE ./
COPY trainer trainer
COPY callbacks callbacks
RUN pip install --no-cache-dir . "tensorflow[and-cuda]>=2.18.1,<2.23"
# The manifests run the examples from here (workingDir /app).
COPY examples examples
