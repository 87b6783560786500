"""Tests of fedcluster_app.core.server: the strategy base, the round loop, checkpoints, replies."""
