"""Tests of fedcluster_app.families.feddrift."""
