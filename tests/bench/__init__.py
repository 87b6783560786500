"""Tests of fedcluster_app.bench (the `fedcluster bench` command)."""
