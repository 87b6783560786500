"""Tests of fedcluster_app.families: every registered strategy, and one folder per family."""
