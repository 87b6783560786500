"""Tests of fedcluster_app.families.fielding."""
