"""Tests of fedcluster_app.core.results: the run's files, recorder, tracking, provenance."""
