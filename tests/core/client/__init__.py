"""Tests of fedcluster_app.core.client: training jobs, kernels, the stream client."""
